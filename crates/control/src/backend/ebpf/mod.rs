//! flannel's udp backend on the in-kernel dataplane (`--dataplane ebpf`): TC programs on a
//! dummy device and on the underlay carry the same wire as the TUN engine, with no userspace
//! crossing. The lease, the wire and the rules are the udp backend's; peers cannot tell.
//!
//! The device, its route, the programs and their maps outlive the daemon (the maps and links
//! are pinned), so a restart or an upgrade does not stop container traffic: the next start
//! adopts them and reconciles the peer maps with the leases. `twill run --cleanup` removes it
//! all.

mod choice;
mod counters;
mod device;

pub use choice::{choose, Dataplane};

use super::userspace::{mtu_source, tun_mtu, Overhead};
use super::{Backend, Setup};
use crate::backend::netlink::Netlink;
use crate::host;
use crate::lease::{Lease, LeaseAttrs};
use crate::node::Node;
use crate::status::EngineView;
use anyhow::Context;
use ipnet::Ipv4Net;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use twill_dataplane::stats::EngineStats;
use twill_dataplane::table::{PeerSpec, SharedTable};
use twill_ebpf::{Attachment, Opened};

pub use crate::node::DEFAULT_BPF_DIR;

/// flannel's udp port, when the network config gives none.
const DEFAULT_PORT: u16 = 8285;
/// flannel's udp encapsulation: an outer IPv4 and UDP header.
const OVERHEAD: usize = 28;

/// Where a node's programs, links and maps are pinned: one directory per device, so nodes
/// with different `--tun-name`s on one host keep apart.
pub fn pin_dir(bpf_dir: &Path, device: &str) -> PathBuf {
    bpf_dir.join(device)
}

/// The eBPF dataplane before the lease: its MTU and where it attaches are checked first.
pub struct EbpfSetup {
    attachment: Attachment,
    pin_dir: PathBuf,
    mtu: u16,
    network: Ipv4Net,
}

impl EbpfSetup {
    pub fn new(node: &Node) -> anyhow::Result<EbpfSetup> {
        let port = node.config.backend.port.unwrap_or(DEFAULT_PORT);
        let iface = &node.iface;
        let mtu = tun_mtu(
            node.options.mtu,
            iface.mtu,
            &mtu_source(iface),
            Overhead::same(OVERHEAD),
        )?;
        let device = node.options.tun_name.clone();
        Ok(EbpfSetup {
            pin_dir: pin_dir(&node.options.bpf_dir, &device),
            attachment: Attachment {
                device,
                underlay: iface.name.clone(),
                local_ip: iface.ipv4()?,
                port,
            },
            mtu,
            network: node.config.need_ipv4("the eBPF dataplane")?.network,
        })
    }
}

impl Setup for EbpfSetup {
    type Backend = Ebpf;

    fn lease_attrs(&self, public_ip: Ipv4Addr) -> LeaseAttrs {
        LeaseAttrs::udp(public_ip)
    }

    /// Makes (or adopts) the device and its route, then loads (or adopts) the programs.
    async fn attach(self, lease: &Lease) -> anyhow::Result<Ebpf> {
        let nl = Netlink::connect().context("opening rtnetlink")?;
        let name = &self.attachment.device;
        let address = Ipv4Net::new(lease.subnet.network(), 32)?;
        let link = device::ensure(&nl, name, u32::from(self.mtu), address).await?;
        host::route_network_via(&nl, self.network, link.index, name).await?;
        let (dataplane, opened) = twill_ebpf::Dataplane::open(&self.pin_dir, &self.attachment)
            .with_context(|| format!("loading the eBPF dataplane on {name}"))?;
        match opened {
            Opened::Fresh => tracing::info!(device = %name, "eBPF dataplane loaded"),
            Opened::Adopted { peers } => tracing::info!(
                device = %name,
                peers,
                "eBPF dataplane adopted from {}: traffic kept flowing",
                self.pin_dir.display()
            ),
        }
        Ok(Ebpf::new(
            dataplane,
            self.attachment.port,
            u32::from(self.mtu),
        ))
    }
}

