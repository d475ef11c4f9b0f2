//! The vxlan backend against the real kernel: two hosts in network namespaces.

mod kernel_common;

use kernel_common::{lease, lines, two_hosts, Mode, Netns};
use serde_json::json;
use twill_control::backend::kernel::KernelConfig;
use twill_control::backend::vxlan::{VtepMacs, VxlanBackend, VxlanConfig, VxlanDevice};
use twill_control::backend::{Backend, Setup};
use twill_control::lease::Lease;

const A_SUBNET: &str = "10.5.1.0/24";
const B_SUBNET: &str = "10.5.2.0/24";

fn vxlan_lease(subnet: &str, public_ip: &str, mac: &str) -> Lease {
    let mut l = lease(subnet, public_ip, Some("vxlan"));
    l.backend_data = Some(json!({ "VNI": 1, "VtepMAC": mac }).into());
    l
}

/// Creates or reuses flannel.1 and returns its VtepMAC, as a node does before taking its lease.
fn vtep_mac(ns: &Netns) -> String {
    let config = ns.config(false);
    ns.block_on(move || async move {
        let dev = VxlanDevice::ensure(&config, VxlanConfig::default(), VtepMacs::default())
            .await
            .unwrap();
        dev.mac().unwrap().to_string()
    })
}

async fn start(own: &Lease, config: KernelConfig) -> VxlanBackend {
    let dev = VxlanDevice::ensure(&config, VxlanConfig::default(), VtepMacs::default())
        .await
        .unwrap();
    dev.attach(own).await.unwrap()
}

/// A (re)started node: device, own lease, then `work` on the backend.
fn on_node<F>(ns: &Netns, own: &Lease, direct_routing: bool, work: F)
where
    F: AsyncFnOnce(&mut VxlanBackend) -> anyhow::Result<()> + Send + 'static,
{
    let (own, config) = (own.clone(), ns.config(direct_routing));
    ns.block_on(move || async move {
        let mut backend = start(&own, config).await;
        work(&mut backend).await.unwrap();
    });
}

struct Hosts {
    a: Netns,
    b: Netns,
    lease_a: Lease,
    lease_b: Lease,
}

fn hosts(test: &str, mode: Mode) -> Hosts {
    let (a, b) = two_hosts(test, mode);
    let lease_a = vxlan_lease(A_SUBNET, "10.200.0.1", &vtep_mac(&a));
    let lease_b = vxlan_lease(B_SUBNET, "10.200.0.2", &vtep_mac(&b));
    Hosts {
        a,
        b,
        lease_a,
        lease_b,
    }
}

fn mac_of(l: &Lease) -> String {
    let mac = l.backend_data.as_ref().unwrap().get("VtepMAC").unwrap();
    mac.as_str().unwrap().to_string()
}

/// The neighbour, fdb entry and route flannel.md lists for one vxlan peer.
fn peer_lines(subnet_addr: &str, subnet: &str, mac: &str, public_ip: &str) -> [String; 3] {
    [
        format!("{subnet_addr} lladdr {mac} PERMANENT"),
        format!("{mac} dst {public_ip} self permanent"),
        format!("{subnet} via {subnet_addr} dev flannel.1 onlink"),
    ]
}

in_both_modes!(
    two_hosts_get_flannels_state_and_ping_over_vxlan,
    reconcile_removes_stale_peers_keeps_foreign_routes_and_is_idempotent,
    restart_after_crash_converges_to_exactly_the_leases,
    direct_routing_gives_same_segment_peers_a_plain_route,
    remove_peer_deletes_its_route_fdb_entry_and_neighbour,
);

