//! The duplicate rule: of two leases that claim overlapping subnets, one endpoint or one key,
//! the older keeps it, whatever order the events come in, and the incremental outcome is the
//! one a fresh snapshot of the same leases gives.

use super::tests::admitted;
use super::*;
use crate::config::Config;
use crate::lease::{Created, LeaseAttrs};
use proptest::prelude::*;

/// A udp lease read from Node `node`, created at `at`.
fn node(node: &str, at: i64, subnet: &str, ip: &str) -> Lease {
    let lease = Lease::new(
        subnet.parse::<ipnet::Ipv4Net>().unwrap(),
        LeaseAttrs::udp(ip.parse::<std::net::Ipv4Addr>().unwrap()),
    );
    lease.with_created(Created::named(at, node))
}

/// A udp node of 10.5.0.0/16 at 10.5.1.0/24, its leases read from Nodes.
fn kube_peers() -> Peers {
    let mut peers = super::tests::peers_on(None);
    peers.namer = LeaseNamer::KubeNode;
    peers
}

fn reasons(peers: &Peers) -> Vec<(String, String)> {
    let refused = peers.refused();
    refused
        .map(|r| (peers.namer.name(&r.lease), r.reason.to_string()))
        .collect()
}

#[test]
fn of_two_nodes_with_one_pod_cidr_the_older_keeps_it_in_any_order() {
    let real = node("node-2", 100, "10.5.2.0/24", "10.200.0.2");
    let impostor = node("impostor", 200, "10.5.2.0/24", "10.200.0.66");
    let why = "it overlaps 10.5.2.0/24, the subnet of the lease node/node-2, made before it: of \
               two leases that claim one subnet, every node keeps the older";
    let refused = vec![("node/impostor".to_string(), why.to_string())];

    let mut in_order = kube_peers();
    let added = admitted(&mut in_order, LeaseEvent::Added(real.clone().into()));
    assert_eq!(added, Some(LeaseEvent::Added(real.clone().into())));
    assert_eq!(
        admitted(&mut in_order, LeaseEvent::Added(impostor.clone().into())),
        None
    );
    assert_eq!(reasons(&in_order), refused);

    let mut reversed = kube_peers();
    admitted(&mut reversed, LeaseEvent::Added(impostor.clone().into()));
    let taken_back = admitted(&mut reversed, LeaseEvent::Added(real.clone().into()));
    assert_eq!(taken_back, Some(LeaseEvent::Added(real.clone().into())));
    assert_eq!(reasons(&reversed), refused);

    let mut listed = kube_peers();
    let all = vec![impostor.clone().into(), real.clone().into()];
    let snapshot = admitted(&mut listed, LeaseEvent::Snapshot(all));
    assert_eq!(
        snapshot,
        Some(LeaseEvent::Snapshot(vec![real.clone().into()]))
    );
    assert_eq!(reasons(&listed), refused);

    // Removing the newer changes nothing for the older; removing the older lets the newer in.
    for mut peers in [in_order, reversed, listed] {
        assert_eq!(
            admitted(&mut peers, LeaseEvent::Removed(impostor.clone().into())),
            None
        );
        assert_eq!(peers.accepted().collect::<Vec<_>>(), [&real]);
        assert!(peers.refused().next().is_none());
        admitted(&mut peers, LeaseEvent::Added(impostor.clone().into()));
        let moved = admitted(&mut peers, LeaseEvent::Removed(real.clone().into()));
        assert_eq!(moved, Some(LeaseEvent::Added(impostor.clone().into())));
        assert!(peers.refused().next().is_none());
    }
}

#[test]
fn a_changed_node_is_an_update_of_its_own_lease_never_of_another() {
    let mut peers = kube_peers();
    let real = node("node-2", 100, "10.5.2.0/24", "10.200.0.2");
    let other = node("node-3", 150, "10.5.3.0/24", "10.200.0.3");
    admitted(
        &mut peers,
        LeaseEvent::Snapshot(vec![real.clone().into(), other.clone().into()]),
    );
    // node-3 now says it has node-2's podCIDR: it loses its own place and gets no other.
    let moved = node("node-3", 150, "10.5.2.0/24", "10.200.0.3");
    let event = admitted(&mut peers, LeaseEvent::Added(moved.into()));
    assert_eq!(event, Some(LeaseEvent::Removed(other.into())));
    assert_eq!(peers.accepted().collect::<Vec<_>>(), [&real]);
    // node-2 moves its address: an update in place.
    let renumbered = node("node-2", 100, "10.5.2.0/24", "10.200.0.22");
    let event = admitted(&mut peers, LeaseEvent::Added(renumbered.clone().into()));
    assert_eq!(event, Some(LeaseEvent::Added(renumbered.into())));
}

