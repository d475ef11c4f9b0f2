//! Blackhole routes (`ip route add blackhole <dst>`), for flanneld's `--ip-blackhole-route`.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteType};
use rtnetlink::RouteMessageBuilder;

use super::{dump_routes, io_error, Netlink};

impl Netlink {
    /// Adds the blackhole route to `dst` unless one is there; whether it had to be added.
    pub async fn ensure_blackhole(&self, dst: IpNet) -> io::Result<bool> {
        let existing = match dst {
            IpNet::V4(_) => RouteMessageBuilder::<Ipv4Addr>::new().build(),
            IpNet::V6(_) => RouteMessageBuilder::<Ipv6Addr>::new().build(),
        };
        let found = dump_routes(existing, |m| blackhole_to(m, dst)).await?;
        if !found.is_empty() {
            return Ok(false);
        }
        let route = match dst {
            IpNet::V4(v4) => RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(v4.network(), v4.prefix_len())
                .kind(RouteType::BlackHole)
                .build(),
            IpNet::V6(v6) => RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(v6.network(), v6.prefix_len())
                .kind(RouteType::BlackHole)
                .build(),
        };
        self.wrote();
        self.handle
            .route()
            .add(route)
            .execute()
            .await
            .map_err(io_error)?;
        Ok(true)
    }
}

/// `Some(())` for a blackhole route to exactly `dst`.
fn blackhole_to(msg: &RouteMessage, dst: IpNet) -> Option<()> {
    if msg.header.kind != RouteType::BlackHole
        || msg.header.destination_prefix_length != dst.prefix_len()
    {
        return None;
    }
    let to = msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some(IpAddr::V4(*ip)),
        RouteAttribute::Destination(RouteAddress::Inet6(ip)) => Some(IpAddr::V6(*ip)),
        _ => None,
    })?;
    (to == dst.network()).then_some(())
}
