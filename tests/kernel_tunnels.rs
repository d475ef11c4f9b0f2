//! The kernel tunnels the host's kernel lacks, for real: ipip (DirectRouting too, and beside a
//! real flanneld v0.28.9 ipip node) and the kernel's WireGuard (two kernel nodes, and a kernel
//! node beside one on twill's userspace WireGuard, IPv4 and dual-stack). They need a kernel with
//! CONFIG_NET_IPIP and WireGuard: tests/kernel_matrix.rs runs them in Debian's own kernels under
//! QEMU (`--ignored`); here they are ignored with that reason, never passed unrun.

mod common;

use anyhow::{ensure, Context, Result};
use common::cluster::*;
use common::wireguard::{self as wg, PSK};
use common::*;
use std::net::IpAddr;
use twill_lab::{kube_part, Proc};

const IPIP: &str = r#"{"Network":"10.5.0.0/16","Backend":{"Type":"ipip"}}"#;
const IPIP_DIRECT: &str =
    r#"{"Network":"10.5.0.0/16","Backend":{"Type":"ipip","DirectRouting":true}}"#;

#[test]
#[ignore = "needs ipip and WireGuard in the kernel: tests/kernel_matrix.rs runs it"]
fn ipip_nodes_route_through_flannel_ipip_and_carry_traffic() -> Result<()> {
    let mut c = cluster("gipip", 2, IPIP)?;
    let _nodes = [c.start(0)?, c.start(1)?];
    let host0 = &c.lab.host(0).ns;
    let link = host0.ip(&["-d", "link", "show", "flannel.ipip"])?;
    ensure!(link.contains("ipip"), "{link}");
    let s1 = c.subnet(1)?;
    let routes = host0.ip(&["route", "show", &s1.to_string()])?;
    ensure!(
        routes.contains("via 10.200.0.2 dev flannel.ipip onlink"),
        "{routes}"
    );
    c.traffic_between_two_nodes()
}

#[test]
#[ignore = "needs ipip and WireGuard in the kernel: tests/kernel_matrix.rs runs it"]
fn ipip_with_direct_routing_routes_a_same_subnet_peer_over_the_underlay() -> Result<()> {
    let mut c = cluster("gipipd", 2, IPIP_DIRECT)?;
    let _nodes = [c.start(0)?, c.start(1)?];
    let s1 = c.subnet(1)?;
    let routes = c.lab.host(0).ns.ip(&["route", "show", &s1.to_string()])?;
    ensure!(routes.contains("via 10.200.0.2 dev eth0"), "{routes}");
    c.traffic_between_two_nodes()
}

/// Host 1 runs flanneld v0.28.9 itself (built by scripts/kube-parts), host 0 twill: each reads
/// the other's lease and routes to it through its flannel.ipip; ping and TCP both ways.
#[test]
#[ignore = "needs ipip and WireGuard in the kernel: tests/kernel_matrix.rs runs it"]
fn ipip_twill_and_a_real_flanneld_share_a_network() -> Result<()> {
    let mut c = cluster("gipipf", 2, IPIP)?;
    let _flanneld = flanneld(&c, 1)?;
    let _twill = c.start(0)?;
    c.add_container(0)?;
    c.add_container(1)?;
    eventually_within("twill knows flanneld's lease", LEASE_WAIT, || {
        Ok(c.peer_subnets(0)?.len() == 1)
    })?;
    let s0 = c.subnet(0)?;
    let flanneld_routes = c.lab.host(1).ns.ip(&["route", "show", &s0.to_string()])?;
    ensure!(
        flanneld_routes.contains("dev flannel.ipip"),
        "flanneld's route to twill: {flanneld_routes}"
    );
    both_ways(&c)
}

/// Two nodes on the kernel's WireGuard: flannel-wg is the kernel's device, with the peer's key,
/// endpoint and PSK as flannel sets them.
#[test]
#[ignore = "needs ipip and WireGuard in the kernel: tests/kernel_matrix.rs runs it"]
fn two_kernel_wireguard_nodes_carry_traffic() -> Result<()> {
    let (c, _nodes) = wg_pair("gwgk", [Path::Kernel, Path::Kernel])?;
    let dump = c
        .lab
        .host(0)
        .ns
        .exec("wg", &["show", "flannel-wg", "dump"])?;
    let peer = dump.lines().nth(1).context("no peer on flannel-wg")?;
    let fields: Vec<&str> = peer.split('\t').collect();
    ensure!(
        fields.first() == Some(&wg::public_key(&c, 1)?.as_str())
            && fields.get(1) == Some(&PSK)
            && fields.get(2) == Some(&"10.200.0.2:51820"),
        "flannel-wg's peer: {peer}"
    );
    both_ways(&c)
}

