//! Destination subnet -> peer, changed one peer at a time as leases come and go.
//!
//! Engines load the current table once per batch (`arc-swap`, no lock) and never wait on the
//! control plane. The control plane clones the current table, changes the clone and swaps it
//! in. The table is built from persistent (structure-sharing) collections: the clone is O(1)
//! and a change copies only the O(log K) nodes it touches, so a lease event costs the same at
//! 60,000 peers as at 10, where rebuilding the table cost O(K).

mod lpm;

use crate::stats::PeerStats;
use arc_swap::{ArcSwap, Guard};
use imbl::Vector;
use ipnet::{Ipv4Net, Ipv6Net};
use lpm::{Lpm, Lpm6, Map};
use std::collections::HashSet;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4};
use std::sync::Arc;

/// Another node: the subnets it owns and the underlay address it sends from and listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerSpec {
    /// The IPv4 subnet: a peer's identity in the table, as a lease's key.
    pub subnet: Ipv4Net,
    /// The IPv6 subnet of a dual-stack lease. A peer without one (a flanneld udp node, an
    /// IPv4-only network) is sent no IPv6 and has every IPv6 packet it sends dropped.
    pub subnet6: Option<Ipv6Net>,
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

/// The peers, indexed `0..len()` without gaps (engines group a batch's packets by index).
pub type Peers = Vector<Peer>;

/// Why a peer was not put in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// Datagrams from one endpoint must belong to one peer: the anti-spoofing check keys on it.
    #[error("its endpoint {0} belongs to the peer of {1}")]
    Endpoint(SocketAddrV4, Ipv4Net),
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
    by_endpoint: Map<SocketAddrV4>,
}

impl PeerSpec {
    /// The same peer with its subnets' host bits cleared.
    fn trunc(self) -> PeerSpec {
        PeerSpec {
            subnet: self.subnet.trunc(),
            subnet6: self.subnet6.map(|s| s.trunc()),
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
mod tests {
    use super::*;

    fn spec(subnet: &str, ip: [u8; 4]) -> PeerSpec {
        PeerSpec {
            subnet: subnet.parse().unwrap(),
            subnet6: None,
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

    /// A dual-stack peer: `fd10:0:0:<third>::/64` beside `10.5.<third>.0/24`.
    fn dual(third: u8) -> PeerSpec {
        PeerSpec {
            subnet6: Some(format!("fd10:0:0:{third:x}::/64").parse().unwrap()),
            ..spec(&format!("10.5.{third}.0/24"), [10, 200, 0, third])
        }
    }

    fn ip6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv6_routes_by_its_own_prefix_and_a_peer_without_one_gets_none() {
        let v4_only = spec("10.5.3.0/24", [10, 200, 0, 3]);
        let table = PeerTable::new(&[dual(1), dual(2), v4_only]);
        assert_eq!(table.route6(ip6("fd10:0:0:2::7")), Some(1));
        assert_eq!(table.route6(ip6("fd10:0:0:1:ffff::1")), Some(0));
        assert_eq!(table.route6(ip6("fd10:0:0:3::1")), None);
        assert_eq!(table.route6(ip6("fd11::1")), None);
        assert_eq!(table.route("10.5.3.1".parse().unwrap()), Some(2));
    }

    #[test]
    fn an_ipv6_subnet_moves_with_updates_and_removals() {
        let shared = SharedTable::default();
        for third in 1..=3 {
            shared.set_peer(dual(third)).unwrap();
        }
        shared.remove_peer(dual(1).subnet);
        let table = shared.load();
        assert_eq!(table.route6(ip6("fd10:0:0:1::1")), None);
        for (i, peer) in table.peers().iter().enumerate() {
            let subnet6 = peer.spec.subnet6.unwrap();
            assert_eq!(table.route6(subnet6.network()), Some(i), "{subnet6}");
        }
        let renumbered = PeerSpec {
            subnet6: Some("fd10:0:0:9::/64".parse().unwrap()),
            ..dual(2)
        };
        shared.set_peer(renumbered).unwrap();
        let table = shared.load();
        assert_eq!(
            table.route6(ip6("fd10:0:0:2::1")),
            None,
            "the old one is gone"
        );
        assert!(table.route6(ip6("fd10:0:0:9::1")).is_some());
        shared
            .set_peer(PeerSpec {
                subnet6: None,
                ..dual(2)
            })
            .unwrap();
        assert_eq!(shared.load().route6(ip6("fd10:0:0:9::1")), None);
    }

    #[test]
    fn an_ipv6_subnet_another_peer_holds_is_a_conflict() {
        let shared = SharedTable::default();
        shared.set_peer(dual(1)).unwrap();
        let claim = PeerSpec {
            subnet6: dual(1).subnet6,
            ..dual(2)
        };
        assert_eq!(
            shared.set_peer(claim),
            Err(Conflict::Subnet6(dual(1).subnet6.unwrap(), dual(1).subnet))
        );
        let table = shared.load();
        assert_eq!(
            (table.len(), table.route6(ip6("fd10:0:0:1::1"))),
            (1, Some(0))
        );
    }
}
