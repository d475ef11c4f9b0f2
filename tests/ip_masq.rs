//! `--ip-masq` and `--iptables-forward-rules` in a lab: two twill hosts with a container each,
//! and an "outside" namespace behind host A (198.51.100.0/24, a network the overlay knows
//! nothing of, and which knows nothing of the overlay). What each side sees is the source
//! address of a real datagram, echoed back where the rules say a reply can return.
//!
//! twill writes and checks its table over netlink; the tests read it with the nft program, so
//! what they see is what an operator's `nft list` shows.

mod common;

use anyhow::{bail, ensure, Context, Result};
use common::*;
use serde_json::Value;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::mpsc;
use std::time::Duration;
use twill_lab::{Container, Netns};

const MASQ: &[&str] = &["--ip-masq", "--iptables-resync", "1"];
/// TEST-NET-2: outside the container network; host A is 198.51.100.1 on the link to it.
const OUTSIDE: &str = "198.51.100.0/24";
const HOST_A_OUTSIDE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const TABLE: &str = "twill-ipv4";
/// The start of the warning about a table of twill's name that twill did not write.
const FOREIGN: &str = "nftables table ip twill-ipv4 is not marked as twill's";

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

fn rules_in_place(pair: &Pair) -> Result<()> {
    eventually("nftables rules in place", || {
        Ok(status(&pair.host(0).ns)?["nftables"]["in_place"] == true)
    })
}

/// twill's table in host A as nft lists it, handles removed; `None` when there is none.
fn table(pair: &Pair) -> Result<Option<Vec<Value>>> {
    let ns = &pair.host(0).ns;
    if !ns.exec("nft", &["list", "tables"])?.contains(TABLE) {
        return Ok(None);
    }
    let listing: Value =
        serde_json::from_str(&ns.exec("nft", &["-j", "list", "table", "ip", TABLE])?)?;
    let mut objects = listing["nftables"].as_array().context("nftables")?.clone();
    for object in &mut objects {
        if let Some(Value::Object(inner)) =
            object.as_object_mut().and_then(|o| o.values_mut().next())
        {
            inner.remove("handle");
        }
    }
    objects.retain(|o| o.get("metainfo").is_none());
    Ok(Some(objects))
}

/// `nft list table ip twill-ipv4` on host A, one trimmed line each.
fn table_text(pair: &Pair) -> Result<Vec<String>> {
    let text = pair
        .host(0)
        .ns
        .exec("nft", &["list", "table", "ip", TABLE])?;
    let lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    Ok(lines.map(String::from).collect())
}

/// Host 0's node started again with extra environment variables (a [`Pair::restart`] with
/// `env`); the node must be stopped.
fn restart_with_env(pair: &mut Pair, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let peer = format!("{}={}", PAIR_SUBNETS[1], pair.host(1).underlay_ip);
    let mut all = vec![
        "--network",
        "10.5.0.0/16",
        "--subnet",
        PAIR_SUBNETS[0],
        "--peer",
        &peer,
    ];
    all.extend_from_slice(args);
    let subnet_file = path_in(&pair.dir, "h0.env");
    pair.nodes[0] = start_twill_with_env(pair.host(0), &all, env, &subnet_file)?;
    Ok(())
}

/// The child processes of every thread of `pid`, now.
fn children(pid: u32) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let text = std::fs::read_to_string(task?.path().join("children")).unwrap_or_default();
        found.extend(text.split_whitespace().map(String::from));
    }
    Ok(found)
}

/// Rules per chain: postrtg, forward.
fn rule_counts(objects: &[Value]) -> (usize, usize) {
    let count = |chain: &str| {
        objects
            .iter()
            .filter(|o| o["rule"]["chain"] == chain)
            .count()
    };
    (count("postrtg"), count("forward"))
}

#[test]
fn containers_leave_as_the_host_and_meet_each_other_as_themselves() -> Result<()> {
    let pair = masq_lab("masq-see", MASQ)?;
    rules_in_place(&pair)?;
    // As an operator sees them: flannel's rules in flannel's order (docs/ip-masq.md), in a
    // table that says whose it is.
    let expected = [
        "table ip twill-ipv4 {",
        "comment \"managed by twill\"",
        "chain postrtg {",
        "type nat hook postrouting priority srcnat; policy accept;",
        "meta mark & 0x00004000 == 0x00004000 return",
        "ip saddr 10.5.1.0/24 ip daddr 10.5.0.0/16 return",
        "ip saddr 10.5.0.0/16 ip daddr 10.5.1.0/24 return",
        "ip saddr != 10.5.0.0/16 ip daddr 10.5.1.0/24 return",
        "ip saddr 10.5.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random",
        "ip saddr != 10.5.0.0/16 ip daddr 10.5.0.0/16 masquerade fully-random",
        "}",
        "chain forward {",
        "type filter hook forward priority filter; policy accept;",
        "ip saddr 10.5.0.0/16 accept",
        "ip daddr 10.5.0.0/16 accept",
        "}",
        "}",
    ];
    ensure!(table_text(&pair)? == expected, "{:#?}", table_text(&pair)?);
    outside_sees_host_a(&pair)?;

    let (a, b) = (pair.container(0), pair.container(1));
    arrives_from(&a.ns, b, a.ip)?;

    // From outside the network to this node's containers: the client's address is kept.
    let out = outside(&pair);
    let via = HOST_A_OUTSIDE.to_string();
    out.ns.ip(&["route", "add", PAIR_SUBNETS[0], "via", &via])?;
    arrives_from(&out.ns, a, out.ip)
}

