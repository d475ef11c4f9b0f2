//! A peer's lease as this node's `Mode` reads it: the WireGuard peer it is on each of our
//! devices, or why it can be none. flanneld's reading, where it works:
//!
//! - Mode separate: a peer on `flannel-wg` at `PublicIP:Port` with the IPv4 subnet, and, for a
//!   dual-stack lease, one on `flannel-wg-v6` at `[PublicIPv6]:` BackendV6Data's `Port` with
//!   the IPv6 subnet.
//! - Modes auto, ipv4 and ipv6: one peer on `flannel-wg` with both subnets, at `PublicIP` or
//!   `PublicIPv6` as the mode (or auto's [`select`]) says. flanneld 0.28 takes the port of an
//!   IPv6 endpoint from BackendV6Data, which names `ListenPortV6`, though in these modes the
//!   peer's one device listens on `ListenPort` alone: its ipv6 mode reaches no peer unless the
//!   two ports are equal. twill takes BackendData's `Port` for either family, the port that
//!   device listens on.
//!
//! A lease that lacks what the mode needs is no peer at all, on any device: the lease gate
//! refuses it with the reason ([`crate::lease_check`]), so it is never half configured.

use crate::backend_kind::BackendKind;
use crate::config::wireguard::{Mode, WireguardConfig};
use crate::config::Config;
use crate::lease::Lease;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use twill_dataplane::engine::wireguard::{PublicKey, WgPeerSpec};

/// How this node reads the leases of its peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseReader {
    pub mode: Mode,
    /// The ports of a lease that names none (flannel before leases carried `Port`): ours.
    pub listen_port: u16,
    pub listen_port_v6: u16,
    /// This node's PublicIPv6, which it has on a dual-stack network only: without one, the
    /// IPv6 side of a lease is left alone, as flanneld leaves it.
    pub own_public_ipv6: Option<Ipv6Addr>,
}

/// The peers one lease is on this node's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePeers {
    /// On `flannel-wg`: IPv4 in Mode separate, both families in the others.
    pub main: WgPeerSpec,
    /// On `flannel-wg-v6`, in Mode separate, for a dual-stack lease.
    pub v6: Option<WgPeerSpec>,
}

impl LeaseReader {
    pub fn new(config: &WireguardConfig, own_public_ipv6: Option<Ipv6Addr>) -> LeaseReader {
        LeaseReader {
            mode: config.mode,
            listen_port: config.listen_port,
            listen_port_v6: config.listen_port_v6,
            own_public_ipv6,
        }
    }

    /// How a node of the network `config` that holds `own` reads its peers' leases, when it
    /// runs the wireguard backend on a dual-stack network (elsewhere, the lease gate's check of
    /// BackendData is all the reading needs).
    pub fn of_dual_stack_node(config: &Config, own: &Lease) -> Option<LeaseReader> {
        let runs = config.backend.kind() == Some(BackendKind::Wireguard);
        let own_public_ipv6 = config.ipv6.as_ref().and(own.public_addrs.v6())?;
        let wireguard = WireguardConfig::of_network(config).ok().filter(|_| runs)?;
        Some(LeaseReader::new(&wireguard, Some(own_public_ipv6)))
    }

    pub fn read(&self, lease: &Lease) -> Result<LeasePeers, String> {
        let (key, port) = lease.wireguard_data()?;
        let subnet6 = self.own_public_ipv6.and(lease.subnets.v6());
        let v6_port = match subnet6 {
            Some(_) => Some(v6_port(lease, &key)?),
            None => None,
        };
        let main = WgPeerSpec {
            subnet: lease.subnets.v4().ok_or("it has no IPv4 subnet")?,
            subnet6,
            endpoint: SocketAddr::new(self.main_endpoint(lease)?, port.unwrap_or(self.listen_port)),
            public_key: key,
        };
        let v6 = match (self.mode, v6_port) {
            (Mode::Separate, Some(v6_port)) => {
                let ip = public_ipv6(lease, "Mode separate's flannel-wg-v6")?;
                let endpoint = SocketAddr::new(ip, v6_port.unwrap_or(self.listen_port_v6));
                Some(WgPeerSpec { endpoint, ..main })
            }
            _ => None,
        };
        Ok(LeasePeers { main, v6 })
    }

    /// Where `flannel-wg` reaches the lease's node.
    fn main_endpoint(&self, lease: &Lease) -> Result<IpAddr, String> {
        let mode = match self.mode {
            Mode::Auto => select(lease, self.own_public_ipv6),
            other => other,
        };
        match mode {
            Mode::Ipv6 => public_ipv6(lease, "Mode ipv6"),
            _ => lease.public_addrs.v4().map(IpAddr::V4).ok_or_else(|| {
                "it has no PublicIP, and this node reaches peers over the IPv4 underlay".into()
            }),
        }
    }
}

/// A dual-stack lease's BackendV6Data `Port`, if it names one. Its key must be BackendData's:
/// flanneld writes its node's one key in both, and the lease gate's checks of keys (ours,
/// another lease's) read BackendData's.
fn v6_port(lease: &Lease, key: &PublicKey) -> Result<Option<u16>, String> {
    match lease.wireguard_v6_data()? {
        None => Err(
            "it has an IPv6 subnet but no BackendV6Data.PublicKey, which flanneld writes on a \
             dual-stack network"
                .into(),
        ),
        Some((key6, _)) if key6 != *key => Err(format!(
            "its BackendV6Data.PublicKey \"{key6}\" is not its BackendData.PublicKey \"{key}\": \
             flanneld writes its node's one key in both"
        )),
        Some((_, port)) => Ok(port),
    }
}

/// The lease's PublicIPv6, which `who` sends to.
fn public_ipv6(lease: &Lease, who: &str) -> Result<IpAddr, String> {
    let ip = lease.public_addrs.v6().ok_or_else(|| {
        format!("it has no PublicIPv6, and {who} reaches peers over the IPv6 underlay")
    })?;
    Ok(IpAddr::V6(ip))
}

/// flannel's `selectMode` for Mode auto: IPv4 to a peer with a public IPv4 address, or without
/// a PublicIPv6; IPv6 when both ends' IPv6 addresses are public (not unique-local) but the
/// peer's IPv4 address is private; else IPv4.
fn select(lease: &Lease, own_public_ipv6: Option<Ipv6Addr>) -> Mode {
    let Some(theirs) = lease.public_addrs.v6() else {
        return Mode::Ipv4;
    };
    // RFC 1918, as flannel's `IP4.IsPrivate`.
    if !lease.public_addrs.v4().is_some_and(|ip| ip.is_private()) {
        return Mode::Ipv4;
    }
    match own_public_ipv6 {
        Some(ours) if !is_unique_local(theirs) && !is_unique_local(ours) => Mode::Ipv6,
        _ => Mode::Ipv4,
    }
}

/// fc00::/7 (RFC 4193), as flannel's `IP6.IsPrivate`.
fn is_unique_local(ip: Ipv6Addr) -> bool {
    ip.octets()[0] & 0xfe == 0xfc
}

#[cfg(test)]
mod tests;
