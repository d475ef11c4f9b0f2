//! The ICMP errors twill answers with, on both userspace backends and on the eBPF dataplane,
//! seen from a container as a router's would be: time exceeded when a TTL runs out in twill (on
//! either node), network unreachable, fragmentation needed for a packet larger than the far
//! node's device, and (the userspace backends; on the eBPF dataplane the kernel sends it
//! before twill's device) fragmentation needed once the underlay's MTU shrinks under a running
//! node; all within the kernel's own ICMP limit. Each comes from the answering node's own
//! address in the network, which the far node's anti-spoofing check lets through.

mod common;

use anyhow::{Context, Result};
use common::bpffs::EBPF;
use common::*;
use std::time::Duration;

/// The userspace backends, by tag and node arguments.
const BACKENDS: [(&str, &[&str]); 2] =
    [("u", &["--backend", "udp"]), ("b", &["--backend", "batch"])];

/// The userspace backends and flannel's udp on the eBPF dataplane.
const DATAPLANES: [(&str, &[&str]); 3] = [BACKENDS[0], BACKENDS[1], ("e", EBPF)];

fn pair(tag: &str, args: &[&str]) -> Result<Pair> {
    start_pair(tag, args, None)
}

/// Both hosts' underlay (eth0) at `mtu`.
fn set_underlay_mtu(pair: &Pair, mtu: u32) -> Result<()> {
    for host in 0..2 {
        let mtu = mtu.to_string();
        pair.host(host)
            .ns
            .ip(&["link", "set", "eth0", "mtu", &mtu])?;
    }
    Ok(())
}

/// `ping` from container 0 with extra options; its output, whether or not it got replies.
fn ping_from(pair: &Pair, options: &str, to: &str) -> Result<String> {
    pair.container(0)
        .ns
        .sh(&format!("ping -c 1 -W 2 {options} {to} || true"))
}

#[test]
fn a_ttl_that_runs_out_in_twill_gets_time_exceeded_from_that_node() -> Result<()> {
    for (tag, backend) in DATAPLANES {
        let pair = pair(&format!("{tag}ttl"), backend)?;
        let far = pair.container(1).ip.to_string();
        // TTL 2: host 0 forwards it with 1 left, and twill on host 0 cannot decrement it.
        let out = ping_from(&pair, "-t 2", &far)?;
        anyhow::ensure!(
            out.contains("From 10.5.1.0 icmp_seq=1 Time to live exceeded"),
            "{backend:?}, near: {out}"
        );
        // TTL 3: twill on host 0 sends it with 1 left; twill on host 1 answers, from its own
        // address, back through the tunnel.
        let out = ping_from(&pair, "-t 3", &far)?;
        anyhow::ensure!(
            out.contains("From 10.5.2.0 icmp_seq=1 Time to live exceeded"),
            "{backend:?}, far: {out}"
        );
        anyhow::ensure!(drops(&pair.host(1).ns, "ttl_exceeded")? >= 1);
    }
    Ok(())
}

#[test]
fn a_far_node_without_a_route_answers_net_unreachable_from_its_own_address() -> Result<()> {
    for (tag, backend) in DATAPLANES {
        let pair = pair(&format!("{tag}unre"), backend)?;
        // Host 1 sends half of its own subnet back into twill, where no peer owns it.
        pair.host(1)
            .ns
            .ip(&["route", "add", "10.5.2.128/25", "dev", "twill0"])?;
        let out = ping_from(&pair, "", "10.5.2.200")?;
        anyhow::ensure!(
            out.contains("From 10.5.2.0 icmp_seq=1 Destination Net Unreachable"),
            "{backend:?}: {out}"
        );
        anyhow::ensure!(drops(&pair.host(0).ns, "spoofed_source")? == 0);
        anyhow::ensure!(drops(&pair.host(1).ns, "no_route")? >= 1);
    }
    Ok(())
}

