//! The kernel backends on a dual-stack network against the real kernel: two hosts in network
//! namespaces with an IPv4 and an IPv6 underlay, each peer reached over both families.

mod kernel_common;

use kernel_common::{dual_stack, lease, lines, two_dual_stack_hosts, Mode, Netns};
use serde_json::json;
use twill_control::backend::host_gw::{HostGwBackend, HostGwSetup};
use twill_control::backend::kernel::KernelConfig;
use twill_control::backend::vxlan::{VtepMacs, VxlanBackend, VxlanConfig, VxlanDevice};
use twill_control::backend::{Backend, Setup};
use twill_control::lease::Lease;

/// Host a's and b's addresses: IPv4 and IPv6 subnet, PublicIP and PublicIPv6.
const A: [&str; 4] = [
    "10.5.1.0/24",
    "fd10:0:0:1::/64",
    "10.200.0.1",
    "fd00:200::1",
];
const B: [&str; 4] = [
    "10.5.2.0/24",
    "fd10:0:0:2::/64",
    "10.200.0.2",
    "fd00:200::2",
];
/// A third node that is gone: its lease is stale.
const C: [&str; 4] = [
    "10.5.3.0/24",
    "fd10:0:0:3::/64",
    "10.200.0.3",
    "fd00:200::3",
];

fn dual_lease([subnet, subnet6, ip, ip6]: [&str; 4], backend: &str) -> Lease {
    dual_stack(lease(subnet, ip, Some(backend)), subnet6, ip6)
}

/// A dual-stack vxlan node's device set-up: both devices, and its lease as it would write it.
fn vxlan_lease(ns: &Netns, host: [&str; 4]) -> Lease {
    let config = ns.dual_stack_config(false, host[3]);
    let public_ip: std::net::Ipv4Addr = host[2].parse().unwrap();
    let attrs = ns.block_on(move || async move {
        let dev = VxlanDevice::ensure(&config, VxlanConfig::default(), VtepMacs::default())
            .await
            .unwrap();
        dev.lease_attrs(public_ip.into())
    });
    let own = Lease::new(host[0].parse::<ipnet::Ipv4Net>().unwrap(), attrs);
    own.with_ipv6_subnet(host[1].parse().unwrap())
}

/// A (re)started vxlan node: devices, own lease, then `work` on the backend.
fn on_vxlan_node<F>(ns: &Netns, own: &Lease, config: KernelConfig, work: F)
where
    F: AsyncFnOnce(&mut VxlanBackend) -> anyhow::Result<()> + Send + 'static,
{
    let own = own.clone();
    ns.block_on(move || async move {
        let dev = VxlanDevice::ensure(&config, VxlanConfig::default(), VtepMacs::default())
            .await
            .unwrap();
        let mut backend = dev.attach(&own).await.unwrap();
        work(&mut backend).await.unwrap();
    });
}

/// A (re)started host-gw node.
fn on_host_gw_node<F>(ns: &Netns, own: &Lease, config: KernelConfig, work: F)
where
    F: AsyncFnOnce(&mut HostGwBackend) -> anyhow::Result<()> + Send + 'static,
{
    let own = own.clone();
    ns.block_on(move || async move {
        let mut backend = HostGwSetup(config).attach(&own).await.unwrap();
        work(&mut backend).await.unwrap();
    });
}

/// flannel-v6.1 on host a holds b's neighbour, fdb entry and route, and nothing else.
fn assert_ipv6_state_of_b_only(a: &Netns, lease_b: &Lease) {
    let mac_b = mac6_of(lease_b);
    let neigh = a.sh("ip -6 neigh show dev flannel-v6.1");
    assert_eq!(
        neigh.trim(),
        format!("fd10:0:0:2:: lladdr {mac_b} PERMANENT")
    );
    let fdb = a.sh("bridge fdb show dev flannel-v6.1");
    assert_eq!(
        fdb.trim(),
        format!("{mac_b} dst fd00:200::2 self permanent")
    );
    let route = "fd10:0:0:2::/64 via fd10:0:0:2:: dev flannel-v6.1 onlink";
    assert_eq!(a.ipv6_routes(), lines(&[route]));
}

