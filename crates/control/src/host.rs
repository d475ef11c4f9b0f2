//! Facts about this host that the daemon needs before any backend runs: the underlay interface
//! and its IPv6 address, our privileges, whether another process holds the TUN we would open,
//! and the one route the userspace backends add.

use crate::backend::netlink::{LinkKind, Netlink, Route, Write};
use crate::lease_check::unusable_ipv6;
use anyhow::{bail, Context};
use ipnet::IpNet;
use nix::ifaddrs::getifaddrs;
use std::net::{Ipv4Addr, Ipv6Addr};

/// The underlay interface: its name, first IPv4 address and MTU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    /// `None` on an IPv6-only host, which can run an IPv6-only network.
    pub address: Option<Ipv4Addr>,
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

/// How the underlay interface is chosen, in flanneld's order: each `--iface` (a name or an
/// address), then each `--iface-regex`, then `--iface-can-reach`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterfaceChoice {
    pub ifaces: Vec<String>,
    pub regexes: Vec<String>,
    pub can_reach: Option<std::net::IpAddr>,
}

/// The underlay interface `choice` names; with nothing named, the one holding `public_ip`, else
/// the default route's.
pub fn choose_interface(
    choice: &InterfaceChoice,
    public_ip: Option<Ipv4Addr>,
    config: &crate::config::Config,
) -> anyhow::Result<Interface> {
    match (choice.ifaces.first(), public_ip) {
        (Some(name), _) => interface(name),
        (None, Some(ip)) => interface_with_address(ip),
        (None, None) => default_route_interface(config.ipv4.is_none()),
    }
}

/// The interface called `name`, with its first IPv4 address if it has one.
pub fn interface(name: &str) -> anyhow::Result<Interface> {
    if nix::net::if_::if_nametoindex(name).is_err() {
        bail!("interface {name} does not exist");
    }
    let address = ipv4_addresses()?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, a)| a);
    Ok(Interface {
        name: name.to_string(),
        address,
        mtu: mtu(name)?,
    })
}

/// The interface that holds `ip`, for `--public-ip` without `--iface`.
pub fn interface_with_address(ip: Ipv4Addr) -> anyhow::Result<Interface> {
    let (name, _) = ipv4_addresses()?
        .into_iter()
        .find(|(_, a)| *a == ip)
        .with_context(|| format!("no interface has the address {ip}; give --iface"))?;
    Ok(Interface {
        mtu: mtu(&name)?,
        name,
        address: Some(ip),
    })
}

/// The interface of the IPv4 default route, as flanneld picks one when given neither
/// `--iface` nor `--public-ip` (a DaemonSet's usual arguments); on an IPv6-only network that
/// of the IPv6 default route, as flanneld's IPv6 stack does.
pub fn default_route_interface(ipv6_only: bool) -> anyhow::Result<Interface> {
    let (path, pick): (&str, fn(&str) -> Option<String>) = match ipv6_only {
        false => ("/proc/net/route", default_route_in),
        // This thread's namespace, as for if_inet6 below.
        true => ("/proc/thread-self/net/ipv6_route", ipv6_default_route_in),
    };
    let table = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    let family = if ipv6_only { "IPv6" } else { "IPv4" };
    let name = pick(&table).with_context(|| {
        format!(
            "this host has no {family} default route, so twill cannot tell which interface is \
             the underlay: give --iface or --public-ip"
        )
    })?;
    interface(&name)
}

/// The interface of the lowest-metric IPv6 default route in a `/proc/net/ipv6_route` table:
/// per line destination and its prefix length, source and its prefix length, next hop,
/// metric, reference count, use count and flags (hex), and the device. The kernel's own
/// unreachable default on `lo` (RTF_REJECT) is no underlay.
fn ipv6_default_route_in(table: &str) -> Option<String> {
    const RTF_REJECT: u32 = 0x0200;
    table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let default = f.first()?.bytes().all(|b| b == b'0') && *f.get(1)? == "00";
            let metric = u32::from_str_radix(f.get(5)?, 16).ok()?;
            let flags = u32::from_str_radix(f.get(8)?, 16).ok()?;
            let dev = f.get(9)?;
            (default && flags & RTF_REJECT == 0 && *dev != "lo").then(|| (metric, dev.to_string()))
        })
        .min()
        .map(|(_, name)| name)
}

/// The interface of the lowest-metric default route in a `/proc/net/route` table.
fn default_route_in(table: &str) -> Option<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let default = f.get(1) == Some(&"00000000") && f.get(7) == Some(&"00000000");
            let metric: u32 = f.get(6)?.parse().ok()?;
            default.then(|| (metric, f[0].to_string()))
        })
        .min()
        .map(|(_, name)| name)
}

