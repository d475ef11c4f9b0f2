//! The underlay interface, chosen as flanneld chooses it (its pkg/ipmatch `LookupExtIface` and
//! main.go): each `--iface` in turn, by name or by one of its addresses; then each
//! `--iface-regex`, matched against the interfaces' addresses, then their names; then
//! `--iface-can-reach`, the interface the kernel routes that address by. With none of them, the
//! interface holding `--public-ip` (or, on a network with IPv6, `--public-ipv6`), else the
//! default route's. The first that fits wins; one that does not is logged and the next tried.
//!
//! The interface's address of each family the network has is the one that chose it (the
//! `--iface` address, the address the regex matched, the route's source), else its best one
//! (`addresses`).

use super::addresses;
use super::default_route::default_route_interface;
use super::netlink::{HostAddress, Link, Netlink};
use crate::stack::Stack;
use anyhow::{bail, Context};
use regex::Regex;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// How the underlay interface is chosen, in flanneld's order: each `--iface` (a name or an
/// address), then each `--iface-regex`, then `--iface-can-reach`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterfaceChoice {
    pub ifaces: Vec<String>,
    pub regexes: Vec<String>,
    pub can_reach: Option<IpAddr>,
}

impl InterfaceChoice {
    fn is_empty(&self) -> bool {
        self.ifaces.is_empty() && self.regexes.is_empty() && self.can_reach.is_none()
    }
}

/// The underlay interface: its name, its addresses of each family and its MTU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    /// The IPv4 address traffic between hosts leaves from; `None` on an interface without one
    /// (an IPv6-only host, which can run an IPv6-only network).
    pub address: Option<Ipv4Addr>,
    /// Its IPv6 address, best first as flanneld ranks them; `None` when it has none.
    pub ipv6: Option<Ipv6Addr>,
    pub mtu: u32,
}

impl Interface {
    /// The IPv4 address, for what needs one: every network but an IPv6-only one.
    pub fn ipv4(&self) -> anyhow::Result<Ipv4Addr> {
        let name = &self.name;
        self.address
            .with_context(|| format!("interface {name} has no IPv4 address"))
    }
}

/// The interface `choice` names; with nothing named, the one holding `public_ip` (or
/// `public_ipv6` on a network with IPv6), else the default route's.
pub async fn choose_interface(
    choice: &InterfaceChoice,
    public_ip: Option<Ipv4Addr>,
    public_ipv6: Option<Ipv6Addr>,
    stack: Stack,
) -> anyhow::Result<Interface> {
    let netlink = Netlink::connect().context("opening rtnetlink")?;
    let host = HostView {
        links: netlink.links().await.context("listing interfaces")?,
        addresses: netlink.addresses().await.context("listing addresses")?,
        ipv6_network: stack.has_ipv6(),
    };
    if choice.is_empty() {
        let public = public_ip
            .map(IpAddr::V4)
            .or(public_ipv6.filter(|_| host.ipv6_network).map(IpAddr::V6));
        return match public {
            Some(ip) => host.with_address(ip),
            None => host.by_name(&default_route_interface(!stack.has_ipv4())?),
        };
    }
    let mut tried = Vec::new();
    for iface in &choice.ifaces {
        let found = match iface.parse::<IpAddr>() {
            Ok(ip) => host.with_address(ip),
            Err(_) => host.by_name(iface),
        };
        match found {
            Ok(interface) => return Ok(interface),
            Err(e) => tried.push(format!("--iface {iface}: {e:#}")),
        }
    }
    for pattern in &choice.regexes {
        match host.by_regex(pattern) {
            Ok(interface) => return Ok(interface),
            Err(e) => tried.push(format!("--iface-regex {pattern}: {e:#}")),
        }
    }
    if let Some(ip) = choice.can_reach {
        match host.reaching(&netlink, ip).await {
            Ok(interface) => return Ok(interface),
            Err(e) => tried.push(format!("--iface-can-reach {ip}: {e:#}")),
        }
    }
    for why in &tried {
        tracing::info!("not the underlay: {why}");
    }
    bail!(
        "no interface matches the interfaces and regular expressions given ({}); this host has {}",
        tried.join("; "),
        host.describe()
    )
}

