//! IPv6-only networks (`EnableIPv4` false) end to end: two twill nodes on real etcd, or under
//! `--kube-subnet-mgr` against a real kube-apiserver, in a lab with an IPv6 underlay, IPv6
//! containers reaching each other through vxlan's `flannel-v6.1` or host-gw's IPv6 routes,
//! checked by sha256. The leases are flanneld's: in etcd the key `0.0.0.0-0&<IPv6 subnet>`,
//! PublicIP 0.0.0.0, vxlan's MAC in BackendV6Data only; in Kubernetes its annotations.

mod common;

use anyhow::{ensure, Context, Result};
use common::cluster::*;
use common::kube::{dual_stack_kube_cluster, KubeCluster, IPV6_NETWORK};
use common::*;
use twill_lab::{Ipv4Net, Ipv6Net};

fn config(backend: &str) -> String {
    format!(
        r#"{{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd10::/56","Backend":{{"Type":"{backend}"}}}}"#
    )
}

/// Two nodes of `backend` on an IPv6-only network: leases, subnet files and kernel state as
/// flanneld has them, IPv6 traffic both ways, and a lease with an IPv4 subnet refused.
fn two_ipv6_only_nodes(tag: &str, backend: &str) -> Result<()> {
    let mut c = dual_stack_cluster(tag, 2, &config(backend))?;
    let _nodes = [c.start(0)?, c.start(1)?];
    eventually("peers known", || {
        Ok(c.peer_subnets(0)?.len() == 1 && c.peer_subnets(1)?.len() == 1)
    })?;
    for host in 0..2 {
        subnet_file_has_only_ipv6(&c, host)?;
        lease_has_flanneld_shape(&c, host, backend)?;
        no_ipv4_state(&c, host)?;
    }
    let peers = c.peer_subnets(0)?;
    ensure!(peers == [c.subnet6(1)?.to_string()], "{peers:?}");
    for host in 0..2 {
        let subnet6 = c.subnet6(host)?;
        add_ipv6_container(c.lab.host_mut(host), host, subnet6)?;
    }
    ipv6_flows_both_ways(c.container(0), c.container(1))?;
    a_lease_with_an_ipv4_subnet_is_refused(&c)
}

/// A container in `subnet6`. The lab's containers have an IPv4 side; here it is a local one
/// that twill never routes.
fn add_ipv6_container(host: &mut twill_lab::Host, n: usize, subnet6: Ipv6Net) -> Result<()> {
    let local = Ipv4Net::new(std::net::Ipv4Addr::new(172, 31, n as u8, 0), 24)?;
    host.add_dual_stack_container(local, subnet6)?;
    Ok(())
}

/// Ping6 both ways, then 8 MiB each way over TCP, checked by sha256.
fn ipv6_flows_both_ways(a: &twill_lab::Container, b: &twill_lab::Container) -> Result<()> {
    for (from, to) in [(a, b), (b, a)] {
        let out = ping(from, to.ipv6.context("IPv6 container")?, 2)?;
        ensure!(out.contains("2 received"), "IPv6: {out}");
    }
    tcp_transfer6_intact(a, b, 8 << 20)?;
    tcp_transfer6_intact(b, a, 8 << 20)
}

/// subnet.env has FLANNEL_IPV6_* and no IPv4 line, as flanneld writes it with EnableIPv4 false.
fn subnet_file_has_only_ipv6(c: &Cluster, host: usize) -> Result<()> {
    let text = std::fs::read_to_string(c.subnet_file(host))?;
    let subnet6: Ipv6Net = c.subnet6(host)?;
    let want = format!(
        "FLANNEL_IPV6_NETWORK=fd10::/56\nFLANNEL_IPV6_SUBNET={}/64\n",
        std::net::Ipv6Addr::from(u128::from(subnet6.network()) + 1)
    );
    ensure!(text.starts_with(&want), "host {host}:\n{text}");
    ensure!(!text.contains("FLANNEL_SUBNET="), "host {host}:\n{text}");
    Ok(())
}

/// The lease key is `0.0.0.0-0&<IPv6 subnet>` and the value has PublicIP 0.0.0.0, the
/// PublicIPv6, and for vxlan BackendV6Data without BackendData, byte for byte as flanneld.
fn lease_has_flanneld_shape(c: &Cluster, host: usize, backend: &str) -> Result<()> {
    let subnet6 = c.subnet6(host)?;
    let key = format!(
        "{PREFIX}/subnets/0.0.0.0-0&{}-{}",
        subnet6.network(),
        subnet6.prefix_len()
    );
    let value = c.etcd.etcdctl(&["get", "--print-value-only", &key])?;
    let head = format!(
        r#"{{"PublicIP":"0.0.0.0","PublicIPv6":"fd00:200::{}","BackendType":"{backend}""#,
        host + 1
    );
    ensure!(value.starts_with(&head), "{key}: {value}");
    let tail = match backend {
        "vxlan" => r#","BackendV6Data":{"VNI":1,"VtepMAC":""#,
        _ => "}",
    };
    ensure!(value[head.len()..].starts_with(tail), "{key}: {value}");
    Ok(())
}

