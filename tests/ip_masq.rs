//! `--ip-masq` and `--iptables-forward-rules` in a lab, in flannel's default iptables mode:
//! two twill hosts with a container each, and an "outside" namespace behind host A
//! (198.51.100.0/24, a network the overlay knows nothing of, and which knows nothing of the
//! overlay). What each side sees is the source address of a real datagram, echoed back where
//! the rules say a reply can return; the rules are read with the host's own `iptables -S` and
//! compared with what a real flanneld v0.28.9 left (tests/data/flanneld-v0.28.9).

mod common;

use anyhow::{bail, ensure, Context, Result};
use common::rules::*;
use common::*;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::mpsc;
use std::time::Duration;
use twill_lab::{Container, Netns};

const MASQ: &[&str] = &["--ip-masq", "--iptables-resync", "1"];
/// TEST-NET-2: outside the container network; host A is 198.51.100.1 on the link to it.
const OUTSIDE: &str = "198.51.100.0/24";
const HOST_A_OUTSIDE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const NETWORK: &str = "10.5.0.0/16";

/// A pair whose host 0 also has an outside namespace behind it, with no route to the overlay.
fn masq_lab(tag: &str, args: &[&str]) -> Result<Pair> {
    let mut pair = start_pair(tag, args, None)?;
    pair.lab.host_mut(0).add_container(OUTSIDE.parse()?)?;
    outside(&pair).ns.ip(&["route", "del", "default"])?;
    Ok(pair)
}

fn outside(pair: &Pair) -> &Container {
    &pair.host(0).containers()[1]
}

/// One datagram from `from` to `to`: the source address it arrived with, and whether the echo
/// sent back to that address reached `from`.
fn arrival(from: &Netns, to: &Container) -> Result<(Ipv4Addr, bool)> {
    let addr = SocketAddr::from((to.ip, 5010));
    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = mpsc::channel();
        let echo = s.spawn(|| to.ns.enter(|| echo_once(addr, ready_tx)));
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .context("echo never bound")??;
        let echoed = from.enter(|| send_and_wait_for_echo(addr))?;
        let seen = echo.join().expect("echo thread")?;
        Ok((seen, echoed))
    })
}

fn echo_once(addr: SocketAddr, ready: mpsc::Sender<Result<()>>) -> Result<Ipv4Addr> {
    let socket = bind_receiver(addr, Duration::from_secs(5), ready)?;
    let mut buf = [0u8; 64];
    let (n, SocketAddr::V4(source)) = socket.recv_from(&mut buf).context("nothing arrived")? else {
        bail!("an IPv6 source");
    };
    // Unroutable without masquerade (the outside has no route to the overlay): then no echo.
    let _ = socket.send_to(&buf[..n], source);
    Ok(*source.ip())
}

/// A fresh socket each time: a new source port is a new conntrack entry, so what happens to
/// it is decided by the rules now in place, not by an earlier flow's NAT mapping.
fn send_and_wait_for_echo(addr: SocketAddr) -> Result<bool> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    socket.set_read_timeout(Some(Duration::from_secs(2)))?;
    socket.send_to(b"where from?", addr)?;
    let mut buf = [0u8; 64];
    Ok(matches!(socket.recv(&mut buf), Ok(n) if &buf[..n] == b"where from?"))
}

/// A datagram from `from` to `to` arrives from `source`, and the reply gets back.
fn arrives_from(from: &Netns, to: &Container, source: Ipv4Addr) -> Result<()> {
    let (seen, echoed) = arrival(from, to)?;
    ensure!(seen == source, "{} saw {seen}, not {source}", to.ip);
    ensure!(echoed, "the reply from {} did not come back", to.ip);
    Ok(())
}

/// Container A to the outside arrives from host A's address on that link.
fn outside_sees_host_a(pair: &Pair) -> Result<()> {
    arrives_from(&pair.container(0).ns, outside(pair), HOST_A_OUTSIDE)
}

/// flanneld's rules for host A's subnet, as a real flanneld left them.
fn flanneld_rules() -> Result<String> {
    recorded("iptables.txt", PAIR_SUBNETS[0], NETWORK)
}

fn host_a_rules(pair: &Pair) -> Result<String> {
    iptables_text(&pair.host(0).ns, "iptables")
}

fn rules_status(pair: &Pair) -> Result<serde_json::Value> {
    Ok(status(&pair.host(0).ns)?["rules"].clone())
}