fn two_hosts_get_flannels_state_and_ping_over_vxlan(mode: Mode) {
    let h = hosts("vx-ping", mode);
    let (la, lb) = (h.lease_a.clone(), h.lease_b.clone());
    on_node(&h.a, &h.lease_a, false, async move |be| {
        be.add_peer(&lb).await
    });
    on_node(&h.b, &h.lease_b, false, async move |be| {
        be.add_peer(&la).await
    });

    let link = h.a.sh("ip -d link show flannel.1");
    assert!(link.contains("mtu 1450"), "{link}");
    assert!(
        link.contains("vxlan id 1 local 10.200.0.1 dev eth0 "),
        "{link}"
    );
    assert!(link.contains("dstport 8472 nolearning"), "{link}");
    assert!(
        link.contains(&format!("link/ether {}", mac_of(&h.lease_a))),
        "{link}"
    );
    assert!(h
        .a
        .sh("ip -4 addr show dev flannel.1")
        .contains("inet 10.5.1.0/32"));
    assert!(h
        .b
        .sh("ip -4 addr show dev flannel.1")
        .contains("inet 10.5.2.0/32"));

    let expected_a = peer_lines("10.5.2.0", B_SUBNET, &mac_of(&h.lease_b), "10.200.0.2");
    assert_eq!(
        h.a.tunnel_state("flannel.1"),
        lines(&expected_a.each_ref().map(String::as_str))
    );
    let expected_b = peer_lines("10.5.1.0", A_SUBNET, &mac_of(&h.lease_a), "10.200.0.1");
    assert_eq!(
        h.b.tunnel_state("flannel.1"),
        lines(&expected_b.each_ref().map(String::as_str))
    );

    assert!(h.a.ping("10.5.2.0"), "flannel.1 to flannel.1");
    h.a.sh("ip addr add 10.5.1.1/32 dev lo");
    h.b.sh("ip addr add 10.5.2.1/32 dev lo");
    assert!(h.a.ping("-I 10.5.1.1 10.5.2.1"), "subnet to subnet");
    assert!(h.b.ping("-I 10.5.2.1 10.5.1.1"), "and back");
}

fn reconcile_removes_stale_peers_keeps_foreign_routes_and_is_idempotent(mode: Mode) {
    let h = hosts("vx-reconcile", mode);
    let stale = vxlan_lease("10.5.3.0/24", "10.200.0.3", "aa:bb:cc:00:00:03");
    let (lb, st) = (h.lease_b.clone(), stale.clone());
    on_node(&h.a, &h.lease_a, false, async move |be| {
        be.add_peer(&lb).await?;
        be.add_peer(&st).await
    });
    assert_eq!(h.a.tunnel_state("flannel.1").len(), 6);
    // Not ours: outside the Network, or not proto boot. A proto boot route inside the Network on
    // the iface is a leftover of a host-gw or DirectRouting run, and is ours to clean.
    h.a.sh("ip route add 192.168.50.0/24 via 10.200.0.254 dev eth0");
    h.a.sh("ip route add 10.5.77.0/24 via 10.200.0.254 dev eth0 proto static");
    h.a.sh("ip route add 10.5.99.0/24 via 10.200.0.9 dev eth0");

    let leases = vec![h.lease_a.clone(), h.lease_b.clone()];
    let once = leases.clone();
    on_node(&h.a, &h.lease_a, false, async move |be| {
        be.reconcile(&once).await
    });
    let first = h.a.tunnel_state("flannel.1");
    let mut expected = peer_lines("10.5.2.0", B_SUBNET, &mac_of(&h.lease_b), "10.200.0.2").to_vec();
    expected.push("10.5.77.0/24 via 10.200.0.254 dev eth0 proto static".into());
    expected.sort();
    assert_eq!(first, expected);
    assert!(h
        .a
        .sh("ip route")
        .contains("192.168.50.0/24 via 10.200.0.254 dev eth0"));

    on_node(&h.a, &h.lease_a, false, async move |be| {
        be.reconcile(&leases).await
    });
    assert_eq!(
        h.a.tunnel_state("flannel.1"),
        first,
        "second reconcile changed state"
    );
}

fn restart_after_crash_converges_to_exactly_the_leases(mode: Mode) {
    let h = hosts("vx-crash", mode);
    let left = vxlan_lease("10.5.3.0/24", "10.200.0.3", "aa:bb:cc:00:00:03");
    let (lb, c) = (h.lease_b.clone(), left.clone());
    on_node(&h.a, &h.lease_a, false, async move |be| {
        be.add_peer(&lb).await?;
        be.add_peer(&c).await
    });
    // Killed while re-programming b: its route is gone, its neighbour and fdb entry are left.
    h.a.sh("ip route del 10.5.2.0/24");
    // Meanwhile b restarted with a new device (new VtepMAC), c left and d joined.
    let b_new = vxlan_lease(B_SUBNET, "10.200.0.2", "aa:bb:cc:00:00:02");
    let joined = vxlan_lease("10.5.4.0/24", "10.200.0.4", "aa:bb:cc:00:00:04");
    let leases = vec![h.lease_a.clone(), b_new, joined];
    on_node(&h.a, &h.lease_a, false, async move |be| {
        be.reconcile(&leases).await
    });

    let mut expected = peer_lines("10.5.2.0", B_SUBNET, "aa:bb:cc:00:00:02", "10.200.0.2").to_vec();
    expected.extend(peer_lines(
        "10.5.4.0",
        "10.5.4.0/24",
        "aa:bb:cc:00:00:04",
        "10.200.0.4",
    ));
    expected.sort();
    assert_eq!(h.a.tunnel_state("flannel.1"), expected);
}