#[test]
fn one_rule_set_across_restarts_and_kills_and_none_after_a_clean_shutdown() -> Result<()> {
    let mut pair = masq_lab("masq-life", MASQ)?;
    rules_in_place(&pair)?;
    let first = table(&pair)?.context("no table after start")?;
    ensure!(rule_counts(&first) == (6, 2), "rules: {first:?}");

    pair.nodes[0].stop()?;
    ensure!(
        table(&pair)?.is_none(),
        "a clean shutdown left the table: {}",
        pair.nodes[0].stderr()
    );
    // The negative control: without twill's rules the container's own address leaves.
    let (seen, _) = arrival(&pair.container(0).ns, outside(&pair))?;
    ensure!(
        seen == pair.container(0).ip,
        "without twill the outside saw {seen}"
    );

    pair.restart(0, MASQ)?;
    rules_in_place(&pair)?;
    ensure!(
        table(&pair)? == Some(first.clone()),
        "a restart wrote other rules"
    );

    pair.nodes[0].kill9();
    ensure!(table(&pair)?.is_some(), "SIGKILL cannot remove the table");
    pair.restart(0, MASQ)?;
    rules_in_place(&pair)?;
    ensure!(
        table(&pair)? == Some(first.clone()),
        "after kill -9 and a restart the table is not exactly one rule set"
    );
    // The table a killed twill left carries twill's mark: replaced without a warning.
    let log = pair.nodes[0].stderr();
    ensure!(!log.contains(FOREIGN), "{log}");
    outside_sees_host_a(&pair)?;

    // Removed behind twill's back: put back within a resync period or two.
    pair.host(0)
        .ns
        .exec("nft", &["delete", "table", "ip", TABLE])?;
    eventually("the table repaired", || {
        let repairs = status(&pair.host(0).ns)?["nftables"]["repairs"].as_u64();
        Ok(repairs >= Some(1) && table(&pair)? == Some(first.clone()))
    })?;
    outside_sees_host_a(&pair)?;

    pair.nodes[0].stop()?;
    ensure!(table(&pair)?.is_none(), "a clean shutdown left the table");
    Ok(())
}

#[test]
fn forward_rules_follow_their_flag_and_a_leftover_table_goes() -> Result<()> {
    let only_forward = masq_lab("masq-fwd", &[])?;
    rules_in_place(&only_forward)?;
    let objects = table(&only_forward)?.context("no table with the default flags")?;
    ensure!(rule_counts(&objects) == (0, 2), "{objects:?}");
    drop(only_forward);

    let mut pair = masq_lab("masq-none", MASQ)?;
    rules_in_place(&pair)?;
    pair.nodes[0].kill9();
    pair.restart(0, &["--iptables-forward-rules=false"])?;
    eventually("the leftover table removed", || Ok(table(&pair)?.is_none()))
        .context(pair.nodes[0].stderr())?;
    let s = status(&pair.host(0).ns)?;
    ensure!(s["nftables"].is_null(), "{s}");
    Ok(())
}

/// The handle of rule `n` (from 1) of `chain`, as `nft -a` prints it.
fn rule_handle(pair: &Pair, chain: &str, n: usize) -> Result<String> {
    let text = pair
        .host(0)
        .ns
        .exec("nft", &["-a", "list", "chain", "ip", TABLE, chain])?;
    let rules = text
        .lines()
        .filter_map(|l| l.split_once("# handle ").map(|h| h.1));
    // The chain's own line carries a handle too.
    let handle = rules.skip(n).map(str::trim).next();
    Ok(handle
        .with_context(|| format!("no rule {n} in {text}"))?
        .into())
}

