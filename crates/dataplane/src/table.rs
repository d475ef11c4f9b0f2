//! Destination subnet -> peer, changed one peer at a time as leases come and go.
//!
//! Engines load the current table once per batch (`arc-swap`, no lock) and never wait on the
//! control plane. The control plane clones the current table, changes the clone and swaps it
//! in. The table is built from persistent (structure-sharing) collections: the clone is O(1)
//! and a change copies only the O(log K) nodes it touches, so a lease event costs the same at
//! 60,000 peers as at 10, where rebuilding the table cost O(K).

use crate::stats::PeerStats;
use arc_swap::{ArcSwap, Guard};
use imbl::shared_ptr::DefaultSharedPtr;
use imbl::{GenericHashMap, Vector};
use ipnet::Ipv4Net;
use rustc_hash::FxBuildHasher;
use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

/// Another node: the subnet it owns and the underlay address it sends from and listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerSpec {
    pub subnet: Ipv4Net,
    pub endpoint: SocketAddrV4,
    /// The highest batch protocol version the peer reads (its lease's `Version`; 1 if absent).
    /// Only the batch engine looks at it.
    pub version: u8,
}

#[derive(Debug, Clone)]
pub struct Peer {
    pub spec: PeerSpec,
    pub stats: Arc<PeerStats>,
}

type Map<K> = GenericHashMap<K, usize, FxBuildHasher, DefaultSharedPtr>;

/// The peers, indexed `0..len()` without gaps (engines group a batch's packets by index).
pub type Peers = Vector<Peer>;

/// Why a peer was not put in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// Datagrams from one endpoint must belong to one peer: the anti-spoofing check keys on it.
    #[error("its endpoint {0} belongs to the peer of {1}")]
    Endpoint(SocketAddrV4, Ipv4Net),
}

/// An immutable routing table: longest-prefix match on destination, exact match on endpoint.
#[derive(Debug, Clone, Default)]
pub struct PeerTable {
    peers: Peers,
    /// One map per distinct prefix length, longest first. flannel leases all share one
    /// SubnetLen, so a lookup is normally a single map's probe.
    by_prefix: Vec<(u8, Map<u32>)>,
    by_endpoint: Map<SocketAddrV4>,
}

