//! flannel's udp backend on the in-kernel dataplane (`--dataplane ebpf`): TC programs on a
//! dummy device and on the underlay carry the same wire as the TUN engine, with no userspace
//! crossing. The lease, the wire and the rules are the udp backend's; peers cannot tell.
//!
//! The device, its route, the programs and their maps outlive the daemon (the maps and links
//! are pinned), so a restart or an upgrade does not stop container traffic: the next start
//! adopts them and reconciles the peer maps with the leases. `twill run --cleanup` removes it
//! all.

mod choice;
mod claimed_port;
mod counters;
mod device;
mod owner;
mod unproven;

pub use choice::{choose, Dataplane};

use super::userspace::{
    backend_port, bind_address, dual_stack_side, mtu_source, tun_mtu, with_ipv6_side, Overhead,
};
use super::{each, Backend, Setup};
use crate::backend_kind::BackendKind;
use crate::host;
use crate::host::netlink::{Netlink, Route};
use crate::lease::{Lease, LeaseAttrs, PublicAddrs};
use crate::node::Node;
use crate::status::EngineView;
use anyhow::{anyhow, Context};
use claimed_port::ClaimedPort;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use owner::Owner;
use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use twill_dataplane::engine::EngineKind;
use twill_dataplane::icmp_limit::IcmpLimit;
use twill_dataplane::stats::EngineStats;
use twill_dataplane::table::{PeerSpec, SharedTable};
use twill_ebpf::{Attachment, Ingress, Opened, Takes};
use unproven::{undo, Unproven};

pub use crate::node::DEFAULT_BPF_DIR;
pub use twill_ebpf::{AttachMode, XdpChoice};

/// Where a node's programs, links and maps are pinned: one directory per device, so nodes
/// with different `--tun-name`s on one host keep apart.
pub fn pin_dir(bpf_dir: &Path, device: &str) -> PathBuf {
    bpf_dir.join(device)
}

/// The eBPF dataplane before the lease: its MTU and where it attaches are checked first, and
/// its device is claimed, so that a second node on it is refused before anything is touched.
pub struct EbpfSetup {
    site: Site,
    owner: Owner,
}

/// What the dataplane is made of: where it attaches, where it pins, and the network (both
/// networks, on a dual-stack one) routed to its device.
struct Site {
    attachment: Attachment,
    pin_dir: PathBuf,
    mtu: u16,
    /// What the outer headers add: the device's MTU stays within the underlay's less this.
    overhead: u32,
    network: Ipv4Net,
    /// A dual-stack network's IPv6Network, and this node's PublicIPv6 (every dual-stack lease
    /// names one, whichever underlay the programs send over).
    ipv6: Option<(Ipv6Net, Ipv6Addr)>,
}

impl EbpfSetup {
    pub fn new(node: &Node) -> anyhow::Result<EbpfSetup> {
        let port = backend_port(node, BackendKind::Udp)?;
        let iface = &node.iface;
        // The programs send from the address the TUN engine's socket binds, and the device
        // leaves room for the same outer headers: 28 bytes over IPv4, 48 over IPv6.
        let local = bind_address(node, node.config.backend.underlay)?;
        let overhead = EngineKind::FlannelUdp.overhead(local);
        let mtu = tun_mtu(
            node.options.mtu,
            iface.mtu,
            &mtu_source(iface),
            Overhead::same(overhead),
        )?;
        let device = node.options.tun_name.clone();
        let owner = Owner::claim(&device)?.map_err(|held| {
            anyhow!(
                "the eBPF dataplane on device {device} is already run by {held}: stop it first, \
                 or give this node another --tun-name"
            )
        })?;
        let veth = veth_under(&iface.name);
        if let Some(veth) = &veth {
            warn_of_software_checksums(&veth.veth);
        }
        let segmenter = veth.is_some();
        let site = Site {
            pin_dir: pin_dir(&node.options.bpf_dir, &device),
            attachment: Attachment {
                device,
                underlay: iface.name.clone(),
                local_ip: iface.ipv4()?,
                local_ip6: match local {
                    IpAddr::V6(local) => Some(local),
                    IpAddr::V4(_) => None,
                },
                port,
                attach: node.options.bpf_attach,
                xdp: node.options.bpf_xdp,
                segmenter,
                // The lease's, once it is known (attach).
                device_ip: None,
                device_ip6: None,
                icmp_limit: IcmpLimit::of_this_namespace(),
            },
            mtu,
            overhead: overhead as u32,
            network: node.config.need_ipv4("the eBPF dataplane")?.network,
            ipv6: dual_stack_side(node),
        };
        Ok(EbpfSetup { site, owner })
    }
}

