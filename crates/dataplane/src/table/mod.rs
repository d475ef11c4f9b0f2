//! Destination subnet -> peer, changed one peer at a time as leases come and go.
//!
//! Engines load the current table once per batch (`arc-swap`, no lock) and never wait on the
//! control plane. The control plane clones the current table, changes the clone and swaps it
//! in. The table is built from persistent (structure-sharing) collections: the clone is O(1)
//! and a change copies only the O(log K) nodes it touches, so a lease event costs the same at
//! 60,000 peers as at 10, where rebuilding the table cost O(K).

mod lpm;

use crate::io::udp::sender;
use crate::stats::PeerStats;
use arc_swap::{ArcSwap, Guard};
use imbl::Vector;
use ipnet::{Ipv4Net, Ipv6Net};
use lpm::{Lpm, Lpm6, Map};
use std::collections::HashSet;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// Another node: the subnets it owns and the underlay address it sends from and listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerSpec {
    /// The IPv4 subnet: a peer's identity in the table, as a lease's key.
    pub subnet: Ipv4Net,
    /// The IPv6 subnet of a dual-stack lease. A peer without one (a flanneld udp node, an
    /// IPv4-only network) is sent no IPv6 and has every IPv6 packet it sends dropped.
    pub subnet6: Option<Ipv6Net>,
    /// The underlay address, IPv4 or IPv6 as the network's underlay is; compared as the
    /// receive path sees senders (see [`crate::io::udp::sender`]).
    pub endpoint: SocketAddr,
    /// The highest batch protocol version the peer reads (its lease's `Version`; 1 if absent).
    /// Only the batch engine looks at it.
    pub version: u8,
}

#[derive(Debug, Clone)]
pub struct Peer {
    pub spec: PeerSpec,
    pub stats: Arc<PeerStats>,
}

/// The peers, indexed `0..len()` without gaps (engines group a batch's packets by index).
pub type Peers = Vector<Peer>;

/// Why a peer was not put in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// Datagrams from one endpoint must belong to one peer: the anti-spoofing check keys on it.
    #[error("its endpoint {0} belongs to the peer of {1}")]
    Endpoint(SocketAddr, Ipv4Net),
    /// An IPv6 subnet routes to one peer (the lease gate keeps subnets apart; this keeps the
    /// table consistent whatever it is given).
    #[error("its IPv6 subnet {0} belongs to the peer of {1}")]
    Subnet6(Ipv6Net, Ipv4Net),
}

/// An immutable routing table: longest-prefix match on destination, per address family, and
/// exact match on endpoint.
#[derive(Debug, Clone, Default)]
pub struct PeerTable {
    peers: Peers,
    v4: Lpm<u32>,
    v6: Lpm6,
    by_endpoint: Map<SocketAddr>,
}

impl PeerSpec {
    /// The same peer with its subnets' host bits cleared, and its endpoint as received
    /// datagrams name their sender.
    fn trunc(self) -> PeerSpec {
        PeerSpec {
            subnet: self.subnet.trunc(),
            subnet6: self.subnet6.map(|s| s.trunc()),
            endpoint: sender(self.endpoint),
            ..self
        }
    }
}

impl PeerTable {
    /// Build a table with fresh counters. Of two peers claiming one subnet or one endpoint, the
    /// first wins.
    pub fn new(specs: &[PeerSpec]) -> PeerTable {
        let mut table = PeerTable::default();
        for spec in specs.iter().map(|s| s.trunc()) {
            if table.owner(spec.subnet).is_none() {
                let _ = table.insert_with(spec, Arc::default());
            }
        }
        table
    }

    /// Adds the peer, or updates the one of its subnet; it keeps its counters when nothing
    /// about it changed. O(log K), and on a table shared with readers only the O(log K) nodes
    /// on the way are copied.
    pub fn insert(&mut self, spec: PeerSpec) -> Result<(), Conflict> {
        let spec = spec.trunc();
        let stats = self.stats_of(&spec);
        self.insert_with(spec, stats)
    }

    fn insert_with(&mut self, spec: PeerSpec, stats: Arc<PeerStats>) -> Result<(), Conflict> {
        let index = self.owner(spec.subnet);
        if let Some(&holder) = self.by_endpoint.get(&spec.endpoint) {
            if Some(holder) != index {
                let holder = self.peers[holder].spec.subnet;
                return Err(Conflict::Endpoint(spec.endpoint, holder));
            }
        }
        if let Some(subnet6) = spec.subnet6 {
            let holder = self.v6.exact(v6_key(subnet6), subnet6.prefix_len());
            if let Some(holder) = holder.filter(|&h| Some(h) != index) {
                return Err(Conflict::Subnet6(subnet6, self.peers[holder].spec.subnet));
            }
        }
        match index {
            Some(index) => {
                self.unlink(index);
                self.link(&spec, index);
                self.peers.set(index, Peer { spec, stats });
            }
            None => {
                let index = self.peers.len();
                self.link(&spec, index);
                self.peers.push_back(Peer { spec, stats });
            }
        }
        Ok(())
    }

