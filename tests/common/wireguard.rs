//! What the WireGuard tests share: the network config, a key file per host, the lease a node
//! must write, two connected nodes (IPv4-only or dual-stack) and the status server's metrics.

use super::cluster::{cluster, dual_stack_cluster, Cluster, PREFIX};
use super::*;
use anyhow::{Context, Result};
use std::net::Ipv6Addr;
use std::path::PathBuf;
use twill_dataplane::engine::wireguard::PrivateKey;

/// Made with `wg genpsk`.
pub const PSK: &str = "vKo36JW5OcxFHeIUTgqMMwbIJg3HLZXtIC0B9lxF6Eo=";
pub const OTHER_PSK: &str = "SAioU7qy9DTNFP+Z0s1bAniVyo36BbAQIjeXifQn4Ho=";
pub const PORT: u16 = 51820;

/// flannel's wireguard network config with a preshared key, and `extra` Backend fields.
pub fn config(psk: &str, extra: &str) -> String {
    format!(r#"{{"Network":"10.5.0.0/16","Backend":{{"Type":"wireguard","PSK":"{psk}"{extra}}}}}"#)
}

/// flannel's wireguard config on a dual-stack network (fd10::/56), in Mode `mode`.
pub fn dual_config(mode: &str) -> String {
    format!(
        r#"{{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd10::/56","Backend":{{"Type":"wireguard","PSK":"{PSK}","Mode":"{mode}"}}}}"#
    )
}

/// Each host keeps its private key in its own file (they share one filesystem).
pub fn key_file(c: &Cluster, host: usize) -> PathBuf {
    c.dir.path().join(format!("wgkey-{host}"))
}

/// `twill run` with the wireguard backend on `host`, its key in [`key_file`], choosing its
/// WireGuard as a user's node does (`--dataplane auto`: the kernel's where it has one).
pub fn start(c: &Cluster, host: usize) -> Result<Proc> {
    start_on(c, host, "auto")
}

/// [`start`] with `--dataplane` `dataplane` (`tun`: twill's userspace WireGuard).
pub fn start_on(c: &Cluster, host: usize, dataplane: &str) -> Result<Proc> {
    let file = key_file(c, host);
    let file = file.to_str().context("key file path")?;
    c.start_with_env(
        host,
        &[("WIREGUARD_KEY_FILE", file), ("TWILL_DATAPLANE", dataplane)],
    )
}

/// The private key in a node's key file, base64, as the file holds it.
pub fn private_key(c: &Cluster, host: usize) -> Result<String> {
    Ok(std::fs::read_to_string(key_file(c, host))?
        .trim()
        .to_string())
}

/// The public key of the private key in a node's key file.
pub fn public_key(c: &Cluster, host: usize) -> Result<String> {
    let key = PrivateKey::from_base64(&private_key(c, host)?)?;
    Ok(key.public_key().to_string())
}

/// A wireguard lease value exactly as flanneld writes it.
pub fn lease_value(public_ip: Ipv4Addr, public_key: &str, port: u16) -> String {
    format!(
        r#"{{"PublicIP":"{public_ip}","PublicIPv6":null,"BackendType":"wireguard","BackendData":{{"PublicKey":"{public_key}","Port":{port}}}}}"#
    )
}

/// A dual-stack wireguard lease value exactly as flanneld writes it: BackendV6Data names the
/// key again and ListenPortV6.
pub fn dual_lease_value(public_ip: Ipv4Addr, public_ipv6: Ipv6Addr, key: &str) -> String {
    format!(
        r#"{{"PublicIP":"{public_ip}","PublicIPv6":"{public_ipv6}","BackendType":"wireguard","BackendData":{{"PublicKey":"{key}","Port":{PORT}}},"BackendV6Data":{{"PublicKey":"{key}","Port":{PORT_V6}}}}}"#
    )
}

/// flannel's default ListenPortV6.
pub const PORT_V6: u16 = 51821;

/// The etcd value of a node's lease.
pub fn lease_of(c: &Cluster, host: usize) -> Result<String> {
    let key = c.lease_key(c.subnet(host)?);
    Ok(c.etcd
        .etcdctl(&["get", "--print-value-only", &key])?
        .trim()
        .to_string())
}

/// Two wireguard nodes through etcd with a container each, which have pinged each other.
pub struct Connected {
    pub c: Cluster,
    pub nodes: Vec<Proc>,
}

pub fn connected(tag: &str, config: &str) -> Result<Connected> {
    let mut c = cluster(tag, 2, config)?;
    let nodes = vec![start(&c, 0)?, start(&c, 1)?];
    c.add_container(0)?;
    c.add_container(1)?;
    eventually("peers known", || {
        Ok(c.peer_subnets(0)?.len() == 1 && c.peer_subnets(1)?.len() == 1)
    })?;
    let out = ping(c.container(0), c.container(1).ip, 2)?;
    anyhow::ensure!(out.contains("2 received"), "{out}");
    Ok(Connected { c, nodes })
}

/// Two wireguard nodes on a dual-stack network of Mode `mode` with a dual-stack container
/// each, which have pinged each other over both families.
pub fn dual_connected(tag: &str, mode: &str) -> Result<Connected> {
    let mut c = dual_stack_cluster(tag, 2, &dual_config(mode))?;
    let nodes = vec![start(&c, 0)?, start(&c, 1)?];
    c.add_dual_stack_container(0)?;
    c.add_dual_stack_container(1)?;
    eventually("peers known", || {
        Ok(c.peer_subnets(0)?.len() == 1 && c.peer_subnets(1)?.len() == 1)
    })?;
    let (a, b) = (c.container(0), c.container(1));
    let to6 = b.ipv6.context("a dual-stack container")?;
    for to in [IpAddr::from(b.ip), IpAddr::from(to6)] {
        let out = ping(a, to, 2)?;
        anyhow::ensure!(out.contains("2 received"), "{out}");
    }
    Ok(Connected { c, nodes })
}

impl Connected {
    pub fn ns(&self, host: usize) -> &Netns {
        &self.c.lab.host(host).ns
    }

    /// `ping -c COUNT` that may fail; its output.
    pub fn try_ping(&self, from: usize, count: u32) -> Result<String> {
        let to = self.c.container(1 - from).ip;
        let script = format!("ping -c {count} -i 0.2 -W 1 {to} || true");
        self.c.container(from).ns.sh(&script)
    }
}

/// GET `/metrics` from the status server in `ns`.
pub fn metrics(ns: &Netns) -> Result<String> {
    http_get(ns, "127.0.0.1:9585", "/metrics")
}

/// `rejected_leases` of a node's status, as (subnet, reason) pairs.
pub fn rejected(ns: &Netns) -> Result<Vec<(String, String)>> {
    let s = status(ns)?;
    let rejected = s["rejected_leases"].as_array().context("rejected_leases")?;
    Ok(rejected
        .iter()
        .map(|r| {
            let text = |field: &str| r[field].as_str().unwrap_or_default().to_string();
            (text("subnet"), text("reason"))
        })
        .collect())
}

/// Two wireguard nodes with a container each whose network configs hold different
/// pre-shared keys: node 0 started with [`PSK`], node 1 after the config changed to
/// [`OTHER_PSK`]. Node 0 knows node 1 as a peer.
pub fn mismatched_psk(tag: &str) -> Result<(Cluster, [Proc; 2])> {
    let mut c = cluster(tag, 2, &config(PSK, ""))?;
    let first = start(&c, 0)?;
    c.etcd
        .etcdctl(&["put", &format!("{PREFIX}/config"), &config(OTHER_PSK, "")])?;
    let second = start(&c, 1)?;
    c.add_container(0)?;
    c.add_container(1)?;
    eventually("peers known", || Ok(c.peer_subnets(0)?.len() == 1))?;
    Ok((c, [first, second]))
}
