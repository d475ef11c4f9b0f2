//! One module per backend behind one trait, as flannel does.
//!
//! The daemon turns lease events into calls on a [`Backend`]; it does not care which one.

pub mod ebpf;
pub mod userspace;
pub mod wireguard;

mod checklist;
pub mod guard;
pub mod host_gw;
pub mod ipip;
pub mod kernel;
mod peer_state;
pub mod sweep;
mod tunnel;
pub mod upkeep;
pub mod vxlan;

use crate::lease::{Lease, LeaseAttrs, PublicAddrs};
use crate::status::EngineView;
use std::borrow::Borrow;
use twill_dataplane::engine::Engine;

/// What every backend does with the leases of the other nodes.
///
/// Implementations must be idempotent: `reconcile` may run at start, periodically, and after a
/// crash, and must leave exactly the state for `leases` (adding what is missing and removing
/// what belongs to peers that no longer hold a lease).
#[allow(async_fn_in_trait)]
pub trait Backend {
    /// MTU for containers (FLANNEL_MTU): the TUN's or tunnel device's, or the iface's for host-gw.
    fn mtu(&self) -> u32;
    /// For a device whose MTU must stay within the underlay's, what encapsulation adds: the
    /// device guard lowers its MTU when the underlay's shrinks under a running node (and
    /// raises it back, up to [`Backend::mtu`]). None: the backend answers a packet too big
    /// for the underlay itself (the userspace engines learn the path MTU), or the kernel's
    /// tunnel device does.
    fn encapsulation_overhead(&self) -> Option<u32> {
        None
    }
    /// The userspace dataplane this backend drives, for status and metrics; the kernel
    /// backends have none.
    fn engine(&self) -> Option<&Engine> {
        None
    }
    /// What status shows of the dataplane: the userspace engine's table and counters by
    /// default, the eBPF dataplane's maps for that one.
    fn engine_view(&self) -> Option<EngineView> {
        self.engine().map(|engine| EngineView {
            name: "tun",
            attach: None,
            ingress: None,
            left_out: Vec::new(),
            table: engine.table().clone(),
            stats: engine.stats().clone(),
            refresh: None,
        })
    }
    /// Requests that changed kernel state since start (the userspace backends make none once
    /// their TUN is up).
    fn kernel_writes(&self) -> u64 {
        0
    }
    async fn add_peer(&mut self, lease: &Lease) -> anyhow::Result<()>;
    async fn remove_peer(&mut self, lease: &Lease) -> anyhow::Result<()>;
    /// `leases` are the gate's own (`Arc<Lease>`, shared rather than copied: there may be
    /// tens of thousands) or, in tests, plain ones.
    async fn reconcile<L: Borrow<Lease>>(&mut self, leases: &[L]) -> anyhow::Result<()>;
}

/// The leases a reconcile was given, as leases.
pub(crate) fn each<L: Borrow<Lease>>(
    leases: &[L],
) -> impl ExactSizeIterator<Item = &Lease> + Clone {
    leases.iter().map(Borrow::borrow)
}

/// A backend before this node holds a lease. Whatever must exist first is made before the
/// `Setup` exists (vxlan's device, whose MAC goes into the lease; ipip's, so a kernel without
/// ipip fails before a subnet is claimed); `attach` finishes once the lease is known.
#[allow(async_fn_in_trait)]
pub trait Setup {
    type Backend: Backend;
    /// What this node publishes in its lease.
    fn lease_attrs(&self, public_addrs: PublicAddrs) -> LeaseAttrs;
    async fn attach(self, lease: &Lease) -> anyhow::Result<Self::Backend>;
}