fn direct_routing_gives_same_segment_peers_a_plain_route(mode: Mode) {
    let h = hosts("vx-direct", mode);
    let far = vxlan_lease("10.5.3.0/24", "192.168.9.3", "aa:bb:cc:00:00:03");
    let (lb, la, f) = (h.lease_b.clone(), h.lease_a.clone(), far.clone());
    on_node(&h.a, &h.lease_a, true, async move |be| {
        be.add_peer(&lb).await?;
        be.add_peer(&f).await
    });
    on_node(&h.b, &h.lease_b, true, async move |be| {
        be.add_peer(&la).await
    });
    let mut expected = peer_lines(
        "10.5.3.0",
        "10.5.3.0/24",
        "aa:bb:cc:00:00:03",
        "192.168.9.3",
    )
    .to_vec();
    expected.push("10.5.2.0/24 via 10.200.0.2 dev eth0".into());
    expected.sort();
    assert_eq!(h.a.tunnel_state("flannel.1"), expected);
    h.a.sh("ip addr add 10.5.1.1/32 dev lo");
    h.b.sh("ip addr add 10.5.2.1/32 dev lo");
    assert!(h.a.ping("-I 10.5.1.1 10.5.2.1"));
}

#[test]
fn existing_device_is_reused_when_it_matches_and_recreated_when_not() {
    let a = Netns::new("vx-reuse", Mode::Nexthops);
    a.sh("ip link add eth0 type veth peer name eth1 && ip addr add 10.200.0.1/24 dev eth0");
    a.sh("ip link set eth0 up && ip link set eth1 up");
    let first = vtep_mac(&a);
    assert_eq!(vtep_mac(&a), first, "a matching device must be reused");

    a.sh("ip link del flannel.1");
    a.sh("ip link add flannel.1 type vxlan id 1 local 10.200.0.1 dev eth0 dstport 4789 nolearning");
    vtep_mac(&a);
    let link = a.sh("ip -d link show flannel.1");
    assert!(link.contains("dstport 8472"), "not recreated: {link}");
}

fn remove_peer_deletes_its_route_fdb_entry_and_neighbour(mode: Mode) {
    let h = hosts("vx-remove", mode);
    let other = vxlan_lease("10.5.3.0/24", "10.200.0.3", "aa:bb:cc:00:00:03");
    let (lb, o) = (h.lease_b.clone(), other.clone());
    on_node(&h.a, &h.lease_a, false, async move |be| {
        be.add_peer(&lb).await?;
        be.add_peer(&o).await?;
        be.remove_peer(&lb).await?;
        // Removing what is already gone is not an error.
        be.remove_peer(&lb).await
    });
    let expected = peer_lines("10.5.3.0", "10.5.3.0/24", "aa:bb:cc:00:00:03", "10.200.0.3");
    assert_eq!(
        h.a.tunnel_state("flannel.1"),
        lines(&expected.each_ref().map(String::as_str))
    );
}

/// flannel's `GBP`, `Learning` and `MTU` reach the device as flanneld sets them (`MTU` is the
/// underlay's: the device gets it less the encapsulation), and a device made again takes the
/// VtepMAC the node published before; a device made with other settings is recreated.
#[test]
fn gbp_learning_mtu_and_the_remembered_mac_reach_the_device() {
    let (a, _b) = two_hosts("vxopts", Mode::Nexthops);
    let config = a.config(false);
    let remembered = "0a:58:0a:05:01:07";
    let vxlan = VxlanConfig {
        gbp: true,
        learning: true,
        mtu: Some(1400),
        ..VxlanConfig::default()
    };
    let macs = VtepMacs {
        v4: Some(remembered.parse().unwrap()),
        v6: None,
    };
    let made = a.block_on(move || async move {
        let dev = VxlanDevice::ensure(&config, vxlan, macs).await.unwrap();
        dev.mac().unwrap().to_string()
    });
    assert_eq!(made, remembered);
    let link = a.sh("ip -d link show flannel.1");
    for shown in ["mtu 1350", " gbp", remembered] {
        assert!(link.contains(shown), "{shown:?} not in:\n{link}");
    }
    assert!(
        !link.contains("nolearning"),
        "learning: iproute2 says nolearning only when off\n{link}"
    );
    // Without GBP and Learning the same device is incompatible, and made anew (random MAC).
    let again = vtep_mac(&a);
    assert_ne!(again, remembered);
    let link = a.sh("ip -d link show flannel.1");
    assert!(
        link.contains("nolearning") && !link.contains(" gbp"),
        "{link}"
    );
}
