//! What the host's interface choice reads: every address with its flags (`ip addr`), and the
//! route the kernel would take to an address (`ip route get`).

use std::io;
use std::net::IpAddr;

use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use netlink_packet_route::AddressFamily;
use rtnetlink::RouteMessageBuilder;

use super::{collect, parse_each, Netlink};

/// An address of an interface, as `ip addr` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostAddress {
    /// The interface's index.
    pub index: u32,
    pub ip: IpAddr,
    /// `IFA_F_*`: permanent, temporary, deprecated, tentative...
    pub flags: u32,
}

/// Where the kernel sends traffic to an address: the interface and the source address it
/// would use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteTo {
    pub index: u32,
    pub source: Option<IpAddr>,
}

impl Netlink {
    /// Every address of every interface of this namespace, both families, in the kernel's
    /// order.
    pub async fn addresses(&self) -> io::Result<Vec<HostAddress>> {
        let req = self.handle.address().get();
        let msgs = collect(req.execute()).await?;
        Ok(msgs.iter().filter_map(host_address).collect())
    }

    /// The route to `ip` (`ip route get`); `None` when there is none (ENETUNREACH).
    pub async fn route_to(&self, ip: IpAddr) -> io::Result<Option<RouteTo>> {
        let message = match ip {
            IpAddr::V4(v4) => RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(v4, 32)
                .build(),
            IpAddr::V6(v6) => RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(v6, 128)
                .build(),
        };
        let found = parse_each(self.handle.route().get(message).execute(), route_to).await;
        match found {
            Ok(routes) => Ok(routes.into_iter().next()),
            Err(e) if e.raw_os_error() == Some(libc::ENETUNREACH) => Ok(None),
            Err(e) => Err(e),
        }
        .map_err(|e| io::Error::new(e.kind(), format!("route to {ip}: {e}")))
    }
}

fn host_address(msg: &AddressMessage) -> Option<HostAddress> {
    let wanted = |a: &AddressAttribute| match (msg.header.family, a) {
        // IFA_LOCAL is an IPv4 interface's own address (IFA_ADDRESS is the peer's on a
        // point-to-point link); IPv6 addresses carry IFA_ADDRESS alone.
        (AddressFamily::Inet, AddressAttribute::Local(ip @ IpAddr::V4(_))) => Some(*ip),
        (AddressFamily::Inet6, AddressAttribute::Address(ip @ IpAddr::V6(_))) => Some(*ip),
        _ => None,
    };
    let ip = msg.attributes.iter().find_map(wanted)?;
    // IFA_FLAGS holds all 32 bits; the header's byte only the low 8 (older kernels).
    let flags = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Flags(flags) => Some(flags.bits()),
        _ => None,
    });
    Some(HostAddress {
        index: msg.header.index,
        ip,
        flags: flags.unwrap_or_else(|| u32::from(msg.header.flags.bits())),
    })
}

fn route_to(msg: &RouteMessage) -> Option<RouteTo> {
    let index = msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(index) => Some(*index),
        _ => None,
    })?;
    let source = msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::PrefSource(RouteAddress::Inet(ip)) => Some(IpAddr::V4(*ip)),
        RouteAttribute::PrefSource(RouteAddress::Inet6(ip)) => Some(IpAddr::V6(*ip)),
        _ => None,
    });
    Some(RouteTo { index, source })
}
