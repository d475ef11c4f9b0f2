//! Hardening 2, the kernel's state: a backend switched across a restart leaves nothing of the
//! old one carrying traffic (host-gw's routes around wireguard would carry it in the clear); a
//! device set down and up gets its route back, with `/healthz` failing while it cannot
//! forward; a second node on a TUN another one holds is refused by name.

mod common;

use anyhow::{Context, Result};
use common::cluster::*;
use common::*;
use std::time::Duration;
use twill_lab::{Netns, Proc};

/// Every ordered pair of udp, twill-batch, vxlan, host-gw and wireguard once (an Eulerian
/// circuit of the complete directed graph), host-gw -> wireguard first.
const CYCLE: [&str; 21] = [
    "host-gw",
    "wireguard",
    "udp",
    "twill-batch",
    "udp",
    "vxlan",
    "udp",
    "host-gw",
    "udp",
    "wireguard",
    "twill-batch",
    "vxlan",
    "twill-batch",
    "host-gw",
    "twill-batch",
    "wireguard",
    "vxlan",
    "host-gw",
    "vxlan",
    "wireguard",
    "host-gw",
];

/// The nodes draw their subnets below 10.5.200.0, where the routes planted as other backends'
/// leftovers lie: a node holding one of those would make it its own.
fn config(backend: &str) -> String {
    format!(
        r#"{{"Network":"10.5.0.0/16","SubnetMax":"10.5.199.0","Backend":{{"Type":"{backend}"}}}}"#
    )
}

/// Each host's wireguard key in its own file (the hosts share one filesystem).
fn key_env(c: &Cluster, host: usize) -> Result<(&'static str, String)> {
    let file = c.dir.path().join(format!("wgkey-{host}"));
    Ok(("WIREGUARD_KEY_FILE", file.to_str().context("path")?.into()))
}

fn start(c: &Cluster, host: usize, env: &[(&str, &str)]) -> Result<Proc> {
    let (key, file) = key_env(c, host)?;
    let mut all = vec![(key, file.as_str())];
    all.extend_from_slice(env);
    c.start_with_env(host, &all)
}

/// Two nodes of `backend` with a container each, which ping each other.
fn connected(tag: &str, backend: &str, env: &[(&str, &str)]) -> Result<(Cluster, Vec<Proc>)> {
    let mut c = cluster(tag, 2, &config(backend))?;
    let nodes = vec![start(&c, 0, env)?, start(&c, 1, env)?];
    c.add_container(0)?;
    c.add_container(1)?;
    pings(&c)?;
    Ok((c, nodes))
}

/// Container 0 reaches container 1, within the time a restarted peer needs to show up.
fn pings(c: &Cluster) -> Result<()> {
    let script = format!("ping -c 1 -W 1 {} || true", c.container(1).ip);
    eventually_within(
        "a ping between the containers",
        Duration::from_secs(15),
        || Ok(c.container(0).ns.sh(&script)?.contains("1 received")),
    )
}

/// What `ip route get <container 1>` on host 0 must show for `backend`.
fn path_of(backend: &str) -> &'static str {
    match backend {
        "udp" | "twill-batch" => "dev twill0",
        "vxlan" => "dev flannel.1",
        "host-gw" => "via 10.200.0.2 dev eth0",
        _ => "dev flannel-wg",
    }
}

/// Restarts both nodes with `backend`, then checks where a packet goes and that it arrives,
/// and that every route inside the network on host 0 is the new backend's or a container's.
fn switch(c: &Cluster, nodes: &mut Vec<Proc>, step: &[&str], mode: RouteMode) -> Result<()> {
    let (from, to) = (step[0], step[1]);
    for node in nodes.iter_mut() {
        node.stop()?;
    }
    c.etcd
        .etcdctl(&["put", &format!("{PREFIX}/config"), &config(to)])?;
    // A node is ready once it wrote its subnet file, after its backend is attached.
    for host in 0..2 {
        std::fs::remove_file(c.subnet_file(host))?;
    }
    *nodes = vec![start(c, 0, mode.env())?, start(c, 1, mode.env())?];
    // The nodes program each other within moments; the old backend's state never goes away.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while let Some(problem) = path_problem(c, to)? {
        let late = std::time::Instant::now() > deadline;
        anyhow::ensure!(!late, "{from} -> {to}: {problem}");
        std::thread::sleep(Duration::from_millis(50));
    }
    pings(c).with_context(|| format!("{from} -> {to}"))
}

