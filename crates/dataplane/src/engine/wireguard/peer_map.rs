//! The WireGuard peers of one engine, one per lease, found by subnet (sending), by the index in
//! a message's receiver field, or by public key (a handshake initiation names its sender only
//! by key).
//!
//! Changed one lease at a time, as the routing table is (`crate::table`): the three maps are
//! persistent (structure-sharing, `imbl`), so the control plane clones the current generation
//! in O(1), changes one peer in O(log K) and swaps it in, while the engine's loops read theirs
//! without a lock. A peer whose subnets and key stay is the same peer in every generation: it
//! keeps its tunnel, sessions and index whatever happens to the others.

use super::keys::PublicKey;
use super::peers::{WgPeer, WgPeerSpec};
use arc_swap::{ArcSwap, Guard};
use imbl::shared_ptr::DefaultSharedPtr;
use imbl::GenericHashMap;
use ipnet::Ipv4Net;
use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

/// boringtun keeps the low 8 bits of a session index for the session; the rest name the peer.
const INDEX_BITS: u32 = 24;

type Map<K> = GenericHashMap<K, Arc<WgPeer>, FxBuildHasher, DefaultSharedPtr>;

/// One generation of peers, with the three ways to find one.
#[derive(Clone, Default)]
pub struct PeerMap {
    by_subnet: Map<Ipv4Net>,
    by_index: Map<u32>,
    by_key: Map<PublicKey>,
}

impl PeerMap {
    pub fn by_subnet(&self, subnet: Ipv4Net) -> Option<&WgPeer> {
        self.by_subnet.get(&subnet).map(|p| &**p)
    }

    /// The peer a message's receiver index names (boringtun's session index: peer, session).
    pub fn by_receiver(&self, receiver: u32) -> Option<&WgPeer> {
        self.by_index.get(&(receiver >> 8)).map(|p| &**p)
    }

    pub fn by_key(&self, key: &PublicKey) -> Option<&WgPeer> {
        self.by_key.get(key).map(|p| &**p)
    }

    pub fn iter(&self) -> impl Iterator<Item = &WgPeer> {
        self.by_subnet.values().map(|p| &**p)
    }

    pub fn len(&self) -> usize {
        self.by_subnet.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_subnet.is_empty()
    }

    fn insert(&mut self, peer: Arc<WgPeer>) {
        self.by_index.insert(peer.index(), peer.clone());
        self.by_key.insert(peer.public_key, peer.clone());
        self.by_subnet.insert(peer.subnet, peer);
    }

    /// Forgets the peer of `subnet`; whether there was one.
    fn remove(&mut self, subnet: Ipv4Net) -> bool {
        let Some(peer) = self.by_subnet.remove(&subnet) else {
            return false;
        };
        self.by_index.remove(&peer.index());
        self.by_key.remove(&peer.public_key);
        true
    }
}

/// Why a lease's peer was left out: a WireGuard key names one peer, and another has this one.
/// (The lease gate lets only one lease per key through, so the daemon never meets this.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("its public key is already the key of the peer of {holder}")]
pub struct KeyTaken {
    pub holder: Ipv4Net,
}

/// The peers an engine reads and the control plane changes.
pub struct WgPeers {
    map: ArcSwap<PeerMap>,
    next_index: AtomicU32,
}

impl Default for WgPeers {
    fn default() -> Self {
        let mut seed = [0u8; 4];
        // A predictable start is harmless (indices travel in clear); random only spreads them.
        let _ = getrandom::fill(&mut seed);
        WgPeers {
            map: ArcSwap::default(),
            next_index: AtomicU32::new(u32::from_le_bytes(seed)),
        }
    }
}

impl WgPeers {
    pub fn load(&self) -> Guard<Arc<PeerMap>> {
        self.map.load()
    }