fn ipv4_addresses() -> anyhow::Result<Vec<(String, Ipv4Addr)>> {
    let addrs = getifaddrs().context("cannot list interface addresses")?;
    Ok(addrs
        .filter_map(|a| {
            let ip = a.address?.as_sockaddr_in()?.ip();
            Some((a.interface_name, ip))
        })
        .collect())
}

/// The IPv6 address of interface `name` that other hosts reach it at, as flanneld's interface
/// lookup picks one for a dual-stack network: permanent (configured) before autoconfigured,
/// stable before temporary. Unlike flanneld it never picks a link-local address (a PublicIPv6
/// names no link, so peers refuse it) and prefers one whose duplicate check is over; deprecated
/// addresses and those that failed the duplicate check are skipped, as are loopback and
/// IPv4-mapped ones. `None` when there is none (or the kernel has IPv6 off).
pub fn ipv6_address(name: &str) -> anyhow::Result<Option<Ipv6Addr>> {
    // This thread's network namespace: /proc/net is the main thread's, and a thread that
    // entered a namespace (setns is per thread) would read another host's addresses.
    const TABLE: &str = "/proc/thread-self/net/if_inet6";
    match std::fs::read_to_string(TABLE) {
        Ok(table) => Ok(ipv6_address_in(&table, name)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {TABLE}")),
    }
}

/// [`ipv6_address`] from a `/proc/net/if_inet6` table: per line the address in 32 hex digits,
/// the interface index, prefix length, scope and flags in hex, and the interface name.
fn ipv6_address_in(table: &str, name: &str) -> Option<Ipv6Addr> {
    const SKIPPED: u32 = libc::IFA_F_DEPRECATED | libc::IFA_F_DADFAILED;
    let mut usable: Vec<(Ipv6Addr, u32)> = table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (addr, flags, iface) = (f.first()?, f.get(4)?, f.get(5)?);
            let addr = Ipv6Addr::from(u128::from_str_radix(addr, 16).ok()?);
            let flags = u32::from_str_radix(flags, 16).ok()?;
            (*iface == name).then_some((addr, flags))
        })
        .filter(|&(addr, flags)| flags & SKIPPED == 0 && unusable_ipv6(addr).is_none())
        .collect();
    // Stable: among equals, the kernel's order stands.
    usable.sort_by_key(|&(_, flags)| {
        let has = |flag: u32| flags & flag != 0;
        (
            has(libc::IFA_F_TENTATIVE),
            !has(libc::IFA_F_PERMANENT),
            has(libc::IFA_F_TEMPORARY),
        )
    });
    usable.first().map(|&(addr, _)| addr)
}

fn mtu(name: &str) -> anyhow::Result<u32> {
    let path = format!("/sys/class/net/{name}/mtu");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    text.trim()
        .parse()
        .with_context(|| format!("{path} holds no number"))
}

/// Fail early, with one clear line, when we cannot create devices or change routes.
pub fn require_net_admin() -> anyhow::Result<()> {
    const CAP_NET_ADMIN: u32 = 12;
    let status = std::fs::read_to_string("/proc/self/status")?;
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    if effective & (1 << CAP_NET_ADMIN) == 0 {
        bail!("twill needs root or CAP_NET_ADMIN to create devices and routes");
    }
    Ok(())
}

/// Fails, naming the device, when a TUN called `name` is held open by another process: another
/// twill or flanneld runs on it. The kernel would refuse a second opener with a bare "Device
/// or resource busy", or, for a multi-queue TUN (`--queues` > 1), let it in as one more queue of
/// the other's device. A TUN nobody holds (a persistent one) is fine: opening it attaches.
/// `fix` says what the operator can do instead.
pub async fn ensure_tun_unclaimed(name: &str, fix: &str) -> anyhow::Result<()> {
    let netlink = Netlink::connect().context("opening rtnetlink")?;
    let link = netlink.link_by_name(name).await?;
    if let Some(LinkKind::Tun { held: true }) = link.map(|l| l.kind) {
        bail!(
            "TUN device {name} is already in use: another process holds it open, most likely \
             another twill or flanneld running on this host; {fix}"
        );
    }
    Ok(())
}

/// `ip route replace <network> dev <dev>`: flanneld's one route that sends the whole container
/// network through the TUN; the more specific local subnet route still wins for our containers.
/// A dual-stack userspace backend routes its IPv6Network the same way.
pub async fn route_network_to(network: impl Into<IpNet>, dev: &str) -> anyhow::Result<()> {
    let netlink = Netlink::connect()?;
    let link = netlink
        .link_by_name(dev)
        .await?
        .with_context(|| format!("device {dev} does not exist"))?;
    route_network_via(&netlink, network, link.index, dev).await
}