#[test]
fn every_change_behind_twills_back_is_repaired() -> Result<()> {
    let pair = masq_lab("masq-repair", MASQ)?;
    rules_in_place(&pair)?;
    let first = table(&pair)?.context("no table after start")?;
    let handle = rule_handle(&pair, "postrtg", 2)?;
    let changes = [
        format!("nft delete rule ip {TABLE} postrtg handle {handle}"),
        format!("nft add rule ip {TABLE} forward counter"),
        format!("nft insert rule ip {TABLE} postrtg counter"),
        format!("nft add chain ip {TABLE} extra"),
        format!("nft add chain ip {TABLE} forward '{{ policy drop; }}'"),
        format!("nft add set ip {TABLE} s '{{ type ipv4_addr; }}'"),
    ];
    // Each change is seen (one more repair), whether or not nft could list it before then.
    for (i, change) in changes.iter().enumerate() {
        pair.host(0).ns.sh(change)?;
        eventually(&format!("repaired after `{change}`"), || {
            let repairs = status(&pair.host(0).ns)?["nftables"]["repairs"].as_u64();
            Ok(repairs >= Some(i as u64 + 1) && table(&pair)? == Some(first.clone()))
        })?;
    }
    let s = status(&pair.host(0).ns)?;
    ensure!(s["nftables"]["in_place"] == true, "{s}");
    Ok(())
}

#[test]
fn an_operators_table_of_twills_name_is_replaced_with_a_warning() -> Result<()> {
    let mut pair = masq_lab("masq-own", MASQ)?;
    rules_in_place(&pair)?;
    let twills = table(&pair)?.context("no table after start")?;
    pair.nodes[0].stop()?;

    // An operator's own table of that name, with a chain and a rule of its own.
    pair.host(0).ns.sh(&format!(
        "nft add table ip {TABLE} && \
         nft add chain ip {TABLE} mine '{{ type filter hook input priority 0; }}' && \
         nft add rule ip {TABLE} mine counter"
    ))?;
    pair.restart(0, MASQ)?;
    rules_in_place(&pair)?;
    let log = pair.nodes[0].stderr();
    ensure!(
        log.contains(FOREIGN) && log.contains("replacing it, as the name is twill's"),
        "no warning about the operator's table:\n{log}"
    );
    ensure!(
        table(&pair)? == Some(twills.clone()),
        "the table is not twill's"
    );

    // Replaced behind twill's back by an unmarked one: written again, and said so.
    pair.host(0).ns.sh(&format!(
        "nft delete table ip {TABLE} && nft add table ip {TABLE}"
    ))?;
    eventually("twill's table back", || {
        Ok(table(&pair)? == Some(twills.clone()))
    })?;
    let log = pair.nodes[0].stderr();
    ensure!(
        log.contains("replaced by one without twill's mark"),
        "{log}"
    );
    Ok(())
}

#[test]
fn the_steady_state_starts_no_process() -> Result<()> {
    let mut pair = masq_lab("masq-nofork", MASQ)?;
    pair.nodes[0].stop()?;
    // An nft first on PATH that only records being run: twill must never run it.
    let spy = scratch()?;
    let ran = path_in(&spy, "nft-ran");
    let nft = path_in(&spy, "nft");
    std::fs::write(
        &nft,
        format!("#!/bin/sh\necho \"$*\" >> {}\nexit 1\n", ran.display()),
    )?;
    std::fs::set_permissions(&nft, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let path = format!("{}:{}", spy.path().display(), std::env::var("PATH")?);
    restart_with_env(&mut pair, MASQ, &[("PATH", &path)])?;
    rules_in_place(&pair)?;
    let pid = pair.nodes[0].pid();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))?;
    ensure!(comm.trim() == "twill", "pid {pid} is {comm}");

    // Three and a half resync periods, and at least until a repair is done: no child process
    // at any look, and none that ran long enough to be counted (cutime, cstime).
    let start = std::time::Instant::now();
    let (mut removed, mut repaired, mut asked) = (false, false, start);
    while start.elapsed() < Duration::from_millis(3500) || !repaired {
        ensure!(
            start.elapsed() < Duration::from_secs(20),
            "no repair in 20 s"
        );
        let kids = children(pid)?;
        ensure!(kids.is_empty(), "twill has child processes {kids:?}");
        if !removed && start.elapsed() > Duration::from_millis(1200) {
            pair.host(0)
                .ns
                .exec("nft", &["delete", "table", "ip", TABLE])?;
            removed = true;
        }
        if removed && !repaired && asked.elapsed() > Duration::from_millis(200) {
            asked = std::time::Instant::now();
            let s = status(&pair.host(0).ns)?;
            repaired = s["nftables"]["repairs"] == 1 && s["nftables"]["in_place"] == true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_comm = stat.rsplit_once(") ").context("stat")?.1;
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 16 and 17 of stat (cutime, cstime) are the 14th and 15th after the command.
    ensure!(
        fields[13] == "0" && fields[14] == "0",
        "children's CPU time: {stat}"
    );

    pair.nodes[0].stop()?;
    ensure!(table(&pair)?.is_none(), "a clean shutdown left the table");
    ensure!(
        !ran.exists(),
        "twill ran nft: {}",
        std::fs::read_to_string(&ran)?
    );
    Ok(())
}