#[test]
fn containers_leave_as_the_host_and_meet_each_other_as_themselves() -> Result<()> {
    let pair = masq_lab("masq-see", MASQ)?;
    // As an operator (or flannel's e2e suite) sees them: flanneld's chains, byte for byte.
    ensure!(
        host_a_rules(&pair)? == flanneld_rules()?,
        "{}",
        host_a_rules(&pair)?
    );
    let rules = rules_status(&pair)?;
    ensure!(
        rules["mode"] == "iptables-nft" && rules["in_place"] == true,
        "{rules}"
    );
    let places = [
        "iptables -t nat FLANNEL-POSTRTG",
        "iptables -t filter FLANNEL-FWD",
    ];
    ensure!(rules["places"] == serde_json::json!(places), "{rules}");
    outside_sees_host_a(&pair)?;

    let (a, b) = (pair.container(0), pair.container(1));
    arrives_from(&a.ns, b, a.ip)?;

    // From outside the network to this node's containers: the client's address is kept.
    let out = outside(&pair);
    let via = HOST_A_OUTSIDE.to_string();
    out.ns.ip(&["route", "add", PAIR_SUBNETS[0], "via", &via])?;
    arrives_from(&out.ns, a, out.ip)
}

/// flanneld leaves its rules when it exits, so pod traffic keeps its masquerade (and its way
/// through a FORWARD DROP) while a DaemonSet pod restarts; twill does the same, and whatever
/// ends it, the next start leaves exactly one set.
#[test]
fn the_rules_outlive_a_stop_or_a_kill_and_a_restart_leaves_one_set() -> Result<()> {
    let mut pair = masq_lab("masq-life", MASQ)?;
    let first = host_a_rules(&pair)?;
    pair.nodes[0].stop()?;
    ensure!(
        host_a_rules(&pair)? == first,
        "a stop changed the rules: {}",
        pair.nodes[0].stderr()
    );
    ensure!(pair.nodes[0]
        .stderr()
        .contains("flannel's rules left in place"));
    // Still masqueraded with twill stopped: the rules, not twill, do it.
    outside_sees_host_a(&pair)?;

    pair.restart(0, MASQ)?;
    forwarding(&pair.nodes[0])?;
    ensure!(host_a_rules(&pair)? == first, "{}", host_a_rules(&pair)?);
    pair.nodes[0].kill9();
    pair.restart(0, MASQ)?;
    forwarding(&pair.nodes[0])?;
    ensure!(
        host_a_rules(&pair)? == first,
        "after kill -9 and a restart the rules are not exactly one set: {}",
        host_a_rules(&pair)?
    );
    // What a killed twill left is taken over without a warning.
    let log = pair.nodes[0].stderr();
    let warned = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("rules"));
    ensure!(warned.count() == 0, "{log}");
    ensure!(
        log.contains("replaced flannel's rules already there"),
        "{log}"
    );
    outside_sees_host_a(&pair)
}

#[test]
fn every_change_behind_twills_back_is_repaired() -> Result<()> {
    let pair = masq_lab("masq-repair", MASQ)?;
    let first = host_a_rules(&pair)?;
    let jump = "-m comment --comment 'flanneld masq' -j FLANNEL-POSTRTG";
    let changes = [
        // A rule of flannel's chain deleted, the jump to it deleted, doubled, put first.
        format!("iptables -t nat -D FLANNEL-POSTRTG -s {NETWORK} -d {} -m comment --comment 'flanneld masq' -j RETURN", PAIR_SUBNETS[0]),
        format!("iptables -t nat -D POSTROUTING {jump}"),
        format!("iptables -t nat -A POSTROUTING {jump}"),
        "iptables -F FLANNEL-FWD".into(),
        "iptables -I FLANNEL-FWD -j DROP".into(),
        "iptables -F FORWARD".into(),
    ];
    // Each change is seen (one more repair) and undone.
    for (i, change) in changes.iter().enumerate() {
        pair.host(0).ns.sh(change)?;
        eventually(&format!("repaired after `{change}`"), || {
            let repairs = rules_status(&pair)?["repairs"].as_u64();
            Ok(repairs >= Some(i as u64 + 1) && host_a_rules(&pair)? == first)
        })?;
    }
    ensure!(rules_status(&pair)?["in_place"] == true);
    outside_sees_host_a(&pair)
}

#[test]
fn forward_rules_follow_their_flag_and_leftovers_go_when_no_rules_are_wanted() -> Result<()> {
    let mut pair = masq_lab("masq-fwd", &[])?;
    let mut lines = flannel_iptables_lines(&pair.host(0).ns, "iptables")?;
    let recorded = flanneld_rules()?;
    let mut forward_only: Vec<&str> = recorded
        .lines()
        .filter(|l| l.contains("FLANNEL-FWD"))
        .collect();
    lines.sort();
    forward_only.sort();
    ensure!(lines == forward_only, "{lines:#?}");
    ensure!(rules_status(&pair)?["ip_masq"] == false);

    pair.nodes[0].kill9();
    pair.restart(0, &["--ip-masq"])?;
    forwarding(&pair.nodes[0])?;
    ensure!(host_a_rules(&pair)? == flanneld_rules()?);
    pair.nodes[0].kill9();
    pair.restart(0, &["--iptables-forward-rules=false"])?;
    forwarding(&pair.nodes[0])?;
    let lines = flannel_iptables_lines(&pair.host(0).ns, "iptables")?;
    ensure!(lines.is_empty(), "leftovers: {lines:#?}");
    ensure!(rules_status(&pair)?.is_null());
    Ok(())
}

