//! A twill vxlan node and a host set up exactly as flanneld v0.28.9 sets itself up (its
//! flannel.1 device, its lease JSON in etcd, and the neighbour, fdb entry and gateway route it
//! writes for each peer) share one network, whichever way twill writes its own routes: what a
//! flanneld peer sees of twill (the lease, the VTEP, the VXLAN packets) does not depend on it.
//! No flanneld binary builds here (one of its modules is refused by the module proxy), so the
//! peer is flanneld's kernel state written with `ip` and `bridge`, as ../shared/reference/
//! flannel.md gives it.

mod common;

use anyhow::{Context, Result};
use common::cluster::*;
use common::*;
use twill_lab::{Ipv4Net, Netns};

const VXLAN: &str = r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#;
/// The flanneld-shaped host's lease, clear of the subnets twill picks (it takes the lowest).
const FLANNEL_SUBNET: &str = "10.5.77.0/24";
const FLANNEL_IP: &str = "10.200.0.2";

#[test]
fn a_flanneld_shaped_vxlan_peer_and_twill_with_nexthop_objects_share_a_network() -> Result<()> {
    flanneld_peer("vxi", RouteMode::Nexthops)
}

#[test]
fn a_flanneld_shaped_vxlan_peer_and_twill_with_gateway_routes_share_a_network() -> Result<()> {
    flanneld_peer("vxigw", RouteMode::GatewayRoutes)
}

fn flanneld_peer(tag: &str, mode: RouteMode) -> Result<()> {
    let mut c = cluster(tag, 2, VXLAN)?;
    let subnet: Ipv4Net = FLANNEL_SUBNET.parse()?;
    let mac = flannel_device(&c.lab.host(1).ns, subnet)?;
    let lease = format!(
        r#"{{"PublicIP":"{FLANNEL_IP}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{mac}"}}}}"#
    );
    c.etcd.etcdctl(&["put", &c.lease_key(subnet), &lease])?;

    let _twill = c.start_with_env(0, mode.env())?;
    let twill_subnet = c.subnet(0)?;
    eventually("twill knows the flanneld peer", || {
        Ok(c.peer_subnets(0)? == [subnet.to_string()])
    })?;
    let routes = c.lab.host(0).ns.ip(&["route", "show", FLANNEL_SUBNET])?;
    anyhow::ensure!(mode.shows_in(&routes), "{mode:?}: {routes}");
    flannel_peer_state(&c, twill_subnet)?;

    c.add_container(0)?;
    c.lab.host_mut(1).add_container(subnet)?;
    let (twills, flannels) = (c.container(0), c.container(1));
    let out = ping(flannels, twills.ip, 2)?;
    anyhow::ensure!(out.contains("2 received"), "{out}");
    tcp_transfer_intact(twills, flannels, 16 << 20)?;
    tcp_transfer_intact(flannels, twills, 16 << 20)
}

/// flannel.1 as flanneld makes it on `ns`, for the lease `subnet`; its VTEP MAC.
fn flannel_device(ns: &Netns, subnet: Ipv4Net) -> Result<String> {
    ns.sh(&format!(
        "ip link add flannel.1 type vxlan id 1 local {FLANNEL_IP} dev eth0 nolearning && \
         ip link set flannel.1 mtu 1450 && \
         ip addr add {}/32 dev flannel.1 && ip link set flannel.1 up",
        subnet.network()
    ))?;
    let link = ns.ip(&["-j", "link", "show", "flannel.1"])?;
    let link: serde_json::Value = serde_json::from_str(&link)?;
    let mac = link[0]["address"]
        .as_str()
        .context("flannel.1 has no MAC")?;
    Ok(mac.to_string())
}

/// What flanneld writes on its host (host 1) for twill's lease, read from etcd as flanneld
/// reads it.
fn flannel_peer_state(c: &Cluster, twill_subnet: Ipv4Net) -> Result<()> {
    let value = c
        .etcd
        .etcdctl(&["get", "--print-value-only", &c.lease_key(twill_subnet)])?;
    let lease: serde_json::Value = serde_json::from_str(value.trim())?;
    let mac = lease["BackendData"]["VtepMAC"]
        .as_str()
        .context("VtepMAC")?;
    let public_ip = lease["PublicIP"].as_str().context("PublicIP")?;
    let gateway = twill_subnet.network();
    c.lab.host(1).ns.sh(&format!(
        "ip neigh replace {gateway} lladdr {mac} dev flannel.1 nud permanent && \
         bridge fdb append {mac} dev flannel.1 dst {public_ip} self permanent && \
         ip route replace {twill_subnet} via {gateway} dev flannel.1 onlink"
    ))?;
    Ok(())
}
