//! Hardening 3, the duplicate rule: a Node or lease can no longer take another node's traffic.
//! Of two leases or Nodes that claim an overlapping subnet (either family) or, where the
//! dataplane knows a peer by its address, the same PublicIP, the older keeps it and the newer
//! is refused and listed in `rejected_leases`; removing the newer changes nothing for the
//! older, removing the older lets the newer in; a node stops for "taken over" only when its
//! own key changed. Against a real kube-apiserver and a real etcd, with traffic checked by
//! sha256.

mod common;

use anyhow::{ensure, Result};
use common::bpffs::BpfFs;
use common::cluster::*;
use common::kube::{kube_cluster, net_conf, KubeCluster};
use common::refusals::settled;
use common::*;

/// Finding 1: a Node made with another Node's podCIDR and flannel's annotations (its own
/// public-ip) is refused, before and after a restart; traffic to the real node is unaffected;
/// deleting the impostor changes nothing; deleting the real Node lets the impostor in.
#[test]
fn a_node_with_another_nodes_pod_cidr_takes_none_of_its_traffic() -> Result<()> {
    let mut c = kube_cluster("h3-podcidr", 3, &net_conf("udp", ""))?;
    c.add_node(0)?;
    c.add_node(1)?;
    let mut nodes = [c.start(0, &[])?, c.start(1, &[])?];
    c.add_container(0)?;
    c.add_container(1)?;
    let real = (
        KubeCluster::pod_cidr(1).to_string(),
        c.lab.host(1).underlay_ip.to_string(),
    );
    let real = (real.0.as_str(), real.1.as_str());
    settled(&c.lab.host(0).ns, real, &[])?;
    c.traffic(0, 1, 4 << 20)?;

    // A Node made after node-1 (named after it too, should both fall in one second) with
    // node-1's podCIDR, at the control host's address, where nothing forwards.
    let impostor_ip = c.lab.host(2).underlay_ip.to_string();
    c.flannel_node("taker", real.0, &impostor_ip)?;
    let why = format!(
        "it overlaps {}, the subnet of the lease node/node-1, made before it",
        real.0
    );
    let refused = [("node/taker", why.as_str())];
    let ns0 = &c.lab.host(0).ns;
    settled(ns0, real, &refused)?;
    c.traffic(0, 1, 4 << 20)?;
    let own = format!("it overlaps this node's own lease {}", real.0);
    settled(
        &c.lab.host(1).ns,
        (
            &KubeCluster::pod_cidr(0).to_string(),
            &c.lab.host(0).underlay_ip.to_string(),
        ),
        &[("node/taker", own.as_str())],
    )?;
    let log = nodes[0].stderr();
    ensure!(
        log.contains("ignoring lease node/taker: it overlaps"),
        "not logged:\n{log}"
    );

    // Deleting the newer changes nothing for the older.
    c.api.delete_node("taker")?;
    settled(ns0, real, &[])?;
    c.traffic(0, 1, 1 << 20)?;

    // A restart lists both at once: the same outcome.
    c.flannel_node("taker", real.0, &impostor_ip)?;
    settled(ns0, real, &refused)?;
    nodes[0].stop()?;
    nodes[0] = c.start(0, &[])?;
    settled(&c.lab.host(0).ns, real, &refused)?;
    c.traffic(0, 1, 4 << 20)?;

    // Deleting the older lets the newer in.
    nodes[1].stop()?;
    c.api.delete_node("node-1")?;
    settled(&c.lab.host(0).ns, (real.0, &impostor_ip), &[])?;
    ensure!(nodes[0].is_running(), "{}", nodes[0].stderr());
    Ok(())
}

/// A dual-stack network of flannel's udp backend.
const DUAL_UDP: &str = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/56","Backend":{"Type":"udp"}}"#;