impl PeerSpec {
    /// The same peer with its subnet's host bits cleared.
    fn trunc(self) -> PeerSpec {
        PeerSpec {
            subnet: self.subnet.trunc(),
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
        if let Some(&holder) = self.by_endpoint.get(&spec.endpoint) {
            let holder = self.peers[holder].spec.subnet;
            if holder != spec.subnet {
                return Err(Conflict::Endpoint(spec.endpoint, holder));
            }
        }
        match self.owner(spec.subnet) {
            Some(index) => {
                self.by_endpoint.remove(&self.peers[index].spec.endpoint);
                self.by_endpoint.insert(spec.endpoint, index);
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

    /// Points the subnet and endpoint of `spec` at `index`.
    fn link(&mut self, spec: &PeerSpec, index: usize) {
        self.by_endpoint.insert(spec.endpoint, index);
        let (len, network) = (spec.subnet.prefix_len(), u32::from(spec.subnet.network()));
        match self.by_prefix.iter_mut().find(|(l, _)| *l == len) {
            Some((_, map)) => {
                map.insert(network, index);
            }
            None => {
                let mut map = Map::default();
                map.insert(network, index);
                self.by_prefix.push((len, map));
                self.by_prefix.sort_by_key(|(l, _)| std::cmp::Reverse(*l));
            }
        }
    }

    /// Forgets the subnet and endpoint of the peer at `index`, and returns it.
    fn unlink(&mut self, index: usize) -> Peer {
        let peer = self.peers[index].clone();
        self.by_endpoint.remove(&peer.spec.endpoint);
        let len = peer.spec.subnet.prefix_len();
        if let Some((_, map)) = self.by_prefix.iter_mut().find(|(l, _)| *l == len) {
            map.remove(&u32::from(peer.spec.subnet.network()));
        }
        self.by_prefix.retain(|(_, map)| !map.is_empty());
        peer
    }

    /// The index of the peer that owns exactly `subnet`.
    fn owner(&self, subnet: Ipv4Net) -> Option<usize> {
        let (_, map) = self
            .by_prefix
            .iter()
            .find(|(len, _)| *len == subnet.prefix_len())?;
        map.get(&u32::from(subnet.network())).copied()
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
    pub fn route(&self, dst: Ipv4Addr) -> Option<usize> {
        let dst = u32::from(dst);
        self.by_prefix.iter().find_map(|(len, map)| {
            let mask = u32::MAX.checked_shl(32 - u32::from(*len)).unwrap_or(0);
            map.get(&(dst & mask)).copied()
        })
    }

    /// The peer that sends from `endpoint`, if any: the first anti-spoofing check.
    pub fn by_endpoint(&self, endpoint: SocketAddrV4) -> Option<&Peer> {
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
mod tests {
    use super::*;

    fn spec(subnet: &str, ip: [u8; 4]) -> PeerSpec {
        PeerSpec {
            subnet: subnet.parse().unwrap(),
            endpoint: SocketAddrV4::new(ip.into(), 8285),
            version: 1,
        }
    }

    #[test]
    fn longest_prefix_wins() {
        let table = PeerTable::new(&[
            spec("10.5.0.0/16", [10, 200, 0, 1]),
            spec("10.5.3.0/24", [10, 200, 0, 3]),
        ]);
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            table
                .lookup(ip("10.5.3.7"))
                .unwrap()
                .spec
                .subnet
                .prefix_len(),
            24
        );
        assert_eq!(
            table
                .lookup(ip("10.5.4.7"))
                .unwrap()
                .spec
                .subnet
                .prefix_len(),
            16
        );
        assert!(table.lookup(ip("10.6.0.1")).is_none());
    }

    #[test]
    fn endpoint_lookup_requires_port() {
        let table = PeerTable::new(&[spec("10.5.3.0/24", [10, 200, 0, 3])]);
        let ep = SocketAddrV4::new(Ipv4Addr::new(10, 200, 0, 3), 8285);
        assert!(table.by_endpoint(ep).is_some());
        assert!(table
            .by_endpoint(SocketAddrV4::new(*ep.ip(), 9999))
            .is_none());
    }

    #[test]
    fn swap_keeps_counters_of_staying_peers() {
        let shared = SharedTable::default();
        let a = spec("10.5.1.0/24", [10, 200, 0, 1]);
        let b = spec("10.5.2.0/24", [10, 200, 0, 2]);
        shared.set_peers(&[a, b]);
        shared.load().peers()[0].stats.tx.add(3, 300);
        shared.load().peers()[1].stats.tx.add(1, 100);
        let b_moved = spec("10.5.2.0/24", [10, 200, 0, 9]);
        shared.set_peers(&[a, b_moved]);
        let table = shared.load();
        assert_eq!(table.peers()[0].stats.tx.packets(), 3);
        assert_eq!(table.peers()[1].stats.tx.packets(), 0);
    }

    #[test]
    fn one_peer_at_a_time_keeps_indices_dense_and_counters() {
        let shared = SharedTable::default();
        let specs: Vec<PeerSpec> = (1..=5u8)
            .map(|i| spec(&format!("10.5.{i}.0/24"), [10, 200, 0, i]))
            .collect();
        for s in &specs {
            shared.set_peer(*s).unwrap();
        }
        shared
            .load()
            .lookup("10.5.5.9".parse().unwrap())
            .unwrap()
            .stats
            .tx
            .add(7, 700);
        shared.remove_peer(specs[1].subnet);
        let table = shared.load();
        assert_eq!(table.len(), 4);
        for (i, peer) in table.peers().iter().enumerate() {
            assert_eq!(table.route(peer.spec.subnet.network()), Some(i));
            assert_eq!(
                table.by_endpoint(peer.spec.endpoint).unwrap().spec,
                peer.spec
            );
        }
        assert!(table.lookup("10.5.2.1".parse().unwrap()).is_none());
        let moved = table.lookup("10.5.5.9".parse().unwrap()).unwrap();
        assert_eq!(
            moved.stats.tx.packets(),
            7,
            "the moved peer kept its counters"
        );
        let ep = specs[0].endpoint;
        assert_eq!(
            shared.set_peer(PeerSpec {
                subnet: "10.5.9.0/24".parse().unwrap(),
                ..specs[0]
            }),
            Err(Conflict::Endpoint(ep, specs[0].subnet))
        );
        let updated = PeerSpec {
            version: 2,
            ..specs[4]
        };
        shared.set_peer(updated).unwrap();
        let table = shared.load();
        assert_eq!(table.len(), 4);
        let peer = table.lookup("10.5.5.9".parse().unwrap()).unwrap();
        assert_eq!((peer.spec.version, peer.stats.tx.packets()), (2, 0));
    }

    #[test]
    fn an_idle_reconcile_leaves_the_table_as_it_is() {
        let shared = SharedTable::default();
        let specs = [
            spec("10.5.1.0/24", [10, 200, 0, 1]),
            spec("10.5.2.0/24", [10, 200, 0, 2]),
        ];
        shared.set_peers(&specs);
        let before = Arc::clone(&shared.load());
        shared.set_peers(&specs);
        assert!(Arc::ptr_eq(&before, &shared.load()));
        shared.set_peers(&specs[1..]);
        assert_eq!(shared.load().len(), 1);
        assert_eq!(before.len(), 2);
    }

    #[test]
    fn an_older_table_is_untouched_by_changes_after_it() {
        let shared = SharedTable::default();
        shared
            .set_peer(spec("10.5.1.0/24", [10, 200, 0, 1]))
            .unwrap();
        let before = Arc::clone(&shared.load());
        shared
            .set_peer(spec("10.5.2.0/24", [10, 200, 0, 2]))
            .unwrap();
        shared.remove_peer("10.5.1.0/24".parse().unwrap());
        assert_eq!(before.len(), 1);
        assert!(before.lookup("10.5.1.1".parse().unwrap()).is_some());
        assert_eq!(shared.load().len(), 1);
    }

    #[test]
    fn duplicate_claims_keep_the_first() {
        let table = PeerTable::new(&[
            spec("10.5.1.0/24", [10, 200, 0, 1]),
            spec("10.5.1.0/24", [10, 200, 0, 2]),
            spec("10.5.2.0/24", [10, 200, 0, 1]),
        ]);
        assert_eq!(table.len(), 1);
    }
}
