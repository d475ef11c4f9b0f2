//! The userspace backends, `udp` (flannel's) and `twill-batch`: a dataplane engine on a TUN,
//! whose peer table follows the leases.
//!
//! Like flanneld's udp backend, the TUN gets the lease's network address as a /32 and one route
//! for the whole network, so the kernel hands every packet for another host's subnet to us. On a
//! dual-stack network the IPv6 side is the same: the IPv6 subnet's network address as a /128,
//! and one route for the IPv6Network. Datagrams go over IPv4 (to peers' PublicIP), as flanneld's
//! udp backend, which has no IPv6 at all, sends them; on a dual-stack network with
//! `Backend.Underlay` "ipv6" they go to peers' PublicIPv6 instead.

use super::{each, Backend, Setup};
use crate::backend_kind::BackendKind;
use crate::config::Underlay;
use crate::host::{self, Interface};
use crate::lease::{BackendData, Lease, LeaseAttrs, PublicAddrs};
use crate::node::Node;
use anyhow::{bail, Context};
use ipnet::{Ipv4Net, Ipv6Net};
use std::borrow::Borrow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use twill_dataplane::engine::{Engine, EngineConfig, EngineKind};
use twill_dataplane::io::TunConfig;
use twill_dataplane::table::{PeerSpec, SharedTable};
use twill_dataplane::wire::batch;

/// The default port of a backend whose engine sends flannel's or twill's datagrams.
pub(crate) fn udp_port(backend: BackendKind) -> u16 {
    backend
        .default_port()
        .expect("a backend run by a UDP engine has a default port")
}

/// This node's lease for `kind`. A twill-batch lease names its port and the highest batch
/// version it reads, as docs/batch-protocol.md specifies; flannel's udp leases carry nothing.
pub fn lease_attrs(kind: EngineKind, public_addrs: PublicAddrs, port: u16) -> LeaseAttrs {
    match kind {
        EngineKind::FlannelUdp => LeaseAttrs::udp(public_addrs),
        EngineKind::Batch { .. } => LeaseAttrs {
            backend_data: Some(
                serde_json::json!({ "Port": port, "Version": batch::HIGHEST_VERSION }).into(),
            ),
            ..LeaseAttrs::twill_batch(public_addrs)
        },
    }
}

/// A userspace backend before its lease: the engine needs the lease's subnet, so the TUN and
/// the socket are only made in `attach`.
pub struct UserspaceSetup {
    kind: EngineKind,
    port: u16,
    underlay: Underlay,
    /// Everything of the engine's config but the subnet.
    engine: EngineConfig,
    network: Ipv4Net,
    /// A dual-stack network's IPv6Network, and this node's PublicIPv6: every dual-stack lease
    /// names one, as flanneld's do, though these engines send over the IPv4 underlay.
    ipv6: Option<(Ipv6Net, Ipv6Addr)>,
}

/// The backend's port, `Backend.Port` or `kind`'s default, checked before anything is made: a
/// port of 0 would bind an ephemeral port no peer knows.
pub(crate) fn backend_port(node: &Node, kind: BackendKind) -> anyhow::Result<u16> {
    let default_port = udp_port(kind);
    let port = node.config.backend.port.unwrap_or(default_port);
    if port == 0 {
        bail!(
            "Backend.Port 0 is not a port peers can reach; give 1 to 65535, or leave it out for the default {default_port}"
        );
    }
    Ok(port)
}

impl UserspaceSetup {
    /// Checks the port and the MTU before anything is made: a TUN MTU beyond what the underlay
    /// carries would be a black hole.
    pub fn new(node: &Node, kind: EngineKind) -> anyhow::Result<UserspaceSetup> {
        let backend = &node.config.backend.backend_type;
        twill_dataplane::io::tun::require_device(&format!("the {backend} backend"))?;
        let options = &node.options;
        let port = backend_port(
            node,
            match kind {
                EngineKind::FlannelUdp => BackendKind::Udp,
                EngineKind::Batch { .. } => BackendKind::TwillBatch,
            },
        )?;
        let underlay = node.config.backend.underlay;
        let local = bind_address(node, underlay)?;
        let (iface, overhead) = (&node.iface, Overhead::same(kind.overhead(local)));
        let mtu = tun_mtu(options.mtu, iface.mtu, &mtu_source(iface), overhead)?;
        let engine = EngineConfig {
            kind,
            subnet: Ipv4Net::default(),
            subnet6: None,
            tun: TunConfig {
                name: options.tun_name.clone(),
                mtu,
                address: Ipv4Addr::UNSPECIFIED,
                offload: !options.no_offload,
                queues: options.queues,
                tx_queue_len: options.tun_tx_queue_len,
            },
            bind: SocketAddr::new(local, port),
            socket_buffer: options.udp_buffer,
        };
        Ok(UserspaceSetup {
            kind,
            port,
            underlay,
            engine,
            network: node.config.need_ipv4("a userspace backend")?.network,
            ipv6: dual_stack_side(node),
        })
    }
}

