//! A fleet: eight lab hosts on one bridged underlay, each with a container, twill on each from
//! one real etcd. Every pair of containers reaches each other, for every backend that runs on
//! this kernel; then one host leaves (its twill stopped, its lease deleted once another has
//! joined), and within seconds every host has dropped the one that left and reaches the new one.

mod common;

use anyhow::{ensure, Context, Result};
use common::cluster::*;
use common::*;
use twill_lab::{Ipv4Net, Proc};

const HOSTS: usize = 8;
/// Runs from the start; the last host joins mid-run.
const FIRST: usize = HOSTS - 1;
const LEAVER: usize = 3;

#[test]
fn a_udp_fleet_reaches_every_pair_through_a_leave_and_a_join() -> Result<()> {
    fleet("fltudp", "udp")
}

#[test]
fn a_twill_batch_fleet_reaches_every_pair_through_a_leave_and_a_join() -> Result<()> {
    fleet("fltbat", "twill-batch")
}

#[test]
fn a_vxlan_fleet_reaches_every_pair_through_a_leave_and_a_join() -> Result<()> {
    fleet("fltvx", "vxlan")
}

#[test]
fn a_host_gw_fleet_reaches_every_pair_through_a_leave_and_a_join() -> Result<()> {
    fleet("flthgw", "host-gw")
}

fn fleet(tag: &str, backend: &str) -> Result<()> {
    let config = format!(r#"{{"Network":"10.5.0.0/16","Backend":{{"Type":"{backend}"}}}}"#);
    let mut c = cluster(tag, HOSTS, &config)?;
    let mut nodes: Vec<Option<Proc>> = Vec::new();
    for host in 0..FIRST {
        nodes.push(Some(c.start(host)?));
        c.add_container(host)?;
    }
    let mut members: Vec<usize> = (0..FIRST).collect();
    let userspace = backend == "udp" || backend == "twill-batch";
    wait_for_full_mesh(&c, &members, userspace)?;
    every_pair_pings(&c, &members)?;

    let left = c.subnet(LEAVER)?;
    nodes[LEAVER].take().context("leaver")?.stop()?;
    // The joiner takes its lease while the leaver's is still held: a subnet freed first could
    // be the joiner's pick (one of the first 100 free, at random, as flannel picks), and then
    // "the leaver's subnet is gone" would never hold.
    nodes.push(Some(c.start(FIRST)?));
    ensure!(c.subnet(FIRST)? != left, "the joiner took a held subnet");
    c.etcd.etcdctl(&["del", &c.lease_key(left)])?;
    c.add_container(FIRST)?;
    members.retain(|&h| h != LEAVER);
    members.push(FIRST);
    wait_for_full_mesh(&c, &members, userspace)?;
    // The join and the leave are separate events: the mesh can be whole before a node has
    // removed the leaver, so its removal is waited for, within the same bound as the mesh.
    for &host in &members {
        let gone = eventually("the leaver removed", || {
            Ok(!programmed(&c, host, left, userspace)?)
        });
        gone.with_context(|| format!("host {host} still has the peer that left ({left})"))?;
    }
    every_pair_pings(&c, &members)?;
    let out = c.container(members[0]).ns.sh(&format!(
        "ping -c 1 -W 1 {} || true",
        c.container(LEAVER).ip
    ))?;
    ensure!(
        out.contains("0 received"),
        "the host that left still answers: {out}"
    );
    Ok(())
}

/// Waits (bounded) until every member has exactly the other members as peers, each one
/// programmed.
fn wait_for_full_mesh(c: &Cluster, members: &[usize], userspace: bool) -> Result<()> {
    let subnets: Vec<Ipv4Net> = members
        .iter()
        .map(|&h| c.subnet(h))
        .collect::<Result<_>>()?;
    for &host in members {
        let own = c.subnet(host)?;
        let others: Vec<Ipv4Net> = subnets.iter().copied().filter(|s| *s != own).collect();
        let mut want: Vec<String> = others.iter().map(Ipv4Net::to_string).collect();
        want.sort();
        eventually(&format!("host {host} has every other member"), || {
            let mut known = c.peer_subnets(host)?;
            known.sort();
            if known != want {
                return Ok(false);
            }
            for subnet in &others {
                if !programmed(c, host, *subnet, userspace)? {
                    return Ok(false);
                }
            }
            Ok(true)
        })?;
    }
    Ok(())
}

/// Whether `host` forwards to `subnet`: in its userspace table, or as a kernel route.
fn programmed(c: &Cluster, host: usize, subnet: Ipv4Net, userspace: bool) -> Result<bool> {
    let ns = &c.lab.host(host).ns;
    if userspace {
        return Ok(engine_peer_subnets(ns)?.contains(&subnet.to_string()));
    }
    Ok(!ns
        .ip(&["route", "show", &subnet.to_string()])?
        .trim()
        .is_empty())
}

/// One ping between every ordered pair of members' containers (a second try for a lost one).
fn every_pair_pings(c: &Cluster, members: &[usize]) -> Result<()> {
    for &from in members {
        for &to in members.iter().filter(|&&to| to != from) {
            let (a, b) = (c.container(from), c.container(to));
            let answered = |out: String| out.contains("1 received");
            let first = a.ns.sh(&format!("ping -c 1 -W 2 {} || true", b.ip))?;
            if answered(first) {
                continue;
            }
            let again = a.ns.sh(&format!("ping -c 1 -W 2 {} || true", b.ip))?;
            ensure!(answered(again.clone()), "host {from} -> host {to}: {again}");
        }
    }
    Ok(())
}
