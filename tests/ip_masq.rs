//! `--ip-masq` and `--iptables-forward-rules` in a lab: two twill hosts with a container each,
//! and an "outside" namespace behind host A (198.51.100.0/24, a network the overlay knows
//! nothing of, and which knows nothing of the overlay). What each side sees is the source
//! address of a real datagram, echoed back where the rules say a reply can return.

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
    outside_sees_host_a(&pair)?;

    // Removed behind twill's back: put back within a resync period or two.
    pair.host(0)
        .ns
        .exec("nft", &["delete", "table", "ip", TABLE])?;
    eventually("the table repaired", || {
        Ok(table(&pair)? == Some(first.clone()))
    })?;
    let s = status(&pair.host(0).ns)?;
    ensure!(s["nftables"]["repairs"].as_u64() >= Some(1), "{s}");
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