/// [`route_network_to`] for a caller that already holds a connection and the device's index.
pub async fn route_network_via(
    netlink: &Netlink,
    network: impl Into<IpNet>,
    oif: u32,
    dev: &str,
) -> anyhow::Result<()> {
    let network = network.into();
    let route = Route {
        dst: network,
        gateway: None,
        oif,
        onlink: false,
        nhid: None,
    };
    netlink
        .write_one(Write::ReplaceRoute(route))
        .await
        .with_context(|| format!("cannot add route {network} dev {dev}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_route_with_the_lowest_metric_names_the_underlay() {
        let table =
            "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n\
            eth1\t00000000\t0100C80A\t0003\t0\t0\t200\t00000000\t0\t0\t0\n\
            eth0\t0000C80A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
            eth0\t00000000\t0100C80A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n";
        assert_eq!(default_route_in(table).as_deref(), Some("eth0"));
        let none = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n\
            eth0\t0000C80A\t00000000\t0001\t0\t0\t0\t00FFFFFF\n";
        assert_eq!(default_route_in(none), None);
    }

    /// Lines as the kernel writes them; the last default is the kernel's unreachable one on lo.
    #[test]
    fn the_ipv6_default_route_with_the_lowest_metric_names_the_underlay_of_an_ipv6_only_network() {
        let zero = "00000000000000000000000000000000";
        let line = |dest: &str, len: &str, metric: &str, flags: &str, dev: &str| {
            format!("{dest} {len} {zero} 00 fd000000000000000000000000000001 {metric} 00000001 00000000 {flags} {dev}\n")
        };
        let table = [
            line(
                "fd000000000000000000000000000000",
                "40",
                "00000100",
                "00000001",
                "eth0",
            ),
            line(zero, "00", "00000400", "00000003", "eth1"),
            line(zero, "00", "00000200", "00000003", "eth0"),
            line(zero, "00", "ffffffff", "00200200", "lo"),
        ]
        .concat();
        assert_eq!(ipv6_default_route_in(&table).as_deref(), Some("eth0"));
        let unreachable_only = line(zero, "00", "ffffffff", "00200200", "lo");
        assert_eq!(ipv6_default_route_in(&unreachable_only), None);
    }

    /// Lines as the kernel writes them: address, index, prefix length, scope, flags, name.
    const IF_INET6: &str = "\
fe80000000000000a8bbccfffedd0001 02 40 20 80     eth0
00000000000000000000000000000001 01 80 10 80       lo
fd000000000000000000000000000009 03 40 00 80     eth1
fd00020000000000a8bbccfffedd0001 02 40 00 00     eth0
20010db8000000000000000000000002 02 40 00 01     eth0
20010db8000000000000000000000003 02 40 00 a0     eth0
20010db8000000000000000000000004 02 40 00 c0     eth0
20010db8000000000000000000000005 02 40 00 88     eth0
fd000200000000000000000000000002 02 40 00 80     eth0
";

    #[test]
    fn the_ipv6_address_is_a_reachable_one_configured_before_autoconfigured() {
        let got = |table: &str, name| ipv6_address_in(table, name).map(|a| a.to_string());
        assert_eq!(
            got(IF_INET6, "eth0").as_deref(),
            Some("fd00:200::2"),
            "permanent, not deprecated (a0), tentative (c0) or DAD-failed (88)"
        );
        assert_eq!(got(IF_INET6, "eth1").as_deref(), Some("fd00::9"));
        assert_eq!(got(IF_INET6, "lo"), None, "loopback");
        assert_eq!(got(IF_INET6, "eth9"), None);
        let dynamic: String = IF_INET6
            .lines()
            .skip(3)
            .take(2)
            .map(|l| l.to_owned() + "\n")
            .collect();
        assert_eq!(
            got(&dynamic, "eth0").as_deref(),
            Some("fd00:200::a8bb:ccff:fedd:1"),
            "autoconfigured before temporary"
        );
        let tentative: String = IF_INET6.lines().filter(|l| l.contains(" c0 ")).collect();
        assert_eq!(
            got(&tentative, "eth0").as_deref(),
            Some("2001:db8::4"),
            "tentative when there is nothing else"
        );
        let link_local: String = IF_INET6.lines().take(1).collect();
        assert_eq!(got(&link_local, "eth0"), None, "link-local");
    }
}
