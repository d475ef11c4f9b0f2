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
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use twill_lab::{Ipv4Net, Netns, Proc};

/// wireguard-go's lease: a subnet no twill node takes first (leases start at 10.5.1.0).
const GO_SUBNET: &str = "10.5.77.0/24";

#[test]
fn twill_and_wireguard_go_carry_traffic_both_ways_keep_alive_and_roam() -> Result<()> {
    let mut c = cluster(
        "wgo",
        2,
        &wg::config(PSK, r#","PersistentKeepaliveInterval":1"#),
    )?;
    let node = wg::start(&c, 0)?;
    let go_subnet: Ipv4Net = GO_SUBNET.parse()?;
    c.add_container(0)?;
    c.lab.host_mut(1).add_container(go_subnet)?;
    let go = WireguardGo::start(&c.lab.host(1).ns)?;
    let go_key = go.configure(&c)?;
    let lease = wg::lease_value(c.lab.host(1).underlay_ip, &go_key, wg::PORT);
    c.etcd.etcdctl(&["put", &c.lease_key(go_subnet), &lease])?;
    eventually("twill follows wireguard-go's lease", || {
        Ok(c.peer_subnets(0)? == [GO_SUBNET])
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

/// wireguard-go on a host, in the foreground, on an interface named for this test process
/// (its control socket lives in /var/run/wireguard, which every namespace shares).
struct WireguardGo<'a> {
    // Drop order: the process stops before its files go.
    proc: Proc,
    name: String,
    ns: &'a Netns,
    files: tempfile::TempDir,
}

impl<'a> WireguardGo<'a> {
    fn start(ns: &'a Netns) -> Result<WireguardGo<'a>> {
        let name = format!("wgo{}", std::process::id() % 1_000_000);
        let env = [("WG_PROCESS_FOREGROUND", "1")];
        let mut proc = ns.spawn_with("wireguard-go", &["-f", &name], &env)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !socket(&name).exists() {
            anyhow::ensure!(proc.is_running(), "wireguard-go exited: {}", proc.stderr());
            anyhow::ensure!(
                Instant::now() < deadline,
                "wireguard-go made no control socket"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(WireguardGo {
            proc,
            name,
            ns,
            files: tempfile::tempdir()?,
        })
    }

    /// As flannel configures a node: a key, the listen port, twill's node as peer (its lease's
    /// key, the network's PSK, its PublicIP:Port, its subnet), the lease network's address as
    /// /32, up, and the whole network routed into the device. Returns the public key.
    fn configure(&self, c: &Cluster) -> Result<String> {
        let key = self.secret_file("private", &self.wg(&["genkey"])?)?;
        let psk = self.secret_file("psk", PSK)?;
        let public = self.wg_stdin(&["pubkey"], &key)?;
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
        let ns = self.ns;
        let address = format!("{}/32", GO_SUBNET.parse::<Ipv4Net>()?.network());
        ns.ip(&["addr", "add", &address, "dev", &self.name])?;
        ns.ip(&["link", "set", &self.name, "up"])?;
        ns.ip(&["route", "add", "10.5.0.0/16", "dev", &self.name])?;
        Ok(public.trim().to_string())
    }

    fn set(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["set", self.name.as_str()];
        all.extend_from_slice(args);
        self.wg(&all)
    }

    /// Bytes wireguard-go has received from twill's node (`wg show transfer`).
    fn received_bytes(&self) -> Result<u64> {
        let out = self.wg(&["show", &self.name, "transfer"])?;
        let rx = out.split_whitespace().nth(1).context("no transfer line")?;
        Ok(rx.parse()?)
    }

    fn wg(&self, args: &[&str]) -> Result<String> {
        self.ns.exec("wg", args)
    }

    fn wg_stdin(&self, args: &[&str], input: &Path) -> Result<String> {
        let script = format!("wg {} < {}", args.join(" "), path(input)?);
        self.ns.sh(&script)
    }

    fn secret_file(&self, name: &str, content: &str) -> Result<PathBuf> {
        let file = self.files.path().join(name);
        std::fs::write(&file, content.trim())?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
        Ok(file)
    }
}

impl Drop for WireguardGo<'_> {
    fn drop(&mut self) {
        let _ = self.proc.stop();
        // wireguard-go removes it on a clean stop; a killed one leaves it behind.
        let _ = std::fs::remove_file(socket(&self.name));
    }
}

fn socket(name: &str) -> PathBuf {
    Path::new("/var/run/wireguard").join(format!("{name}.sock"))
}

fn path(p: &Path) -> Result<&str> {
    p.to_str().context("non-UTF-8 path")
}