fn mac6_of(l: &Lease) -> String {
    let mac = l.backend_v6_data.as_ref().unwrap().get("VtepMAC").unwrap();
    mac.as_str().unwrap().to_string()
}

/// Each host's IPv4 and IPv6 subnet's first address on lo, then ping both ways in both
/// families from subnet to subnet.
fn pings_both_families(a: &Netns, b: &Netns) {
    a.sh("ip addr add 10.5.1.1/32 dev lo && ip -6 addr add fd10:0:0:1::1/128 dev lo nodad");
    b.sh("ip addr add 10.5.2.1/32 dev lo && ip -6 addr add fd10:0:0:2::1/128 dev lo nodad");
    assert!(a.ping("-I 10.5.1.1 10.5.2.1"), "IPv4 a -> b");
    assert!(b.ping("-I 10.5.2.1 10.5.1.1"), "IPv4 b -> a");
    assert!(a.ping("-6 -I fd10:0:0:1::1 fd10:0:0:2::1"), "IPv6 a -> b");
    assert!(b.ping("-6 -I fd10:0:0:2::1 fd10:0:0:1::1"), "IPv6 b -> a");
}

in_both_modes!(
    vxlan_gives_each_peer_flannels_ipv6_device_state_and_pings_both_families,
    vxlan_reconcile_and_remove_peer_converge_on_the_ipv6_device,
    host_gw_routes_each_family_via_its_public_address_and_converges,
);