/// A dual-stack udp node (10.5.1.0/24 and fd10:0:0:1::/64), its leases from etcd keys.
fn dual_stack_peers() -> Peers {
    let config = Config::from_json(
        r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/48"}"#,
    )
    .unwrap();
    let own = key_lease(1, 1, "fd10:0:0:1::/64", "10.200.0.1");
    let rules = LeaseRules::new(&config, &own);
    Peers::new(
        rules,
        LeaseNamer::EtcdKey("/coreos.com/network/subnets/".into()),
    )
}

/// The etcd key `10.5.<third>.0-24&<v6>` made at revision `at`.
fn key_lease(third: u8, at: i64, v6: &str, ip: &str) -> Lease {
    let subnet: ipnet::Ipv4Net = format!("10.5.{third}.0/24").parse().unwrap();
    let lease = Lease::new(
        subnet,
        LeaseAttrs::udp(ip.parse::<std::net::Ipv4Addr>().unwrap()),
    );
    let lease = lease.with_ipv6_subnet(v6.parse().unwrap());
    lease.with_created(Created::at(at))
}

#[test]
fn a_dual_stack_key_repeating_a_peers_half_is_another_lease_and_refused() {
    let mut peers = dual_stack_peers();
    let real = key_lease(2, 5, "fd10:0:0:2::/64", "10.200.0.2");
    let same_v4 = key_lease(2, 9, "fd10:0:0:99::/64", "10.200.0.66");
    let same_v6 = key_lease(7, 11, "fd10:0:0:2::/64", "10.200.0.67");
    admitted(&mut peers, LeaseEvent::Snapshot(vec![real.clone().into()]));
    assert_eq!(
        admitted(&mut peers, LeaseEvent::Added(same_v4.clone().into())),
        None
    );
    assert_eq!(
        admitted(&mut peers, LeaseEvent::Added(same_v6.clone().into())),
        None
    );
    let prefix = "/coreos.com/network/subnets/";
    assert_eq!(
        reasons(&peers),
        [
            (
                format!("{prefix}10.5.2.0-24&fd10:0:0:99::-64"),
                "it overlaps 10.5.2.0/24, the subnet of the lease 10.5.2.0/24, made before it: \
                 of two leases that claim one subnet, every node keeps the older"
                    .to_string()
            ),
            (
                format!("{prefix}10.5.7.0-24&fd10:0:0:2::-64"),
                "its IPv6 subnet overlaps fd10:0:0:2::/64, the IPv6 subnet of the lease \
                 10.5.2.0/24, made before it: of two leases that claim one subnet, every node \
                 keeps the older"
                    .to_string()
            ),
        ]
    );
    assert_eq!(
        admitted(&mut peers, LeaseEvent::Removed(same_v4.into())),
        None
    );
    assert_eq!(peers.accepted().collect::<Vec<_>>(), [&real]);
    // The real key goes: the next in line, by creation, is the peer.
    let event = admitted(&mut peers, LeaseEvent::Removed(real.clone().into()));
    assert_eq!(event, Some(LeaseEvent::Snapshot(vec![same_v6.into()])));
}

