//! The host-gw backend against the real kernel: two hosts in network namespaces.

mod kernel_common;

use kernel_common::{config, lease, lines, two_hosts, Netns};
use twill_control::backend::host_gw::{HostGwBackend, HostGwSetup};
use twill_control::backend::{Backend, Setup};
use twill_control::lease::Lease;

fn on_node<F>(ns: &Netns, own: &Lease, work: F)
where
    F: AsyncFnOnce(&mut HostGwBackend) -> anyhow::Result<()> + Send + 'static,
{
    let own = own.clone();
    ns.block_on(move || async move {
        let mut backend = HostGwSetup(config(false)).attach(&own).await.unwrap();
        assert_eq!(backend.mtu(), 1500);
        work(&mut backend).await.unwrap();
    });
}

fn host_gw(subnet: &str, public_ip: &str) -> Lease {
    lease(subnet, public_ip, Some("host-gw"))
}

#[test]
fn two_hosts_route_via_public_ips_and_ping() {
    let (a, b) = two_hosts("hgw-ping");
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

#[test]
fn reconcile_and_remove_peer_converge() {
    let (a, _b) = two_hosts("hgw-reconcile");
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
