//! The reference path for twill-wireguard: wireguard-go on both hosts, configured with `wg` the
//! way flannel's wireguard backend configures the kernel's device (each host's lease address
//! as /32, the network routed into the device, the other host as peer). Unavailable, with the
//! reason, where wireguard-go or wg is not installed.

use crate::addressing::{pairs, subnet, NETWORK, UNDERLAY_MTU};
use anyhow::{Context, Result};
use std::path::Path;
use twill_lab::wireguard_go::{generate_key, installed};
use twill_lab::{Lab, WireguardGo};

/// flannel's device MTU on the lab's 1500-byte underlay (and wireguard-go's default).
pub const MTU: u32 = UNDERLAY_MTU - 80;
const PORT: &str = "51820";

/// Start and configure wireguard-go on both hosts; they stop when the result drops.
pub fn start(lab: &Lab, dir: &Path) -> Result<Vec<WireguardGo>> {
    installed()?;
    let mut keys = Vec::new();
    for i in 0..2 {
        let file = dir.join(format!("wireguard-go-{i}.key"));
        let public = generate_key(&lab.host(i).ns, &file)?;
        keys.push((file.to_str().context("key path")?.to_string(), public));
    }
    let mut daemons = Vec::new();
    for (i, host, peer) in pairs(lab) {
        let name = format!("wgb{}h{i}", std::process::id() % 100_000);
        daemons.push(WireguardGo::start(&host.ns, &name)?);
        let endpoint = format!("{}:{PORT}", peer.underlay_ip);
        let allowed = subnet(1 - i).to_string();
        let (private, _) = &keys[i];
        let (_, peer_key) = &keys[1 - i];
        host.ns.exec(
            "wg",
            &[
                "set",
                &name,
                "private-key",
                private,
                "listen-port",
                PORT,
                "peer",
                peer_key,
                "endpoint",
                &endpoint,
                "allowed-ips",
                &allowed,
            ],
        )?;
        let address = format!("{}/32", subnet(i).network());
        host.ns
            .ip(&["link", "set", &name, "mtu", &MTU.to_string()])?;
        host.ns.ip(&["addr", "add", &address, "dev", &name])?;
        host.ns.ip(&["link", "set", &name, "up"])?;
        host.ns.ip(&["route", "add", NETWORK, "dev", &name])?;
    }
    Ok(daemons)
}