/// A dual-stack network's IPv6Network and this node's PublicIPv6 (every dual-stack lease names
/// one, as flanneld's do), for the backends that route the whole IPv6Network into their device.
pub(crate) fn dual_stack_side(node: &Node) -> Option<(Ipv6Net, Ipv6Addr)> {
    let network6 = node.config.ipv6.as_ref().map(|v6| v6.network);
    network6.zip(node.public_addrs.v6())
}

/// `attrs` with this node's PublicIPv6 on a dual-stack network (`ipv6`, [`dual_stack_side`]).
pub(crate) fn with_ipv6_side(attrs: LeaseAttrs, ipv6: Option<(Ipv6Net, Ipv6Addr)>) -> LeaseAttrs {
    match ipv6 {
        Some((_, public_ipv6)) => attrs.with_ipv6(public_ipv6, None),
        None => attrs,
    }
}

/// Where the engine's socket binds: the interface's address of the underlay's family, as
/// flanneld binds its udp socket to the interface's IPv4 address. An interface without a
/// usable IPv6 address leaves the PublicIPv6 (`--public-ipv6`), which must then be local.
pub(crate) fn bind_address(node: &Node, underlay: Underlay) -> anyhow::Result<IpAddr> {
    match underlay {
        Underlay::Ipv4 => Ok(node.iface.ipv4()?.into()),
        Underlay::Ipv6 => match node.iface.ipv6.or(node.public_addrs.v6()) {
            Some(ip) => Ok(ip.into()),
            None => bail!(
                "Backend.Underlay is ipv6, but this node has no IPv6 address to send from: \
                 give interface {} a global or unique-local IPv6 address, or --public-ipv6",
                node.iface.name
            ),
        },
    }
}

/// The smallest MTU every IPv4 host must take (RFC 791).
const MIN_MTU: u32 = 576;

/// What a backend adds to each packet: by default (the device MTU it picks) and at the least
/// (the largest `--mtu` that still fits). They differ for WireGuard, whose default keeps
/// flannel's 80 bytes (room for an IPv6 underlay) though 60 suffice over IPv4.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Overhead {
    pub default: usize,
    pub least: usize,
}

impl Overhead {
    pub fn same(bytes: usize) -> Overhead {
        Overhead {
            default: bytes,
            least: bytes,
        }
    }
}

/// `--mtu`, or the underlay's MTU less the default overhead; refused outside 576..=what the
/// underlay carries after the least overhead. `source` says where the underlay's MTU comes from
/// (`eth0 has MTU 1500`, `Backend.MTU is 1400`), for the one-line error.
pub(crate) fn tun_mtu(
    wanted: Option<u16>,
    underlay: u32,
    source: &str,
    overhead: Overhead,
) -> anyhow::Result<u16> {
    let after = |bytes: usize| {
        underlay
            .saturating_sub(bytes as u32)
            .min(u32::from(u16::MAX))
    };
    let largest = after(overhead.least);
    let mtu = wanted.map_or(after(overhead.default), u32::from);
    if mtu < MIN_MTU || mtu > largest {
        let given = match wanted {
            Some(m) => format!("--mtu {m}"),
            None => format!("the default MTU {mtu}"),
        };
        bail!(
            "{given} does not fit: it must be between {MIN_MTU} and {largest} ({source} and this backend adds {} bytes)",
            overhead.least
        );
    }
    Ok(mtu as u16)
}

/// Where the interface's MTU comes from, for [`tun_mtu`]'s error.
pub(crate) fn mtu_source(iface: &Interface) -> String {
    format!("{} has MTU {}", iface.name, iface.mtu)
}

impl Setup for UserspaceSetup {
    type Backend = Userspace;

    fn lease_attrs(&self, public_addrs: PublicAddrs) -> LeaseAttrs {
        with_ipv6_side(lease_attrs(self.kind, public_addrs, self.port), self.ipv6)
    }

    /// Opens the TUN with the lease's network addresses and routes the whole network (and the
    /// IPv6Network, on a dual-stack one) into it.
    async fn attach(mut self, lease: &Lease) -> anyhow::Result<Userspace> {
        let subnet = lease
            .subnets
            .v4()
            .context("a userspace engine needs an IPv4 subnet, and our lease has none")?;
        self.engine.subnet = subnet;
        self.engine.subnet6 = lease.subnets.v6().filter(|_| self.ipv6.is_some());
        self.engine.tun.address = subnet.network();
        let engine = Engine::start(&self.engine)?;
        let dev = &self.engine.tun.name;
        host::route_network_to(self.network, dev).await?;
        if let Some((network6, _)) = self.ipv6 {
            host::route_network_to(network6, dev).await?;
        }
        Ok(Userspace::new(engine, self.port, self.underlay))
    }
}

