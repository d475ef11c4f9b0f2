//! The peer table's unit tests.

use super::*;

fn spec(subnet: &str, ip: [u8; 4]) -> PeerSpec {
    PeerSpec {
        subnet: subnet.parse().unwrap(),
        subnet6: None,
        endpoint: SocketAddr::from((ip, 8285)),
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
    let ep = SocketAddr::from(([10, 200, 0, 3], 8285));
    assert!(table.by_endpoint(ep).is_some());
    assert!(table.by_endpoint(SocketAddr::new(ep.ip(), 9999)).is_none());
}

#[test]
fn ipv6_endpoints_match_senders_as_received() {
    use std::net::SocketAddrV6;
    let underlay: Ipv6Addr = "fd00:200::3".parse().unwrap();
    // A lease's address has no flow label or scope; a received sender may carry either.
    let mut peer = spec("10.5.3.0/24", [0; 4]);
    peer.endpoint = SocketAddrV6::new(underlay, 8285, 0, 0).into();
    let mut mapped = spec("10.5.4.0/24", [0; 4]);
    mapped.endpoint =
        SocketAddrV6::new(Ipv4Addr::new(10, 200, 0, 4).to_ipv6_mapped(), 8285, 0, 0).into();
    let table = PeerTable::new(&[peer, mapped]);
    let received = SocketAddrV6::new(underlay, 8285, 7, 2).into();
    let found = table.by_endpoint(crate::io::udp::sender(received));
    assert_eq!(found.map(|p| p.spec.subnet), Some(peer.subnet));
    assert!(table
        .by_endpoint(SocketAddrV6::new(underlay, 8286, 0, 0).into())
        .is_none());
    // An IPv4-mapped endpoint is kept as the IPv4 address an IPv4 socket reports.
    let v4 = SocketAddr::from(([10, 200, 0, 4], 8285));
    assert_eq!(
        table.by_endpoint(v4).map(|p| p.spec.subnet),
        Some(mapped.subnet)
    );
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
