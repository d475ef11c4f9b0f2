//! The external interface (`--iface`) as the kernel backends see it: its index, addresses and
//! MTU, and the routes that go straight out of it (host-gw's, DirectRouting's).

use std::net::{IpAddr, Ipv6Addr};

use anyhow::Context;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::netlink::{Netlink, Route};

/// The external interface as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Uplink {
    pub index: u32,
    /// First IPv4 address with its prefix, as flanneld picks it; `None` on an IPv6-only host.
    pub addr: Option<Ipv4Net>,
    /// First IPv6 address that is not link-local, if the interface has one.
    pub addr6: Option<Ipv6Net>,
    pub mtu: u32,
}

/// Opens rtnetlink in the caller's network namespace and looks up the external interface.
pub(crate) async fn connect(iface: &str) -> anyhow::Result<(Netlink, Uplink)> {
    let nl = Netlink::connect().context("opening rtnetlink")?;
    let uplink = Uplink::lookup(&nl, iface).await?;
    Ok((nl, uplink))
}

impl Uplink {
    pub async fn lookup(nl: &Netlink, name: &str) -> anyhow::Result<Uplink> {
        let link = nl.link_by_name(name).await?;
        let link = link.with_context(|| format!("interface {name} not found"))?;
        let addr = nl.ipv4_addresses(link.index).await?.first().copied();
        let addrs6 = nl.ipv6_addresses(link.index).await?;
        Ok(Uplink {
            index: link.index,
            addr,
            addr6: addrs6.into_iter().find(|a| !is_link_local(a.addr())),
            mtu: link.mtu,
        })
    }

    /// The IPv4 address, for a tunnel device's local end; `iface` names the interface.
    pub fn ipv4(&self, iface: &str) -> anyhow::Result<Ipv4Net> {
        self.addr
            .with_context(|| format!("interface {iface} has no IPv4 address"))
    }

    /// `<dst> via <gateway> dev <iface>`: host-gw's route to a peer's subnet, and
    /// DirectRouting's, of either family.
    pub fn route_via(&self, dst: impl Into<IpNet>, gateway: impl Into<IpAddr>) -> Route {
        let (dst, gateway) = (dst.into(), gateway.into());
        Route {
            dst,
            gateway: Some(gateway),
            oif: self.index,
            onlink: false,
            nhid: None,
        }
    }
}

/// fe80::/10: every IPv6 interface has one; it is no address to be reached at from elsewhere.
pub(crate) fn is_link_local(ip: Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn uplink() -> Uplink {
        Uplink {
            index: 2,
            addr: Some("10.200.0.1/24".parse().unwrap()),
            addr6: Some("fd00:200::1/64".parse().unwrap()),
            mtu: 1500,
        }
    }
}
