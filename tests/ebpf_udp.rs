//! The eBPF dataplane (`--dataplane ebpf`) on the real kernel, in the lab: it carries flannel's
//! udp wire to a TUN udp node and to another eBPF node, counts what it carries in status, keeps
//! container traffic flowing while its daemon restarts, and `--cleanup` removes all it leaves.

mod common;

use anyhow::{ensure, Context, Result};
use common::bpffs::*;
use common::*;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};
use twill_lab::Container;

/// A udp node on the TUN engine.
const TUN: &[&str] = &["--backend", "udp", "--dataplane", "tun"];

/// A udp node on `auto`, the default dataplane (named, over the lab's TUN_UNLESS_NAMED): eBPF,
/// on the lab's veth underlay too.
const AUTO: &[&str] = &["--backend", "udp", "--dataplane", "auto"];

/// Ping both ways with flanneld's TTL, and 8 MiB each way over TCP checked by sha256.
fn carries_both_ways(pair: &Pair) -> Result<()> {
    ping_both_ways_with_ttl_60(pair)?;
    tcp_transfer_intact(pair.container(0), pair.container(1), 8 << 20)?;
    tcp_transfer_intact(pair.container(1), pair.container(0), 8 << 20)
}

/// Host 0's status: the eBPF dataplane, and its peer's counters past what the transfers sent.
fn counted_by_ebpf(pair: &Pair) -> Result<()> {
    let s = status(&pair.host(0).ns)?;
    ensure!(s["dataplane"] == "ebpf", "not the eBPF dataplane: {s}");
    let peer = &s["counters"]["peers"][0];
    for field in ["tx_bytes", "rx_bytes"] {
        let bytes = peer[field].as_u64().unwrap_or(0);
        ensure!(
            bytes > 8 << 20,
            "peer {field} {bytes} below the 8 MiB sent: {s}"
        );
    }
    let total = s["counters"]["tx_packets"].as_u64().unwrap_or(0);
    ensure!(total > 0, "no tx_packets in the totals: {s}");
    Ok(())
}

#[test]
fn an_ebpf_node_and_a_tun_node_share_flannels_wire() -> Result<()> {
    let pair = start_pair_with("ebpftun", [EBPF, TUN], None)?;
    carries_both_ways(&pair)?;
    counted_by_ebpf(&pair)?;
    let tun = status(&pair.host(1).ns)?;
    ensure!(tun["dataplane"] == "tun", "{tun}");
    Ok(())
}

/// A bridge whose port is a veth (the node's address on the bridge) hands the eBPF node what
/// the veth was handed: a TUN node's UDP GSO trains whole. The node (on `auto`) finds the veth
/// below the bridge and takes the trains through its segmenter; it took them for single
/// datagrams before, and 8 MiB from a TUN node without offloads took 512 s where it takes 2.
/// What the node sends the TUN node leaves the bridge's port as datagrams.
#[test]
fn an_ebpf_node_on_a_bridge_over_a_veth_carries_a_tun_nodes_trains() -> Result<()> {
    let mut lab = pair_lab("ebpfbr")?;
    let host = lab.host_mut(0);
    let ip = host.underlay_ip;
    host.ns.sh(&format!(
        "ip link add br0 type bridge && ip -4 addr flush dev eth0 && \
         ip link set eth0 master br0 && ip addr add {ip}/24 dev br0 && ip link set br0 up"
    ))?;
    host.iface = "br0".into();
    let plain_tun = [TUN, &["--no-offload"]].concat();
    let pair = start_pair_in(lab, [AUTO, &plain_tun], [&[], &[]], None)?;
    let ns = &pair.host(0).ns;
    let sent = || -> Result<[u64; 2]> {
        Ok([
            ns.device_counter("eth0", "tx_bytes")?,
            ns.device_counter("eth0", "tx_packets")?,
        ])
    };
    let before = sent()?;
    carries_both_ways(&pair)?;
    let after = sent()?;
    let (bytes, frames) = (after[0] - before[0], after[1] - before[1]);
    ensure!(
        frames > 0 && bytes / frames <= 1514,
        "{frames} frames of {bytes} bytes left the bridge's veth port: super-packets"
    );
    counted_by_ebpf(&pair)?;
    let said = pair.nodes[0].stderr();
    ensure!(
        said.contains("the underlay br0 sits on the veth eth0: a segmenter carries"),
        "{said}"
    );
    Ok(())
}