    /// Makes the peers exactly `specs`, changing only what differs: a peer whose subnets and key
    /// stay keeps its tunnel (and follows its lease's endpoint); one whose lease changed its key
    /// gets a new one, so the next packet starts a handshake with the new key; an idle
    /// reconcile leaves the peers as they are. Of two specs with one subnet or one key, the
    /// first wins. O(K): for a reconcile; a lease event takes [`WgPeers::set_peer`].
    pub fn set(&self, specs: &[WgPeerSpec]) {
        let mut wanted = FxHashMap::with_capacity_and_hasher(specs.len(), Default::default());
        let mut keys = FxHashSet::with_capacity_and_hasher(specs.len(), Default::default());
        for spec in specs {
            if !wanted.contains_key(&spec.subnet) && keys.insert(spec.public_key) {
                wanted.insert(spec.subnet, spec);
            }
        }
        let current = self.map.load_full();
        let mut next = PeerMap::clone(&current);
        let mut changed = false;
        // First every peer that goes or changes its key or IPv6 subnet, so that no key stays
        // taken by a peer on its way out.
        for peer in current.iter() {
            let stays = wanted
                .get(&peer.subnet)
                .is_some_and(|w| w.public_key == peer.public_key && w.subnet6 == peer.subnet6);
            if !stays {
                changed |= next.remove(peer.subnet);
            }
        }
        for spec in wanted.values() {
            // No key is taken now but by the peer of its own subnet.
            changed |= self.place(&current, &mut next, spec).unwrap_or(false);
        }
        if changed {
            self.map.store(Arc::new(next));
        }
    }

    /// Adds the peer of a lease, or updates the one of its subnet, as [`WgPeers::set`] would,
    /// touching no other peer. A lease whose key another peer has leaves its subnet without a
    /// peer. O(log K).
    pub fn set_peer(&self, spec: &WgPeerSpec) -> Result<(), KeyTaken> {
        let current = self.map.load_full();
        let mut next = PeerMap::clone(&current);
        let placed = self.place(&current, &mut next, spec);
        let changed = match placed {
            Ok(changed) => changed,
            Err(_) => next.remove(spec.subnet),
        };
        if changed {
            self.map.store(Arc::new(next));
        }
        placed.map(drop)
    }

    /// Removes the peer of `subnet`, if there is one; whether there was. O(log K).
    pub fn remove_peer(&self, subnet: Ipv4Net) -> bool {
        let mut next = PeerMap::clone(&self.map.load());
        let removed = next.remove(subnet);
        if removed {
            self.map.store(Arc::new(next));
        }
        removed
    }

    /// Puts the peer of `spec` into `next`, the generation after `current`; whether `next`
    /// changed (a peer that stays only follows its lease's endpoint, in place).
    fn place(
        &self,
        current: &PeerMap,
        next: &mut PeerMap,
        spec: &WgPeerSpec,
    ) -> Result<bool, KeyTaken> {
        match next.by_key.get(&spec.public_key) {
            Some(peer) if peer.subnet == spec.subnet && peer.subnet6 == spec.subnet6 => {
                peer.follow_lease(spec.endpoint);
                return Ok(false);
            }
            // Its lease's IPv6 subnet changed: allowed IPs are a peer's own, so a new peer.
            Some(peer) if peer.subnet == spec.subnet => {}
            Some(holder) => {
                return Err(KeyTaken {
                    holder: holder.subnet,
                })
            }
            None => {}
        }
        // A new peer, or a new key or IPv6 subnet for its subnet: a new tunnel and index.
        next.remove(spec.subnet);
        let index = self.free_index(current, next);
        next.insert(Arc::new(WgPeer::new(spec, index)));
        Ok(true)
    }