/// What on host 0 is not yet, or no longer, `backend`'s alone: where a packet to container 1
/// goes, the routes inside the network (the backend's or the container's), vxlan's device.
fn path_problem(c: &Cluster, backend: &str) -> Result<Option<String>> {
    let ns = &c.lab.host(0).ns;
    let route = ns.ip(&["route", "get", &c.container(1).ip.to_string()])?;
    if !route.contains(path_of(backend)) {
        return Ok(Some(format!("a packet goes {route}")));
    }
    let device = path_of(backend).trim_start_matches("via 10.200.0.2 ");
    let routes = ns.ip(&["-4", "route", "show", "root", "10.5.0.0/16"])?;
    let stale = routes
        .lines()
        .find(|line| !line.contains(device) && !line.contains("dev veth"));
    if let Some(line) = stale {
        return Ok(Some(format!("left behind: {line}\n{routes}")));
    }
    let vxlan = ns.ip(&["link", "show", "flannel.1"]);
    if backend != "vxlan" && vxlan.is_ok() {
        return Ok(Some("flannel.1 kept".to_string()));
    }
    // twill's nexthop objects live only with a backend of one route per peer.
    let nexthops = ns.ip(&["nexthop", "show", "protocol", "116"])?;
    let per_peer = matches!(backend, "vxlan" | "host-gw");
    Ok((!per_peer && !nexthops.is_empty()).then(|| format!("nexthops kept:\n{nexthops}")))
}

#[test]
fn switching_between_any_two_backends_leaves_only_the_new_ones_path() -> Result<()> {
    switching_cycle("swcycle", RouteMode::Nexthops)
}

#[test]
fn switching_between_any_two_backends_with_gateway_routes_leaves_only_the_new_ones_path(
) -> Result<()> {
    switching_cycle("swcyclegw", RouteMode::GatewayRoutes)
}

fn switching_cycle(tag: &str, mode: RouteMode) -> Result<()> {
    let pairs: std::collections::HashSet<_> = CYCLE.windows(2).map(|w| (w[0], w[1])).collect();
    assert_eq!(pairs.len(), 20, "the cycle must hold every ordered pair");
    let (c, mut nodes) = connected(tag, CYCLE[0], mode.env())?;
    for step in CYCLE.windows(2) {
        switch(&c, &mut nodes, step, mode)?;
        if step[1] == "wireguard" {
            only_wireguard_on_the_wire(&c, step[0])?;
        }
        if step == ["host-gw", "wireguard"] {
            let log = nodes[0].stderr();
            let removed = format!("removed route {} via 10.200.0.2 dev eth0", c.subnet(1)?);
            anyhow::ensure!(log.contains(&removed), "{removed:?} not logged:\n{log}");
        }
    }
    Ok(())
}

/// While the containers ping, host 0's underlay carries no packet but etcd's and WireGuard's:
/// nothing in the clear, nothing in another backend's encapsulation.
fn only_wireguard_on_the_wire(c: &Cluster, from: &str) -> Result<()> {
    let ns = &c.lab.host(0).ns;
    let pcap = c.dir.path().join(format!("from-{from}.pcap"));
    let path = pcap.to_str().context("path")?;
    let filter = "ip and not tcp port 2379";
    let mut tcpdump = ns.spawn("tcpdump", &["-i", "eth0", "-n", "-U", "-w", path, filter])?;
    // tcpdump writes the file's header once it captures.
    eventually("tcpdump capturing", || Ok(pcap.exists()))?;
    std::thread::sleep(Duration::from_millis(200));
    let out = ping(c.container(0), c.container(1).ip, 5)?;
    anyhow::ensure!(out.contains("5 received"), "{out}");
    std::thread::sleep(Duration::from_millis(200));
    tcpdump.stop()?;
    let (wireguard, other) = classify(&std::fs::read(&pcap)?)?;
    let not_wireguard = format!("{from} -> wireguard: not WireGuard: {other:?}");
    anyhow::ensure!(other.is_empty(), not_wireguard);
    // 10 pings' worth; tcpdump may miss the first under load, never most.
    let few = format!("{from} -> wireguard: {wireguard} WireGuard datagrams");
    anyhow::ensure!(wireguard >= 5, few);
    Ok(())
}