/// Node 1 runs the default dataplane as root: `auto` runs eBPF on the veth underlay too, and
/// says why.
#[test]
fn two_ebpf_nodes_carry_each_others_traffic() -> Result<()> {
    let pair = start_pair_with("ebpfpair", [EBPF, AUTO], None)?;
    carries_both_ways(&pair)?;
    counted_by_ebpf(&pair)?;
    let auto = status(&pair.host(1).ns)?;
    ensure!(auto["dataplane"] == "ebpf", "{auto}");
    // Where auto found no tcx links (before Linux 6.6), classic TC does their job and status
    // names what was left out; the rest of what it lists is nothing on a veth.
    let left_out = auto["dataplane_left_out"].as_array().context("left out")?;
    let tcx_left_out = left_out
        .iter()
        .any(|l| l.as_str().is_some_and(|l| l.starts_with("tcx links")));
    ensure!(
        tcx_left_out == (auto["dataplane_attach"] == "tc") && left_out.len() <= 1,
        "{auto}"
    );
    let said = pair.nodes[1].stderr();
    ensure!(
        said.contains(
            "dataplane: ebpf (--dataplane auto; this kernel runs it; the underlay eth0 is a veth"
        ),
        "{said}"
    );
    Ok(())
}

/// A veth underlay whose transmit checksumming is off (what an older twill's veth rule left,
/// which outlives it) makes every packet the node sends segmented in software: the node says
/// so, with the command that gives TSO back, and still carries traffic.
#[test]
fn transmit_checksumming_left_off_on_a_veth_underlay_is_said() -> Result<()> {
    let mut pair = start_pair_with("ebpfcsum", [EBPF, EBPF], None)?;
    pair.nodes[0].stop()?;
    pair.host(0).ns.sh("ethtool -K eth0 tx off")?;
    pair.restart(0, EBPF)?;
    carries_both_ways(&pair)?;
    let said = pair.nodes[0].stderr();
    ensure!(
        said.contains("transmit checksumming is off on the veth eth0")
            && said.contains("`ethtool -K eth0 tx on` gives TSO back"),
        "{said}"
    );
    let other = pair.nodes[1].stderr();
    ensure!(!other.contains("transmit checksumming is off"), "{other}");
    Ok(())
}

/// Datagrams numbered 0..count, one every `gap`, from one container to another; how many
/// distinct ones arrived.
fn paced_stream(from: &Container, to: &Container, count: u32, gap: Duration) -> Result<u32> {
    let addr = SocketAddr::from((to.ip, 5010));
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let receiver = s.spawn(|| {
            to.ns.enter(|| -> Result<u32> {
                let socket = bind_receiver(addr, Duration::from_millis(300), ready_tx)?;
                let mut seen = vec![false; count as usize];
                let mut buf = [0u8; 64];
                loop {
                    match socket.recv(&mut buf) {
                        Ok(4) => {
                            let n = u32::from_be_bytes(buf[..4].try_into()?);
                            if let Some(slot) = seen.get_mut(n as usize) {
                                *slot = true;
                            }
                        }
                        Ok(_) => {}
                        // Late datagrams get one more timeout to arrive after the last send.
                        Err(_) if done.load(Relaxed) => break,
                        Err(_) => {}
                    }
                }
                Ok(seen.iter().filter(|&&s| s).count() as u32)
            })
        });
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .context("stream receiver never bound")??;
        let sent = from.ns.enter(|| -> Result<()> {
            let socket = UdpSocket::bind("0.0.0.0:0")?;
            let start = Instant::now();
            for n in 0..count {
                socket.send_to(&n.to_be_bytes(), addr)?;
                let due = start + gap * (n + 1);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            Ok(())
        });
        done.store(true, Relaxed);
        let received = receiver.join().expect("stream receiver thread");
        sent?;
        received
    })
}

/// The daemon of an eBPF node is stopped with SIGTERM and started again while datagrams flow
/// both ways through it and a TCP transfer runs: the programs and maps, pinned, go on
/// forwarding without it, and the new daemon adopts them.
#[test]
fn over_tcx_traffic_keeps_flowing_while_the_daemon_restarts() -> Result<()> {
    keeps_flowing_across_a_restart("ebpfrstx", "tcx")
}