#[test]
fn ip_masq_fully_random_disable_masquerades_with_plain_masquerade() -> Result<()> {
    let mut args = MASQ.to_vec();
    args.push("--ip-masq-fully-random-disable");
    let pair = masq_lab("masq-random", &args)?;
    let expected = flanneld_rules()?.replace(" --random-fully", "");
    ensure!(host_a_rules(&pair)? == expected, "{}", host_a_rules(&pair)?);
    ensure!(rules_status(&pair)?["fully_random"] == false);
    outside_sees_host_a(&pair)
}

/// A host whose FORWARD policy is DROP (as Docker sets it): pod traffic between the nodes
/// crosses it through FLANNEL-FWD, which FORWARD jumps to, as with flanneld; without the
/// forward rules the same traffic is dropped (the control that shows it was the chain).
#[test]
fn pod_traffic_crosses_a_forward_drop_policy_through_flannels_chain() -> Result<()> {
    let mut pair = start_pair("masq-drop", &[], None)?;
    for host in 0..2 {
        pair.host(host)
            .ns
            .exec("iptables", &["-P", "FORWARD", "DROP"])?;
    }
    // flanneld's FORWARD and FLANNEL-FWD on such a host (no --ip-masq: no FLANNEL-POSTRTG).
    let recorded = flanneld_rules()?.replace("-P FORWARD ACCEPT", "-P FORWARD DROP");
    let expected: String = recorded
        .lines()
        .skip_while(|l| !l.starts_with("-P FORWARD"))
        .map(|l| format!("{l}\n"))
        .collect();
    let ns = &pair.host(0).ns;
    let forward =
        ns.exec("iptables", &["-S", "FORWARD"])? + &ns.exec("iptables", &["-S", "FLANNEL-FWD"])?;
    ensure!(forward == expected, "{forward}");
    tcp_transfer_intact(pair.container(0), pair.container(1), 8 << 20)?;
    tcp_transfer_intact(pair.container(1), pair.container(0), 8 << 20)?;

    for host in 0..2 {
        pair.nodes[host].stop()?;
        pair.restart(host, &["--iptables-forward-rules=false"])?;
        forwarding(&pair.nodes[host])?;
    }
    ensure!(flannel_iptables_lines(&pair.host(0).ns, "iptables")?.is_empty());
    let crossed = ping(pair.container(0), pair.container(1).ip, 2);
    ensure!(
        crossed.is_err(),
        "crossed a DROP policy without the rules: {crossed:?}"
    );
    ensure!(
        pair.nodes.iter_mut().all(|n| n.is_running()),
        "a node stopped"
    );
    Ok(())
}

/// iptables mode on a host without iptables: one line naming the package and the config field
/// that picks nftables instead, before anything is written.
#[test]
fn a_host_without_iptables_is_told_what_to_install() -> Result<()> {
    let mut pair = masq_lab("masq-noipt", MASQ)?;
    pair.nodes[0].stop()?;
    let ns = &pair.host(0).ns;
    ns.exec("iptables", &["-t", "nat", "-F", "FLANNEL-POSTRTG"])?;
    let before = flannel_iptables_lines(ns, "iptables")?;
    // A PATH with `ip` alone (the lab starts twill through `ip netns exec`).
    let empty = scratch()?;
    std::os::unix::fs::symlink(which_ip()?, path_in(&empty, "ip"))?;
    let path = empty.path().to_str().context("path")?;
    let log = failing_start(&pair, &path_in(&pair.dir, "h0.env"), &[("PATH", path)])?;
    let last = log.lines().last().unwrap_or_default();
    for words in [
        "neither iptables-nft-restore nor its -legacy- form is on PATH",
        "apt install iptables",
        "\"EnableNFTables\": true",
    ] {
        ensure!(last.contains(words), "{words:?} not in {last:?}");
    }
    // Nothing was touched: the emptied chain is as the test left it.
    ensure!(flannel_iptables_lines(&pair.host(0).ns, "iptables")? == before);
    Ok(())
}

fn which_ip() -> Result<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|d| d.join("ip"))
        .find(|p| p.is_file());
    found.context("no ip on PATH")
}

/// Host A's node with `--ip-masq`, `subnet_file` and `env`, which must fail: what it said.
fn failing_start(
    pair: &Pair,
    subnet_file: &std::path::Path,
    env: &[(&str, &str)],
) -> Result<String> {
    let host = pair.host(0);
    let file = subnet_file.to_str().context("path")?;
    let mut args = vec![
        "run",
        "--iface",
        &host.iface,
        "--subnet-file",
        file,
        "--ip-masq",
    ];
    let flags = pair_flags(pair, 0);
    args.extend(flags.iter().map(String::as_str));
    let mut node = spawn_twill(&host.ns, &args, env)?;
    node.failure_within(Duration::from_secs(20), "twill kept running")
}