/// Counts the pcap's UDP datagrams to or from port 51820, and describes every other packet.
fn classify(file: &[u8]) -> Result<(usize, Vec<String>)> {
    anyhow::ensure!(file.len() >= 24, "pcap too short");
    let (mut at, mut wireguard, mut other) = (24, 0, Vec::new());
    while at + 16 <= file.len() {
        let len = u32::from_le_bytes(file[at + 8..at + 12].try_into()?) as usize;
        let frame = file
            .get(at + 16..at + 16 + len)
            .context("frame cut short")?;
        at += 16 + len;
        let ip = frame.get(14..).context("no IP header")?;
        let ports = ip
            .get((ip[0] & 0xf) as usize * 4..)
            .and_then(|l4| l4.get(..4));
        let port = |p: &[u8], i: usize| u16::from_be_bytes([p[i], p[i + 1]]);
        match (ip[9], ports) {
            (17, Some(p)) if port(p, 0) == 51820 || port(p, 2) == 51820 => wireguard += 1,
            _ => other.push(format!(
                "proto {} {:?} -> {:?}",
                ip[9],
                &ip[12..16],
                &ip[16..20]
            )),
        }
    }
    Ok((wireguard, other))
}

/// Routes and devices that merely look like twill's are left alone by the sweep at every
/// reconcile; a host-gw route, a stale vxlan device of this network and a vxlan route on a
/// device of another network are removed.
#[test]
fn the_periodic_sweep_removes_only_what_a_backend_left() -> Result<()> {
    let (c, nodes) = connected("swkeep", "udp", &[("TWILL_RECONCILE_INTERVAL", "1")])?;
    let ns = &c.lab.host(0).ns;
    let own = c.subnet(0)?;
    // Both inside our subnet, clear of the lab's container (.1 and .2 on veth0).
    let nth = |n: u32| std::net::Ipv4Addr::from(u32::from(own.network()) + n);
    let (bridge, own_part) = (format!("{}/29", nth(201)), format!("{}/26", nth(64)));
    // Subnets above the first 100, where no lease of this two-node network is.
    let planted = [
        // Kept: a container bridge of our own subnet, a device of another name, a route
        // outside the network, and a route of no backend's form.
        "link add cni0 type bridge".to_string(),
        format!("addr add {bridge} dev cni0"),
        "link set cni0 up".into(),
        format!("route add {own_part} dev cni0"),
        "link add flannelx type bridge".into(),
        "link set flannelx up".into(),
        "route add 10.5.208.0/24 dev flannelx".into(),
        "route add 10.6.2.0/24 via 10.200.0.2 dev eth0".into(),
        "route add 10.5.209.0/24 dev eth0".into(),
        // A vxlan device of another network: kept, but its route inside ours goes.
        "link add flannel.9 type vxlan id 9 dev eth0 dstport 8472 nolearning".into(),
        "addr add 10.99.0.0/32 dev flannel.9".into(),
        "link set flannel.9 up".into(),
        "route add 10.5.211.0/24 via 10.5.211.0 dev flannel.9 onlink".into(),
        // Removed: host-gw's route, and vxlan's device made for this network.
        "route add 10.5.207.0/24 via 10.200.0.2 dev eth0".into(),
        "link add flannel.1 type vxlan id 1 dev eth0 dstport 8472 nolearning".into(),
        format!("addr add {}/32 dev flannel.1", own.network()),
        "link set flannel.1 up".into(),
        "route add 10.5.210.0/24 via 10.5.210.0 dev flannel.1 onlink".into(),
    ];
    for command in &planted {
        ns.ip(&command.split(' ').collect::<Vec<_>>())?;
    }
    eventually("the sweep", || {
        let routes = ns.ip(&["-4", "route", "show", "root", "10.5.0.0/16"])?;
        Ok(!routes.contains("10.5.207.0") && !routes.contains("10.5.211.0"))
    })?;
    anyhow::ensure!(
        ns.ip(&["link", "show", "flannel.1"]).is_err(),
        "flannel.1 kept"
    );
    ns.ip(&["link", "show", "flannel.9"])?;
    let routes = ns.ip(&["-4", "route"])?;
    for kept in [
        &own_part,
        "10.5.208.0/24",
        "10.6.2.0/24",
        "10.5.209.0/24",
        "10.5.0.0/16",
    ] {
        anyhow::ensure!(routes.contains(kept), "{kept} removed:\n{routes}");
    }
    let log = nodes[0].stderr();
    for logged in [
        "removed route 10.5.207.0/24 via 10.200.0.2 dev eth0: host-gw's",
        "removed route 10.5.211.0/24 via 10.5.211.0 dev flannel.9 onlink: vxlan's",
        "deleted flannel.1",
    ] {
        anyhow::ensure!(log.contains(logged), "{logged:?} not logged:\n{log}");
    }
    pings(&c)
}

