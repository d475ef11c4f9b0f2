//! The host-gw backend against the real kernel: two hosts in network namespaces.

mod kernel_common;

use kernel_common::{lease, lines, two_hosts, Mode, Netns};
use twill_control::backend::host_gw::{HostGwBackend, HostGwSetup};
use twill_control::backend::kernel::KernelConfig;
use twill_control::backend::{Backend, Setup};
use twill_control::lease::Lease;

fn on_node<F>(ns: &Netns, own: &Lease, work: F)
where
    F: AsyncFnOnce(&mut HostGwBackend) -> anyhow::Result<()> + Send + 'static,
{
    on_node_with(ns, own, ns.config(false), work)
}

/// [`on_node`] with a configuration of its own (a restart in the other mode).
fn on_node_with<F>(ns: &Netns, own: &Lease, config: KernelConfig, work: F)
where
    F: AsyncFnOnce(&mut HostGwBackend) -> anyhow::Result<()> + Send + 'static,
{
    let own = own.clone();
    ns.block_on(move || async move {
        let mut backend = HostGwSetup(config).attach(&own).await.unwrap();
        assert_eq!(backend.mtu(), 1500);
        work(&mut backend).await.unwrap();
    });
}

fn host_gw(subnet: &str, public_ip: &str) -> Lease {
    lease(subnet, public_ip, Some("host-gw"))
}

in_both_modes!(
    two_hosts_route_via_public_ips_and_ping,
    reconcile_and_remove_peer_converge,
    nexthops_of_others_are_never_touched,
);

fn two_hosts_route_via_public_ips_and_ping(mode: Mode) {
    let (a, b) = two_hosts("hgw-ping", mode);
    let (la, lb) = (
        host_gw("10.5.1.0/24", "10.200.0.1"),
        host_gw("10.5.2.0/24", "10.200.0.2"),
    );
    let (pa, pb) = (la.clone(), lb.clone());
    on_node(&a, &la, async move |be| be.add_peer(&pb).await);
    on_node(&b, &lb, async move |be| be.add_peer(&pa).await);
    assert_eq!(
        a.network_routes(),
        lines(&["10.5.2.0/24 via 10.200.0.2 dev eth0"])
    );
    assert_eq!(
        b.network_routes(),
        lines(&["10.5.1.0/24 via 10.200.0.1 dev eth0"])
    );

    a.sh("ip addr add 10.5.1.1/32 dev lo");
    b.sh("ip addr add 10.5.2.1/32 dev lo");
    assert!(a.ping("-I 10.5.1.1 10.5.2.1"));
    assert!(b.ping("-I 10.5.2.1 10.5.1.1"));
}

fn reconcile_and_remove_peer_converge(mode: Mode) {
    let (a, _b) = two_hosts("hgw-reconcile", mode);
    let own = host_gw("10.5.1.0/24", "10.200.0.1");
    let (b, c, d) = (
        host_gw("10.5.2.0/24", "10.200.0.2"),
        host_gw("10.5.3.0/24", "10.200.0.3"),
        host_gw("10.5.4.0/24", "10.200.0.4"),
    );
    // Leases of another backend type never reach a backend: the lease gate refuses them
    // (lease_check's unit tests, tests/hostile.rs).
    let (pb, pc, pd) = (b.clone(), c.clone(), d.clone());
    on_node(&a, &own, async move |be| {
        be.add_peer(&pb).await?;
        be.add_peer(&pc).await?;
        be.add_peer(&pd).await?;
        be.remove_peer(&pd).await
    });
    let before = [
        "10.5.2.0/24 via 10.200.0.2 dev eth0",
        "10.5.3.0/24 via 10.200.0.3 dev eth0",
    ];
    assert_eq!(a.network_routes(), lines(&before));

    // After a crash: c left, d (whose route was removed) is back.
    let leases = vec![own.clone(), b, d];
    let again = leases.clone();
    on_node(&a, &own, async move |be| be.reconcile(&leases).await);
    let after = [
        "10.5.2.0/24 via 10.200.0.2 dev eth0",
        "10.5.4.0/24 via 10.200.0.4 dev eth0",
    ];
    assert_eq!(a.network_routes(), lines(&after));
    on_node(&a, &own, async move |be| be.reconcile(&again).await);
    assert_eq!(a.network_routes(), lines(&after));
}

