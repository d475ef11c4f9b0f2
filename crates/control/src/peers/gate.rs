//! Where the accepted peers live: the node owns its [`Gate`], through which every lease event
//! from the registry passes on its one way to the backend, and hands status a [`PeersView`],
//! which reads the same peers and cannot change them.

use super::{Admitted, Peers};
use crate::lease::{Lease, LeaseEvent};
use std::sync::{Arc, RwLock, RwLockReadGuard};

/// The node's peers, which only the node changes. The lock is for status's readers: the node
/// is the one writer.
pub struct Gate(Arc<RwLock<Peers>>);

/// Status's read-only handle on the node's peers.
#[derive(Clone)]
pub struct PeersView(Arc<RwLock<Peers>>);

impl Gate {
    pub fn new(peers: Peers) -> Gate {
        Gate(Arc::new(RwLock::new(peers)))
    }

    /// Passes a registry event through the lease checks ([`Peers::admit`]); what comes out is
    /// what the backend must do.
    pub fn admit(&mut self, event: LeaseEvent) -> Option<Admitted> {
        self.0.write().unwrap().admit(event)
    }

    /// The peer leases the backend was given, for a reconcile: the gate's own, shared, not
    /// copies (at 60,000 leases a copy is about 7 MB).
    pub fn accepted_leases(&self) -> Vec<Arc<Lease>> {
        self.0.read().unwrap().accepted.values().cloned().collect()
    }

    pub fn view(&self) -> PeersView {
        PeersView(self.0.clone())
    }
}

impl PeersView {
    pub fn read(&self) -> RwLockReadGuard<'_, Peers> {
        self.0.read().unwrap()
    }
}