/// The same over classic TC, as on a kernel before 6.6: a clsact filter outlives the daemon
/// by itself, and the restart replaces its program in one step.
#[test]
fn over_classic_tc_traffic_keeps_flowing_while_the_daemon_restarts() -> Result<()> {
    keeps_flowing_across_a_restart("ebpfrstc", "tc")
}

fn keeps_flowing_across_a_restart(tag: &str, attach: &str) -> Result<()> {
    let dir = scratch()?;
    let bpf = BpfFs::mount(path_in(&dir, "bpf"))?;
    let mut args = bpf.ebpf_args();
    args.extend(["--bpf-attach", attach]);
    let mut pair = start_pair_with(tag, [&args, TUN], None)?;
    attached_through(&pair.host(0).ns, attach)?;
    shown_as(&pair.host(0).ns, attach)?;
    ping_both_ways_with_ttl_60(&pair)?;
    const COUNT: u32 = 4000;
    let gap = Duration::from_millis(1);
    let mut old = pair.nodes.remove(0);
    let (outbound, inbound, transfer, new) = std::thread::scope(|s| -> Result<_> {
        let (a, b) = (pair.container(0), pair.container(1));
        let out = s.spawn(|| paced_stream(a, b, COUNT, gap));
        let inb = s.spawn(|| paced_stream(b, a, COUNT, gap));
        let tcp = s.spawn(|| tcp_transfer_intact(b, a, 64 << 20));
        std::thread::sleep(Duration::from_millis(500));
        let stopped = old.stop()?;
        ensure!(stopped.success(), "SIGTERM: {stopped}\n{}", old.stderr());
        std::thread::sleep(Duration::from_millis(500));
        let new = pair.start_node(0, &args);
        Ok((
            out.join().expect("outbound stream"),
            inb.join().expect("inbound stream"),
            tcp.join().expect("tcp transfer"),
            new,
        ))
    })?;
    let mut new = new?;
    let (outbound, inbound) = (outbound?, inbound?);
    transfer.context("TCP across the restart")?;
    let lost = 2 * COUNT - outbound - inbound;
    eprintln!(
        "datagrams lost across the daemon's restart: {lost} of {}",
        2 * COUNT
    );
    ensure!(
        lost == 0,
        "lost {lost}: {outbound} out, {inbound} in of {COUNT} each"
    );
    let log = new.stderr();
    ensure!(log.contains("adopted"), "the restart did not adopt: {log}");
    ensure!(
        said_attach(&log, attach),
        "the restart does not say it attached by {attach}: {log}"
    );
    attached_through(&pair.host(0).ns, attach)?;
    ensure!(new.is_running(), "{log}");
    pair.nodes.insert(0, new);
    let (a, b) = (pair.container(0), pair.container(1));
    let after = paced_stream(a, b, COUNT, gap)? + paced_stream(b, a, COUNT, gap)?;
    ensure!(
        after == 2 * COUNT,
        "lost {} after the restart",
        2 * COUNT - after
    );
    counted_by_ebpf_after_restart(&pair)
}

/// After a restart the counters go on from the maps, not from zero.
fn counted_by_ebpf_after_restart(pair: &Pair) -> Result<()> {
    let s = status(&pair.host(0).ns)?;
    let rx = s["counters"]["peers"][0]["rx_bytes"].as_u64().unwrap_or(0);
    ensure!(
        rx > 64 << 20,
        "rx_bytes {rx} forgot what came before the restart: {s}"
    );
    Ok(())
}

/// `twill run --cleanup` removes the pins, the device and its route, the segmenter, and the
/// programs on the underlay (XDP asked for on the lab's veth), after a stop left them running.
#[test]
fn over_tcx_cleanup_removes_what_the_stopped_dataplane_left() -> Result<()> {
    cleanup_removes_all("ebpfcltx", "tcx")
}

#[test]
fn over_classic_tc_cleanup_removes_what_the_stopped_dataplane_left() -> Result<()> {
    cleanup_removes_all("ebpfcltc", "tc")
}

