//! A WireGuard engine's peers as the control plane changes them: each peer's WireGuard state
//! ([`WgPeers`]) and its entry in the routing table, which finds it by subnet for sending and
//! holds its counters, kept in step. A lease event costs O(log K) in both, as in the udp and
//! batch engines; a reconcile, O(K).

use super::peer_map::{KeyTaken, WgPeers};
use super::peers::WgPeerSpec;
use crate::table::{Conflict, PeerSpec, SharedTable};
use ipnet::Ipv4Net;
use std::net::SocketAddrV4;
use std::sync::Arc;

/// The peers of one engine, and its routing table.
pub struct Peering {
    peers: Arc<WgPeers>,
    table: Arc<SharedTable>,
}

/// Why a lease's peer was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Key(#[from] KeyTaken),
    #[error(transparent)]
    Route(#[from] Conflict),
    /// A peer for `flannel-wg-v6` on an engine that runs no such device.
    #[error("this engine runs no flannel-wg-v6")]
    NoDevice,
}

impl Peering {
    pub fn new(peers: Arc<WgPeers>, table: Arc<SharedTable>) -> Peering {
        Peering { peers, table }
    }

    /// Makes the peers exactly `specs`, changing only what differs (a peer whose key changed is
    /// re-keyed). O(K): for a reconcile.
    pub fn set_all(&self, specs: &[WgPeerSpec]) {
        self.peers.set(specs);
        let routes: Vec<PeerSpec> = specs.iter().map(route).collect();
        self.table.set_peers(&routes);
    }

    /// Adds the peer of one lease, or updates the one of its subnet; no other peer is touched.
    /// O(log K).
    pub fn set(&self, spec: &WgPeerSpec) -> Result<(), Refused> {
        self.peers.set_peer(spec)?;
        self.table.set_peer(route(spec))?;
        Ok(())
    }

    /// Removes the peer of `subnet`, if there is one. O(log K).
    pub fn remove(&self, subnet: Ipv4Net) {
        self.peers.remove_peer(subnet);
        self.table.remove_peer(subnet);
    }
}

/// A peer's entry in the routing table, which finds it by subnet (IPv4 or IPv6) for sending
/// and holds its counters. The table keeps one peer per endpoint, for the engines that tell peers apart by
/// the address a datagram comes from; WireGuard tells them apart by key, and two nodes behind
/// one NAT publish one `PublicIP:Port`. So the entry's endpoint names the subnet instead
/// (`10.5.2.0:0`, port 0 being no one's): where datagrams go is the peer's own business
/// ([`super::WgPeer::endpoint`], which follows roaming).
fn route(spec: &WgPeerSpec) -> PeerSpec {
    PeerSpec {
        subnet: spec.subnet,
        subnet6: spec.subnet6,
        endpoint: SocketAddrV4::new(spec.subnet.network(), 0).into(),
        version: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::super::keys::PublicKey;
    use super::*;

    fn spec(n: u8, key: u8) -> WgPeerSpec {
        WgPeerSpec {
            subnet: format!("10.5.{n}.0/24").parse().unwrap(),
            subnet6: Some(format!("fd10:0:0:{n}::/64").parse().unwrap()),
            endpoint: format!("10.200.0.{n}:51820").parse().unwrap(),
            public_key: PublicKey([key; 32]),
        }
    }

    fn peering() -> Peering {
        Peering::new(Arc::default(), Arc::default())
    }

    /// The subnets of the WireGuard peers and of the routing table's, sorted.
    fn subnets(p: &Peering) -> (Vec<Ipv4Net>, Vec<Ipv4Net>) {
        let mut peers: Vec<Ipv4Net> = p.peers.load().iter().map(|p| p.subnet).collect();
        let mut routes: Vec<Ipv4Net> = p
            .table
            .load()
            .peers()
            .iter()
            .map(|p| p.spec.subnet)
            .collect();
        peers.sort();
        routes.sort();
        (peers, routes)
    }

    #[test]
    fn a_lease_event_changes_the_peer_and_its_route_together() {
        let p = peering();
        let (a, b) = (spec(1, 1), spec(2, 2));
        p.set(&a).unwrap();
        p.set(&b).unwrap();
        assert_eq!(
            subnets(&p),
            (vec![a.subnet, b.subnet], vec![a.subnet, b.subnet])
        );
        let table = p.table.load();
        let route_b = table.get(b.subnet).unwrap();
        route_b.stats.tx.add(3, 300);
        assert_eq!(route_b.spec.endpoint.to_string(), "10.5.2.0:0");
        let to_b6 = table.route6("fd10:0:0:2::5".parse().unwrap());
        assert_eq!(to_b6.map(|i| table.peers()[i].spec.subnet), Some(b.subnet));

        p.set(&WgPeerSpec {
            public_key: PublicKey([9; 32]),
            ..a
        })
        .unwrap();
        p.remove(a.subnet);
        assert_eq!(subnets(&p), (vec![b.subnet], vec![b.subnet]));
        let kept = p.table.load().get(b.subnet).unwrap().stats.tx.packets();
        assert_eq!(kept, 3, "the untouched peer keeps its counters");
    }

    #[test]
    fn a_refused_peer_gets_no_route_and_a_reconcile_agrees_with_the_events() {
        let p = peering();
        let (a, b) = (spec(1, 1), spec(2, 2));
        p.set_all(&[a, b]);
        let copy = WgPeerSpec {
            subnet: spec(3, 0).subnet,
            ..a
        };
        assert_eq!(
            p.set(&copy),
            Err(Refused::Key(KeyTaken { holder: a.subnet }))
        );
        assert_eq!(
            subnets(&p),
            (vec![a.subnet, b.subnet], vec![a.subnet, b.subnet])
        );
        p.remove(b.subnet);
        let events = subnets(&p);
        p.set_all(&[a]);
        assert_eq!(subnets(&p), events);
    }
}
