//! Hardening 4, finding 1: a lease or Node that repeats another node's VtepMAC takes none of
//! its traffic. The kernel's fdb is keyed by MAC, so a copy of B's MAC at the impostor's
//! PublicIP would repoint B's frames there; of two leases with one VtepMAC (on either device,
//! flannel.1 or flannel-v6.1) the older keeps it and the newer is in `rejected_leases`. In etcd
//! mode on a dual-stack network and in Kubernetes mode, against a real etcd and a real
//! kube-apiserver, with the fdb read back and traffic checked by sha256.

mod common;

use anyhow::{ensure, Context, Result};
use common::cluster::*;
use common::kube::{kube_cluster, net_conf, KubeCluster};
use common::refusals::{peers, rejected, settled};
use common::*;
use std::time::Duration;
use twill_lab::Netns;

const DUAL_VXLAN: &str = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/56","Backend":{"Type":"vxlan"}}"#;

/// The MAC of `dev` in `ns`.
fn mac_of(ns: &Netns, dev: &str) -> Result<String> {
    Ok(ns
        .sh(&format!("cat /sys/class/net/{dev}/address"))?
        .trim()
        .to_string())
}

/// Whether `dev`'s fdb in `ns` sends `mac`'s frames to `dst`, and nowhere else.
fn fdb_sends(ns: &Netns, dev: &str, mac: &str, dst: &str) -> Result<()> {
    let fdb = ns.exec("bridge", &["fdb", "show", "dev", dev])?;
    let entries: Vec<&str> = fdb
        .lines()
        .filter(|l| l.starts_with(mac) && l.contains(" dst "))
        .collect();
    ensure!(
        entries.len() == 1 && entries[0].contains(&format!(" dst {dst} ")),
        "{dev}'s fdb for {mac}, want dst {dst}:\n{fdb}"
    );
    Ok(())
}

/// A /64 of fd10::/56 that no lease key in etcd names.
fn unheld_subnet6(c: &Cluster, but: &[String]) -> Result<String> {
    let held = c.etcd.etcdctl(&[
        "get",
        "--prefix",
        "--keys-only",
        &format!("{PREFIX}/subnets/"),
    ])?;
    (0..=255u16)
        .rev()
        .map(|i| format!("fd10:0:0:{i:x}::"))
        .find(|s| !held.contains(&format!("&{s}-64")) && !but.contains(s))
        .context("every /64 of fd10::/56 is held")
}

#[test]
fn a_lease_repeating_a_peers_vtep_mac_of_either_family_is_refused_in_etcd_mode() -> Result<()> {
    let mut c = dual_stack_cluster("h4-vtep", 3, DUAL_VXLAN)?;
    let mut node0 = c.start(0)?;
    let mut node1 = c.start(1)?;
    c.add_dual_stack_container(0)?;
    c.add_dual_stack_container(1)?;
    let (subnet1, ip1) = (c.subnet(1)?.to_string(), c.lab.host(1).underlay_ip);
    let (ip1, ip1v6) = (ip1.to_string(), "fd00:200::2");
    let real = (subnet1.as_str(), ip1.as_str());
    settled(&c.lab.host(0).ns, real, &[])?;
    let ns1 = &c.lab.host(1).ns;
    let (mac, mac6) = (mac_of(ns1, "flannel.1")?, mac_of(ns1, "flannel-v6.1")?);

    // Two leases at the control host's addresses, where nothing answers: one with node 1's
    // flannel.1 MAC, one with its flannel-v6.1 MAC.
    let impostor_ip = c.lab.host(2).underlay_ip.to_string();
    let mut keys = Vec::new();
    let mut taken6 = Vec::new();
    for (mac4, mac6) in [
        (mac.as_str(), "02:aa:00:00:00:06"),
        ("02:aa:00:00:00:04", &mac6),
    ] {
        let v4 = c.unheld_subnet()?;
        let v6 = unheld_subnet6(&c, &taken6)?;
        let key = format!("{PREFIX}/subnets/{}-24&{v6}-64", v4.network());
        let value = format!(
            r#"{{"PublicIP":"{impostor_ip}","PublicIPv6":"fd00:200::3","BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{mac4}"}},"BackendV6Data":{{"VNI":1,"VtepMAC":"{mac6}"}}}}"#
        );
        c.etcd.etcdctl(&["put", &key, &value])?;
        taken6.push(v6);
        keys.push(key);
    }
    let why = |field: &str, mac: &str| {
        format!("its {field}.VtepMAC {mac} is already the VtepMAC of the lease {subnet1}")
    };
    let (why4, why6) = (why("BackendData", &mac), why("BackendV6Data", &mac6));
    let refused = [
        (keys[0].as_str(), why4.as_str()),
        (keys[1].as_str(), why6.as_str()),
    ];
    let check = |c: &Cluster| -> Result<()> {
        let ns0 = &c.lab.host(0).ns;
        settled(ns0, real, &refused)?;
        fdb_sends(ns0, "flannel.1", &mac, &ip1)?;
        fdb_sends(ns0, "flannel-v6.1", &mac6, ip1v6)?;
        c.dual_stack_containers_reach_each_other()?;
        tcp_transfer_intact(c.container(0), c.container(1), 4 << 20)?;
        tcp_transfer_intact(c.container(1), c.container(0), 4 << 20)
    };
    check(&c)?;
    let log = node0.stderr();
    ensure!(
        log.matches(&format!("ignoring lease {}", keys[0])).count() == 1,
        "not logged once:\n{log}"
    );
    // A restart reads them all in one list: the same outcome.
    node0.stop()?;
    node0 = c.start(0)?;
    check(&c)?;

    // Node 1 leaves for good: its MACs are free, and the two leases that waited for them are
    // peers (they share an address, which vxlan allows).
    node1.stop()?;
    let key1 = format!(
        "{}&{}-64",
        c.lease_key(subnet1.parse()?),
        c.subnet6(1)?.network()
    );
    let deleted = c.etcd.etcdctl(&["del", &key1])?;
    ensure!(deleted.trim() == "1", "{key1}: {deleted}");
    let ns0 = &c.lab.host(0).ns;
    eventually_within("both waiting leases taken", Duration::from_secs(15), || {
        Ok(rejected(ns0)?.is_empty() && peers(ns0)?.len() == 2)
    })
    .with_context(|| format!("peers {:?}, rejected {:?}", peers(ns0), rejected(ns0)))?;
    fdb_sends(ns0, "flannel.1", &mac, &impostor_ip)?;
    fdb_sends(ns0, "flannel-v6.1", &mac6, "fd00:200::3")?;
    ensure!(node0.is_running(), "{}", node0.stderr());
    Ok(())
}