/// The veth the underlay is or sits on, which needs the segmenter; an underlay whose devices
/// cannot be read is taken for a NIC, which segments by itself (said in the log).
fn veth_under(underlay: &str) -> Option<twill_ebpf::VethUnder> {
    twill_ebpf::veth_under(underlay).unwrap_or_else(|e| {
        tracing::warn!("{e:#}: taken for a NIC, which segments what the programs send");
        None
    })
}

/// Says so when transmit checksumming (and with it TSO) is off on the `veth` the underlay is or
/// sits on, as an older twill's veth rule left it, and the setting outlives the node: every
/// packet this node sends over it is then segmented in software, several times slower. It may
/// be the operator's choice, so it is said, not undone.
fn warn_of_software_checksums(veth: &str) {
    if twill_ebpf::checksums_in_software(veth).unwrap_or(false) {
        tracing::warn!(
            "transmit checksumming is off on the veth {veth} (an older twill turned it off, or \
             its operator): every packet sent over it is segmented in software, several times \
             slower; `ethtool -K {veth} tx on` gives TSO back"
        );
    }
}

/// The field of an eBPF node's udp lease (BackendData, which flanneld's udp backend neither
/// writes nor reads) that says the node takes TCP super-packets whole over a veth underlay:
/// peers send it those without the segmenter (docs/decisions.md, "A veth underlay is not a
/// wire").
const SUPER_PACKETS: &str = "SuperPackets";

/// What the node of `lease` takes from a veth underlay.
fn takes(lease: &Lease) -> Takes {
    let data = lease.backend_data.as_ref();
    match data.and_then(|d| d.get(SUPER_PACKETS)) {
        Some(serde_json::Value::Bool(true)) => Takes::SuperPackets,
        _ => Takes::Datagrams,
    }
}

impl Setup for EbpfSetup {
    type Backend = Ebpf;

    fn lease_attrs(&self, public_addrs: PublicAddrs) -> LeaseAttrs {
        let attrs = LeaseAttrs {
            backend_data: Some(serde_json::json!({ SUPER_PACKETS: true }).into()),
            ..LeaseAttrs::udp(public_addrs)
        };
        with_ipv6_side(attrs, self.site.ipv6)
    }

    /// Makes (or adopts) the device, loads (or adopts) the programs, then routes the network
    /// to the device. A step that fails takes back what the steps before it made.
    async fn attach(mut self, lease: &Lease) -> anyhow::Result<Ebpf> {
        let port = ClaimedPort::claim(&self.site.attachment)?;
        let nl = Netlink::connect().context("opening rtnetlink")?;
        let (subnet, _) = lease.ipv4_side()?;
        let address = Ipv4Net::new(subnet.network(), 32)?;
        let subnet6 = lease.subnets.v6().filter(|_| self.site.ipv6.is_some());
        let address6 = subnet6
            .map(|s| Ipv6Net::new(s.network(), 128))
            .transpose()?;
        let name = self.site.attachment.device.clone();
        self.site.attachment.device_ip = Some(address.addr());
        self.site.attachment.device_ip6 = address6.map(|a| a.addr());
        let mtu = u32::from(self.site.mtu);
        let made = device::ensure(&nl, &name, mtu, address, address6).await?;
        let opened = twill_ebpf::Dataplane::open(&self.site.pin_dir, &self.site.attachment)
            .with_context(|| format!("loading the eBPF dataplane on {name}"));
        let (dataplane, opened) = match opened {
            Ok(opened) => opened,
            Err(e) => return Err(undo(&nl, made, None, e).await),
        };
        let replaced = match self.site.route(&nl, made.link.index).await {
            Ok(replaced) => replaced,
            Err(e) => {
                let fresh = (opened == Opened::Fresh).then_some(dataplane);
                return Err(undo(&nl, made, fresh, e).await);
            }
        };
        match dataplane.ingress() {
            Ingress::Xdp => tracing::info!(
                underlay = %self.site.attachment.underlay,
                "eBPF dataplane decapsulates at XDP, before GRO"
            ),
            Ingress::Tc { why } if self.site.attachment.xdp == XdpChoice::On => tracing::warn!(
                underlay = %self.site.attachment.underlay,
                "eBPF dataplane decapsulates at TC, after GRO (slower for TCP): {why}"
            ),
            Ingress::Tc { why } => tracing::info!(
                underlay = %self.site.attachment.underlay,
                "eBPF dataplane decapsulates at TC: {why}"
            ),
        }
        let left_out = dataplane.left_out();
        if !left_out.is_empty() {
            tracing::warn!(
                "eBPF dataplane runs without what this kernel lacks or refused: {}",
                left_out.join("; ")
            );
        }
        match opened {
            Opened::Fresh => tracing::info!(
                device = %name,
                attach = dataplane.hook().name(),
                "eBPF dataplane loaded"
            ),
            Opened::Adopted { peers } => tracing::info!(
                device = %name,
                attach = dataplane.hook().name(),
                peers,
                "eBPF dataplane adopted from {}: traffic kept flowing",
                self.site.pin_dir.display()
            ),
        }
        let unproven = Unproven {
            device: made.created.then_some(name),
            pins: opened == Opened::Fresh,
            replaced,
        };
        Ok(Ebpf::new(
            self,
            dataplane,
            unproven,
            (address, address6),
            port,
        ))
    }
}

