//! What a registry tells the node about the network's leases: the events of one stream, which
//! the lease gate and the daemon read.

use super::Lease;
use std::sync::Arc;

/// A change in the set of other nodes' leases, in our own, or in the network config.
///
/// Our own lease never appears in `Snapshot`, `Added` or `Removed`: backends program routes to
/// peers, never to themselves (flannel filters it the same way).
///
/// A peer's lease travels as an `Arc`: the registry's table and the lease gate keep the very
/// same copy (at 60,000 leases a second copy is about 9 MB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// The complete set of peer leases. Sent first, and again after every re-list (etcd came
    /// back, the watch history was compacted); the consumer replaces its table with it, which is
    /// how it catches up on anything it missed.
    Snapshot(Vec<Arc<Lease>>),
    /// A peer lease appeared or changed (same subnet, new attributes).
    Added(Arc<Lease>),
    /// A peer lease expired or was deleted; carries its last known attributes, so a backend can
    /// remove exactly what it added (e.g. the vxlan fdb entry for its VtepMAC).
    Removed(Arc<Lease>),
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
