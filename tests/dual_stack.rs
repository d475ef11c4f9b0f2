//! Dual-stack networks end to end: two twill nodes on real etcd in a lab with an IPv4 and an
//! IPv6 underlay, dual-stack containers reaching each other over both families.

mod common;

use anyhow::{ensure, Result};
use common::cluster::*;
use common::*;

fn config(backend: &str) -> String {
    format!(
        r#"{{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/56","Backend":{{"Type":"{backend}"}}}}"#
    )
}

/// Two nodes of `backend` (routes written as `mode` says), their dual-stack containers, and
/// traffic both ways in both families, checked by sha256.
fn two_dual_stack_nodes_carry_both_families(
    tag: &str,
    backend: &str,
    mode: RouteMode,
) -> Result<()> {
    let mut c = dual_stack_cluster(tag, 2, &config(backend))?;
    let _nodes = [
        c.start_with_env(0, mode.env())?,
        c.start_with_env(1, mode.env())?,
    ];
    eventually("peers known", || {
        Ok(c.peer_subnets(0)?.len() == 1 && c.peer_subnets(1)?.len() == 1)
    })?;
    leases_have_flanneld_shape(&c, backend)?;
    c.add_dual_stack_container(0)?;
    c.add_dual_stack_container(1)?;
    let (a, b) = (c.container(0), c.container(1));
    for (from, to) in [(a, b), (b, a)] {
        let out = ping(from, to.ip, 2)?;
        ensure!(out.contains("2 received"), "IPv4: {out}");
        let to6 = to.ipv6.expect("dual-stack container");
        let out = ping(from, to6, 2)?;
        ensure!(out.contains("2 received"), "IPv6: {out}");
    }
    let routes = c
        .lab
        .host(0)
        .ns
        .ip(&["-6", "route", "show", "root", "fd10::/56"])?;
    ensure!(routes.contains(&c.subnet6(1)?.to_string()), "{routes}");
    tcp_transfer_intact(a, b, 8 << 20)?;
    tcp_transfer6_intact(a, b, 8 << 20)?;
    tcp_transfer6_intact(b, a, 8 << 20)
}

/// Each node's lease is one etcd key with both subnets, and its JSON carries the PublicIPv6
/// (and vxlan's BackendV6Data), as flanneld writes a dual-stack lease.
fn leases_have_flanneld_shape(c: &Cluster, backend: &str) -> Result<()> {
    for host in 0..2 {
        let key = format!(
            "{}&{}-{}",
            c.lease_key(c.subnet(host)?),
            c.subnet6(host)?.network(),
            c.subnet6(host)?.prefix_len()
        );
        let value = c.etcd.etcdctl(&["get", "--print-value-only", &key])?;
        let public_ipv6 = format!(r#""PublicIPv6":"fd00:200::{}""#, host + 1);
        ensure!(value.contains(&public_ipv6), "{key}: {value}");
        let v6_data = value.contains(r#""BackendV6Data":{"VNI":1,"VtepMAC":""#);
        ensure!(v6_data == (backend == "vxlan"), "{key}: {value}");
    }
    Ok(())
}

#[test]
fn vxlan_carries_a_dual_stack_network_through_nexthop_objects() -> Result<()> {
    two_dual_stack_nodes_carry_both_families("dsvx", "vxlan", RouteMode::Nexthops)
}

#[test]
fn vxlan_carries_a_dual_stack_network_through_gateway_routes() -> Result<()> {
    two_dual_stack_nodes_carry_both_families("dsvxgw", "vxlan", RouteMode::GatewayRoutes)
}

#[test]
fn host_gw_carries_a_dual_stack_network() -> Result<()> {
    two_dual_stack_nodes_carry_both_families("dshgw", "host-gw", RouteMode::Nexthops)
}

#[test]
fn a_dual_stack_network_on_a_backend_without_ipv6_is_refused_in_one_line() -> Result<()> {
    let c = dual_stack_cluster("dsudp", 2, &config("udp"))?;
    let last = c.failing_start(0)?;
    ensure!(
        last.contains(
            "twill's udp backend carries no IPv6 yet (dual-stack runs on vxlan and host-gw)"
        ),
        "{last}"
    );
    Ok(())
}