/// The host's interfaces and addresses, read once.
struct HostView {
    links: Vec<Link>,
    addresses: Vec<HostAddress>,
    /// The network has IPv6: an interface's IPv6 address is looked for too.
    ipv6_network: bool,
}

impl HostView {
    fn by_name(&self, name: &str) -> anyhow::Result<Interface> {
        let link = self.links.iter().find(|l| l.name == name);
        let link = link.with_context(|| format!("interface {name} does not exist"))?;
        Ok(self.interface(link, None))
    }

    /// The interface holding `ip`, any address of it (as flanneld looks it up).
    fn with_address(&self, ip: IpAddr) -> anyhow::Result<Interface> {
        let index = self.addresses.iter().find(|a| a.ip == ip).map(|a| a.index);
        let link = index.and_then(|i| self.links.iter().find(|l| l.index == i));
        let link = link.with_context(|| format!("no interface has the address {ip}"))?;
        Ok(self.interface(link, Some(ip)))
    }

    /// The first interface, in index order, one of whose usable addresses of the network's
    /// families matches `pattern` (IPv4's on an IPv4 network; on a dual-stack one both, as
    /// flanneld requires), else the first whose name matches.
    fn by_regex(&self, pattern: &str) -> anyhow::Result<Interface> {
        let regex =
            Regex::new(pattern).map_err(|e| anyhow::anyhow!("not a regular expression: {e}"))?;
        let matching =
            |ips: Vec<IpAddr>| ips.into_iter().find(|ip| regex.is_match(&ip.to_string()));
        let mut links: Vec<&Link> = self.links.iter().collect();
        links.sort_by_key(|l| l.index);
        for link in &links {
            let v4 = addresses::ipv4(&self.addresses, link.index);
            let v6 = addresses::ipv6(&self.addresses, link.index);
            let v4 = matching(v4.into_iter().map(IpAddr::V4).collect());
            let v6 = matching(v6.into_iter().map(IpAddr::V6).collect());
            let chosen = match (self.ipv6_network, v4, v6) {
                (false, Some(v4), _) => Some((v4, None)),
                (true, Some(v4), Some(v6)) => Some((v4, Some(v6))),
                _ => None,
            };
            if let Some((v4, v6)) = chosen {
                let mut interface = self.interface(link, Some(v4));
                interface.ipv6 = v6.and_then(ipv6_of).or(interface.ipv6);
                return Ok(interface);
            }
        }
        match links.into_iter().find(|l| regex.is_match(&l.name)) {
            Some(link) => Ok(self.interface(link, None)),
            None => bail!("no interface's address or name matches it"),
        }
    }

    /// The interface the kernel routes `ip` by, with the route's source address.
    async fn reaching(&self, netlink: &Netlink, ip: IpAddr) -> anyhow::Result<Interface> {
        let route = netlink.route_to(ip).await?;
        let route = route.with_context(|| format!("no route to {ip}"))?;
        let link = self.links.iter().find(|l| l.index == route.index);
        let link = link.with_context(|| format!("the route to {ip} leaves by no interface"))?;
        Ok(self.interface(link, route.source))
    }

    /// `link` as the underlay, with `chosen` (the address that chose it) as its address of
    /// that family and its best address of the other.
    fn interface(&self, link: &Link, chosen: Option<IpAddr>) -> Interface {
        let v4 = chosen.and_then(|ip| match ip {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        });
        let v6 = chosen.and_then(ipv6_of);
        Interface {
            name: link.name.clone(),
            address: v4.or_else(|| {
                addresses::ipv4(&self.addresses, link.index)
                    .first()
                    .copied()
            }),
            ipv6: v6.or_else(|| {
                addresses::ipv6(&self.addresses, link.index)
                    .first()
                    .copied()
            }),
            mtu: link.mtu,
        }
    }

