//! `--kube-subnet-mgr` on every backend this kernel has: two twill nodes whose leases are
//! their Nodes' podCIDRs in a real kube-apiserver carry container traffic, checked end to end,
//! and write flannel's annotations exactly as flanneld v0.28.9 does.

mod common;

use anyhow::{Context, Result};
use common::kube::{kube_cluster, net_conf, KubeCluster, PREFIX};
use twill_lab::Proc;

/// Starts both nodes on `conf`, checks their annotations and traffic both ways, stops them
/// and removes what a kernel backend leaves behind, so the next backend starts clean.
fn carries_traffic(c: &KubeCluster, conf: &str, env: [&[(&str, &str)]; 2]) -> Result<()> {
    c.set_net_conf(conf)?;
    let nodes: Vec<Proc> = vec![c.start(0, env[0])?, c.start(1, env[1])?];
    c.wait_peers(0, &[KubeCluster::pod_cidr(1)])?;
    c.wait_peers(1, &[KubeCluster::pod_cidr(0)])?;
    c.traffic(0, 1, 8 << 20)
        .with_context(|| format!("{conf}: 0 -> 1"))?;
    c.traffic(1, 0, 8 << 20)
        .with_context(|| format!("{conf}: 1 -> 0"))?;
    drop(nodes);
    for host in 0..2 {
        let ns = &c.lab.host(host).ns;
        let peer = KubeCluster::pod_cidr(1 - host).to_string();
        ns.sh(&format!(
            "ip link del flannel.1 2>/dev/null; ip link del flannel-wg 2>/dev/null; \
             ip route flush {peer}; ip route flush 10.5.0.0/16 exact; true"
        ))?;
    }
    Ok(())
}

fn annotation(c: &KubeCluster, host: usize, name: &str) -> Result<String> {
    let node = c.api.node(&KubeCluster::node_name(host))?;
    let key = format!("{PREFIX}/{name}");
    node.metadata
        .annotations
        .and_then(|a| a.get(&key).cloned())
        .with_context(|| format!("Node {host} has no {key}"))
}

fn two_nodes(tag: &str) -> Result<KubeCluster> {
    let mut c = kube_cluster(tag, 2, &net_conf("udp", ""))?;
    c.add_node(0)?;
    c.add_node(1)?;
    c.add_container(0)?;
    c.add_container(1)?;
    Ok(c)
}

#[test]
fn userspace_backends_carry_pod_traffic_with_flannels_annotations() -> Result<()> {
    let c = two_nodes("kube-us")?;
    let none: [&[(&str, &str)]; 2] = [&[], &[]];

    carries_traffic(&c, &net_conf("udp", ""), none)?;
    // flanneld's udp backend writes an empty type and JSON null data.
    assert_eq!(annotation(&c, 0, "backend-type")?, "");
    assert_eq!(annotation(&c, 0, "backend-data")?, "null");
    assert_eq!(
        annotation(&c, 0, "public-ip")?,
        c.lab.host(0).underlay_ip.to_string()
    );
    assert_eq!(annotation(&c, 0, "kube-subnet-manager")?, "true");
    let node = c.api.node(&KubeCluster::node_name(0))?;
    let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
    let network = conditions
        .iter()
        .find(|c| c.type_ == "NetworkUnavailable")
        .context("no NetworkUnavailable condition")?;
    assert_eq!(
        (network.status.as_str(), network.reason.as_deref()),
        ("False", Some("FlannelIsUp"))
    );

    carries_traffic(&c, &net_conf("twill-batch", ""), none)?;
    assert_eq!(annotation(&c, 1, "backend-type")?, "twill-batch");

    let keys: Vec<String> = (0..2)
        .map(|h| {
            c.dir
                .path()
                .join(format!("wgkey-{h}"))
                .display()
                .to_string()
        })
        .collect();
    let env0 = [("WIREGUARD_KEY_FILE", keys[0].as_str())];
    let env1 = [("WIREGUARD_KEY_FILE", keys[1].as_str())];
    carries_traffic(&c, &net_conf("wireguard", ""), [&env0, &env1])?;
    let data: serde_json::Value = serde_json::from_str(&annotation(&c, 0, "backend-data")?)?;
    assert!(
        data["PublicKey"].as_str().is_some_and(|k| k.len() == 44),
        "{data}"
    );
    assert_eq!(data["Port"], 51820);
    Ok(())
}

#[test]
fn kernel_backends_carry_pod_traffic_with_flannels_annotations() -> Result<()> {
    let c = two_nodes("kube-kn")?;
    let none: [&[(&str, &str)]; 2] = [&[], &[]];

    carries_traffic(&c, &net_conf("vxlan", ""), none)?;
    assert_eq!(annotation(&c, 0, "backend-type")?, "vxlan");
    let data: serde_json::Value = serde_json::from_str(&annotation(&c, 0, "backend-data")?)?;
    assert_eq!(data["VNI"], 1);
    let mac = c
        .lab
        .host(0)
        .ns
        .sh("cat /sys/class/net/flannel.1/address 2>/dev/null || true")?;
    assert!(data["VtepMAC"].as_str().is_some(), "{data} ({mac})");

    carries_traffic(&c, &net_conf("vxlan", r#","DirectRouting":true"#), none)?;
    carries_traffic(&c, &net_conf("host-gw", ""), none)?;
    assert_eq!(annotation(&c, 1, "backend-type")?, "host-gw");
    assert_eq!(annotation(&c, 1, "backend-data")?, "null");
    Ok(())
}
