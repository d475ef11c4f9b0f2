//! This host's kernel as twill reads and writes it, below the backends and the lease gate: the
//! rtnetlink client (`netlink`), the facts the daemon needs before any backend runs (the
//! underlay interface and its addresses, `interface`, chosen as flanneld chooses it; our
//! privileges; whether another process holds the TUN we would open), the external interface as
//! the kernel backends route through it (`uplink`), twill's nexthop objects (`nexthops`), and
//! the one route the userspace backends add. Nothing here knows a lease or a backend.

mod addresses;
mod default_route;
mod interface;
pub mod netlink;
pub(crate) mod nexthops;
pub(crate) mod uplink;

pub use interface::{choose_interface, Interface, InterfaceChoice};

use anyhow::{bail, Context};
use ipnet::IpNet;
use netlink::{LinkKind, Netlink, Route, Write};

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
