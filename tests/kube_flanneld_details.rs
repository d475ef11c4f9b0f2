//! What flanneld does in Kubernetes mode that a drop-in must do too, against a real
//! kube-apiserver: the operator's `node-public-ip` annotation, the VtepMAC kept across a
//! restart that makes the device anew, and NetworkUnavailable cleared only once the node is
//! ready.

mod common;

use anyhow::{ensure, Context, Result};
use common::kube::{kube_cluster, net_conf, KubeCluster, PREFIX};
use common::*;

fn annotation(c: &KubeCluster, host: usize, name: &str) -> Result<Option<String>> {
    let node = c.api.node(&KubeCluster::node_name(host))?;
    let key = format!("{PREFIX}/{name}");
    Ok(node.metadata.annotations.and_then(|a| a.get(&key).cloned()))
}

/// The Node's NetworkUnavailable condition as (status, reason), if set.
fn network_unavailable(c: &KubeCluster, host: usize) -> Result<Option<(String, String)>> {
    let node = c.api.node(&KubeCluster::node_name(host))?;
    let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
    Ok(conditions
        .into_iter()
        .find(|c| c.type_ == "NetworkUnavailable")
        .map(|c| (c.status, c.reason.unwrap_or_default())))
}

/// An operator's `node-public-ip` on the Node, an address of the host other than its
/// interface's first, is the address the node publishes and its peers reach it at.
#[test]
fn the_node_public_ip_annotation_is_the_public_ip() -> Result<()> {
    let mut c = kube_cluster("kpubip", 3, &net_conf("vxlan", ""))?;
    let second = "10.200.0.201";
    c.lab
        .host(0)
        .ns
        .ip(&["addr", "add", &format!("{second}/24"), "dev", "eth0"])?;
    let key = format!("{PREFIX}/node-public-ip");
    let cidr = KubeCluster::pod_cidr(0).to_string();
    c.api
        .create_node(&KubeCluster::node_name(0), Some(&cidr), &[(&key, second)])?;
    c.add_node(1)?;
    let _n0 = c.start(0, &[])?;
    let _n1 = c.start(1, &[])?;
    ensure!(
        annotation(&c, 0, "public-ip")?.as_deref() == Some(second),
        "published {:?}",
        annotation(&c, 0, "public-ip")?
    );
    c.wait_peers(1, &[KubeCluster::pod_cidr(0)])?;
    let fdb = c.lab.host(1).ns.sh("bridge fdb show dev flannel.1")?;
    ensure!(fdb.contains(&format!("dst {second}")), "{fdb}");
    c.add_container(0)?;
    c.add_container(1)?;
    c.traffic(0, 1, 1 << 20)
}

/// A vxlan node restarted after its device was deleted makes it again with the VtepMAC its
/// Node's backend-data holds: the annotation does not change, and the peer's fdb and neighbour
/// entries, untouched, still carry the traffic.
#[test]
fn a_restarted_vxlan_node_keeps_its_vtep_mac() -> Result<()> {
    let mut c = kube_cluster("kvtepmac", 3, &net_conf("vxlan", ""))?;
    c.add_node(0)?;
    c.add_node(1)?;
    let mut n0 = c.start(0, &[])?;
    let _n1 = c.start(1, &[])?;
    c.wait_peers(1, &[KubeCluster::pod_cidr(0)])?;
    let before = annotation(&c, 0, "backend-data")?.context("no backend-data")?;
    n0.stop()?;
    let ns = &c.lab.host(0).ns;
    ns.ip(&["link", "del", "flannel.1"])?;
    let _n0 = c.start(0, &[])?;
    let after = annotation(&c, 0, "backend-data")?.context("no backend-data")?;
    ensure!(before == after, "backend-data {before} became {after}");
    let link = ns.ip(&["link", "show", "flannel.1"])?;
    let mac: serde_json::Value = serde_json::from_str(&before)?;
    let mac = mac["VtepMAC"].as_str().context("VtepMAC")?;
    ensure!(link.contains(mac), "flannel.1 is not {mac}:\n{link}");
    c.add_container(0)?;
    c.add_container(1)?;
    c.traffic(0, 1, 1 << 20)
}