fn cleanup_removes_all(tag: &str, attach: &str) -> Result<()> {
    let dir = scratch()?;
    let bpf = BpfFs::mount(path_in(&dir, "bpf"))?;
    let mut args = bpf.ebpf_args();
    args.extend(["--bpf-attach", attach, "--bpf-xdp", "on"]);
    let mut pair = start_pair_with(tag, [&args, TUN], None)?;
    pair.nodes[0].stop()?;
    let ns = &pair.host(0).ns;
    attached_through(ns, attach)?;
    let xdp = || -> Result<bool> { Ok(ns.ip(&["link", "show", "eth0"])?.contains("xdp")) };
    ensure!(xdp()?, "no XDP program left running on eth0 after a stop");
    let pins = bpf.path.join("twill0");
    ensure!(
        pins.is_dir(),
        "nothing pinned after a stop: {:?}",
        bpf.entries()?
    );
    for device in ["twill0", "twill0-segs", "twill0-segr"] {
        ensure!(
            ns.ip(&["link", "show", device]).is_ok(),
            "{device} went with the daemon"
        );
    }
    ns.exec(TWILL, &["run", "--cleanup", "--bpf-dir", bpf.arg()])?;
    ensure!(!pins.exists(), "left pinned: {:?}", bpf.entries()?);
    for device in ["twill0", "twill0-segs", "twill0-segr"] {
        ensure!(
            ns.ip(&["link", "show", device]).is_err(),
            "{device} left behind"
        );
    }
    let routes = ns.ip(&["route", "show", "10.5.0.0/16"])?;
    ensure!(routes.trim().is_empty(), "route left behind: {routes}");
    let attached = ns.exec("bpftool", &["net", "show", "dev", "eth0"])?;
    ensure!(
        !attached.contains("twill"),
        "programs left on eth0: {attached}"
    );
    let filters = ns.exec("tc", &["filter", "show", "dev", "eth0", "ingress"])?;
    ensure!(filters.trim().is_empty(), "filter left on eth0: {filters}");
    ensure!(!xdp()?, "XDP program left on eth0");
    // A second cleanup finds nothing and says nothing is wrong.
    ns.exec(TWILL, &["run", "--cleanup", "--bpf-dir", bpf.arg()])?;
    Ok(())
}

/// The ingress program runs on the underlay through `attach`: a classic filter is what `tc
/// filter show` lists, a tcx link is not (and this bpftool predates tcx).
fn attached_through(ns: &twill_lab::Netns, attach: &str) -> Result<()> {
    let filters = ns.exec("tc", &["filter", "show", "dev", "eth0", "ingress"])?;
    let listed = filters.contains("twill_ingress") && filters.contains("direct-action");
    ensure!(
        listed == (attach == "tc"),
        "attached by {attach}, and tc filter show dev eth0 ingress says: {filters}"
    );
    Ok(())
}

/// Status and /metrics name the dataplane and how its programs attach.
fn shown_as(ns: &twill_lab::Netns, attach: &str) -> Result<()> {
    let s = status(ns)?;
    ensure!(
        s["dataplane"] == "ebpf" && s["dataplane_attach"] == attach,
        "status: {s}"
    );
    // On the lab's veth underlay `--bpf-xdp auto` decapsulates at TC.
    ensure!(s["dataplane_ingress"] == "tc", "status: {s}");
    let metrics = http_get(ns, "127.0.0.1:9585", "/metrics")?;
    let line = format!("twill_dataplane_info{{dataplane=\"ebpf\",attach=\"{attach}\"}} 1");
    ensure!(metrics.contains(&line), "no {line} in /metrics: {metrics}");
    Ok(())
}

/// The daemon said at start how it attached.
fn said_attach(log: &str, attach: &str) -> bool {
    log.contains(&format!("attach=\"{attach}\"")) || log.contains(&format!("attach={attach} "))
}

/// With a backend other than udp, `--dataplane ebpf` is refused in one line before anything
/// is made.
#[test]
fn ebpf_with_another_backend_is_refused_in_one_line() -> Result<()> {
    let (lab, line) = refused("ebpfrefuse", &["--backend", "twill-batch"])?;
    ensure!(
        line.contains("--dataplane ebpf carries flannel's udp wire only")
            && line.contains("twill-batch"),
        "{line}"
    );
    ensure!(
        lab.host(0).ns.ip(&["link", "show", "twill0"]).is_err(),
        "twill0 was made"
    );
    Ok(())
}