/// No IPv4 device, address or route of twill's: the network has no IPv4.
fn no_ipv4_state(c: &Cluster, host: usize) -> Result<()> {
    let ns = &c.lab.host(host).ns;
    let links = ns.ip(&["-br", "link", "show"])?;
    ensure!(!links.contains("flannel.1"), "host {host}: {links}");
    let routes = ns.ip(&["-4", "route", "show"])?;
    let stray = routes
        .lines()
        .find(|r| r.contains("flannel") || r.contains("10.5."));
    ensure!(stray.is_none(), "host {host}: {routes}");
    Ok(())
}

/// A lease with an IPv4 subnet, written by hand, is refused by name and changes no route.
fn a_lease_with_an_ipv4_subnet_is_refused(c: &Cluster) -> Result<()> {
    let key = format!("{PREFIX}/subnets/10.5.9.0-24&fd10:0:0:99::-64");
    let value = r#"{"PublicIP":"10.200.0.9","PublicIPv6":"fd00:200::9","BackendType":"host-gw"}"#;
    c.etcd.etcdctl(&["put", &key, value])?;
    let host0 = &c.lab.host(0).ns;
    eventually("the IPv4 lease refused", || {
        let rejected = status(host0)?["rejected_leases"].clone();
        Ok(rejected.as_array().is_some_and(|r| !r.is_empty()))
    })?;
    let rejected = status(host0)?["rejected_leases"][0].clone();
    // Named by its whole key, IPv6 part included: that is where the operator finds it.
    ensure!(rejected["key"] == key, "{rejected}");
    let reason = rejected["reason"].as_str().unwrap_or_default();
    let want = "it has the IPv4 subnet 10.5.9.0/24, and this network is IPv6-only";
    ensure!(reason.starts_with(want), "{rejected}");
    let routes = host0.ip(&["-6", "route", "show"])?;
    ensure!(!routes.contains("fd10:0:0:99::"), "{routes}");
    Ok(())
}

#[test]
fn vxlan_carries_an_ipv6_only_network() -> Result<()> {
    two_ipv6_only_nodes("v6ovx", "vxlan")
}

#[test]
fn host_gw_carries_an_ipv6_only_network() -> Result<()> {
    two_ipv6_only_nodes("v6ohgw", "host-gw")
}

/// An IPv6-only network on hosts whose underlay has no IPv4 at all: etcd is reached over a
/// control link of its own, eth0 carries IPv6 alone, and twill still finds its interface,
/// writes PublicIP 0.0.0.0 and carries the traffic, on vxlan and host-gw.
#[test]
fn an_ipv6_only_network_runs_on_an_underlay_without_ipv4() -> Result<()> {
    for (tag, backend) in [("v6uvx", "vxlan"), ("v6uhgw", "host-gw")] {
        let mut c = ipv6_underlay_cluster(tag, &config(backend))?;
        let _nodes = [c.start(0)?, c.start(1)?];
        eventually("peers known", || {
            Ok(c.peer_subnets(0)?.len() == 1 && c.peer_subnets(1)?.len() == 1)
        })?;
        for host in 0..2 {
            lease_has_flanneld_shape(&c, host, backend)?;
            let subnet6 = c.subnet6(host)?;
            add_ipv6_container(c.lab.host_mut(host), host, subnet6)?;
        }
        ipv6_flows_both_ways(c.container(0), c.container(1)).context(backend)?;
    }
    Ok(())
}

