//! The eBPF dataplane on a dual-stack network, on real etcd in a lab with an IPv4 and an IPv6
//! underlay: IPv4 and IPv6 inner packets over the IPv4 underlay, between two eBPF nodes (over
//! tcx links and over classic TC) and between an eBPF node and a TUN node, with the underlay's
//! offloads left as the kernel sets them; traffic checked by sha256 both ways. Hostile IPv6
//! datagrams counted under the userspace engine's reasons, and the device's IPv6 address and
//! route repaired as the TUN's are.

mod common;

use anyhow::{ensure, Result};
use common::cluster::*;
use common::hostile6::{fake_dual_stack_peer_with, Underlay};
use common::*;

/// A dual-stack udp network, datagrams over the IPv4 underlay (flannel's udp default).
const CONFIG: &str = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/56","Backend":{"Type":"udp"}}"#;

/// twill's device, as the tests name it (`--tun-name`).
const DEVICE: &str = "twill0";

fn ebpf(attach: &'static str) -> [&'static str; 4] {
    ["--dataplane", "ebpf", "--bpf-attach", attach]
}

const TUN: [&str; 2] = ["--dataplane", "tun"];

/// Host `host` runs the eBPF dataplane with both networks routed to its device, which has the
/// lease's IPv6 network address, and counted the transfers of both families to and from its
/// peer (16 MiB each way at least: 8 of each family).
fn ebpf_carried_both_families(c: &Cluster, host: usize) -> Result<()> {
    let ns = &c.lab.host(host).ns;
    let s = status(ns)?;
    ensure!(s["dataplane"] == "ebpf", "not the eBPF dataplane: {s}");
    let peer = &s["counters"]["peers"][0];
    for field in ["tx_bytes", "rx_bytes"] {
        let bytes = peer[field].as_u64().unwrap_or(0);
        ensure!(
            bytes > 16 << 20,
            "peer {field} {bytes} below the 16 MiB sent: {s}"
        );
    }
    let routes = ns.ip(&["-6", "route", "show", "root", "fd10::/56"])?;
    ensure!(
        routes.contains(&format!("fd10::/56 dev {DEVICE}")),
        "{routes}"
    );
    let address = format!("{}/128", c.subnet6(host)?.network());
    let addresses = ns.ip(&["-6", "addr", "show", "dev", DEVICE])?;
    ensure!(addresses.contains(&address), "no {address}: {addresses}");
    ensure!(
        !addresses.contains("fe80"),
        "a link-local address: {addresses}"
    );
    Ok(())
}

/// Two eBPF nodes attached by `attach`, carrying both families to each other.
fn two_ebpf_nodes(tag: &str, attach: &'static str) -> Result<()> {
    let mut c = dual_stack_cluster(tag, 2, CONFIG)?;
    let args = ebpf(attach);
    let _nodes = [c.start_with(0, &args, &[])?, c.start_with(1, &args, &[])?];
    transfers(&mut c)?;
    for host in 0..2 {
        ebpf_carried_both_families(&c, host)?;
    }
    c.nothing_dropped_but_the_kernels_own()
}

/// Both families both ways between the containers of the running nodes of `c`.
fn transfers(c: &mut Cluster) -> Result<()> {
    eventually("peers known", || {
        Ok(c.peer_subnets(0)?.len() == 1 && c.peer_subnets(1)?.len() == 1)
    })?;
    c.dual_stack_containers_ping_each_other()?;
    let (a, b) = (c.container(0), c.container(1));
    tcp_transfer_intact(a, b, 8 << 20)?;
    tcp_transfer_intact(b, a, 8 << 20)?;
    tcp_transfer6_intact(a, b, 8 << 20)?;
    tcp_transfer6_intact(b, a, 8 << 20)
}

#[test]
fn over_tcx_two_ebpf_nodes_carry_both_families_over_the_ipv4_underlay() -> Result<()> {
    two_ebpf_nodes("eds4x", "tcx")
}

#[test]
fn over_classic_tc_two_ebpf_nodes_carry_both_families_over_the_ipv4_underlay() -> Result<()> {
    two_ebpf_nodes("eds4c", "tc")
}

/// flannel's wire is the same whichever dataplane carries it: an eBPF node and a TUN node
/// carry both families to each other, the veth between them as the kernel set it up.
#[test]
fn an_ebpf_node_and_a_tun_node_carry_both_families() -> Result<()> {
    let mut c = dual_stack_cluster("edstun", 2, CONFIG)?;
    let args = ebpf("auto");
    let _nodes = [c.start_with(0, &args, &[])?, c.start_with(1, &TUN, &[])?];
    transfers(&mut c)?;
    ebpf_carried_both_families(&c, 0)?;
    let tun = status(&c.lab.host(1).ns)?;
    ensure!(tun["dataplane"] == "tun", "{tun}");
    c.nothing_dropped_but_the_kernels_own()
}

/// The hostile IPv6 datagrams the TUN engine counts (tests/hostile.rs), at an eBPF node: a
/// source outside the sending peer's IPv6 subnet is `spoofed_source`, a packet that is not one
/// well-formed IPv6 packet `malformed`, a stranger's port `unknown_peer`; only the good one
/// reaches the container.
#[test]
fn hostile_ipv6_datagrams_are_counted_by_the_ebpf_programs_and_never_delivered() -> Result<()> {
    let args = ebpf("auto");
    let fake = fake_dual_stack_peer_with("eds6h", "udp", "", Underlay::Ipv4, &args)?;
    let s = status(&fake.cluster.lab.host(0).ns)?;
    ensure!(s["dataplane"] == "ebpf", "not the eBPF dataplane: {s}");
    fake.attack_udp_port()
}

/// What the TUN's upkeep gives a dual-stack TUN, the eBPF device gets too: its IPv6 network
/// route and its IPv6 address, deleted, come back, and IPv6 flows again.
#[test]
fn the_ebpf_devices_ipv6_route_and_address_come_back_when_deleted() -> Result<()> {
    let mut c = dual_stack_cluster("eds6up", 2, CONFIG)?;
    let args = ebpf("auto");
    let _nodes = [c.start_with(0, &args, &[])?, c.start_with(1, &args, &[])?];
    eventually("peers known", || {
        Ok(c.peer_subnets(0)?.len() == 1 && c.peer_subnets(1)?.len() == 1)
    })?;
    c.add_dual_stack_container(0)?;
    c.add_dual_stack_container(1)?;
    let ns = &c.lab.host(0).ns;
    deleted_route_comes_back(ns, "fd10::/56", DEVICE)?;
    let own6 = format!("{}/128", c.subnet6(0)?.network());
    ns.ip(&["-6", "addr", "del", &own6, "dev", DEVICE])?;
    eventually("the address back", || {
        Ok(ns
            .ip(&["-6", "addr", "show", "dev", DEVICE])?
            .contains(&own6))
    })?;
    tcp_transfer6_intact(c.container(0), c.container(1), 1 << 20)?;
    tcp_transfer6_intact(c.container(1), c.container(0), 1 << 20)
}