    /// The interfaces and their addresses, for an error that must say what there was.
    fn describe(&self) -> String {
        let described: Vec<String> = self
            .links
            .iter()
            .map(|l| {
                let v4 = addresses::ipv4(&self.addresses, l.index)
                    .into_iter()
                    .map(IpAddr::V4);
                let v6 = addresses::ipv6(&self.addresses, l.index)
                    .into_iter()
                    .map(IpAddr::V6);
                let all: Vec<String> = v4.chain(v6).map(|ip| ip.to_string()).collect();
                format!("{} [{}]", l.name, all.join(" "))
            })
            .collect();
        described.join(", ")
    }
}

fn ipv6_of(ip: IpAddr) -> Option<Ipv6Addr> {
    match ip {
        IpAddr::V6(v6) => Some(v6),
        IpAddr::V4(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::netlink::LinkKind;

    fn link(index: u32, name: &str) -> Link {
        Link {
            index,
            name: name.into(),
            mtu: 1500 + index,
            mac: None,
            kind: LinkKind::Other(None),
            up: true,
        }
    }

    fn host(ipv6_network: bool) -> HostView {
        let p = libc::IFA_F_PERMANENT;
        let on = |index, ip: &str| HostAddress {
            index,
            ip: ip.parse().unwrap(),
            flags: p,
        };
        HostView {
            links: vec![link(3, "eth1"), link(1, "lo"), link(2, "eth0")],
            addresses: vec![
                on(1, "127.0.0.1"),
                on(2, "192.168.9.2"),
                on(2, "fe80::2"),
                on(3, "10.200.0.1"),
                on(3, "10.200.0.7"),
                on(3, "fd00:200::1"),
            ],
            ipv6_network,
        }
    }

    #[test]
    fn an_interface_is_found_by_name_or_by_any_of_its_addresses() {
        let h = host(false);
        let eth1 = h.by_name("eth1").unwrap();
        assert_eq!(
            (eth1.address, eth1.mtu),
            (Some("10.200.0.1".parse().unwrap()), 1503)
        );
        assert_eq!(eth1.ipv6, Some("fd00:200::1".parse().unwrap()));
        let by_second = h.with_address("10.200.0.7".parse().unwrap()).unwrap();
        assert_eq!(
            (by_second.name.as_str(), by_second.address),
            ("eth1", Some("10.200.0.7".parse().unwrap())),
            "the address given is the one used"
        );
        assert!(h.by_name("eth9").unwrap_err().to_string().contains("eth9"));
        let err = h.with_address("10.0.0.1".parse().unwrap()).unwrap_err();
        assert_eq!(err.to_string(), "no interface has the address 10.0.0.1");
    }

    #[test]
    fn a_regex_matches_addresses_first_then_names() {
        let h = host(false);
        let by_address = h.by_regex(r"^10\.200\.0\.7$").unwrap();
        assert_eq!(by_address.name, "eth1");
        assert_eq!(by_address.address, Some("10.200.0.7".parse().unwrap()));
        // "eth" matches no address: the first name in index order wins.
        assert_eq!(h.by_regex("eth").unwrap().name, "eth0");
        assert_eq!(h.by_regex("^192\\.").unwrap().name, "eth0");
        assert!(h.by_regex("^wlan").is_err());
        let err = h.by_regex("(").unwrap_err().to_string();
        assert!(err.starts_with("not a regular expression"), "{err}");
        // A dual-stack network needs both families to match on the same interface.
        let dual = host(true);
        let both = dual.by_regex(r"^(10\.200\.0\.7|fd00)").unwrap();
        assert_eq!(both.name, "eth1");
        assert_eq!(both.address, Some("10.200.0.7".parse().unwrap()));
        assert_eq!(both.ipv6, Some("fd00:200::1".parse().unwrap()));
        assert!(
            dual.by_regex(r"^192\.168\.").is_err(),
            "eth0's IPv6 does not match"
        );
    }
}