/// `path` (a probe) from host `ns`: the status line and the body.
fn probe(ns: &Netns, path: &str) -> Result<String> {
    http_get(ns, "127.0.0.1:9585", path)
}

/// `dev` set down: `/readyz` fails naming it (`/healthz` stays 200: nothing a restart would
/// repair better), and it stays down (the reconcile is a minute away); set up again: its
/// route, `/readyz` and the ping are back at once.
fn down_and_up(c: &Cluster, dev: &str, route: &str) -> Result<()> {
    let ns = &c.lab.host(0).ns;
    ns.ip(&["link", "set", dev, "down"])?;
    eventually("/readyz failing", || {
        let ready = probe(ns, "/readyz")?;
        Ok(ready.starts_with("HTTP/1.1 503") && ready.contains(&format!("device {dev} is down")))
    })?;
    let health = probe(ns, "/healthz")?;
    anyhow::ensure!(health.starts_with("HTTP/1.1 200"), "{health}");
    std::thread::sleep(Duration::from_millis(500));
    let link = ns.ip(&["link", "show", dev])?;
    anyhow::ensure!(
        !link.contains(",UP"),
        "{dev} set up before the reconcile: {link}"
    );
    ns.ip(&["link", "set", dev, "up"])?;
    eventually("the route back and /readyz ok", || {
        let routes = ns.ip(&["route", "show", "dev", dev])?;
        Ok(routes.contains(route) && probe(ns, "/readyz")?.starts_with("HTTP/1.1 200"))
    })?;
    pings(c)
}

/// Its MTU and address changed, or the route deleted, behind its back: put back at once.
#[test]
fn a_udp_tun_set_down_and_up_gets_its_route_back() -> Result<()> {
    let (c, _nodes) = connected("tunudp", "udp", &[])?;
    down_and_up(&c, "twill0", "10.5.0.0/16")?;
    let ns = &c.lab.host(0).ns;
    ns.ip(&["route", "del", "10.5.0.0/16", "dev", "twill0"])?;
    ns.ip(&["link", "set", "twill0", "mtu", "1000"])?;
    // The kernel also flushes the routes of a device that loses its last address.
    ns.ip(&["addr", "flush", "dev", "twill0"])?;
    let address = format!("inet {}/32", c.subnet(0)?.network());
    eventually("MTU, address and route restored", || {
        let link = ns.ip(&["addr", "show", "twill0"])?;
        let routes = ns.ip(&["route", "show", "dev", "twill0"])?;
        Ok(link.contains("mtu 1472") && link.contains(&address) && routes.contains("10.5.0.0/16"))
    })?;
    pings(&c)
}

#[test]
fn a_batch_tun_set_down_and_up_gets_its_route_back() -> Result<()> {
    let (c, _nodes) = connected("tunbatch", "twill-batch", &[])?;
    down_and_up(&c, "twill0", "10.5.0.0/16")
}