/// A kernel-WireGuard node and a userspace-WireGuard one (`--dataplane tun`) speak one wire:
/// the same keys, PSK and port.
#[test]
#[ignore = "needs ipip and WireGuard in the kernel: tests/kernel_matrix.rs runs it"]
fn kernel_and_userspace_wireguard_nodes_share_a_network() -> Result<()> {
    let (c, _nodes) = wg_pair("gwgm", [Path::Kernel, Path::Userspace])?;
    both_ways(&c)
}

/// The same on a dual-stack network (Mode auto: IPv6 inside the IPv4 tunnel), both families.
#[test]
#[ignore = "needs ipip and WireGuard in the kernel: tests/kernel_matrix.rs runs it"]
fn dual_stack_kernel_and_userspace_wireguard_nodes_share_a_network() -> Result<()> {
    let mut c = dual_stack_cluster("gwgm6", 2, &wg::dual_config("auto"))?;
    let _nodes = [
        start_wg(&c, 0, Path::Kernel)?,
        start_wg(&c, 1, Path::Userspace)?,
    ];
    c.dual_stack_containers_ping_each_other()?;
    let (a, b) = (c.container(0), c.container(1));
    tcp_transfer6_intact(a, b, 8 << 20)?;
    tcp_transfer6_intact(b, a, 8 << 20)?;
    both_ways(&c)
}

/// A lease takes longer to cross etcd to flanneld under QEMU's emulator.
const LEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Ping and 16 MiB of TCP, sha256-checked, each way between the containers of hosts 0 and 1.
fn both_ways(c: &Cluster) -> Result<()> {
    let (a, b) = (c.container(0), c.container(1));
    for (from, to) in [(a, b), (b, a)] {
        let out = ping(from, IpAddr::from(to.ip), 3)?;
        ensure!(out.contains("3 received"), "{out}");
        tcp_transfer_intact(from, to, 16 << 20)?;
    }
    Ok(())
}

/// Which WireGuard a node runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Kernel,
    Userspace,
}

/// Two wireguard nodes on the `paths` given, a container each, which know each other.
fn wg_pair(tag: &str, paths: [Path; 2]) -> Result<(Cluster, [Proc; 2])> {
    let mut c = cluster(tag, 2, &wg::config(PSK, ""))?;
    let nodes = [start_wg(&c, 0, paths[0])?, start_wg(&c, 1, paths[1])?];
    c.add_container(0)?;
    c.add_container(1)?;
    eventually_within("peers known", LEASE_WAIT, || {
        Ok(c.peer_subnets(0)?.len() == 1 && c.peer_subnets(1)?.len() == 1)
    })?;
    Ok((c, nodes))
}

/// A wireguard node on `host`, on the `path` it must say it took.
fn start_wg(c: &Cluster, host: usize, path: Path) -> Result<Proc> {
    let dataplane = match path {
        Path::Kernel => "auto",
        Path::Userspace => "tun",
    };
    let node = wg::start_on(c, host, dataplane)?;
    let said = match path {
        Path::Kernel => "wireguard: the kernel's WireGuard carries the traffic",
        Path::Userspace => {
            "wireguard: --dataplane tun; twill's userspace WireGuard carries the traffic"
        }
    };
    ensure!(node.stderr().contains(said), "{}", node.stderr());
    Ok(node)
}

/// flanneld v0.28.9 on `host` against the cluster's etcd, waited for until it wrote its subnet
/// file.
fn flanneld(c: &Cluster, host: usize) -> Result<Proc> {
    let binary = kube_part("flanneld")?;
    let binary = binary.to_str().context("flanneld path")?;
    let endpoint = c.etcd.endpoint();
    let file = c.subnet_file(host);
    let args = [
        format!("--etcd-endpoints={endpoint}"),
        "--iface=eth0".into(),
        format!("--subnet-file={}", file.display()),
        "--ip-masq=false".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut proc = c.lab.host(host).ns.spawn(binary, &args)?;
    eventually_within("flanneld's subnet file", LEASE_WAIT, || {
        ensure!(proc.is_running(), "flanneld exited:\n{}", proc.stderr());
        Ok(file.exists())
    })?;
    Ok(proc)
}