#[test]
fn a_lease_at_a_peers_public_ip_is_refused_whatever_its_subnet() {
    let mut peers = super::tests::peers_on(None);
    let attrs = LeaseAttrs::udp("10.200.0.2".parse::<std::net::Ipv4Addr>().unwrap());
    let real = Lease::new("10.5.2.0/24".parse::<ipnet::Ipv4Net>().unwrap(), attrs)
        .with_created(Created::at(5));
    // Below the real one: subnet order would put it first.
    let copy = Lease::new(
        "10.5.0.0/24".parse::<ipnet::Ipv4Net>().unwrap(),
        real.attrs(),
    )
    .with_created(Created::at(9));
    let snapshot = admitted(
        &mut peers,
        LeaseEvent::Snapshot(vec![copy.clone().into(), real.clone().into()]),
    );
    assert_eq!(
        snapshot,
        Some(LeaseEvent::Snapshot(vec![real.clone().into()]))
    );
    assert_eq!(
        reasons(&peers),
        [(
            "peer 10.5.0.0/24".to_string(),
            "its PublicIP 10.200.0.2 is already the address of the lease 10.5.2.0/24, made \
             before it: this dataplane knows a peer by its address, so one address is one peer"
                .to_string()
        )]
    );
    let event = admitted(&mut peers, LeaseEvent::Removed(real.clone().into()));
    assert_eq!(event, Some(LeaseEvent::Snapshot(vec![copy.into()])));
}

#[test]
fn an_older_lease_displaces_a_chain_and_the_waiting_come_back() {
    // a (oldest) and b share a subnet, b and c an address: with a, b waits and c is a peer.
    let mut peers = kube_peers();
    let a = node("a", 1, "10.5.2.0/24", "10.200.0.2");
    let b = node("b", 2, "10.5.2.0/24", "10.200.0.3");
    let c = node("c", 3, "10.5.4.0/24", "10.200.0.3");
    admitted(&mut peers, LeaseEvent::Added(c.clone().into()));
    admitted(&mut peers, LeaseEvent::Added(b.clone().into()));
    assert_eq!(peers.accepted().collect::<Vec<_>>(), [&b]);
    let event = admitted(&mut peers, LeaseEvent::Added(a.clone().into()));
    assert_eq!(
        event,
        Some(LeaseEvent::Snapshot(vec![
            a.clone().into(),
            c.clone().into()
        ]))
    );
    let event = admitted(&mut peers, LeaseEvent::Removed(a.into()));
    assert_eq!(event, Some(LeaseEvent::Snapshot(vec![b.into()])));
}

/// One step of a registry: a Node (by index) written with a lease, or removed.
#[derive(Debug, Clone)]
enum Step {
    Put { node: usize, subnet: u8, ip: u8 },
    Remove(usize),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let put =
        (0..6usize, 2..5u8, 2..5u8).prop_map(|(node, subnet, ip)| Step::Put { node, subnet, ip });
    let remove = (0..6usize).prop_map(Step::Remove);
    prop::collection::vec(prop_oneof![3 => put, 1 => remove], 1..40)
}

proptest! {
    /// After every event, the accepted leases are those a fresh snapshot of the registry's
    /// leases gives, the backend (fed the events) has exactly them, and every refused lease
    /// that waits waits for an accepted one.
    #[test]
    fn events_end_where_a_snapshot_of_the_same_leases_ends(
        steps in steps(),
        created in prop::collection::vec(0..3i64, 6),
    ) {
        let mut peers = kube_peers();
        let mut registry: BTreeMap<usize, Lease> = BTreeMap::new();
        let mut backend: BTreeMap<SubnetId, Lease> = BTreeMap::new();
        for step in steps {
            let event = match step {
                Step::Put { node: n, subnet, ip } => {
                    let lease = node(
                        &format!("n{n}"),
                        created[n],
                        &format!("10.5.{subnet}.0/24"),
                        &format!("10.200.0.{ip}"),
                    );
                    registry.insert(n, lease.clone());
                    LeaseEvent::Added(lease.into())
                }
                Step::Remove(n) => match registry.remove(&n) {
                    Some(lease) => LeaseEvent::Removed(lease.into()),
                    None => continue,
                },
            };
            match admitted(&mut peers, event) {
                Some(LeaseEvent::Snapshot(all)) => {
                    backend = all.into_iter().map(|l| (l.id(), Arc::unwrap_or_clone(l))).collect();
                }
                Some(LeaseEvent::Added(lease)) => {
                    backend.insert(lease.id(), Arc::unwrap_or_clone(lease));
                }
                Some(LeaseEvent::Removed(lease)) => {
                    backend.remove(&lease.id());
                }
                _ => {}
            }
            let mut fresh = kube_peers();
            let listed = registry.values().map(|l| Arc::new(l.clone())).collect();
            admitted(&mut fresh, LeaseEvent::Snapshot(listed));
            let accepted: Vec<&Lease> = peers.accepted().collect();
            prop_assert_eq!(&accepted, &fresh.accepted().collect::<Vec<_>>());
            prop_assert_eq!(&accepted, &backend.values().collect::<Vec<_>>());
            prop_assert_eq!(peers.refused().count() + accepted.len(), registry.len());
            for refused in peers.refused() {
                if let Some(holder) = &refused.waits_for {
                    prop_assert!(peers.origins.contains_key(holder), "{refused:?}");
                }
            }
        }
    }
}