impl Site {
    /// The network (and the IPv6Network) routed to the device; the routes it replaced, where
    /// they led elsewhere (another node's device on this host, whose traffic a start that fails
    /// must give back).
    async fn route(&self, nl: &Netlink, index: u32) -> anyhow::Result<Vec<Route>> {
        let networks = std::iter::once(IpNet::V4(self.network))
            .chain(self.ipv6.map(|(network6, _)| IpNet::V6(network6)));
        let routes = nl.boot_routes().await.context("listing routes")?;
        let mut replaced = Vec::new();
        for network in networks {
            let before = routes.iter().find(|r| r.dst == network && r.oif != index);
            replaced.extend(before.cloned());
            host::route_network_via(nl, network, index, &self.attachment.device).await?;
        }
        Ok(replaced)
    }
}

/// A peer as the maps hold it: where it is, its IPv6 subnet, what its node takes.
type Wanted = (SocketAddr, Option<Ipv6Net>, Takes);

/// The eBPF dataplane following the leases: each peer is an entry in its maps. Dropping it
/// leaves the programs running, by design (see the module's comment), once it has reconciled.
pub struct Ebpf {
    dataplane: Arc<twill_ebpf::Dataplane>,
    site: Site,
    /// The device's addresses, the lease's network addresses (the IPv6 one on a dual-stack
    /// network).
    address: Ipv4Net,
    address6: Option<Ipv6Net>,
    /// What this start made and no reconcile has proven yet.
    unproven: Unproven,
    /// The claim on the device, held for as long as the node runs.
    _owner: Owner,
    /// The peers as status shows them, with counters copied in from the maps.
    table: Arc<SharedTable>,
    stats: Arc<EngineStats>,
    mtu: u32,
    /// flannel's udp leases carry no port: every peer listens on the network's.
    port: u16,
    /// Map updates since start, for status: an idle reconcile makes none.
    writes: u64,
    /// flannel's udp port, claimed, and what reaches it counted ([`ClaimedPort`]).
    claimed: ClaimedPort,
}

impl Ebpf {
    fn new(
        setup: EbpfSetup,
        dataplane: twill_ebpf::Dataplane,
        unproven: Unproven,
        (address, address6): (Ipv4Net, Option<Ipv6Net>),
        claimed: ClaimedPort,
    ) -> Ebpf {
        let EbpfSetup { site, owner } = setup;
        Ebpf {
            dataplane: Arc::new(dataplane),
            mtu: u32::from(site.mtu),
            port: site.attachment.port,
            site,
            address,
            address6,
            unproven,
            _owner: owner,
            table: Arc::default(),
            stats: Arc::default(),
            writes: 0,
            claimed,
        }
    }

    fn set(&mut self, subnet: Ipv4Net, peer: Wanted) -> anyhow::Result<()> {
        self.writes += 1;
        let (endpoint, subnet6, takes) = peer;
        self.dataplane.set_peer(subnet, subnet6, endpoint, takes)
    }

    fn unset(&mut self, subnet: Ipv4Net) -> anyhow::Result<()> {
        self.writes += 1;
        self.dataplane.remove_peer(subnet)
    }

