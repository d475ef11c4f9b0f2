//! The kernel hand-off driven by the daemon and a real etcd: vxlan and host-gw nodes program
//! flannel's state and carry traffic; ipip fails clearly on a kernel without it; a node killed
//! with -9 and restarted ends with exactly the right state. The vxlan and host-gw tests run in
//! both route modes: through nexthop objects (the default) and flanneld's gateway routes.

mod common;

use anyhow::{Context, Result};
use common::cluster::*;
use common::*;

const VXLAN: &str = r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#;
const HOST_GW: &str = r#"{"Network":"10.5.0.0/16","Backend":{"Type":"host-gw"}}"#;

#[test]
fn vxlan_nodes_program_flannels_state_and_carry_traffic() -> Result<()> {
    vxlan_nodes("kvx", RouteMode::Nexthops)
}

#[test]
fn vxlan_nodes_with_gateway_routes_program_flannels_state_and_carry_traffic() -> Result<()> {
    vxlan_nodes("kvxgw", RouteMode::GatewayRoutes)
}

fn vxlan_nodes(tag: &str, mode: RouteMode) -> Result<()> {
    let mut c = cluster(tag, 2, VXLAN)?;
    let _nodes = [
        c.start_with_env(0, mode.env())?,
        c.start_with_env(1, mode.env())?,
    ];
    let (s0, s1) = (c.subnet(0)?, c.subnet(1)?);
    let value = c
        .etcd
        .etcdctl(&["get", "--print-value-only", &c.lease_key(s1)])?;
    let lease: serde_json::Value = serde_json::from_str(value.trim())?;
    assert_eq!(lease["BackendType"], "vxlan");
    assert_eq!(lease["BackendData"]["VNI"], 1);
    let mac = lease["BackendData"]["VtepMAC"]
        .as_str()
        .context("VtepMAC")?;
    let host0 = &c.lab.host(0).ns;
    let link = host0.ip(&["-d", "link", "show", "flannel.1"])?;
    assert!(
        link.contains("vxlan id 1 local 10.200.0.1 dev eth0"),
        "{link}"
    );
    let remote_net = s1.network().to_string();
    let neigh = host0.ip(&["neigh", "show", "dev", "flannel.1"])?;
    assert!(
        neigh.contains(&format!("{remote_net} lladdr {mac} PERMANENT")),
        "{neigh}"
    );
    let fdb = host0.exec("bridge", &["fdb", "show", "dev", "flannel.1"])?;
    assert!(
        fdb.contains(&format!("{mac} dst 10.200.0.2 self permanent")),
        "{fdb}"
    );
    let routes = host0.ip(&["route", "show", &s1.to_string()])?;
    assert!(
        routes.contains(&format!("via {remote_net} dev flannel.1 onlink")),
        "{routes}"
    );
    assert!(mode.shows_in(&routes), "{mode:?}: {routes}");
    let env = std::fs::read_to_string(c.subnet_file(0))?;
    assert!(env.contains("FLANNEL_MTU=1450"), "{env}");
    assert_ne!(s0, s1);
    c.traffic_between_two_nodes()
}

#[test]
fn host_gw_nodes_route_via_each_other_and_carry_traffic() -> Result<()> {
    host_gw_nodes("khgw", RouteMode::Nexthops)
}

#[test]
fn host_gw_nodes_with_gateway_routes_route_via_each_other_and_carry_traffic() -> Result<()> {
    host_gw_nodes("khgwgw", RouteMode::GatewayRoutes)
}

fn host_gw_nodes(tag: &str, mode: RouteMode) -> Result<()> {
    let mut c = cluster(tag, 2, HOST_GW)?;
    let _nodes = [
        c.start_with_env(0, mode.env())?,
        c.start_with_env(1, mode.env())?,
    ];
    let s1 = c.subnet(1)?;
    let routes = c.lab.host(0).ns.ip(&["route", "show", &s1.to_string()])?;
    assert!(routes.contains("via 10.200.0.2 dev eth0"), "{routes}");
    assert!(mode.shows_in(&routes), "{mode:?}: {routes}");
    c.traffic_between_two_nodes()
}