#[test]
fn a_node_annotated_with_a_peers_vtep_mac_is_refused_in_kubernetes_mode() -> Result<()> {
    let mut c = kube_cluster("h4-kvtep", 3, &net_conf("vxlan", ""))?;
    c.add_node(0)?;
    c.add_node(1)?;
    let mut nodes = [c.start(0, &[])?, c.start(1, &[])?];
    c.add_container(0)?;
    c.add_container(1)?;
    let real_subnet = KubeCluster::pod_cidr(1).to_string();
    let ip1 = c.lab.host(1).underlay_ip.to_string();
    let real = (real_subnet.as_str(), ip1.as_str());
    settled(&c.lab.host(0).ns, real, &[])?;
    let mac = mac_of(&c.lab.host(1).ns, "flannel.1")?;

    // Named after node-1, should both fall in one second.
    let impostor_ip = c.lab.host(2).underlay_ip.to_string();
    let data = format!(r#"{{"VNI":1,"VtepMAC":"{mac}"}}"#);
    let spare = KubeCluster::pod_cidr(2).to_string();
    c.flannel_node_of("vtep-taker", &spare, &impostor_ip, "vxlan", &data)?;
    let why = format!(
        "its BackendData.VtepMAC {mac} is already the VtepMAC of the lease node/node-1, made \
         before it"
    );
    let refused = [("node/vtep-taker", why.as_str())];
    let ns0 = &c.lab.host(0).ns;
    settled(ns0, real, &refused)?;
    fdb_sends(ns0, "flannel.1", &mac, &ip1)?;
    let out = ping(c.container(0), c.container(1).ip, 20)?;
    ensure!(out.contains("20 received"), "{out}");
    c.traffic(0, 1, 4 << 20)?;
    ensure!(
        nodes[0]
            .stderr()
            .contains("ignoring lease node/vtep-taker: its BackendData.VtepMAC"),
        "not logged:\n{}",
        nodes[0].stderr()
    );

    // Deleting the newer changes nothing for the older; a restart lists both at once.
    c.api.delete_node("vtep-taker")?;
    settled(ns0, real, &[])?;
    c.flannel_node_of("vtep-taker", &spare, &impostor_ip, "vxlan", &data)?;
    nodes[0].stop()?;
    nodes[0] = c.start(0, &[])?;
    let ns0 = &c.lab.host(0).ns;
    settled(ns0, real, &refused)?;
    fdb_sends(ns0, "flannel.1", &mac, &ip1)?;
    c.traffic(0, 1, 4 << 20)?;
    for node in &mut nodes {
        ensure!(node.is_running(), "a node stopped:\n{}", node.stderr());
    }
    Ok(())
}
