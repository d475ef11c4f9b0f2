//! twill under flanneld's command line, as an operator adopts it: the binary swapped under
//! flanneld's unit (started as `flanneld`, Go-style flags, `FLANNELD_*` variables), the probes
//! kube-flannel.yml asks, and systemd's READY=1 for a `Type=notify` unit.

mod common;

use anyhow::{ensure, Context, Result};
use common::cluster::{cluster, Cluster};
use common::*;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::Duration;
use twill_lab::{Host, Proc};

const VXLAN: &str = r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#;
const UDP: &str = r#"{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}"#;

/// A link named `flanneld` to the twill binary, in `dir`: how an operator swaps the binary
/// under flanneld's unit.
fn flanneld_link(dir: &Path) -> Result<PathBuf> {
    let link = dir.join("flanneld");
    if !link.exists() {
        std::os::unix::fs::symlink(TWILL, &link)?;
    }
    Ok(link)
}

/// `flanneld ARGS` on `host` with `env`, waited for until it wrote its subnet file.
fn start_flanneld(c: &Cluster, host: usize, args: &[&str], env: &[(&str, &str)]) -> Result<Proc> {
    let flanneld = flanneld_link(c.dir.path())?;
    let program = flanneld.to_str().context("path")?;
    let h = c.lab.host(host);
    let mut node = h.ns.spawn_with(program, args, env)?;
    wait_ready(&h.ns, &mut node, &c.subnet_file(host))?;
    Ok(node)
}

/// subnet.env as flanneld writes it for `subnet` on a 10.5.0.0/16 network of this MTU.
fn flanneld_subnet_env(c: &Cluster, host: usize, mtu: u32) -> Result<String> {
    let subnet = c.subnet(host)?;
    let first = subnet.hosts().next().context("a host address")?;
    Ok(format!(
        "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET={first}/{}\nFLANNEL_MTU={mtu}\n\
         FLANNEL_IPMASQ=true\n",
        subnet.prefix_len()
    ))
}