/// Nodes whose MTUs differ (the far one given a smaller `--mtu`): a packet larger than the far
/// node's device takes gets fragmentation needed from that node, naming its MTU, so that the
/// sender's path MTU discovery finds it; the eBPF dataplane answers as the userspace backends.
#[test]
fn a_packet_too_big_for_the_far_nodes_device_gets_frag_needed_from_that_node() -> Result<()> {
    for (tag, backend) in DATAPLANES {
        let far_args = [backend, &["--mtu", "1300"]].concat();
        let pair = start_pair_with(&format!("{tag}far"), [backend, &far_args], None)?;
        let far = pair.container(1).ip.to_string();
        let out = ping_from(&pair, "-M do -s 1400", &far)?;
        anyhow::ensure!(
            out.contains("From 10.5.2.0 icmp_seq=1 Frag needed and DF set (mtu = 1300)"),
            "{backend:?}, too big: {out}"
        );
        anyhow::ensure!(drops(&pair.host(1).ns, "too_big")? >= 1);
        // What the sender learned: the largest packet that fits gets through.
        let out = ping_from(&pair, "-M do -s 1272", &far)?;
        anyhow::ensure!(out.contains("1 received"), "{backend:?}, fitting: {out}");
    }
    Ok(())
}

#[test]
fn an_underlay_mtu_that_shrinks_under_a_running_node_gets_frag_needed() -> Result<()> {
    for (tag, backend) in BACKENDS {
        let pair = pair(&format!("{tag}pmtu"), backend)?;
        let far = pair.container(1).ip.to_string();
        let out = ping_from(&pair, "-M do -s 1400", &far)?;
        anyhow::ensure!(out.contains("1 received"), "{backend:?}, before: {out}");
        set_underlay_mtu(&pair, 1300)?;
        // The first too-big packet teaches twill the new path MTU and is answered at once.
        let overhead = if tag == "u" { 28 } else { 42 };
        let fits = 1300 - overhead;
        let out = ping_from(&pair, "-M do -s 1400", &far)?;
        anyhow::ensure!(
            out.contains(&format!("Frag needed and DF set (mtu = {fits})")),
            "{backend:?}, after: {out}"
        );
        anyhow::ensure!(drops(&pair.host(0).ns, "too_big")? >= 1);
        // The refused send is in the log at warn, with the errno (EMSGSIZE) and the peer.
        let log = pair.nodes[0].stderr();
        anyhow::ensure!(
            log.contains("WARN")
                && log.contains("UDP send refused by the kernel")
                && log.contains("errno=90")
                && log.contains("peer=10.200.0.2"),
            "{backend:?}: {log}"
        );
        let out = ping_from(&pair, &format!("-M do -s {}", fits - 28), &far)?;
        anyhow::ensure!(out.contains("1 received"), "{backend:?}, fitting: {out}");
        // Grown back, the underlay carries the larger packet again: the engine asks the route
        // again (once a second while its path MTU is low). The container forgets what it
        // learned each time, else it would not try.
        set_underlay_mtu(&pair, 1500)?;
        let larger = format!("ip route flush cache; ping -c 1 -W 1 -M do -s 1400 {far} || true");
        eventually_within("a larger ping again", Duration::from_secs(10), || {
            Ok(pair.container(0).ns.sh(&larger)?.contains("1 received"))
        })
        .with_context(|| format!("{backend:?}: {}", pair.nodes[0].stderr()))?;
        let log = pair.nodes[0].stderr();
        anyhow::ensure!(log.contains("path MTU raised"), "{backend:?}: {log}");
    }
    Ok(())
}