    /// Where the programs send to the lease's node: its PublicIP, or its PublicIPv6 over the
    /// IPv6 underlay (a lease without one is refused by the lease gate before this).
    fn endpoint(&self, lease: &Lease, public_ip: Ipv4Addr) -> anyhow::Result<SocketAddr> {
        if self.site.attachment.local_ip6.is_none() {
            return Ok(SocketAddrV4::new(public_ip, self.port).into());
        }
        let public_ipv6 = lease.public_addrs.v6().with_context(|| {
            format!(
                "the lease of {} has no PublicIPv6 for the IPv6 underlay",
                lease.id()
            )
        })?;
        Ok(SocketAddr::new(public_ipv6.into(), self.port))
    }

    /// The lease's IPv6 subnet, on a dual-stack network.
    fn subnet6(&self, lease: &Lease) -> Option<Ipv6Net> {
        lease.subnets.v6().filter(|_| self.site.ipv6.is_some())
    }

    fn spec(&self, lease: &Lease) -> anyhow::Result<PeerSpec> {
        let (subnet, public_ip) = lease.ipv4_side()?;
        Ok(PeerSpec {
            subnet,
            endpoint: self.endpoint(lease, public_ip)?,
            version: 1,
            subnet6: self.subnet6(lease),
        })
    }

    /// Puts back what someone took away while the node ran: the device (deleted, or a
    /// `--cleanup --force`), its route, and the programs with their pins. What the device
    /// guard reports as gone is repaired here, at the reconcile it promises.
    async fn repair(&mut self) -> anyhow::Result<()> {
        if self.dataplane.intact()? {
            return Ok(());
        }
        let name = self.site.attachment.device.clone();
        let opened = self.put_back(&name).await.with_context(|| {
            format!(
                "the eBPF dataplane on {name} was taken away under twill, and cannot be put back"
            )
        })?;
        tracing::warn!(device = %name, ?opened, "the eBPF dataplane on {name} was taken away under twill; put it back");
        Ok(())
    }

    async fn put_back(&self, name: &str) -> anyhow::Result<twill_ebpf::Opened> {
        let nl = Netlink::connect().context("opening rtnetlink")?;
        let made = device::ensure(&nl, name, self.mtu, self.address, self.address6).await?;
        let opened = self.dataplane.reopen()?;
        self.site.route(&nl, made.link.index).await?;
        Ok(opened)
    }
}

impl Drop for Ebpf {
    /// A start that fails before the first reconcile takes back what it made, so that a dead
    /// device does not keep the network's route (nor programs the underlay's udp port).
    fn drop(&mut self) {
        std::mem::take(&mut self.unproven).take_back(&self.site.pin_dir);
    }
}

impl Backend for Ebpf {
    fn mtu(&self) -> u32 {
        self.mtu
    }

    /// The programs cannot answer a packet too big for the underlay once it is encapsulated
    /// (a TCP super-packet cannot be cut into an answer), so the device's MTU follows the
    /// underlay's down, and the kernel answers before the device.
    fn encapsulation_overhead(&self) -> Option<u32> {
        Some(self.site.overhead)
    }

    fn kernel_writes(&self) -> u64 {
        self.writes
    }

    fn engine_view(&self) -> Option<EngineView> {
        let strays = self.claimed.strays();
        Some(counters::view(
            &self.dataplane,
            &self.table,
            &self.stats,
            strays,
        ))
    }