/// A node that is not ready (its subnet file cannot be written: under /dev/null no directory
/// can be made) forwards and waits, and leaves the Node's network unavailable; one that is
/// ready marks it available.
#[test]
fn network_unavailable_is_cleared_only_once_ready() -> Result<()> {
    let c = kube_cluster("kready", 2, &net_conf("host-gw", ""))?;
    c.add_node(0)?;
    let conf = c.net_conf_path();
    let kubeconfig = c.kubeconfig();
    let args = [
        "run",
        "--iface",
        "eth0",
        "--kube-subnet-mgr",
        "--net-config-path",
        conf.to_str().context("path")?,
        "--kubeconfig-file",
        kubeconfig.to_str().context("path")?,
        "--subnet-file",
        "/dev/null/subnet.env",
    ];
    let env = [("NODE_NAME", "node-0")];
    let ns = &c.lab.host(0).ns;
    let mut waiting = spawn_twill(ns, &args, &env)?;
    let why = "not ready: cannot write the subnet file /dev/null/subnet.env";
    eventually("readyz names the subnet file", || {
        ensure!(waiting.is_running(), "twill exited:\n{}", waiting.stderr());
        Ok(http_get(ns, "127.0.0.1:9585", "/readyz").is_ok_and(|r| r.contains(why)))
    })?;
    // Tried again meanwhile, never ready.
    std::thread::sleep(std::time::Duration::from_secs(5));
    ensure!(
        network_unavailable(&c, 0)?.is_none(),
        "marked available by a node that never was ready: {:?}",
        network_unavailable(&c, 0)?
    );
    waiting.stop()?;
    let _node = c.start(0, &[])?;
    eventually("NetworkUnavailable False", || {
        Ok(network_unavailable(&c, 0)? == Some(("False".into(), "FlannelIsUp".into())))
    })
}

/// A Node registered anew without a podCIDR (a kubelet after the API server lost its data)
/// does not stop the node: it waits, and once the controller manager gives the Node its
/// podCIDR back, twill writes its annotations again and its peers reach it again (they drop it
/// meanwhile: the Node is no lease then); a different podCIDR then stops it, since the host's
/// containers are numbered from the old one.
#[test]
fn a_node_registered_anew_without_a_pod_cidr_is_waited_for() -> Result<()> {
    let mut c = kube_cluster("kreregister", 3, &net_conf("host-gw", ""))?;
    c.add_node(0)?;
    c.add_node(1)?;
    let mut node0 = c.start(0, &[])?;
    let _node1 = c.start(1, &[])?;
    c.wait_peers(1, &[KubeCluster::pod_cidr(0)])?;
    c.add_container(0)?;
    c.add_container(1)?;
    let name = KubeCluster::node_name(0);
    c.api.delete_node(&name)?;
    c.api.create_node(&name, None, &[])?;
    eventually("the wait said", || {
        Ok(node0.stderr().contains("has no podCIDR now"))
    })?;
    ensure!(node0.is_running(), "{}", node0.stderr());
    c.api
        .set_pod_cidr(&name, &KubeCluster::pod_cidr(0).to_string())?;
    eventually("annotated again", || {
        Ok(annotation(&c, 0, "public-ip")?.is_some())
    })?;
    c.wait_peers(1, &[KubeCluster::pod_cidr(0)])?;
    c.traffic(1, 0, 1 << 20)?;
    ensure!(node0.is_running(), "{}", node0.stderr());
    c.api.delete_node(&name)?;
    c.api.create_node(&name, Some("10.5.99.0/24"), &[])?;
    let stderr = node0.failure_within(std::time::Duration::from_secs(20), "twill kept running")?;
    ensure!(stderr.contains("podCIDR changed"), "{stderr}");
    Ok(())
}