/// On the eBPF dataplane the device's MTU follows the underlay's down and back up: the programs
/// cannot answer a packet too big for the underlay once it is encapsulated (a TCP super-packet
/// least of all), so the kernel answers before twill's device, and TCP finds the path MTU and
/// carries its bytes whole.
#[test]
fn on_the_ebpf_dataplane_the_device_mtu_follows_the_underlays() -> Result<()> {
    let pair = pair("epmtu", EBPF)?;
    let far = pair.container(1).ip.to_string();
    let device_mtu = |host: usize, mtu: u32| {
        eventually_within(
            &format!("twill0 of host {host} at MTU {mtu}"),
            Duration::from_secs(20),
            || {
                let link = pair.host(host).ns.ip(&["-o", "link", "show", "twill0"])?;
                Ok(link.contains(&format!(" mtu {mtu} ")))
            },
        )
    };
    let out = ping_from(&pair, "-M do -s 1400", &far)?;
    anyhow::ensure!(out.contains("1 received"), "before: {out}");
    set_underlay_mtu(&pair, 1300)?;
    for host in 0..2 {
        device_mtu(host, 1272)?;
    }
    let out = ping_from(&pair, "-M do -s 1400", &far)?;
    anyhow::ensure!(
        out.contains("Frag needed and DF set (mtu = 1272)"),
        "after: {out}"
    );
    let out = ping_from(&pair, "-M do -s 1244", &far)?;
    anyhow::ensure!(out.contains("1 received"), "fitting: {out}");
    tcp_transfer_intact(pair.container(0), pair.container(1), 4 << 20)?;
    set_underlay_mtu(&pair, 1500)?;
    for host in 0..2 {
        device_mtu(host, 1472)?;
    }
    Ok(())
}

/// A node answers no faster than the kernel's own ICMP limit in its namespace
/// (`net.ipv4.icmp_msgs_per_sec`, `icmp_msgs_burst`, read at start): a container's probes at a
/// subnet no peer owns get the burst and then what the rate pays for; the rest are still
/// dropped and counted under no_route, and counted as held back.
#[test]
fn probes_at_a_subnet_no_peer_owns_get_answers_within_the_kernels_icmp_limit() -> Result<()> {
    const PROBES: usize = 20;
    const BURST: usize = 3;
    for (tag, backend) in DATAPLANES {
        let mut pair = pair(&format!("{tag}lim"), backend)?;
        pair.host(0).ns.sh(&format!(
            "sysctl -qw net.ipv4.icmp_msgs_per_sec=1 net.ipv4.icmp_msgs_burst={BURST}"
        ))?;
        pair.nodes[0].stop()?;
        pair.restart(0, backend)?;
        let out = pair
            .container(0)
            .ns
            .sh(&format!("ping -c {PROBES} -i 0.01 -W 1 10.5.9.9 || true"))?;
        let answered = out.matches("Destination Net Unreachable").count();
        // One more for each second the probes took (ping's own "time 190ms").
        let took_ms: u64 = out
            .split("time ")
            .last()
            .and_then(|t| t.split("ms").next())
            .and_then(|t| t.trim().parse().ok())
            .with_context(|| format!("no time in {out}"))?;
        let paid = BURST + 1 + (took_ms / 1000) as usize;
        anyhow::ensure!(
            (BURST..=paid.min(PROBES - 1)).contains(&answered),
            "{backend:?}: {answered} answered, want {BURST} to {paid}: {out}"
        );
        let held_back = (PROBES - answered) as u64;
        let ns = &pair.host(0).ns;
        let counted = eventually("the counters", || {
            let s = status(ns)?;
            Ok(
                s["counters"]["drops"]["no_route"].as_u64() == Some(PROBES as u64)
                    && s["counters"]["icmp_rate_limited"].as_u64() == Some(held_back),
            )
        });
        counted.with_context(|| {
            format!(
                "{backend:?}: want {held_back} held back: {}",
                status(ns).unwrap_or_default()
            )
        })?;
        if tag == "e" {
            continue;
        }
        // An error that carries a path MTU is never held back, as the kernel's are not: with
        // the budget just spent, a packet too big for a shrunk underlay still gets its answer.
        set_underlay_mtu(&pair, 1300)?;
        let far = pair.container(1).ip;
        let out = pair.container(0).ns.sh(&format!(
            "ping -c 5 -i 0.01 -W 0.1 10.5.9.9; ping -c 1 -W 2 -M do -s 1400 {far} || true"
        ))?;
        anyhow::ensure!(
            out.contains("Frag needed and DF set"),
            "{backend:?}, too big: {out}"
        );
    }
    Ok(())
}
