//! A pair of lab hosts, each running a twill node with the other as its static peer and one
//! container behind it, and the checks most pair tests make.

use super::{path_in, ping, scratch, start_twill_launched, status, tcp_transfer_intact};
use anyhow::Result;
use twill_lab::{Container, Host, Lab, Proc};

/// The container subnets of [`start_pair`]'s two hosts, inside the network 10.5.0.0/16.
pub const PAIR_SUBNETS: [&str; 2] = ["10.5.1.0/24", "10.5.2.0/24"];

/// Two lab hosts running `twill run ARGS` with static peers, one container each.
pub struct Pair {
    pub lab: Lab,
    pub nodes: Vec<Proc>,
    pub dir: tempfile::TempDir,
}

impl Pair {
    pub fn container(&self, host: usize) -> &Container {
        &self.lab.host(host).containers()[0]
    }

    pub fn host(&self, host: usize) -> &Host {
        self.lab.host(host)
    }

    /// Start host `i`'s node again, after it stopped or was killed, with `args`.
    pub fn restart(&mut self, i: usize, args: &[&str]) -> Result<()> {
        self.restart_launched(i, &[], args)
    }

    /// [`Pair::restart`], twill run by `launcher` ([`start_twill_launched`]).
    pub fn restart_launched(&mut self, i: usize, launcher: &[&str], args: &[&str]) -> Result<()> {
        self.nodes[i] = start_pair_node(&self.lab, &self.dir, i, launcher, args, None)?;
        Ok(())
    }

    /// Host `i`'s node as [`start_pair_with`] starts it, with `args`; the caller keeps it (a
    /// test that starts it while its containers are in use).
    pub fn start_node(&self, i: usize, args: &[&str]) -> Result<Proc> {
        start_pair_node(&self.lab, &self.dir, i, &[], args, None)
    }
}

/// Start a [`Pair`]: each host names the other as its peer; host 0 also gets `extra_peer`.
pub fn start_pair(tag: &str, args: &[&str], extra_peer: Option<&str>) -> Result<Pair> {
    start_pair_with(tag, [args, args], extra_peer)
}

/// [`start_pair`] with different arguments for host 0 and host 1.
pub fn start_pair_with(tag: &str, args: [&[&str]; 2], extra_peer: Option<&str>) -> Result<Pair> {
    start_pair_launched(tag, args, [&[], &[]], extra_peer)
}

/// [`start_pair_with`], each host's twill run by its launcher ([`start_twill_launched`]).
pub fn start_pair_launched(
    tag: &str,
    args: [&[&str]; 2],
    launchers: [&[&str]; 2],
    extra_peer: Option<&str>,
) -> Result<Pair> {
    let lab = pair_lab(tag)?;
    start_pair_in(lab, args, launchers, extra_peer)
}

/// The two hosts of a [`Pair`], each with its container, no node started yet.
pub fn pair_lab(tag: &str) -> Result<Lab> {
    let mut lab = Lab::of(tag, 2)?;
    for (i, subnet) in PAIR_SUBNETS.iter().enumerate() {
        lab.host_mut(i).add_container(subnet.parse()?)?;
    }
    Ok(lab)
}

/// [`start_pair_launched`] in a lab of [`pair_lab`]'s, which the caller may have reshaped.
pub fn start_pair_in(
    lab: Lab,
    args: [&[&str]; 2],
    launchers: [&[&str]; 2],
    extra_peer: Option<&str>,
) -> Result<Pair> {
    let dir = scratch()?;
    let mut nodes = Vec::new();
    for (i, (host_args, launcher)) in args.iter().zip(launchers).enumerate() {
        let extra = extra_peer.filter(|_| i == 0);
        nodes.push(start_pair_node(&lab, &dir, i, launcher, host_args, extra)?);
    }
    Ok(Pair { lab, nodes, dir })
}

/// Host `i`'s node of a [`Pair`]: its subnet, the other host as its peer, then `args`.
fn start_pair_node(
    lab: &Lab,
    dir: &tempfile::TempDir,
    i: usize,
    launcher: &[&str],
    args: &[&str],
    extra_peer: Option<&str>,
) -> Result<Proc> {
    let other = 1 - i;
    let peer = format!("{}={}", PAIR_SUBNETS[other], lab.host(other).underlay_ip);
    let mut all = vec![
        "--network",
        "10.5.0.0/16",
        "--subnet",
        PAIR_SUBNETS[i],
        "--peer",
        &peer,
    ];
    if let Some(extra) = extra_peer {
        all.extend(["--peer", extra]);
    }
    all.extend_from_slice(args);
    let file = path_in(dir, &format!("h{i}.env"));
    start_twill_launched(lab.host(i), launcher, &all, &[], &file)
}

/// 64 MiB over TCP from host 0's container to host 1's, checked by sha256, and counted by the
/// sending node's per-peer counter.
pub fn transfer_64_mib_intact(pair: &Pair) -> Result<()> {
    tcp_transfer_intact(pair.container(0), pair.container(1), 64 << 20)?;
    let s = status(&pair.host(0).ns)?;
    let tx = s["counters"]["peers"][0]["tx_bytes"].as_u64().unwrap_or(0);
    anyhow::ensure!(
        tx > 64 << 20,
        "peer tx counter {tx} below the bytes sent: {s}"
    );
    Ok(())
}

/// Three pings each way between the pair's containers, with flanneld's TTL: 64, minus one per
/// routing host and one for each twill decrement on send and on receive.
pub fn ping_both_ways_with_ttl_60(pair: &Pair) -> Result<()> {
    let (a, b) = (pair.container(0), pair.container(1));
    let out = ping(a, b.ip, 3)?;
    anyhow::ensure!(
        out.contains("3 received") && out.contains("ttl=60"),
        "{out}"
    );
    let out = ping(b, a.ip, 3)?;
    anyhow::ensure!(out.contains("3 received"), "{out}");
    Ok(())
}
