//! Destination subnet -> peer, replaced whole when leases change.
//!
//! Engines load the current table once per batch (`arc-swap`, no lock) and never wait on the
//! control plane; the control plane builds a new table and swaps it in.

use crate::stats::PeerStats;
use arc_swap::{ArcSwap, Guard};
use ipnet::Ipv4Net;
use rustc_hash::FxHashMap;
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

#[derive(Debug)]
pub struct Peer {
    pub spec: PeerSpec,
    pub stats: Arc<PeerStats>,
}

/// An immutable routing table: longest-prefix match on destination, exact match on endpoint.
#[derive(Debug, Default)]
pub struct PeerTable {
    peers: Vec<Peer>,
    /// One map per distinct prefix length, longest first. flannel leases all share one
    /// SubnetLen, so a lookup is normally a single hash probe.
    by_prefix: Vec<(u8, FxHashMap<u32, usize>)>,
    by_endpoint: FxHashMap<SocketAddrV4, usize>,
}

impl PeerTable {
    /// Build a table; peers also present in `previous` (same subnet and endpoint) keep their
    /// counters. Of two peers claiming one subnet or one endpoint, the first wins.
    pub fn new(specs: &[PeerSpec], previous: &PeerTable) -> PeerTable {
        let mut table = PeerTable::default();
        for spec in specs {
            let spec = PeerSpec {
                subnet: spec.subnet.trunc(),
                ..*spec
            };
            if table.by_endpoint.contains_key(&spec.endpoint) || table.owner(&spec).is_some() {
                continue;
            }
            let stats = previous
                .by_spec(&spec)
                .map_or_else(Default::default, |p| p.stats.clone());
            table.insert(Peer { spec, stats });
        }
        table
            .by_prefix
            .sort_by_key(|(len, _)| std::cmp::Reverse(*len));
        table
    }

    fn insert(&mut self, peer: Peer) {
        let index = self.peers.len();
        let subnet = peer.spec.subnet;
        self.by_endpoint.insert(peer.spec.endpoint, index);
        let len = subnet.prefix_len();
        match self.by_prefix.iter_mut().find(|(l, _)| *l == len) {
            Some((_, map)) => {
                map.insert(u32::from(subnet.network()), index);
            }
            None => {
                let map = FxHashMap::from_iter([(u32::from(subnet.network()), index)]);
                self.by_prefix.push((len, map));
            }
        }
        self.peers.push(peer);
    }

    fn owner(&self, spec: &PeerSpec) -> Option<&Peer> {
        let (_, map) = self
            .by_prefix
            .iter()
            .find(|(len, _)| *len == spec.subnet.prefix_len())?;
        map.get(&u32::from(spec.subnet.network()))
            .map(|&i| &self.peers[i])
    }

    fn by_spec(&self, spec: &PeerSpec) -> Option<&Peer> {
        self.owner(spec).filter(|p| p.spec == *spec)
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

    pub fn peers(&self) -> &[Peer] {
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

    /// Replace the peers, keeping the counters of those that stay.
    pub fn set_peers(&self, specs: &[PeerSpec]) {
        let next = PeerTable::new(specs, &self.0.load());
        self.0.store(Arc::new(next));
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
        let table = PeerTable::new(
            &[
                spec("10.5.0.0/16", [10, 200, 0, 1]),
                spec("10.5.3.0/24", [10, 200, 0, 3]),
            ],
            &PeerTable::default(),
        );
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
        let table = PeerTable::new(
            &[spec("10.5.3.0/24", [10, 200, 0, 3])],
            &PeerTable::default(),
        );
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
    fn duplicate_claims_keep_the_first() {
        let table = PeerTable::new(
            &[
                spec("10.5.1.0/24", [10, 200, 0, 1]),
                spec("10.5.1.0/24", [10, 200, 0, 2]),
                spec("10.5.2.0/24", [10, 200, 0, 1]),
            ],
            &PeerTable::default(),
        );
        assert_eq!(table.len(), 1);
    }
}
