//! A WireGuard that is not twill: host 0 runs twill's wireguard backend (userspace: this kernel
//! has no WireGuard), host 1 runs wireguard-go configured with `wg` as flannel configures a
//! node, from host 0's lease, and its own lease is in etcd for twill to find. Traffic both ways,
//! twill's persistent keepalives, and twill following wireguard-go to a new port (roaming).

mod common;

use anyhow::{Context, Result};
use common::cluster::*;
use common::wireguard::{self as wg, PSK};
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;
use twill_lab::wireguard_go::generate_key;
use twill_lab::{Ipv4Net, Netns, WireguardGo};

#[test]
fn twill_and_wireguard_go_carry_traffic_both_ways_keep_alive_and_roam() -> Result<()> {
    let mut c = cluster(
        "wgo",
        2,
        &wg::config(PSK, r#","PersistentKeepaliveInterval":1"#),
    )?;
    let node = wg::start(&c, 0)?;
    // wireguard-go's lease: a subnet twill's node did not draw (it draws at random).
    let go_subnet = c.unheld_subnet()?;
    c.add_container(0)?;
    c.lab.host_mut(1).add_container(go_subnet)?;
    let go = GoNode::start(&c.lab.host(1).ns)?;
    let go_key = go.configure(&c, go_subnet)?;
    let lease = wg::lease_value(c.lab.host(1).underlay_ip, &go_key, wg::PORT);
    c.etcd.etcdctl(&["put", &c.lease_key(go_subnet), &lease])?;
    eventually("twill follows wireguard-go's lease", || {
        Ok(c.peer_subnets(0)? == [go_subnet.to_string()])
    })?;

    let (twill_side, go_side) = (c.container(0), c.container(1));
    let out = ping(twill_side, go_side.ip, 3)?;
    assert!(out.contains("3 received"), "{out}");
    let out = ping(go_side, twill_side.ip, 3)?;
    assert!(out.contains("3 received"), "{out}");
    tcp_transfer_intact(twill_side, go_side, 32 << 20)?;
    tcp_transfer_intact(go_side, twill_side, 32 << 20)?;

    // PersistentKeepaliveInterval 1: idle, twill still sends about once a second.
    let before = go.received_bytes()?;
    std::thread::sleep(Duration::from_millis(3500));
    let keepalives = (go.received_bytes()? - before) / 32;
    assert!(keepalives >= 2, "{keepalives} keepalives in 3.5 s");

    // wireguard-go moves to another port; its next datagram tells twill where it is now.
    go.set(&["listen-port", "51821"])?;
    let out = ping(go_side, twill_side.ip, 2)?;
    assert!(out.contains("2 received"), "{out}");
    tcp_transfer_intact(twill_side, go_side, 8 << 20)?;
    let log = node.stderr();
    assert!(
        log.contains("WireGuard peer roamed") && log.contains(":51821"),
        "{log}"
    );
    Ok(())
}

/// wireguard-go on host 1, on an interface named for this test process.
struct GoNode<'a> {
    go: WireguardGo,
    ns: &'a Netns,
    files: tempfile::TempDir,
}

impl<'a> GoNode<'a> {
    fn start(ns: &'a Netns) -> Result<GoNode<'a>> {
        let name = format!("wgo{}", std::process::id() % 1_000_000);
        Ok(GoNode {
            go: WireguardGo::start(ns, &name)?,
            ns,
            files: tempfile::tempdir()?,
        })
    }

    /// As flannel configures a node leasing `subnet`: a key, the listen port, twill's node as
    /// peer (its lease's key, the network's PSK, its PublicIP:Port, its subnet), the lease
    /// network's address as /32, up, and the whole network routed into the device. Returns the
    /// public key.
    fn configure(&self, c: &Cluster, subnet: Ipv4Net) -> Result<String> {
        let key = self.files.path().join("private");
        let public = generate_key(self.ns, &key)?;
        let psk = self.files.path().join("psk");
        std::fs::write(&psk, PSK)?;
        std::fs::set_permissions(&psk, std::fs::Permissions::from_mode(0o600))?;
        let peer_key = wg::public_key(c, 0)?;
        let endpoint = format!("{}:{}", c.lab.host(0).underlay_ip, wg::PORT);
        let allowed = c.subnet(0)?.to_string();
        self.set(&["private-key", path(&key)?, "listen-port", "51820"])?;
        self.set(&[
            "peer",
            &peer_key,
            "preshared-key",
            path(&psk)?,
            "endpoint",
            &endpoint,
        ])?;
        self.set(&["peer", &peer_key, "allowed-ips", &allowed])?;
        let name = self.go.name();
        let address = format!("{}/32", subnet.network());
        self.ns.ip(&["addr", "add", &address, "dev", name])?;
        self.ns.ip(&["link", "set", name, "up"])?;
        self.ns.ip(&["route", "add", "10.5.0.0/16", "dev", name])?;
        Ok(public)
    }

    fn set(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["set", self.go.name()];
        all.extend_from_slice(args);
        self.ns.exec("wg", &all)
    }

    /// Bytes wireguard-go has received from twill's node (`wg show transfer`).
    fn received_bytes(&self) -> Result<u64> {
        let out = self.ns.exec("wg", &["show", self.go.name(), "transfer"])?;
        let rx = out.split_whitespace().nth(1).context("no transfer line")?;
        Ok(rx.parse()?)
    }
}

fn path(p: &Path) -> Result<&str> {
    p.to_str().context("non-UTF-8 path")
}