/// Two hosts whose eth0 has IPv6 only, with etcd on host 0 reached over a separate IPv4
/// control link, `ctl0` (10.250.0.1 and .2), which twill does not use.
fn ipv6_underlay_cluster(tag: &str, config: &str) -> Result<Cluster> {
    twill_lab::require_root()?;
    let spec = twill_lab::LabSpec {
        hosts: 2,
        tag: tag.into(),
        ..Default::default()
    };
    let lab = twill_lab::Lab::new(spec)?.with_ipv6_underlay()?;
    let (ns0, ns1) = (&lab.host(0).ns, &lab.host(1).ns);
    let made = std::process::Command::new("ip")
        .args(["link", "add", "ctl0", "netns", ns0.name(), "type", "veth"])
        .args(["peer", "name", "ctl0", "netns", ns1.name()])
        .status()?;
    ensure!(made.success(), "cannot make the control link");
    for (ns, ip) in [(ns0, "10.250.0.1/30"), (ns1, "10.250.0.2/30")] {
        ns.ip(&["addr", "add", ip, "dev", "ctl0"])?;
        ns.ip(&["link", "set", "ctl0", "up"])?;
        ns.ip(&["-4", "addr", "flush", "dev", "eth0"])?;
    }
    let etcd = twill_lab::Etcd::listening(Some(ns0), "10.250.0.1".parse()?)?;
    etcd.etcdctl(&["put", &format!("{PREFIX}/config"), config])?;
    Ok(Cluster {
        lab,
        etcd,
        dir: scratch()?,
    })
}

/// The userspace backends and wireguard carry no IPv6-only network yet: one line, at start.
#[test]
fn an_ipv6_only_network_on_udp_is_refused_in_one_line() -> Result<()> {
    let c = dual_stack_cluster("v6oudp", 2, &config("udp"))?;
    let line = c.failing_start(0)?;
    let want = "EnableIPv4 is false: the IPv6-only network fd10::/56 is valid, but twill runs an \
                IPv6-only network on vxlan and host-gw only, not on udp";
    ensure!(line.contains(want), "{line}");
    Ok(())
}

/// `--kube-subnet-mgr` on an IPv6-only network, where flannel's IPv6-only clusters run: Nodes
/// with only an IPv6 podCIDR, flanneld's annotations (vxlan: no public-ip, no backend-data),
/// and IPv6 traffic both ways, on vxlan and then host-gw.
#[test]
fn kube_subnet_mgr_runs_an_ipv6_only_network_on_vxlan_and_host_gw() -> Result<()> {
    let mut c = dual_stack_kube_cluster("kube-v6o", 2, &kube_config("vxlan"))?;
    for host in 0..2 {
        let cidr6 = KubeCluster::pod_cidr6(host).to_string();
        let name = KubeCluster::node_name(host);
        c.api
            .create_node_with_cidrs(&name, &[cidr6.as_str()], &[])?;
        add_ipv6_container(c.lab.host_mut(host), host, KubeCluster::pod_cidr6(host))?;
    }
    for backend in ["vxlan", "host-gw"] {
        c.set_net_conf(&kube_config(backend))?;
        let nodes = [c.start(0, &[])?, c.start(1, &[])?];
        c.wait_peers(0, &[KubeCluster::pod_cidr6(1)])?;
        c.wait_peers(1, &[KubeCluster::pod_cidr6(0)])?;
        for host in 0..2 {
            kube_annotations_are_flanneld_s(&c, host, backend)?;
        }
        ipv6_flows_both_ways(c.container(0), c.container(1)).context(backend)?;
        drop(nodes);
        for host in 0..2 {
            let peer6 = KubeCluster::pod_cidr6(1 - host);
            c.lab.host(host).ns.sh(&format!(
                "ip link del flannel-v6.1 2>/dev/null; ip -6 route flush {peer6}; true"
            ))?;
        }
    }
    Ok(())
}

fn kube_config(backend: &str) -> String {
    format!(
        r#"{{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"{IPV6_NETWORK}","Backend":{{"Type":"{backend}"}}}}"#
    )
}

/// What flanneld's kube.go writes on an IPv6-only node: vxlan leaves public-ip and
/// backend-data out; host-gw writes them as 0.0.0.0 and null.
fn kube_annotations_are_flanneld_s(c: &KubeCluster, host: usize, backend: &str) -> Result<()> {
    let node = c.api.node(&KubeCluster::node_name(host))?;
    let annotations = node.metadata.annotations.unwrap_or_default();
    let get = |name: &str| {
        let key = format!("{}/{name}", common::kube::PREFIX);
        annotations.get(&key).cloned()
    };
    ensure!(
        get("backend-type").as_deref() == Some(backend),
        "{annotations:?}"
    );
    let public_ipv6 = format!("fd00:200::{}", host + 1);
    ensure!(get("public-ipv6") == Some(public_ipv6), "{annotations:?}");
    let ipv4_side = (get("public-ip"), get("backend-data"));
    let want = match backend {
        "vxlan" => (None, None),
        _ => (Some("0.0.0.0".to_string()), Some("null".to_string())),
    };
    ensure!(ipv4_side == want, "{backend}: {annotations:?}");
    Ok(())
}