#[test]
fn ipip_on_this_kernel_fails_with_a_clear_message() -> Result<()> {
    let c = cluster(
        "kipip",
        2,
        r#"{"Network":"10.5.0.0/16","Backend":{"Type":"ipip"}}"#,
    )?;
    let last = c.failing_start(0)?;
    if c.lab
        .host(1)
        .ns
        .ip(&["link", "add", "probe0", "type", "ipip"])
        .is_ok()
    {
        eprintln!("this kernel has ipip; the clear-error path cannot be exercised here");
        return Ok(());
    }
    assert!(last.contains("CONFIG_NET_IPIP"), "{last}");
    assert!(last.contains("vxlan") && last.contains("host-gw"), "{last}");
    let keys = c
        .etcd
        .etcdctl(&["get", "--prefix", "--keys-only", PREFIX])?;
    assert!(!keys.contains("/subnets/"), "a subnet was claimed: {keys}");
    Ok(())
}

#[test]
fn a_node_killed_with_9_and_restarted_ends_with_exactly_the_right_state() -> Result<()> {
    killed_and_restarted("kcrash", RouteMode::Nexthops)
}

#[test]
fn a_node_with_gateway_routes_killed_with_9_and_restarted_ends_with_exactly_the_right_state(
) -> Result<()> {
    killed_and_restarted("kcrashgw", RouteMode::GatewayRoutes)
}

fn killed_and_restarted(tag: &str, mode: RouteMode) -> Result<()> {
    let c = cluster(tag, 3, VXLAN)?;
    let env = mode.env();
    let mut nodes = [
        c.start_with_env(0, env)?,
        c.start_with_env(1, env)?,
        c.start_with_env(2, env)?,
    ];
    let (s1, s2) = (c.subnet(1)?, c.subnet(2)?);
    eventually("both peers programmed", || {
        let routes = c
            .lab
            .host(0)
            .ns
            .ip(&["route", "show", "dev", "flannel.1"])?;
        Ok(routes.contains(&s1.to_string()) && routes.contains(&s2.to_string()))
    })?;
    nodes[0].kill9();
    // While node 0 is down, node 2 leaves for good: its state on node 0 is now stale.
    nodes[2].stop()?;
    c.etcd.etcdctl(&["del", &c.lease_key(s2)])?;
    let _restarted = c.start_with_env(0, env)?;
    let host0 = &c.lab.host(0).ns;
    eventually("stale peer removed", || {
        let routes = host0.ip(&["route", "show", "dev", "flannel.1"])?;
        Ok(!routes.contains(&s2.to_string()))
    })?;
    let routes = host0.ip(&["route", "show", "dev", "flannel.1"])?;
    assert_eq!(routes.lines().count(), 1, "{routes}");
    assert!(routes.contains(&s1.to_string()), "{routes}");
    assert!(mode.shows_in(&routes), "{mode:?}: {routes}");
    // Exactly the one peer's nexthop object of twill's, or none.
    let nexthops = host0.ip(&["nexthop", "show", "protocol", "116"])?;
    let want = usize::from(mode == RouteMode::Nexthops);
    assert_eq!(nexthops.lines().count(), want, "{nexthops}");
    let neigh = host0.ip(&["neigh", "show", "dev", "flannel.1", "nud", "permanent"])?;
    assert_eq!(neigh.lines().count(), 1, "{neigh}");
    let fdb = host0.exec("bridge", &["fdb", "show", "dev", "flannel.1"])?;
    let remote: Vec<_> = fdb.lines().filter(|l| l.contains(" dst ")).collect();
    assert_eq!(remote.len(), 1, "{fdb}");
    assert!(remote[0].contains("dst 10.200.0.2"), "{fdb}");
    Ok(())
}
