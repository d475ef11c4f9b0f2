//! The udp backend on the eBPF dataplane (`twill run --dataplane ebpf`) at scale: its peers are
//! entries in the programs' maps, which the bench reads through the daemon's own pins (twill
//! runs under `ip netns exec`, whose private mounts hold the bpffs it pins in; the bench sees
//! them as /proc/<pid>/root does), and which it times a lease's route arriving in and leaving.

use super::leases::Synthetic;
use crate::paths::Twill;
use anyhow::{ensure, Result};
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use twill_ebpf::PinnedPeers;
use twill_lab::Host;

/// Where the daemon pins, inside its own mount namespace, and its device.
const BPF_DIR: &str = "/sys/fs/bpf/twill";
const DEVICE: &str = "twill0";
/// flannel's udp port: the synthetic leases' peers all listen on it.
const PORT: u16 = 8285;

/// `twill` running udp leases on the eBPF dataplane, pinning where [`Maps::open`] looks.
pub fn twill(twill: &Twill) -> Twill {
    let ours = [
        "--dataplane",
        "ebpf",
        "--bpf-dir",
        BPF_DIR,
        "--tun-name",
        DEVICE,
    ];
    twill.with_args(&ours)
}

/// `twill run --cleanup`: the device and its route go (the pins went with the daemon's mount
/// namespace, and its programs with them), so the next backend's run starts from nothing.
pub fn clean_up(host: &Host, twill: &Twill) -> Result<()> {
    let binary = twill.binary.to_string_lossy();
    let args = [
        "run",
        "--cleanup",
        "--bpf-dir",
        BPF_DIR,
        "--tun-name",
        DEVICE,
    ];
    host.ns.exec(&binary, &args)?;
    Ok(())
}

/// The maps of the daemon `pid`.
pub struct Maps(PinnedPeers);

impl Maps {
    pub fn open(pid: u32) -> Result<Maps> {
        let dir = PathBuf::from(format!("/proc/{pid}/root{BPF_DIR}")).join(DEVICE);
        Ok(Maps(PinnedPeers::open(&dir)?))
    }

    /// The maps hold a route and a peer for each of the `k` leases, and no more.
    pub fn check_programmed(&self, k: u32) -> Result<()> {
        let (routes, peers) = self.0.count()?;
        let k = k as usize;
        ensure!(
            routes == k && peers == k,
            "the maps hold {routes} routes and {peers} peers, not {k}"
        );
        Ok(())
    }

    /// Polls the routes map until `lease`'s route leads to its peer (or, with `gone`, no
    /// longer does); when it was seen.
    pub fn wait(&self, lease: Synthetic, gone: bool, limit: Duration) -> Result<Instant> {
        let peer = SocketAddrV4::new(lease.public_ip(), PORT);
        let deadline = Instant::now() + limit;
        loop {
            let routed = self.0.route(lease.subnet())? == Some(peer);
            if routed != gone {
                return Ok(Instant::now());
            }
            ensure!(
                Instant::now() < deadline,
                "the maps never {} {lease:?}'s route within {limit:?}",
                if gone { "dropped" } else { "held" }
            );
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}