/// Finding 2: on a dual-stack etcd network, a key that repeats node 1's IPv4 subnet with
/// another IPv6 half stops no one: node 1 keeps running, node 0 keeps node 1's real lease, and
/// both refuse the copy.
#[test]
fn a_key_repeating_a_peers_ipv4_half_is_refused_and_stops_no_one() -> Result<()> {
    let mut c = dual_stack_cluster("h3-dualkey", 2, DUAL_UDP)?;
    let mut nodes = [c.start(0)?, c.start(1)?];
    let (subnet, ip) = (
        c.subnet(1)?.to_string(),
        c.lab.host(1).underlay_ip.to_string(),
    );
    let real = (subnet.as_str(), ip.as_str());
    settled(&c.lab.host(0).ns, real, &[])?;
    c.add_container(0)?;
    c.add_container(1)?;
    let out = ping(c.container(0), c.container(1).ip, 2)?;
    ensure!(out.contains("2 received"), "{out}");

    let v4 = c.subnet(1)?;
    let key = format!(
        "{PREFIX}/subnets/{}-{}&fd10:0:0:ff::-64",
        v4.network(),
        v4.prefix_len()
    );
    let value = r#"{"PublicIP":"10.200.0.99","PublicIPv6":"fd00:200::99"}"#;
    c.etcd.etcdctl(&["put", &key, value])?;
    let why = format!("it overlaps {subnet}, the subnet of the lease {subnet}, made before it");
    settled(&c.lab.host(0).ns, real, &[(key.as_str(), why.as_str())])?;
    let own = format!("it overlaps this node's own lease {subnet}");
    let peer0 = (
        c.subnet(0)?.to_string(),
        c.lab.host(0).underlay_ip.to_string(),
    );
    settled(
        &c.lab.host(1).ns,
        (&peer0.0, &peer0.1),
        &[(key.as_str(), own.as_str())],
    )?;
    for node in &mut nodes {
        ensure!(node.is_running(), "a node stopped:\n{}", node.stderr());
    }
    tcp_transfer_intact(c.container(0), c.container(1), 4 << 20)?;

    c.etcd.etcdctl(&["del", &key])?;
    settled(&c.lab.host(0).ns, real, &[])?;
    tcp_transfer_intact(c.container(1), c.container(0), 1 << 20)?;
    for node in &mut nodes {
        ensure!(node.is_running(), "a node stopped:\n{}", node.stderr());
    }
    Ok(())
}

/// Finding 3: a lease at a subnet below node 1's with node 1's PublicIP is refused on a udp
/// node (the TUN engine, then the eBPF programs), also after the node restarts and reads both
/// in one list, where subnet order used to pick the copy. Node 1 stays reachable; once node 1's
/// lease is gone, the copy is the peer.
#[test]
fn a_lease_at_a_peers_public_ip_is_refused_on_the_tun_dataplane() -> Result<()> {
    same_public_ip("h3-iptun", false)
}

#[test]
fn a_lease_at_a_peers_public_ip_is_refused_on_the_ebpf_dataplane() -> Result<()> {
    same_public_ip("h3-ipebpf", true)
}

fn same_public_ip(tag: &str, ebpf: bool) -> Result<()> {
    let mut c = cluster(tag, 2, UDP_CONFIG)?;
    let bpf = BpfFs::mount(path_in(&c.dir, "bpf"))?;
    let args0: Vec<&str> = match ebpf {
        true => vec!["--dataplane", "ebpf", "--bpf-dir", bpf.arg()],
        false => vec![],
    };
    // The nodes take the subnets their subnet files name, so the copy can lie below node 1's.
    for (host, subnet) in [(0, "10.5.100.1/24"), (1, "10.5.200.1/24")] {
        let env = format!("FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET={subnet}\n");
        std::fs::write(c.subnet_file(host), env)?;
    }
    let mut node0 = c.start_with(0, &args0, &[])?;
    let mut node1 = c.start(1)?;
    let ip1 = c.lab.host(1).underlay_ip.to_string();
    let real = ("10.5.200.0/24", ip1.as_str());
    settled(&c.lab.host(0).ns, real, &[])?;
    c.add_container(0)?;
    c.add_container(1)?;

    let copy_key = c.lease_key("10.5.3.0/24".parse()?);
    c.etcd
        .etcdctl(&["put", &copy_key, &format!(r#"{{"PublicIP":"{ip1}"}}"#)])?;
    let why = format!(
        "its PublicIP {ip1} is already the address of the lease 10.5.200.0/24, made before it"
    );
    let refused = [(copy_key.as_str(), why.as_str())];
    settled(&c.lab.host(0).ns, real, &refused)?;
    node0.stop()?;
    node0 = c.start_with(0, &args0, &[])?;
    let ns0 = &c.lab.host(0).ns;
    settled(ns0, real, &refused)?;
    let dataplane = status(ns0)?["dataplane"].clone();
    ensure!(
        dataplane == if ebpf { "ebpf" } else { "tun" },
        "{dataplane}"
    );
    let out = ping(c.container(0), c.container(1).ip, 2)?;
    ensure!(out.contains("2 received"), "{out}");
    tcp_transfer_intact(c.container(0), c.container(1), 4 << 20)?;
    tcp_transfer_intact(c.container(1), c.container(0), 4 << 20)?;

    // Node 1 leaves for good: the copy is next in line.
    node1.stop()?;
    let real_key = c.lease_key("10.5.200.0/24".parse()?);
    c.etcd.etcdctl(&["del", &real_key])?;
    settled(ns0, ("10.5.3.0/24", &ip1), &[])?;
    ensure!(node0.is_running(), "{}", node0.stderr());
    Ok(())
}
