//! `--kube-subnet-mgr` on a dual-stack network, against a real kube-apiserver: two twill nodes
//! whose Nodes have an IPv4 and an IPv6 podCIDR carry container traffic of both families over
//! an IPv4+IPv6 underlay, on vxlan, host-gw, udp and twill-batch (the last over the IPv6
//! underlay), and write flanneld v0.28.9's v6 annotations; podCIDRs a dual-stack node cannot
//! lease are refused in one line naming the Node.

mod common;

use anyhow::{ensure, Context, Result};
use common::kube::{
    dual_stack_kube_cluster, dual_stack_net_conf, KubeCluster, IPV6_NETWORK, PREFIX,
};
use common::*;
use twill_lab::Proc;

fn annotation(c: &KubeCluster, node: &str, name: &str) -> Result<String> {
    let node = c.api.node(node)?;
    let key = format!("{PREFIX}/{name}");
    node.metadata
        .annotations
        .and_then(|a| a.get(&key).cloned())
        .with_context(|| format!("the Node has no {key}"))
}

/// Both nodes on `backend`: flanneld's annotations, pings of both families both ways, 8 MiB
/// over IPv4 and over IPv6 each way checked by sha256; then the nodes stop and what the
/// backend leaves behind is removed, so the next backend starts clean.
fn carries_both_families(c: &KubeCluster, backend: &str) -> Result<()> {
    carries_both_families_with(c, backend, &dual_stack_net_conf(backend))
}

/// [`carries_both_families`] with the net-conf.json `conf` of `backend`.
fn carries_both_families_with(c: &KubeCluster, backend: &str, conf: &str) -> Result<()> {
    c.set_net_conf(conf)?;
    let nodes: Vec<Proc> = vec![c.start(0, &[])?, c.start(1, &[])?];
    c.wait_peers(0, &[KubeCluster::pod_cidr(1)])?;
    c.wait_peers(1, &[KubeCluster::pod_cidr(0)])?;
    for host in 0..2 {
        annotations_are_flanneld_s(c, host, backend)?;
        let env = std::fs::read_to_string(c.subnet_file(host))?;
        let subnet6 = format!("FLANNEL_IPV6_SUBNET=fd10:0:0:{}::1/64", host + 1);
        ensure!(env.contains(&subnet6), "{env}");
    }
    let (a, b) = (c.container(0), c.container(1));
    for (from, to) in [(a, b), (b, a)] {
        let out = ping(from, to.ip, 2)?;
        ensure!(out.contains("2 received"), "{backend} IPv4: {out}");
        let out = ping(from, to.ipv6.context("a dual-stack container")?, 2)?;
        ensure!(out.contains("2 received"), "{backend} IPv6: {out}");
    }
    // A kernel backend routes the peer's IPv6 podCIDR; a userspace one the IPv6Network into
    // its TUN.
    let routed = match backend {
        "udp" | "twill-batch" => IPV6_NETWORK.to_string(),
        _ => KubeCluster::pod_cidr6(1).to_string(),
    };
    let routes = c.lab.host(0).ns.ip(&["-6", "route", "show", &routed])?;
    ensure!(
        routes.contains(&routed),
        "{backend}: no route to {routed}: {routes}"
    );
    tcp_transfer_intact(a, b, 8 << 20).with_context(|| format!("{backend}: IPv4 0 -> 1"))?;
    tcp_transfer6_intact(a, b, 8 << 20).with_context(|| format!("{backend}: IPv6 0 -> 1"))?;
    tcp_transfer6_intact(b, a, 8 << 20).with_context(|| format!("{backend}: IPv6 1 -> 0"))?;
    drop(nodes);
    for host in 0..2 {
        let peer = KubeCluster::pod_cidr(1 - host);
        let peer6 = KubeCluster::pod_cidr6(1 - host);
        c.lab.host(host).ns.sh(&format!(
            "ip link del flannel.1 2>/dev/null; ip link del flannel-v6.1 2>/dev/null; \
             ip route flush {peer}; ip -6 route flush {peer6}; true"
        ))?;
    }
    Ok(())
}