/// The eBPF dataplane following the leases: each peer is an entry in its maps. Dropping it
/// leaves the programs running, by design (see the module's comment).
pub struct Ebpf {
    dataplane: Arc<twill_ebpf::Dataplane>,
    /// The peers as status shows them, with counters copied in from the maps.
    table: Arc<SharedTable>,
    stats: Arc<EngineStats>,
    mtu: u32,
    /// flannel's udp leases carry no port: every peer listens on the network's.
    port: u16,
    /// Map updates since start, for status: an idle reconcile makes none.
    writes: u64,
}

impl Ebpf {
    fn new(dataplane: twill_ebpf::Dataplane, port: u16, mtu: u32) -> Ebpf {
        Ebpf {
            dataplane: Arc::new(dataplane),
            table: Arc::default(),
            stats: Arc::default(),
            mtu,
            port,
            writes: 0,
        }
    }

    fn set(&mut self, subnet: Ipv4Net, endpoint: SocketAddrV4) -> anyhow::Result<()> {
        self.writes += 1;
        self.dataplane.set_peer(subnet, endpoint)
    }

    fn unset(&mut self, subnet: Ipv4Net) -> anyhow::Result<()> {
        self.writes += 1;
        self.dataplane.remove_peer(subnet)
    }

    /// The programs send over IPv4 only: a dual-stack network, the only one with an IPv6
    /// underlay, never runs them.
    fn endpoint(&self, lease: &Lease) -> SocketAddrV4 {
        SocketAddrV4::new(lease.public_ip, self.port)
    }

    fn spec(&self, lease: &Lease) -> PeerSpec {
        PeerSpec {
            subnet: lease.subnet,
            endpoint: self.endpoint(lease).into(),
            version: 1,
            // The programs carry IPv4 only; a dual-stack network never runs them.
            subnet6: None,
        }
    }
}

impl Backend for Ebpf {
    fn backend_type(&self) -> Option<&'static str> {
        None
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn kernel_writes(&self) -> u64 {
        self.writes
    }

    fn engine_view(&self) -> Option<EngineView> {
        Some(counters::view(&self.dataplane, &self.table, &self.stats))
    }

    async fn add_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        self.table
            .set_peer(self.spec(lease))
            .with_context(|| format!("peer {} left out", lease.subnet))?;
        self.set(lease.subnet, self.endpoint(lease))
    }

    async fn remove_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        self.table.remove_peer(lease.subnet);
        self.unset(lease.subnet)
    }

    /// The maps end up holding exactly the leases' peers: a restart's adopted maps, or a change
    /// made behind twill's back, are brought in line with one update per difference.
    async fn reconcile(&mut self, leases: &[Lease]) -> anyhow::Result<()> {
        let specs: Vec<PeerSpec> = leases.iter().map(|l| self.spec(l)).collect();
        self.table.set_peers(&specs);
        let wanted: BTreeMap<Ipv4Net, SocketAddrV4> = self
            .table
            .load()
            .peers()
            .iter()
            .filter_map(|p| match p.spec.endpoint {
                SocketAddr::V4(endpoint) => Some((p.spec.subnet, endpoint)),
                // None: every endpoint this backend writes is IPv4 ([`Ebpf::endpoint`]).
                SocketAddr::V6(_) => None,
            })
            .collect();
        let present: BTreeMap<Ipv4Net, SocketAddrV4> =
            self.dataplane.peers()?.into_iter().collect();
        for subnet in present.keys().filter(|s| !wanted.contains_key(s)) {
            self.unset(*subnet)?;
        }
        for (subnet, endpoint) in &wanted {
            if present.get(subnet) != Some(endpoint) {
                self.set(*subnet, *endpoint)?;
            }
        }
        Ok(())
    }
}

/// `twill run --cleanup`: removes what the eBPF dataplane leaves behind on purpose (the
/// programs, links and maps pinned under `bpf_dir`, and the device `device` with its route).
/// Nothing there is fine; what was removed is logged.
pub async fn cleanup(bpf_dir: &Path, device: &str) -> anyhow::Result<()> {
    let pins = pin_dir(bpf_dir, device);
    twill_ebpf::remove(&pins).with_context(|| format!("removing {}", pins.display()))?;
    let nl = Netlink::connect().context("opening rtnetlink")?;
    if device::remove(&nl, device).await? {
        tracing::info!("removed the eBPF dataplane's device {device} and its route");
    }
    Ok(())
}