    /// Removes the peer of `subnet`; whether there was one. The last peer takes the removed
    /// one's index, so indices stay `0..len()`. O(log K).
    pub fn remove(&mut self, subnet: Ipv4Net) -> bool {
        let Some(index) = self.owner(subnet.trunc()) else {
            return false;
        };
        self.unlink(index);
        let last = self.peers.len() - 1;
        if index != last {
            let moved = self.unlink(last);
            self.link(&moved.spec, index);
            self.peers.set(index, moved);
        }
        self.peers.pop_back();
        true
    }

    /// The counters of a peer with exactly this spec in this table, or new ones.
    fn stats_of(&self, spec: &PeerSpec) -> Arc<PeerStats> {
        let same = self.get(spec.subnet).filter(|p| p.spec == *spec);
        same.map_or_else(Default::default, |p| p.stats.clone())
    }

    /// Points the subnets and endpoint of `spec` at `index`.
    fn link(&mut self, spec: &PeerSpec, index: usize) {
        self.by_endpoint.insert(spec.endpoint, index);
        self.v4
            .insert(v4_key(spec.subnet), spec.subnet.prefix_len(), index);
        if let Some(subnet6) = spec.subnet6 {
            self.v6.insert(v6_key(subnet6), subnet6.prefix_len(), index);
        }
    }

    /// Forgets the subnets and endpoint of the peer at `index`, and returns it.
    fn unlink(&mut self, index: usize) -> Peer {
        let peer = self.peers[index].clone();
        let spec = &peer.spec;
        self.by_endpoint.remove(&spec.endpoint);
        self.v4
            .remove(v4_key(spec.subnet), spec.subnet.prefix_len());
        if let Some(subnet6) = spec.subnet6 {
            self.v6.remove(v6_key(subnet6), subnet6.prefix_len());
        }
        peer
    }

    /// The index of the peer that owns exactly `subnet`.
    fn owner(&self, subnet: Ipv4Net) -> Option<usize> {
        self.v4.exact(v4_key(subnet), subnet.prefix_len())
    }

    /// The peer that owns exactly `subnet`.
    pub fn get(&self, subnet: Ipv4Net) -> Option<&Peer> {
        self.owner(subnet).map(|i| &self.peers[i])
    }

    /// The peer whose subnet holds `dst`, longest prefix first.
    pub fn lookup(&self, dst: Ipv4Addr) -> Option<&Peer> {
        self.route(dst).map(|i| &self.peers[i])
    }

    /// Like [`PeerTable::lookup`], but the peer's index, for engines that group by peer.
    #[inline]
    pub fn route(&self, dst: Ipv4Addr) -> Option<usize> {
        self.v4.lookup(u32::from(dst))
    }

    /// The index of the peer whose IPv6 subnet holds `dst`, longest prefix first.
    #[inline]
    pub fn route6(&self, dst: Ipv6Addr) -> Option<usize> {
        self.v6.lookup(u128::from(dst))
    }

    /// The peer that sends from `endpoint`, if any: the first anti-spoofing check.
    #[inline]
    pub fn by_endpoint(&self, endpoint: SocketAddr) -> Option<&Peer> {
        self.by_endpoint.get(&endpoint).map(|&i| &self.peers[i])
    }

    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }
}

fn v4_key(subnet: Ipv4Net) -> u32 {
    u32::from(subnet.network())
}

fn v6_key(subnet: Ipv6Net) -> u128 {
    u128::from(subnet.network())
}

/// The shared, swappable table an engine reads and the control plane writes.
#[derive(Debug, Default)]
pub struct SharedTable(ArcSwap<PeerTable>);

impl SharedTable {
    pub fn load(&self) -> Guard<Arc<PeerTable>> {
        self.0.load()
    }

    /// Makes the table hold exactly `specs`, changing only what differs: peers that stay keep
    /// their counters, and an idle reconcile leaves the table as it is. Of two specs claiming
    /// one subnet the first wins; a spec whose endpoint another peer holds is left out. O(K).
    pub fn set_peers(&self, specs: &[PeerSpec]) {
        let current = self.0.load_full();
        let mut next = PeerTable::clone(&current);
        let wanted: HashSet<Ipv4Net> = specs.iter().map(|s| s.subnet.trunc()).collect();
        let stale = current.peers.iter().map(|p| p.spec.subnet);
        let mut changed = false;
        for subnet in stale.filter(|s| !wanted.contains(s)) {
            changed |= next.remove(subnet);
        }
        let mut placed = HashSet::with_capacity(specs.len());
        for spec in specs.iter().map(|s| s.trunc()) {
            let first = placed.insert(spec.subnet);
            if first && next.get(spec.subnet).map(|p| p.spec) != Some(spec) {
                changed |= next.insert(spec).is_ok();
            }
        }
        if changed {
            self.0.store(Arc::new(next));
        }
    }

    /// Adds or updates one peer. O(log K): for lease events.
    pub fn set_peer(&self, spec: PeerSpec) -> Result<(), Conflict> {
        let mut next = PeerTable::clone(&self.0.load());
        next.insert(spec)?;
        self.0.store(Arc::new(next));
        Ok(())
    }

    /// Removes the peer of `subnet`, if there is one. O(log K).
    pub fn remove_peer(&self, subnet: Ipv4Net) {
        let mut next = PeerTable::clone(&self.0.load());
        if next.remove(subnet) {
            self.0.store(Arc::new(next));
        }
    }
}

#[cfg(test)]
mod tests;