/// The userspace WireGuard's TUN, and a second node on it refused by name.
#[test]
fn a_wireguard_tun_set_down_and_up_gets_its_route_back() -> Result<()> {
    let (c, _nodes) = connected("tunwg", "wireguard", &[])?;
    down_and_up(&c, "flannel-wg", "10.5.0.0/16")?;
    let refused = second_node(&c, &[])?;
    anyhow::ensure!(
        refused.contains("TUN device flannel-wg is already in use"),
        "{refused}"
    );
    pings(&c)
}

/// vxlan's device loses its peers' routes with it; they come back when it is up.
#[test]
fn a_vxlan_device_set_down_and_up_gets_its_peer_routes_back() -> Result<()> {
    let (c, _nodes) = connected("tunvx", "vxlan", &[])?;
    down_and_up(&c, "flannel.1", &c.subnet(1)?.to_string())
}

#[test]
fn a_vxlan_device_with_gateway_routes_set_down_and_up_gets_its_peer_routes_back() -> Result<()> {
    let (c, _nodes) = connected("tunvxgw", "vxlan", RouteMode::GatewayRoutes.env())?;
    down_and_up(&c, "flannel.1", &c.subnet(1)?.to_string())
}

/// The periodic reconcile sets a device that was set down up again, with its route.
#[test]
fn the_reconcile_sets_a_downed_tun_up_again() -> Result<()> {
    let (c, _nodes) = connected("tunrec", "udp", &[("TWILL_RECONCILE_INTERVAL", "2")])?;
    let ns = &c.lab.host(0).ns;
    ns.ip(&["link", "set", "twill0", "down"])?;
    eventually("/readyz failing", || {
        Ok(probe(ns, "/readyz")?.contains("device twill0 is down"))
    })?;
    eventually_within("twill0 up again", Duration::from_secs(5), || {
        let routes = ns.ip(&["route", "show", "dev", "twill0"])?;
        Ok(routes.contains("10.5.0.0/16") && probe(ns, "/readyz")?.starts_with("HTTP/1.1 200"))
    })?;
    pings(&c)
}

/// A second `twill run` on host 0 (another status port and subnet file): its last line.
fn second_node(c: &Cluster, args: &[&str]) -> Result<String> {
    let file = c.dir.path().join("second.env");
    let endpoint = c.etcd.endpoint();
    let mut all = vec!["run", "--etcd-endpoints", &endpoint, "--iface", "eth0"];
    all.extend(["--status-addr", "127.0.0.1:9586"]);
    all.extend(["--subnet-file", file.to_str().context("path")?]);
    all.extend_from_slice(args);
    let (key, key_file) = key_env(c, 0)?;
    let mut node = spawn_twill(&c.lab.host(0).ns, &all, &[(key, &key_file)])?;
    let stderr = node.failure_within(Duration::from_secs(30), "a second node ran")?;
    anyhow::ensure!(!file.exists(), "the second node wrote its subnet file");
    Ok(stderr.lines().last().unwrap_or_default().to_string())
}

/// Without the check the kernel answers a single-queue TUN's second opener with a bare
/// "Device or resource busy", and lets a multi-queue one's in as one more queue.
#[test]
fn a_second_node_on_the_same_tun_is_refused_by_name() -> Result<()> {
    for queues in ["1", "2"] {
        let c = cluster("tunbusy", 2, UDP_CONFIG)?;
        let key = key_env(&c, 0)?;
        let endpoint = c.etcd.endpoint();
        let args = ["--etcd-endpoints", &endpoint, "--queues", queues];
        let host = c.lab.host(0);
        let mut first = start_twill_with_env(host, &args, &[(key.0, &key.1)], &c.subnet_file(0))?;
        let last = second_node(&c, &["--tun-name", "twill0", "--queues", queues])?;
        for words in [
            "TUN device twill0 is already in use",
            "another twill or flanneld",
        ] {
            anyhow::ensure!(last.contains(words), "queues {queues}: {last}");
        }
        anyhow::ensure!(first.is_running(), "the first node stopped");
        host.ns.ip(&["link", "show", "twill0"])?;
    }
    Ok(())
}