    /// A peer index in use by neither generation, so a message in flight for a peer that just
    /// left can not reach a new one.
    fn free_index(&self, current: &PeerMap, next: &PeerMap) -> u32 {
        loop {
            let index = self.next_index.fetch_add(1, Relaxed) & ((1 << INDEX_BITS) - 1);
            if !current.by_index.contains_key(&index) && !next.by_index.contains_key(&index) {
                return index;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::keys::PrivateKey;
    use super::super::peers::{Sealed, TunnelParams};
    use super::*;
    use std::net::{Ipv4Addr, SocketAddr};

    fn spec(subnet: &str, port: u16, key: u8) -> WgPeerSpec {
        WgPeerSpec {
            subnet: subnet.parse().unwrap(),
            subnet6: None,
            endpoint: SocketAddr::from((Ipv4Addr::new(10, 200, 0, key), port)),
            public_key: PublicKey([key; 32]),
        }
    }

    fn params() -> TunnelParams {
        TunnelParams {
            private_key: PrivateKey::generate(),
            preshared_key: None,
            keepalive: None,
        }
    }

    /// Gives the peer of `subnet` a tunnel, with a handshake under way.
    fn start_handshake(peers: &WgPeers, subnet: Ipv4Net, params: &TunnelParams) {
        let mut buf = [0u8; 256];
        let sealed = peers
            .load()
            .by_subnet(subnet)
            .unwrap()
            .seal(params, &[0; 20], &mut buf);
        assert!(matches!(sealed, Sealed::Handshake(148)), "{sealed:?}");
    }

    /// Every peer is found the three ways, and the maps hold nothing else.
    fn assert_consistent(map: &PeerMap) {
        for peer in map.iter() {
            let receiver = (peer.index() << 8) | 5;
            assert!(std::ptr::eq(map.by_receiver(receiver).unwrap(), peer));
            assert!(std::ptr::eq(map.by_key(&peer.public_key).unwrap(), peer));
        }
        assert_eq!(map.by_index.len(), map.len());
        assert_eq!(map.by_key.len(), map.len());
    }

    #[test]
    fn peers_are_found_by_subnet_index_and_key() {
        let peers = WgPeers::default();
        let a = spec("10.5.1.0/24", 51820, 1);
        peers.set(&[a, spec("10.5.2.0/24", 51820, 2)]);
        let map = peers.load();
        let found = map.by_subnet(a.subnet).unwrap();
        assert_eq!(found.endpoint(), a.endpoint);
        let receiver = (found.index() << 8) | 3;
        assert_eq!(map.by_receiver(receiver).unwrap().subnet, a.subnet);
        assert_eq!(map.by_key(&a.public_key).unwrap().subnet, a.subnet);
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn a_peer_keeps_its_tunnel_until_its_key_changes() {
        let (peers, params) = (WgPeers::default(), params());
        let a = spec("10.5.1.0/24", 51820, 1);
        peers.set(&[a]);
        start_handshake(&peers, a.subnet, &params);
        let moved = WgPeerSpec {
            endpoint: SocketAddr::from((Ipv4Addr::new(10, 200, 0, 9), 51820)),
            ..a
        };
        peers.set(&[moved]);
        let peer = peers
            .load()
            .by_subnet(a.subnet)
            .map(|p| (p.has_tunnel(), p.endpoint()));
        assert_eq!(peer, Some((true, moved.endpoint)));
        peers.set(&[WgPeerSpec {
            public_key: PublicKey([7; 32]),
            ..moved
        }]);
        assert!(!peers.load().by_subnet(a.subnet).unwrap().has_tunnel());
    }

    #[test]
    fn a_new_ipv6_subnet_makes_a_new_peer_by_event_and_by_reconcile() {
        let (peers, params) = (WgPeers::default(), params());
        let a = spec("10.5.1.0/24", 51820, 1);
        let dual = WgPeerSpec {
            subnet6: Some("fd10:0:0:1::/64".parse().unwrap()),
            ..a
        };
        peers.set(&[a]);
        start_handshake(&peers, a.subnet, &params);
        peers.set_peer(&dual).unwrap();
        let map = peers.load();
        let peer = map.by_subnet(a.subnet).unwrap();
        assert_eq!((peer.subnet6, peer.has_tunnel()), (dual.subnet6, false));
        assert_consistent(&map);
        start_handshake(&peers, a.subnet, &params);
        peers.set(&[a]);
        let map = peers.load();
        let peer = map.by_subnet(a.subnet).unwrap();
        assert_eq!((peer.subnet6, peer.has_tunnel()), (None, false));
        assert_consistent(&map);
    }

    #[test]
    fn roaming_moves_the_endpoint_until_the_lease_moves_it() {
        let peers = WgPeers::default();
        let a = spec("10.5.1.0/24", 51820, 1);
        peers.set(&[a]);
        let roamed = SocketAddr::from((Ipv4Addr::new(192, 0, 2, 1), 40000));
        let map = peers.load();
        let peer = map.by_subnet(a.subnet).unwrap();
        assert!(peer.roam(roamed));
        assert!(!peer.roam(roamed));
        peers.set(&[a]);
        assert_eq!(
            peer.endpoint(),
            roamed,
            "an unchanged lease keeps the roamed endpoint"
        );
        peers.set_peer(&a).unwrap();
        assert_eq!(peer.endpoint(), roamed, "so does an unchanged lease event");
        let moved = WgPeerSpec {
            endpoint: SocketAddr::from((Ipv4Addr::new(10, 200, 0, 9), 51820)),
            ..a
        };
        peers.set_peer(&moved).unwrap();
        assert_eq!(peer.endpoint(), moved.endpoint);
    }

    #[test]
    fn duplicate_subnets_or_keys_keep_the_first() {
        let peers = WgPeers::default();
        let a = spec("10.5.1.0/24", 51820, 1);
        let same_key = WgPeerSpec {
            subnet: "10.5.9.0/24".parse().unwrap(),
            ..a
        };
        peers.set(&[a, same_key, spec("10.5.1.0/24", 1, 2)]);
        assert_eq!(peers.load().len(), 1);
        assert_consistent(&peers.load());
    }

    #[test]
    fn a_lease_event_changes_its_peer_and_leaves_the_others_and_their_sessions_alone() {
        let (peers, params) = (WgPeers::default(), params());
        let (a, b, c) = (
            spec("10.5.1.0/24", 51820, 1),
            spec("10.5.2.0/24", 51820, 2),
            spec("10.5.3.0/24", 51820, 3),
        );
        for s in [a, b, c] {
            peers.set_peer(&s).unwrap();
        }
        start_handshake(&peers, b.subnet, &params);
        let before = Arc::clone(&peers.load());
        let b_peer = |map: &PeerMap| Arc::as_ptr(map.by_subnet.get(&b.subnet).unwrap());

        let rekeyed = WgPeerSpec {
            public_key: PublicKey([11; 32]),
            ..a
        };
        peers.set_peer(&rekeyed).unwrap();
        assert!(peers.remove_peer(c.subnet));
        assert!(!peers.remove_peer(c.subnet));
        peers.set_peer(&spec("10.5.4.0/24", 51820, 4)).unwrap();

        let map = peers.load();
        assert_eq!(map.len(), 3);
        assert_consistent(&map);
        assert_eq!(b_peer(&map), b_peer(&before), "B is the same peer");
        assert!(map.by_subnet(b.subnet).unwrap().has_tunnel());
        let old_a = before.by_subnet(a.subnet).unwrap();
        let new_a = map.by_subnet(a.subnet).unwrap();
        assert_ne!(new_a.index(), old_a.index(), "a new key, a new index");
        assert!(map.by_receiver(old_a.index() << 8).is_none());
        assert!(map.by_key(&a.public_key).is_none());
        assert!(map.by_subnet(c.subnet).is_none());
        // The generation the engine may still hold is untouched.
        assert_eq!(before.len(), 3);
        assert!(before.by_subnet(c.subnet).is_some());
        assert_consistent(&before);
    }

    #[test]
    fn a_lease_with_another_peers_key_is_refused_and_leaves_its_subnet_without_a_peer() {
        let peers = WgPeers::default();
        let (a, b) = (spec("10.5.1.0/24", 51820, 1), spec("10.5.2.0/24", 51820, 2));
        peers.set(&[a, b]);
        let copy = WgPeerSpec {
            public_key: a.public_key,
            ..b
        };
        assert_eq!(peers.set_peer(&copy), Err(KeyTaken { holder: a.subnet }));
        let map = peers.load();
        assert!(map.by_subnet(b.subnet).is_none());
        assert_eq!(map.by_key(&a.public_key).unwrap().subnet, a.subnet);
        assert_consistent(&map);
    }

    #[test]
    fn an_idle_reconcile_leaves_the_peers_as_they_are() {
        let peers = WgPeers::default();
        let specs = [spec("10.5.1.0/24", 51820, 1), spec("10.5.2.0/24", 51820, 2)];
        peers.set(&specs);
        let before = Arc::clone(&peers.load());
        peers.set(&specs);
        assert!(Arc::ptr_eq(&before, &peers.load()));
        peers.set_peer(&specs[0]).unwrap();
        assert!(Arc::ptr_eq(&before, &peers.load()));
    }

    #[test]
    fn events_one_at_a_time_end_where_a_reconcile_of_the_same_leases_does() {
        // Keys 1..=6 over subnets 1..=5, changed in a fixed pseudo-random order.
        let mut leases: FxHashMap<Ipv4Net, WgPeerSpec> = FxHashMap::default();
        let (events, reconciled) = (WgPeers::default(), WgPeers::default());
        let mut x = 7u32;
        for _ in 0..500 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let (subnet, key) = (format!("10.5.{}.0/24", 1 + (x >> 8) % 5), (x >> 16) % 7);
            let s = spec(&subnet, 51820, key as u8);
            if key == 0 {
                leases.remove(&s.subnet);
                events.remove_peer(s.subnet);
            } else if leases.values().all(|l| l.public_key != s.public_key) {
                // The lease gate lets one lease per key through.
                leases.insert(s.subnet, s);
                events.set_peer(&s).unwrap();
            }
            let all: Vec<WgPeerSpec> = leases.values().copied().collect();
            reconciled.set(&all);
            let (e, r) = (events.load(), reconciled.load());
            assert_consistent(&e);
            let view = |m: &PeerMap| {
                let mut v: Vec<_> = m.iter().map(|p| (p.subnet, p.public_key)).collect();
                v.sort_by_key(|(s, _)| *s);
                v
            };
            assert_eq!(view(&e), view(&r));
        }
    }
}
