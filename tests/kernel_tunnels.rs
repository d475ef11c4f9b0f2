//! The kernel tunnels the host's kernel lacks, for real: ipip (two twill nodes beside a real
//! flanneld v0.28.9 ipip node; DirectRouting) and the kernel's WireGuard (two kernel nodes
//! beside one on twill's userspace WireGuard, on a dual-stack network). They need a kernel with
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

/// Hosts 0 and 1 run twill, host 2 flanneld v0.28.9 itself (built by scripts/kube-parts): each
/// routes to the others through its flannel.ipip; ping and TCP both ways between every pair.
#[test]
#[ignore = "needs ipip and WireGuard in the kernel: tests/kernel_matrix.rs runs it"]
fn ipip_twill_nodes_and_a_real_flanneld_share_a_network() -> Result<()> {
    let mut c = cluster("gipip", 3, IPIP)?;
    let _twill = [c.start(0)?, c.start(1)?];
    let _flanneld = flanneld(&c, 2)?;
    for host in 0..3 {
        c.add_container(host)?;
    }
    eventually_within("every node knows the other two", LEASE_WAIT, || {
        Ok(c.peer_subnets(0)?.len() == 2 && c.peer_subnets(1)?.len() == 2)
    })?;
    let host0 = &c.lab.host(0).ns;
    let link = host0.ip(&["-d", "link", "show", "flannel.ipip"])?;
    ensure!(link.contains("ipip"), "{link}");
    let routes = host0.ip(&["route", "show", &c.subnet(1)?.to_string()])?;
    ensure!(
        routes.contains("via 10.200.0.2 dev flannel.ipip onlink"),
        "{routes}"
    );
    let s0 = c.subnet(0)?;
    let flanneld_routes = c.lab.host(2).ns.ip(&["route", "show", &s0.to_string()])?;
    ensure!(
        flanneld_routes.contains("dev flannel.ipip"),
        "flanneld's route to twill: {flanneld_routes}"
    );
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        both_ways(&c, a, b)?;
    }
    Ok(())
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

/// On a dual-stack network (Mode auto: IPv6 inside the IPv4 tunnel), hosts 0 and 1 on the
/// kernel's WireGuard, whose flannel-wg has the peer's key, endpoint and PSK as flannel sets
/// them, and host 2 on twill's userspace WireGuard (`--dataplane tun`): one wire, the same keys,
/// PSK and port; both families between every pair.
#[test]
#[ignore = "needs ipip and WireGuard in the kernel: tests/kernel_matrix.rs runs it"]
fn kernel_and_userspace_wireguard_nodes_share_a_dual_stack_network() -> Result<()> {
    let mut c = dual_stack_cluster("gwg", 3, &wg::dual_config("auto"))?;
    let _nodes = [
        start_wg(&c, 0, Path::Kernel)?,
        start_wg(&c, 1, Path::Kernel)?,
        start_wg(&c, 2, Path::Userspace)?,
    ];
    for host in 0..3 {
        c.add_dual_stack_container(host)?;
    }
    eventually_within("every node knows the other two", LEASE_WAIT, || {
        Ok((0..3).all(|h| c.peer_subnets(h).is_ok_and(|p| p.len() == 2)))
    })?;
    let dump = c
        .lab
        .host(0)
        .ns
        .exec("wg", &["show", "flannel-wg", "dump"])?;
    let key1 = wg::public_key(&c, 1)?;
    let peer = dump
        .lines()
        .skip(1)
        .find(|l| l.starts_with(&key1))
        .with_context(|| format!("no peer {key1} on flannel-wg:\n{dump}"))?;
    let fields: Vec<&str> = peer.split('\t').collect();
    ensure!(
        fields.get(1) == Some(&PSK) && fields.get(2) == Some(&"10.200.0.2:51820"),
        "flannel-wg's peer: {peer}"
    );
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        both_ways(&c, a, b)?;
        let (from, to) = (c.container(a), c.container(b));
        for (from, to) in [(from, to), (to, from)] {
            let ip6 = to.ipv6.context("dual-stack container")?;
            let out = ping(from, IpAddr::from(ip6), 2)?;
            ensure!(out.contains("2 received"), "IPv6: {out}");
            tcp_transfer6_intact(from, to, 4 << 20)?;
        }
    }
    Ok(())
}

/// A lease takes longer to cross etcd to flanneld under QEMU's emulator.
const LEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Ping and 4 MiB of TCP, sha256-checked, each way between the containers of hosts `a` and `b`.
fn both_ways(c: &Cluster, a: usize, b: usize) -> Result<()> {
    let (a, b) = (c.container(a), c.container(b));
    for (from, to) in [(a, b), (b, a)] {
        let out = ping(from, IpAddr::from(to.ip), 3)?;
        ensure!(out.contains("3 received"), "{out}");
        tcp_transfer_intact(from, to, 4 << 20)?;
    }
    Ok(())
}

/// Which WireGuard a node runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Kernel,
    Userspace,
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