/// The engines each node of a [`joins_with_flanneld_s_command_line`] runs, as `twill status`
/// names them, and the `TWILL_DATAPLANE` node 0 is given (node 1 runs the default).
struct Engines {
    node0_dataplane: Option<&'static str>,
    want: [Option<&'static str>; 2],
}

/// Node 0 from flanneld's argv in every spelling Go takes, node 1 from `FLANNELD_*` alone:
/// both join the etcd network, write flanneld's subnet.env and carry traffic between their
/// containers.
fn joins_with_flanneld_s_command_line(
    tag: &str,
    config: &str,
    mtu: u32,
    engines: Engines,
) -> Result<()> {
    let mut c = cluster(tag, 2, config)?;
    let endpoint = c.etcd.endpoint();
    let file0 = c.subnet_file(0);
    let file0 = file0.to_str().context("path")?;
    let endpoints = format!("-etcd-endpoints={endpoint}");
    let argv = [
        endpoints.as_str(),
        "--iface",
        "eth0",
        "-subnet-file",
        file0,
        "-ip-masq",
        "--iptables-resync=7",
        "-v=2",
    ];
    let dataplane: Vec<_> = engines
        .node0_dataplane
        .map(|d| ("TWILL_DATAPLANE", d))
        .into_iter()
        .collect();
    let _node0 = start_flanneld(&c, 0, &argv, &dataplane)?;
    let file1 = c.subnet_file(1);
    let env = [
        ("FLANNELD_ETCD_ENDPOINTS", endpoint.as_str()),
        ("FLANNELD_IFACE", "eth0"),
        ("FLANNELD_SUBNET_FILE", file1.to_str().context("path")?),
        ("FLANNELD_IP_MASQ", "true"),
    ];
    let mut node1 = start_flanneld(&c, 1, &[], &env)?;
    for (host, want) in engines.want.into_iter().enumerate() {
        let running = status(&c.lab.host(host).ns)?["dataplane"].clone();
        ensure!(
            running.as_str() == want,
            "host {host} runs {running}, not {want:?}"
        );
    }
    for host in 0..2 {
        let written = std::fs::read_to_string(c.subnet_file(host))?;
        ensure!(
            written == flanneld_subnet_env(&c, host, mtu)?,
            "host {host} wrote\n{written}"
        );
    }
    let log = node1.stderr();
    ensure!(
        log.contains("flags from the environment: FLANNELD_ETCD_ENDPOINTS, FLANNELD_IFACE"),
        "{log}"
    );
    c.traffic_between_two_nodes()?;
    ensure!(node1.is_running(), "{}", node1.stderr());
    Ok(())
}

#[test]
fn flanneld_s_command_line_joins_a_vxlan_network() -> Result<()> {
    let kernel = Engines {
        node0_dataplane: None,
        want: [None, None],
    };
    joins_with_flanneld_s_command_line("facevx", VXLAN, 1450, kernel)
}

/// udp under flanneld's command line: node 1 on the default dataplane, eBPF (on this veth
/// underlay too), beside node 0 on the TUN engine, chosen by `TWILL_DATAPLANE` in the
/// environment: the mixed pair a cluster has while its nodes change over, on a veth underlay
/// with the offloads the kernel gives it (no ethtool).
#[test]
fn flanneld_s_command_line_joins_a_udp_network_on_ebpf_by_default_beside_a_tun_node() -> Result<()>
{
    let mixed = Engines {
        node0_dataplane: Some("tun"),
        want: [Some("tun"), Some("ebpf")],
    };
    joins_with_flanneld_s_command_line("faceudp", UDP, 1472, mixed)
}

/// `flanneld` (or `twill` without a subcommand) with a flag flanneld lacks: refused in one
/// line naming it, with Go's exit code; `-h` lists flanneld's flags and exits 0.
#[test]
fn a_flag_flanneld_lacks_is_refused_in_one_line() -> Result<()> {
    let dir = scratch()?;
    let flanneld = flanneld_link(dir.path())?;
    for (program, args, named) in [
        (
            &flanneld,
            &["-ip-masq", "-dataplane=ebpf"][..],
            "-dataplane",
        ),
        (
            &PathBuf::from(TWILL),
            &["--kube-subnet-mgr", "--dataplane", "ebpf"],
            "-dataplane",
        ),
        (&flanneld, &["-ip-masq=maybe"], "-ip-masq"),
        (&flanneld, &["-v", "high"], "-v"),
    ] {
        let out = std::process::Command::new(program).args(args).output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(out.status.code() == Some(2), "{args:?}: {out:?}");
        ensure!(stderr.lines().count() == 1, "{args:?}: {stderr}");
        ensure!(stderr.contains(named), "{args:?}: {stderr}");
    }
    let help = std::process::Command::new(&flanneld).arg("-h").output()?;
    let usage = String::from_utf8_lossy(&help.stderr);
    ensure!(help.status.success(), "{help:?}");
    for flag in [
        "-iface-can-reach",
        "-ip-blackhole-route",
        "-vmodule",
        "FLANNELD_",
    ] {
        ensure!(usage.contains(flag), "{flag} missing:\n{usage}");
    }
    let version = std::process::Command::new(&flanneld)
        .arg("--version")
        .output()?;
    let version = String::from_utf8_lossy(&version.stdout);
    ensure!(version.starts_with("twill 0."), "{version}");
    Ok(())
}

/// `GET path` on host's health port: the status line and body.
fn probe(host: &Host, port: u16, path: &str) -> Result<String> {
    http_get(&host.ns, &format!("{}:{port}", host.underlay_ip), path)
}

/// Whether `GET path` on host's health port answers 200.
fn answers_200(host: &Host, port: u16, path: &str) -> bool {
    probe(host, port, path).is_ok_and(|a| a.starts_with("HTTP/1.1 200"))
}

/// kube-flannel.yml's probes across a start with etcd down: `/healthz` answers 200 from the
/// first second and `/readyz` 503, until etcd is back and the node has written its subnet
/// file and rules; then `/readyz` is 200. systemd hears READY=1 only then.
#[test]
fn the_probes_answer_from_the_start_and_ready_waits_for_the_node() -> Result<()> {
    let mut c = cluster("faceprobe", 2, VXLAN)?;
    c.etcd.stop()?;
    let host = c.lab.host(0);
    let port = host.ns.enter(twill_lab::free_tcp_port)?;
    let notify = c.dir.path().join("notify.sock");
    let systemd = UnixDatagram::bind(&notify)?;
    systemd.set_read_timeout(Some(Duration::from_millis(200)))?;
    let flanneld = flanneld_link(c.dir.path())?;
    let file = c.subnet_file(0);
    let args = [
        format!("-etcd-endpoints={}", c.etcd.endpoint()),
        "-iface=eth0".into(),
        format!("-subnet-file={}", file.display()),
        format!("-healthz-port={port}"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env = [("NOTIFY_SOCKET", notify.to_str().context("path")?)];
    let mut node = host
        .ns
        .spawn_with(flanneld.to_str().context("path")?, &args, &env)?;
    eventually("/healthz answering while etcd is down", || {
        Ok(answers_200(host, port, "/healthz"))
    })?;
    let ready = probe(host, port, "/readyz")?;
    ensure!(ready.starts_with("HTTP/1.1 503"), "{ready}");
    ensure!(!file.exists(), "subnet.env written without etcd");
    ensure!(
        read_notice(&systemd).is_none(),
        "READY=1 before the node was ready"
    );
    c.etcd.start()?;
    eventually("/readyz 200 once etcd is back", || {
        Ok(answers_200(host, port, "/readyz"))
    })?;
    ensure!(file.exists(), "ready without subnet.env");
    let mut notices = Vec::new();
    eventually("READY=1 for systemd", || {
        notices.extend(read_notice(&systemd));
        Ok(notices.iter().any(|n| n.lines().any(|l| l == "READY=1")))
    })?;
    ensure!(node.is_running(), "{}", node.stderr());
    Ok(())
}

/// A node started before the network config exists waits for it, as flanneld v0.28.9 does
/// (it exited before): `/healthz` 200 and `/readyz` 503 meanwhile, the missing key said once,
/// then ready once the operator puts the config. Both faces: flanneld's and `twill run`.
#[test]
fn without_a_network_config_both_faces_wait_for_it_and_say_so_once() -> Result<()> {
    let c = cluster("facenocfg", 2, VXLAN)?;
    let config_key = format!("{}/config", common::cluster::PREFIX);
    c.etcd.etcdctl(&["del", &config_key])?;
    let flanneld = flanneld_link(c.dir.path())?;
    let mut nodes = Vec::new();
    let mut ports = Vec::new();
    for i in 0..2 {
        let host = c.lab.host(i);
        let port = host.ns.enter(twill_lab::free_tcp_port)?;
        let file = c.subnet_file(i).display().to_string();
        let endpoint = c.etcd.endpoint();
        let node = match i {
            0 => host.ns.spawn(
                flanneld.to_str().context("path")?,
                &[
                    &format!("-etcd-endpoints={endpoint}"),
                    "-iface=eth0",
                    &format!("-subnet-file={file}"),
                    &format!("-healthz-port={port}"),
                ],
            )?,
            _ => spawn_twill(
                &host.ns,
                &[
                    "run",
                    "--etcd-endpoints",
                    &endpoint,
                    "--iface",
                    "eth0",
                    "--subnet-file",
                    &file,
                    "--healthz-port",
                    &port.to_string(),
                ],
                &[],
            )?,
        };
        nodes.push(node);
        ports.push(port);
    }
    let said = "flannel network config not found";
    for (i, node) in nodes.iter_mut().enumerate() {
        let (host, port) = (c.lab.host(i), ports[i]);
        eventually_within(
            "/healthz 200 without a config",
            Duration::from_secs(20),
            || {
                ensure!(node.is_running(), "gave up: {}", node.stderr());
                Ok(answers_200(host, port, "/healthz"))
            },
        )?;
        eventually("the missing config said", || {
            Ok(node.stderr().contains(said))
        })?;
    }
    std::thread::sleep(Duration::from_secs(3));
    for (i, node) in nodes.iter_mut().enumerate() {
        ensure!(node.is_running(), "gave up: {}", node.stderr());
        let ready = probe(c.lab.host(i), ports[i], "/readyz")?;
        ensure!(ready.starts_with("HTTP/1.1 503"), "{ready}");
        ensure!(
            node.stderr().matches(said).count() == 1,
            "said more than once:\n{}",
            node.stderr()
        );
    }
    c.etcd.etcdctl(&["put", &config_key, VXLAN])?;
    for (i, node) in nodes.iter_mut().enumerate() {
        let (host, port) = (c.lab.host(i), ports[i]);
        eventually_within(
            "/readyz 200 once the config is there",
            Duration::from_secs(30),
            || {
                ensure!(node.is_running(), "{}", node.stderr());
                Ok(answers_200(host, port, "/readyz"))
            },
        )?;
        ensure!(c.subnet_file(i).exists(), "ready without subnet.env");
    }
    Ok(())
}

/// One datagram from the notify socket, if one comes within its read timeout.
fn read_notice(socket: &UnixDatagram) -> Option<String> {
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// `-ip-blackhole-route`: a blackhole route for the node's subnet, put back within a resync
/// when deleted.
#[test]
fn the_blackhole_route_is_added_and_kept() -> Result<()> {
    let c = cluster("faceblack", 2, VXLAN)?;
    let endpoint = format!("-etcd-endpoints={}", c.etcd.endpoint());
    let file = format!("-subnet-file={}", c.subnet_file(0).display());
    let args = [
        endpoint.as_str(),
        "-iface=eth0",
        &file,
        "-ip-blackhole-route",
        "-iptables-resync=1",
    ];
    let node = start_flanneld(&c, 0, &args, &[])?;
    let ns = &c.lab.host(0).ns;
    let subnet = c.subnet(0)?.to_string();
    let blackholes = || ns.ip(&["route", "show", "type", "blackhole"]);
    eventually(
        "the blackhole route",
        || Ok(blackholes()?.contains(&subnet)),
    )?;
    ns.ip(&["route", "del", "blackhole", &subnet])?;
    eventually("the blackhole route back", || {
        Ok(blackholes()?.contains(&subnet))
    })?;
    ensure!(
        node.stderr()
            .contains(&format!("blackhole route {subnet} added")),
        "{}",
        node.stderr()
    );
    Ok(())
}