/// Nexthops twill did not make: one in twill's id range (the id 10.5.3.0/24 would get), one
/// with twill's protocol outside it, one of neither. Whatever twill does, they stay as they
/// were, and the peer whose id is taken gets a gateway route instead.
fn nexthops_of_others_are_never_touched(mode: Mode) {
    let (a, _b) = two_hosts("hgw-foreign", mode);
    let others = [
        "id 1946157059 via 10.200.0.7 dev eth0 proto static",
        "id 77 via 10.200.0.8 dev eth0 proto 116",
        "id 78 via 10.200.0.9 dev eth0",
    ];
    for nh in others {
        a.sh(&format!(
            "ip nexthop add {}",
            nh.replace(" proto ", " protocol ")
        ));
    }
    let listed = || a.sh("ip nexthop show");
    let before = listed();
    for nh in others {
        assert!(
            before.contains(nh.split(" via ").next().unwrap()),
            "{before}"
        );
    }
    let own = host_gw("10.5.1.0/24", "10.200.0.1");
    let (b, c) = (
        host_gw("10.5.2.0/24", "10.200.0.2"),
        host_gw("10.5.3.0/24", "10.200.0.3"),
    );
    let leases = vec![own.clone(), b.clone(), c.clone()];
    let (pb, pc) = (b.clone(), c.clone());
    on_node(&a, &own, async move |be| {
        be.add_peer(&pc).await?;
        be.reconcile(&leases).await?;
        be.reconcile(&leases).await?;
        be.remove_peer(&pc).await?;
        be.add_peer(&pc).await?;
        be.remove_peer(&pb).await?;
        be.remove_peer(&pc).await?;
        be.reconcile::<Lease>(&[]).await
    });
    assert_eq!(listed(), before, "another's nexthop changed");
    // The collision on the way: c's route was a gateway route, b's went through its nexthop.
    on_node(&a, &own, async move |be| be.add_peer(&c).await);
    let routes = a.sh("ip -4 route show root 10.5.0.0/16");
    assert_eq!(
        routes.trim(),
        "10.5.3.0/24 via 10.200.0.3 dev eth0",
        "{routes}"
    );
    assert_eq!(listed(), before);
}

/// A node restarted in the other mode adopts nothing of the old one's: nexthop objects give
/// way to gateway routes and back, with twill's nexthops gone in gateway mode.
#[test]
fn a_restart_in_the_other_mode_converts_every_route() {
    let (a, _b) = two_hosts("hgw-modes", Mode::Nexthops);
    let own = host_gw("10.5.1.0/24", "10.200.0.1");
    let leases = vec![
        own.clone(),
        host_gw("10.5.2.0/24", "10.200.0.2"),
        host_gw("10.5.3.0/24", "10.200.0.3"),
    ];
    let routes = [
        "10.5.2.0/24 via 10.200.0.2 dev eth0",
        "10.5.3.0/24 via 10.200.0.3 dev eth0",
    ];
    let mut gateway = a.config(false);
    gateway.nexthop_objects = false;
    for config in [a.config(false), gateway, a.config(false)] {
        let with_nexthops = config.nexthop_objects;
        let all = leases.clone();
        on_node_with(&a, &own, config, async move |be| be.reconcile(&all).await);
        let listed = a.sh("ip -4 route show root 10.5.0.0/16");
        assert_eq!(
            listed.matches(" nhid ").count(),
            if with_nexthops { 2 } else { 0 }
        );
        let nexthops = a.sh("ip nexthop show").lines().count();
        assert_eq!(nexthops, if with_nexthops { 2 } else { 0 }, "{listed}");
        if with_nexthops {
            assert_eq!(a.network_routes(), lines(&routes));
        }
    }
}