/// A vxlan lease of 10.5.`third`.0/24 at `ip` with VtepMACs `mac` and, dual-stack, `mac6`.
fn vxlan_lease(third: u8, at: i64, ip: &str, mac: &str, mac6: &str) -> Lease {
    let subnet: ipnet::Ipv4Net = format!("10.5.{third}.0/24").parse().unwrap();
    let ip6: std::net::Ipv6Addr = format!("fd00:200::{third}").parse().unwrap();
    let data6 = serde_json::json!({"VNI": 1, "VtepMAC": mac6});
    let attrs = LeaseAttrs::vxlan(ip.parse::<std::net::Ipv4Addr>().unwrap(), 1, mac)
        .with_ipv6(ip6, Some(data6.into()));
    let v6 = format!("fd10:0:0:{third}::/64").parse().unwrap();
    let lease = Lease::new(subnet, attrs).with_ipv6_subnet(v6);
    lease.with_created(Created::at(at))
}

/// Hardening 4's finding 1: the kernel's fdb is keyed by MAC, so a lease repeating a peer's
/// VtepMAC (of either device) would take its frames; the older lease keeps it.
#[test]
fn a_lease_repeating_a_peers_vtep_mac_is_refused_on_either_device() {
    let config = Config::from_json(
        r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/48","Backend":{"Type":"vxlan"}}"#,
    )
    .unwrap();
    let own = vxlan_lease(1, 1, "10.200.0.1", "02:00:00:00:01:04", "02:00:00:00:01:06");
    let rules = LeaseRules::new(&config, &own);
    let namer = LeaseNamer::EtcdKey("/coreos.com/network/subnets/".into());
    let mut peers = Peers::new(rules, namer);
    let real = vxlan_lease(2, 5, "10.200.0.2", "02:00:00:00:02:04", "02:00:00:00:02:06");
    let same_mac = vxlan_lease(3, 9, "10.200.0.3", "02:00:00:00:02:04", "02:00:00:00:03:06");
    let same_mac6 = vxlan_lease(4, 9, "10.200.0.4", "02:00:00:00:04:04", "02:00:00:00:02:06");
    // A v4 MAC equal to another's v6 MAC is on another device: no clash.
    let crossed = vxlan_lease(5, 9, "10.200.0.5", "02:00:00:00:02:06", "02:00:00:00:05:06");
    let snapshot = admitted(
        &mut peers,
        LeaseEvent::Snapshot(vec![
            same_mac.clone().into(),
            same_mac6.clone().into(),
            crossed.clone().into(),
            real.clone().into(),
        ]),
    );
    assert_eq!(
        snapshot,
        Some(LeaseEvent::Snapshot(vec![
            real.clone().into(),
            crossed.into()
        ]))
    );
    let taken = |device: &str, mac: &str| {
        format!(
            "its {device}.VtepMAC {mac} is already the VtepMAC of the lease 10.5.2.0/24, made \
             before it: the kernel's fdb sends a MAC's frames to one host"
        )
    };
    let mut got = reasons(&peers);
    got.sort();
    assert_eq!(
        got,
        [
            (
                "/coreos.com/network/subnets/10.5.3.0-24&fd10:0:0:3::-64".to_string(),
                taken("BackendData", "02:00:00:00:02:04")
            ),
            (
                "/coreos.com/network/subnets/10.5.4.0-24&fd10:0:0:4::-64".to_string(),
                taken("BackendV6Data", "02:00:00:00:02:06")
            ),
        ]
    );
    // The real lease goes: the first made of those that waited for it takes the MAC.
    let event = admitted(&mut peers, LeaseEvent::Removed(real.into()));
    let Some(LeaseEvent::Snapshot(now)) = event else {
        panic!("{event:?}")
    };
    assert_eq!(now.len(), 3, "{now:?}");
    assert!(reasons(&peers).is_empty());
}
