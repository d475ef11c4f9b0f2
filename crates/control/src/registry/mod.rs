//! Where leases live: etcd in flannel's schema, or a fixed list given on the command line.
//!
//! The daemon drives either through [`Registry`]: read the network [`Config`], then
//! [`Registry::start`] with this node's [`LeaseAttrs`] to get its own lease and a stream of
//! [`LeaseEvent`]s about the other nodes. Keeping the lease alive (renewal, re-acquisition)
//! happens behind that stream, so the daemon only reacts to events.

mod backoff;
mod etcd;
pub mod kube;
mod namer;
mod static_peers;

pub use backoff::Backoff;
pub use etcd::{EtcdOptions, EtcdRegistry, Timing, DEFAULT_ENDPOINTS, DEFAULT_PREFIX};
pub use kube::{KubeOptions, KubeRegistry};
pub use namer::{node_key, LeaseNamer};
pub use static_peers::{parse_peer, StaticRegistry};

use crate::backend::netlink::MacAddr;
use crate::config::Config;
use crate::lease::{Lease, LeaseAttrs};
use futures::future::BoxFuture;
use std::net::{Ipv4Addr, Ipv6Addr};
use tokio::sync::mpsc;

/// A change in the set of other nodes' leases, in our own, or in the network config.
///
/// Our own lease never appears in `Snapshot`, `Added` or `Removed`: backends program routes to
/// peers, never to themselves (flannel filters it the same way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// The complete set of peer leases. Sent first, and again after every re-list (etcd came
    /// back, the watch history was compacted); the consumer replaces its table with it, which is
    /// how it catches up on anything it missed.
    Snapshot(Vec<Lease>),
    /// A peer lease appeared or changed (same subnet, new attributes).
    Added(Lease),
    /// A peer lease expired or was deleted; carries its last known attributes, so a backend can
    /// remove exactly what it added (e.g. the vxlan fdb entry for its VtepMAC).
    Removed(Lease),
    /// Our lease was lost (its key deleted or expired) and acquired again, with the same subnet.
    OwnLease(Lease),
    /// Our lease is gone for good (`why`), e.g. the Node's podCIDR was changed. Like
    /// [`LeaseEvent::OwnLeaseTaken`], the node must stop rather than take another subnet.
    OwnLeaseGone(String),
    /// Another node now holds our subnet (this is its lease). No other subnet is taken in its
    /// place: the containers on this host are numbered from the old one, so the node must stop.
    OwnLeaseTaken(Lease),
    /// An entry among the leases that is not a lease (`why` says what is wrong), or, with
    /// `why: None`, that such an entry is gone or readable again.
    Unreadable { key: String, why: Option<String> },
    /// The network config in the registry changed since this node started: `Some(what)` says
    /// how it differs from the config the node runs with, `None` that it matches again.
    ConfigChanged(Option<String>),
}

/// What a registry remembers of this node (see [`Registry::remembered`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Remembered {
    /// The address peers must reach this node at, as its operator put it on the Node
    /// (`node-public-ip`): it overrides `--public-ip`, as in flanneld.
    pub public_ip: Option<Ipv4Addr>,
    /// The same for IPv6 (`node-public-ipv6`).
    pub public_ipv6: Option<Ipv6Addr>,
    /// The VtepMAC this node published before (its own `backend-data`): a vxlan device made
    /// again takes it, so the peers' fdb and neighbour entries stay right across a restart.
    pub vtep_mac: Option<MacAddr>,
    /// The same for `flannel-v6.<VNI>` (`backend-v6-data`).
    pub vtep_mac_v6: Option<MacAddr>,
}

/// A source of leases for one flannel network.
#[allow(async_fn_in_trait)]
pub trait Registry {
    /// The network config every node of the network shares.
    fn config(&self) -> &Config;

    /// Which registry this is, for `twill status` and the log (e.g. "etcd http://…").
    fn name(&self) -> String;

    /// How this registry's leases are named in logs and status.
    fn lease_namer(&self) -> LeaseNamer {
        LeaseNamer::default()
    }

    /// What the registry keeps of this node from an earlier run or from its operator, read
    /// before anything is set up: flanneld's `GetStoredPublicIP` and `GetStoredMacAddresses`
    /// (Kubernetes); nothing elsewhere.
    async fn remembered(&self) -> anyhow::Result<Remembered> {
        Ok(Remembered::default())
    }

    /// What to do once the node is ready (subnet.env written, the rules in place), such as
    /// telling Kubernetes the Node's network is available; the daemon spawns it then.
    fn on_ready(&self) -> Option<BoxFuture<'static, ()>> {
        None
    }

    /// Acquires (or reuses) this node's lease and keeps it alive in the background for as long
    /// as the returned receiver exists; dropping the receiver stops the background work but
    /// leaves the lease in place, as flanneld's clean shutdown does, so a restart keeps the
    /// subnet. The receiver first yields a [`LeaseEvent::Snapshot`].
    async fn start(self, attrs: LeaseAttrs) -> anyhow::Result<(Lease, mpsc::Receiver<LeaseEvent>)>;
}

/// Capacity of the event channel: large enough for a burst of joins, small enough that a stuck
/// consumer shows up as backpressure instead of unbounded memory.
const EVENT_QUEUE: usize = 256;