/// The Node of `host` carries flanneld's v6 annotations: `public-ipv6` is the host's IPv6
/// underlay address, `backend-v6-data` vxlan's `{"VNI":1,"VtepMAC":…}` of its flannel-v6.1
/// device (the text flanneld marshals), or JSON null on host-gw.
fn annotations_are_flanneld_s(c: &KubeCluster, host: usize, backend: &str) -> Result<()> {
    let node = KubeCluster::node_name(host);
    let get = |name| annotation(c, &node, name);
    // flanneld's udp backend writes an empty type.
    let backend_type = if backend == "udp" { "" } else { backend };
    ensure!(get("backend-type")? == backend_type, "{node}");
    ensure!(get("kube-subnet-manager")? == "true", "{node}");
    let underlay = c.lab.host(host).underlay_ip.to_string();
    ensure!(
        get("public-ip")? == underlay,
        "{node}: {}",
        get("public-ip")?
    );
    let public_ipv6 = format!("fd00:200::{}", host + 1);
    ensure!(
        get("public-ipv6")? == public_ipv6,
        "{node}: {}",
        get("public-ipv6")?
    );
    let want = match backend {
        "vxlan" => {
            let ns = &c.lab.host(host).ns;
            let mac = ns.sh("cat /sys/class/net/flannel-v6.1/address")?;
            format!(r#"{{"VNI":1,"VtepMAC":"{}"}}"#, mac.trim())
        }
        _ => "null".to_string(),
    };
    let v6_data = get("backend-v6-data")?;
    ensure!(
        v6_data == want,
        "{node}: backend-v6-data {v6_data}, want {want}"
    );
    Ok(())
}

#[test]
fn vxlan_and_host_gw_carry_a_dual_stack_network_with_flanneld_s_annotations() -> Result<()> {
    let mut c = dual_stack_kube_cluster("kube-ds", 2, &dual_stack_net_conf("vxlan"))?;
    for host in 0..2 {
        c.add_dual_stack_node(host)?;
        c.add_dual_stack_container(host)?;
    }
    carries_both_families(&c, "vxlan")?;
    carries_both_families(&c, "host-gw")
}

/// The userspace backends publish `public-ipv6` too (flanneld's udp has no IPv6 to publish), so
/// their peers are read as dual-stack leases; twill-batch sends over the IPv6 underlay.
#[test]
fn udp_and_twill_batch_carry_a_dual_stack_network_under_kubernetes() -> Result<()> {
    let mut c = dual_stack_kube_cluster("kube-dsu", 2, &dual_stack_net_conf("udp"))?;
    for host in 0..2 {
        c.add_dual_stack_node(host)?;
        c.add_dual_stack_container(host)?;
    }
    carries_both_families(&c, "udp")?;
    let over_ipv6 = dual_stack_net_conf("twill-batch").replace(
        r#""Type":"twill-batch""#,
        r#""Type":"twill-batch","Underlay":"ipv6""#,
    );
    carries_both_families_with(&c, "twill-batch", &over_ipv6)
}

/// Node `name` annotated as a dual-stack flanneld host-gw node, with `cidrs` as its podCIDRs.
fn flannel_node(c: &KubeCluster, name: &str, cidrs: &[&str]) -> Result<()> {
    let keys = [
        "kube-subnet-manager",
        "public-ip",
        "backend-type",
        "backend-data",
    ];
    let v6_keys = ["public-ipv6", "backend-v6-data"];
    let keys: Vec<String> = keys
        .iter()
        .chain(&v6_keys)
        .map(|k| format!("{PREFIX}/{k}"))
        .collect();
    let values = [
        "true",
        "10.200.0.50",
        "host-gw",
        "null",
        "fd00:200::50",
        "null",
    ];
    let annotations: Vec<(&str, &str)> = keys.iter().map(String::as_str).zip(values).collect();
    c.api.create_node_with_cidrs(name, cidrs, &annotations)
}

#[test]
fn podcidrs_a_dual_stack_node_cannot_lease_are_refused_in_one_line() -> Result<()> {
    let c = dual_stack_kube_cluster("kube-dsbad", 2, &dual_stack_net_conf("host-gw"))?;
    // The API server itself refuses podCIDRs that are more than one per family, so no Node
    // can bring twill's refusal of them (a unit test of node_cidrs shows it).
    for cidrs in [
        &["10.5.9.0/24", "fd10:0:0:9::/64", "10.5.10.0/24"][..],
        &["10.5.9.0/24", "10.5.10.0/24"][..],
    ] {
        let err = format!("{:#}", flannel_node(&c, "too-many", cidrs).unwrap_err());
        ensure!(
            err.contains("may specify no more than one CIDR for each IP family"),
            "{err}"
        );
    }

    c.add_dual_stack_node(0)?;
    let _node = c.start(0, &[])?;
    // A peer without an IPv6 podCIDR is ignored on a dual-stack network, as flanneld ignores
    // it, and named with the reason.
    flannel_node(&c, "v4-only", &["10.5.20.0/24"])?;
    eventually("the IPv4-only peer rejected", || {
        Ok(c.rejected(0)?.iter().any(|(key, why)| {
            key == "node/v4-only" && why.contains("no IPv6 podCIDR, and the network is dual-stack")
        }))
    })?;
    ensure!(c.peer_subnets(0)?.is_empty(), "{:?}", c.peer_subnets(0)?);

    let refusals = [
        (
            "v6-outside",
            &["10.5.30.0/24", "fd99:0:0:30::/64"][..],
            "the IPv6Network fd10::/56 in net-conf.json does not contain Node v6-outside's IPv6 \
             podCIDR fd99:0:0:30::/64",
        ),
        (
            "v6-only",
            &["fd10:0:0:31::/64"][..],
            "Node v6-only's podCIDRs have no IPv4 CIDR (only fd10:0:0:31::/64)",
        ),
    ];
    let kubeconfig = c.kubeconfig();
    for (name, cidrs, want) in refusals {
        c.api.create_node_with_cidrs(name, cidrs, &[])?;
        let auth = ["--kubeconfig-file", kubeconfig.to_str().context("path")?];
        let stderr = c.failing_start(1, &auth, &[("NODE_NAME", name)])?;
        let last = stderr.lines().last().unwrap_or_default();
        ensure!(last.contains(want), "{name}: {stderr}");
    }
    Ok(())
}