    async fn add_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        let spec = self.spec(lease)?;
        self.table
            .set_peer(spec)
            .with_context(|| format!("peer {} left out", lease.id()))?;
        self.set(spec.subnet, (spec.endpoint, spec.subnet6, takes(lease)))
    }

    async fn remove_peer(&mut self, lease: &Lease) -> anyhow::Result<()> {
        let (subnet, _) = lease.ipv4_side()?;
        self.table.remove_peer(subnet);
        self.unset(subnet)
    }

    /// The maps end up holding exactly the leases' peers: a restart's adopted maps, or a change
    /// made behind twill's back, are brought in line with one update per difference. The
    /// device and programs are put back first if someone took them away.
    async fn reconcile<L: Borrow<Lease>>(&mut self, leases: &[L]) -> anyhow::Result<()> {
        self.unproven = Unproven::default();
        self.repair().await?;
        // One pass: each lease's peer, and what its node takes (the table keeps no such field).
        let (specs, lease_takes): (Vec<PeerSpec>, BTreeMap<Ipv4Net, Takes>) = each(leases)
            .filter_map(|l| Some((self.spec(l).ok()?, takes(l))))
            .map(|(spec, takes)| (spec, (spec.subnet, takes)))
            .unzip();
        self.table.set_peers(&specs);
        let wanted: BTreeMap<Ipv4Net, Wanted> = self
            .table
            .load()
            .peers()
            .iter()
            .map(|p| {
                let takes = lease_takes.get(&p.spec.subnet).copied();
                let takes = takes.unwrap_or(Takes::Datagrams);
                (p.spec.subnet, (p.spec.endpoint, p.spec.subnet6, takes))
            })
            .collect();
        let subnets6 = self.dataplane.peer_subnets6();
        let peers_take = self.dataplane.peers_take();
        let present: BTreeMap<Ipv4Net, Wanted> = self
            .dataplane
            .peers()?
            .into_iter()
            .map(|(subnet, endpoint)| {
                let subnet6 = subnets6.get(&subnet).copied();
                let takes = peers_take.get(&subnet).copied();
                (
                    subnet,
                    (endpoint, subnet6, takes.unwrap_or(Takes::Datagrams)),
                )
            })
            .collect();
        for subnet in present.keys().filter(|s| !wanted.contains_key(s)) {
            self.unset(*subnet)?;
        }
        for (subnet, peer) in &wanted {
            if present.get(subnet) != Some(peer) {
                self.set(*subnet, *peer)?;
            }
        }
        Ok(())
    }
}

/// `twill run --cleanup`: removes what the eBPF dataplane leaves behind on purpose (the
/// programs, links and maps pinned under `bpf_dir`, and the device `device` with its route).
/// Nothing there is fine; what was removed is logged. Refused while a running twill owns them.
pub async fn cleanup(bpf_dir: &Path, device: &str) -> anyhow::Result<()> {
    remove(bpf_dir, device, false).await
}

/// `twill run --cleanup --force`: [`cleanup`], even while a running twill owns them (which
/// puts them back at its next reconcile).
pub async fn cleanup_anyway(bpf_dir: &Path, device: &str) -> anyhow::Result<()> {
    remove(bpf_dir, device, true).await
}

async fn remove(bpf_dir: &Path, device: &str, force: bool) -> anyhow::Result<()> {
    let _owner = match Owner::claim(device)? {
        Ok(owner) => Some(owner),
        Err(held) if force => {
            tracing::warn!("removing the eBPF dataplane on {device} of {held}, as --force says");
            None
        }
        Err(held) => {
            return Err(anyhow!(
                "the eBPF dataplane on device {device} belongs to {held}: stop it first, give \
                 this node another --tun-name, or remove it anyway with --cleanup --force"
            ))
        }
    };
    let pins = pin_dir(bpf_dir, device);
    let removed = match force {
        true => twill_ebpf::remove_anyway(&pins),
        false => twill_ebpf::remove(&pins),
    };
    removed.with_context(|| format!("removing {}", pins.display()))?;
    let nl = Netlink::connect().context("opening rtnetlink")?;
    if device::remove(&nl, device).await? {
        tracing::info!("removed the eBPF dataplane's device {device} and its route");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn lease_with(data: Option<serde_json::Value>) -> Lease {
        let attrs = LeaseAttrs {
            backend_data: data.map(Into::into),
            ..LeaseAttrs::udp(Ipv4Addr::new(10, 200, 0, 2))
        };
        Lease::new("10.5.2.0/24".parse::<Ipv4Net>().unwrap(), attrs)
    }

    /// Only a lease that says `"SuperPackets": true` is sent super-packets; anything else
    /// another client may have written there (a string, a number, null, another field, no
    /// data: flanneld's) gets datagrams, which every node reads.
    #[test]
    fn only_super_packets_true_is_sent_super_packets() {
        use serde_json::json;
        assert_eq!(
            takes(&lease_with(Some(json!({"SuperPackets": true})))),
            Takes::SuperPackets
        );
        for data in [
            Some(json!({"SuperPackets": "true"})),
            Some(json!({"SuperPackets": 1})),
            Some(json!({"SuperPackets": false})),
            Some(json!({"SuperPackets": null})),
            Some(json!({"superpackets": true})),
            Some(json!([true])),
            None,
        ] {
            assert_eq!(
                takes(&lease_with(data.clone())),
                Takes::Datagrams,
                "{data:?}"
            );
        }
    }
}