/// A `--bpf-dir` where nothing can be pinned (under /proc) stops the node with one line naming
/// the directory.
#[test]
fn a_bpf_dir_that_cannot_hold_pins_is_named_in_one_line() -> Result<()> {
    let (_lab, line) = refused(
        "ebpfbaddir",
        &["--backend", "udp", "--bpf-dir", "/proc/twill-pins"],
    )?;
    ensure!(
        line.contains("cannot create /proc/twill-pins/twill0"),
        "{line}"
    );
    Ok(())
}

/// Start a node of host 0 with `--dataplane ebpf` and `args`, which must make it stop within
/// 10 s; the lab and the last line it wrote.
fn refused(tag: &str, extra: &[&str]) -> Result<(twill_lab::Lab, String)> {
    let lab = twill_lab::Lab::new(twill_lab::LabSpec {
        hosts: 2,
        tag: tag.into(),
        ..Default::default()
    })?;
    let dir = scratch()?;
    let file = path_in(&dir, "subnet.env");
    let args = [
        "run",
        "--iface",
        "eth0",
        "--subnet-file",
        file.to_str().context("path")?,
        "--network",
        "10.5.0.0/16",
        "--subnet",
        "10.5.1.0/24",
        "--dataplane",
        "ebpf",
    ];
    let all: Vec<&str> = args.iter().chain(extra).copied().collect();
    let mut proc = spawn_twill(&lab.host(0).ns, &all, &[])?;
    let stderr = proc.failure_within(Duration::from_secs(30), "twill kept running")?;
    let line = stderr.lines().rev().find(|l| !l.trim().is_empty());
    let line = line.unwrap_or_default().to_string();
    Ok((lab, line))
}

/// A node that may not load eBPF programs (root with CAP_NET_ADMIN alone, as setpriv leaves it):
/// `--dataplane ebpf` fails with one line naming what is missing, and `auto` says the same and
/// runs the TUN engine, whose traffic flows.
#[test]
fn without_cap_bpf_ebpf_names_what_is_missing_and_auto_runs_the_tun() -> Result<()> {
    let mut lab = twill_lab::Lab::new(twill_lab::LabSpec {
        hosts: 2,
        tag: "ebpfcaps".into(),
        ..Default::default()
    })?;
    for (host, subnet) in PAIR_SUBNETS.iter().enumerate() {
        lab.host_mut(host).add_container(subnet.parse()?)?;
    }
    let dir = scratch()?;
    let start = |host: usize, dataplane: &str| -> Result<twill_lab::Proc> {
        let peer = format!(
            "{}={}",
            PAIR_SUBNETS[1 - host],
            lab.host(1 - host).underlay_ip
        );
        let file = path_in(&dir, &format!("h{host}.env"));
        let twill = [
            TWILL,
            "run",
            "--iface=eth0",
            "--network=10.5.0.0/16",
            "--subnet",
            PAIR_SUBNETS[host],
            "--peer",
            &peer,
            "--backend=udp",
            "--dataplane",
            dataplane,
            "--subnet-file",
            file.to_str().context("path")?,
        ];
        let args: Vec<&str> = NET_ADMIN_ONLY.iter().chain(&twill).copied().collect();
        lab.host(host)
            .ns
            .spawn_with("setpriv", &args, &[("RUST_LOG", "info")])
    };
    let mut refused = start(0, "ebpf")?;
    let stderr = refused.failure_within(Duration::from_secs(30), "twill kept running")?;
    let want = "--dataplane ebpf cannot run here: not allowed to load eBPF programs: run twill \
                as root, or with CAP_BPF and CAP_NET_ADMIN";
    ensure!(stderr.lines().any(|l| l.ends_with(want)), "{stderr}");
    let mut nodes = Vec::new();
    for host in 0..2 {
        let mut node = start(host, "auto")?;
        wait_ready(
            &lab.host(host).ns,
            &mut node,
            &path_in(&dir, &format!("h{host}.env")),
        )?;
        nodes.push(node);
    }
    let said = nodes[0].stderr();
    ensure!(
        said.contains("dataplane: tun (--dataplane auto; eBPF cannot run: not allowed"),
        "{said}"
    );
    let (a, b) = (&lab.host(0).containers()[0], &lab.host(1).containers()[0]);
    tcp_transfer_intact(a, b, 4 << 20)?;
    ensure!(status(&lab.host(0).ns)?["dataplane"] == "tun");
    Ok(())
}