fn vxlan_gives_each_peer_flannels_ipv6_device_state_and_pings_both_families(mode: Mode) {
    let (a, b) = two_dual_stack_hosts("ds-vx", mode);
    let (lease_a, lease_b) = (vxlan_lease(&a, A), vxlan_lease(&b, B));
    let data6 = lease_a.backend_v6_data.as_ref().unwrap();
    assert_eq!(
        data6.json(),
        format!(r#"{{"VNI":1,"VtepMAC":"{}"}}"#, mac6_of(&lease_a)),
        "flanneld's BackendV6Data"
    );
    assert_eq!(
        lease_a.public_addrs.v6(),
        Some("fd00:200::1".parse().unwrap())
    );
    let (la, lb) = (lease_a.clone(), lease_b.clone());
    on_vxlan_node(
        &a,
        &lease_a,
        a.dual_stack_config(false, A[3]),
        async move |be| be.add_peer(&lb).await,
    );
    on_vxlan_node(
        &b,
        &lease_b,
        b.dual_stack_config(false, B[3]),
        async move |be| be.add_peer(&la).await,
    );

    let link = a.sh("ip -d link show flannel-v6.1");
    assert!(link.contains("mtu 1430"), "{link}");
    assert!(
        link.contains("vxlan id 1 local fd00:200::1 dev eth0 "),
        "{link}"
    );
    assert!(link.contains("nolearning"), "{link}");
    assert!(
        link.contains(&format!("link/ether {}", mac6_of(&lease_a))),
        "{link}"
    );
    let addr = a.sh("ip -6 addr show dev flannel-v6.1 scope global");
    assert!(addr.contains("inet6 fd10:0:0:1::/128"), "{addr}");
    let accept_ra = a.sh("cat /proc/sys/net/ipv6/conf/flannel-v6.1/accept_ra");
    assert_eq!(accept_ra.trim(), "0");

    assert_ipv6_state_of_b_only(&a, &lease_b);
    // The IPv4 side is as on an IPv4-only node, and nothing of one family is on the other's
    // device.
    assert_eq!(a.tunnel_state("flannel.1").len(), 3);
    pings_both_families(&a, &b);
}

fn vxlan_reconcile_and_remove_peer_converge_on_the_ipv6_device(mode: Mode) {
    let (a, b) = two_dual_stack_hosts("ds-vxrc", mode);
    let (lease_a, lease_b) = (vxlan_lease(&a, A), vxlan_lease(&b, B));
    let mut stale = dual_lease(C, "vxlan");
    stale.backend_data = Some(json!({"VNI": 1, "VtepMAC": "aa:bb:cc:00:00:03"}).into());
    stale.backend_v6_data = Some(json!({"VNI": 1, "VtepMAC": "aa:bb:cc:00:06:03"}).into());
    let config = a.dual_stack_config(false, A[3]);
    let (lb, st) = (lease_b.clone(), stale.clone());
    on_vxlan_node(&a, &lease_a, config.clone(), async move |be| {
        be.add_peer(&lb).await?;
        be.add_peer(&st).await
    });
    assert_eq!(a.ipv6_routes().len(), 2);
    // A route of an operator's outside the IPv6Network is not the backend's.
    a.sh("ip -6 route add fd99::/64 via fd00:200::9 dev eth0");

    let leases = vec![lease_a.clone(), lease_b.clone()];
    on_vxlan_node(&a, &lease_a, config.clone(), async move |be| {
        be.reconcile(&leases).await
    });
    assert_ipv6_state_of_b_only(&a, &lease_b);
    assert!(a
        .sh("ip -6 route")
        .contains("fd99::/64 via fd00:200::9 dev eth0"));

    let lb = lease_b.clone();
    on_vxlan_node(&a, &lease_a, config, async move |be| {
        be.remove_peer(&lb).await
    });
    assert_eq!(a.ipv6_routes(), Vec::<String>::new());
    assert_eq!(a.sh("ip -6 neigh show dev flannel-v6.1").trim(), "");
    assert_eq!(a.sh("bridge fdb show dev flannel-v6.1").trim(), "");
    assert_eq!(a.tunnel_state("flannel.1"), Vec::<String>::new());
    drop(b);
}

fn host_gw_routes_each_family_via_its_public_address_and_converges(mode: Mode) {
    let (a, b) = two_dual_stack_hosts("ds-hgw", mode);
    let (lease_a, lease_b) = (dual_lease(A, "host-gw"), dual_lease(B, "host-gw"));
    let stale = dual_lease(C, "host-gw");
    let (la, lb, st) = (lease_a.clone(), lease_b.clone(), stale.clone());
    let config_a = a.dual_stack_config(false, A[3]);
    on_host_gw_node(&a, &lease_a, config_a.clone(), async move |be| {
        be.add_peer(&lb).await?;
        be.add_peer(&st).await
    });
    on_host_gw_node(
        &b,
        &lease_b,
        b.dual_stack_config(false, B[3]),
        async move |be| be.add_peer(&la).await,
    );
    assert_eq!(
        a.ipv6_routes(),
        lines(&[
            "fd10:0:0:2::/64 via fd00:200::2 dev eth0",
            "fd10:0:0:3::/64 via fd00:200::3 dev eth0",
        ])
    );
    assert_eq!(a.network_routes().len(), 2);
    pings_both_families(&a, &b);

    let leases = vec![lease_a.clone(), lease_b.clone()];
    on_host_gw_node(&a, &lease_a, config_a.clone(), async move |be| {
        be.reconcile(&leases).await
    });
    assert_eq!(
        a.ipv6_routes(),
        lines(&["fd10:0:0:2::/64 via fd00:200::2 dev eth0"])
    );
    assert_eq!(a.network_routes().len(), 1);
    let lb = lease_b.clone();
    on_host_gw_node(&a, &lease_a, config_a, async move |be| {
        be.remove_peer(&lb).await
    });
    assert_eq!(a.ipv6_routes(), Vec::<String>::new());
    assert_eq!(a.network_routes(), Vec::<String>::new());
}