/// Feeds an engine's peer table from leases of one backend type, one peer per event. Owns the
/// engine: dropping the backend stops forwarding and removes the TUN.
pub struct Userspace {
    engine: Engine,
    table: Arc<SharedTable>,
    mtu: u32,
    /// The port peers listen on when their lease does not say (flannel leases never do).
    default_port: u16,
    underlay: Underlay,
}

impl Userspace {
    pub fn new(engine: Engine, default_port: u16, underlay: Underlay) -> Userspace {
        Userspace {
            table: engine.table().clone(),
            mtu: u32::from(engine.mtu()),
            engine,
            default_port,
            underlay,
        }
    }

    /// The peer a lease describes; `None` for a lease with no IPv4 subnet or no address of the
    /// underlay's family, which the lease gate refuses before it gets here.
    fn spec(&self, lease: &Lease) -> Option<PeerSpec> {
        let fields = lease.backend_data.as_ref().and_then(BackendData::fields);
        let field = |name: &str| fields.as_ref()?.get(name)?.as_u64();
        let port = field("Port").and_then(|p| u16::try_from(p).ok());
        let version = field("Version").and_then(|v| u8::try_from(v).ok());
        let address: IpAddr = match self.underlay {
            Underlay::Ipv4 => lease.public_addrs.v4()?.into(),
            Underlay::Ipv6 => lease.public_addrs.v6()?.into(),
        };
        Some(PeerSpec {
            subnet: lease.subnets.v4()?,
            subnet6: lease.subnets.v6(),
            endpoint: SocketAddr::new(address, port.unwrap_or(self.default_port)),
            version: version.unwrap_or(batch::VERSION),
        })
    }
}

impl Backend for Userspace {
    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn engine(&self) -> Option<&Engine> {
        Some(&self.engine)
    }

    /// Only leases of this backend's type arrive here: the lease gate refuses the others.
    async fn add_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        let Some(spec) = self.spec(lease) else {
            bail!(
                "peer {} left out: its lease has no IPv4 subnet, or no address of the underlay's \
                 family",
                lease.id()
            );
        };
        let set = self.table.set_peer(spec);
        set.with_context(|| format!("peer {} left out", lease.id()))
    }

    async fn remove_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        if let Some(subnet) = lease.subnets.v4() {
            self.table.remove_peer(subnet);
        }
        Ok(())
    }

    async fn reconcile<L: Borrow<Lease>>(&mut self, leases: &[L]) -> anyhow::Result<()> {
        let specs: Vec<PeerSpec> = each(leases).filter_map(|l| self.spec(l)).collect();
        self.table.set_peers(&specs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eth0(mtu: u32) -> Interface {
        Interface {
            name: "eth0".into(),
            address: Some(Ipv4Addr::new(10, 200, 0, 1)),
            ipv6: None,
            mtu,
        }
    }

    #[test]
    fn mtu_defaults_to_what_the_underlay_carries() {
        let fit = |wanted, mtu, bytes| {
            tun_mtu(wanted, mtu, &mtu_source(&eth0(mtu)), Overhead::same(bytes))
        };
        assert_eq!(fit(None, 1500, 28).unwrap(), 1472);
        assert_eq!(fit(Some(1400), 1500, 42).unwrap(), 1400);
        assert_eq!(fit(None, 70000, 28).unwrap(), u16::MAX);
        // WireGuard: flannel's default leaves 80 bytes, but up to 60 less fits over IPv4.
        let wg = Overhead {
            default: 80,
            least: 60,
        };
        assert_eq!(tun_mtu(None, 1500, "eth0 has MTU 1500", wg).unwrap(), 1420);
        assert_eq!(
            tun_mtu(Some(1440), 1500, "eth0 has MTU 1500", wg).unwrap(),
            1440
        );
        let err = tun_mtu(Some(1441), 1400, "Backend.MTU is 1400", wg);
        let err = err.unwrap_err().to_string();
        assert!(
            err.contains("between 576 and 1340 (Backend.MTU is 1400"),
            "{err}"
        );
    }

    #[test]
    fn an_mtu_the_underlay_cannot_carry_is_refused_in_one_line() {
        for (wanted, mtu, want) in [
            (
                Some(9000),
                1500,
                "--mtu 9000 does not fit: it must be between 576 and 1472",
            ),
            (Some(1473), 1500, "between 576 and 1472"),
            (Some(0), 1500, "--mtu 0 does not fit"),
            (Some(67), 1500, "--mtu 67 does not fit"),
            (None, 600, "the default MTU 572 does not fit"),
        ] {
            let source = mtu_source(&eth0(mtu));
            let err = tun_mtu(wanted, mtu, &source, Overhead::same(28));
            let err = err.unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
            assert!(err.contains("eth0 has MTU"), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }
}
