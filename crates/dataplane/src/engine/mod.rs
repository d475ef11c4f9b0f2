//! The userspace dataplanes: tokio tasks that move packets TUN -> UDP and UDP -> TUN.
//!
//! The per-packet rules both engines share live here: route a packet from TUN to a peer, and
//! check a packet from a peer before it reaches TUN. The engines differ only in how packets
//! are laid out in datagrams.

pub mod batch;
mod path_mtu;
pub mod udp;

use crate::io::udp::SendError;
use crate::io::{Tun, TunConfig, TunWriter, UdpIo};
use crate::log_limit::LogLimit;
use crate::stats::{DropReason, DropTally, EngineStats};
use crate::table::{Peer, PeerTable, SharedTable};
use crate::wire::ipv4::Ipv4Packet;
use crate::wire::{self, flannel, icmp, WireError};
use ipnet::Ipv4Net;
use std::net::SocketAddrV4;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Which datagram layout an engine speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// flannel's udp backend: one bare inner packet per datagram.
    FlannelUdp,
    /// twill's batch protocol: many packets per datagram. `delay` lets a not-full datagram wait
    /// that long for more packets; `None` never waits.
    Batch { delay: Option<Duration> },
}

impl EngineKind {
    pub fn default_port(self) -> u16 {
        match self {
            EngineKind::FlannelUdp => flannel::DEFAULT_PORT,
            EngineKind::Batch { .. } => wire::batch::DEFAULT_PORT,
        }
    }

    /// Bytes the underlay and the format add to a packet sent alone: TUN MTU = underlay - this.
    pub fn overhead(self) -> usize {
        match self {
            EngineKind::FlannelUdp => flannel::OVERHEAD,
            EngineKind::Batch { .. } => wire::batch::OVERHEAD,
        }
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub kind: EngineKind,
    pub tun: TunConfig,
    /// This node's lease: batch datagrams name their sender by it.
    pub subnet: Ipv4Net,
    /// Where to bind; peers send to this port on our public IP.
    pub bind: SocketAddrV4,
    /// Send and receive buffer of the UDP socket, bytes each.
    pub socket_buffer: usize,
}

/// A running dataplane. Dropping it stops the tasks and removes the TUN device.
pub struct Engine {
    table: Arc<SharedTable>,
    stats: Arc<EngineStats>,
    tasks: Vec<JoinHandle<()>>,
    offload: bool,
    mtu: u16,
}

impl Engine {
    /// Open the TUN and the socket and start forwarding. Must run inside a tokio runtime.
    pub fn start(config: &EngineConfig) -> anyhow::Result<Engine> {
        let udp = Arc::new(UdpIo::bind(config.bind, config.socket_buffer)?);
        let tun = Tun::open(&config.tun)?;
        let table = Arc::new(SharedTable::default());
        let stats = Arc::new(EngineStats::default());
        let io = Shared {
            udp,
            table: table.clone(),
            stats: stats.clone(),
            mtu: usize::from(tun.mtu()),
        };
        let tasks = match config.kind {
            EngineKind::FlannelUdp => udp::spawn(&tun, &io),
            EngineKind::Batch { delay } => batch::spawn(&tun, &io, config.subnet, delay),
        };
        Ok(Engine {
            table,
            stats,
            tasks,
            offload: tun.offload(),
            mtu: tun.mtu(),
        })
    }

    pub fn table(&self) -> &Arc<SharedTable> {
        &self.table
    }

    pub fn stats(&self) -> &Arc<EngineStats> {
        &self.stats
    }

    pub fn offload(&self) -> bool {
        self.offload
    }

    pub fn mtu(&self) -> u16 {
        self.mtu
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// What every task of one engine shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub udp: Arc<UdpIo>,
    pub table: Arc<SharedTable>,
    pub stats: Arc<EngineStats>,
    pub mtu: usize,
}

/// Route a packet read from TUN: find its peer's index and decrement its TTL as flanneld does.
pub fn route_outbound(packet: &mut [u8], table: &PeerTable) -> Result<usize, DropReason> {
    let mut ip = Ipv4Packet::new_checked(packet).map_err(|e| match e {
        WireError::BadVersion => DropReason::NotIpv4,
        _ => DropReason::Malformed,
    })?;
    let peer = table.route(ip.dst_addr()).ok_or(DropReason::NoRoute)?;
    if !ip.decrement_ttl() {
        return Err(DropReason::TtlExceeded);
    }
    Ok(peer)
}

/// Check a packet that arrived from `peer` before it goes to TUN: it must decode, come from
/// inside the peer's subnet, fit the TUN, and have TTL left (flanneld decrements here too).
pub fn accept_inbound(packet: &mut [u8], peer: &Peer, mtu: usize) -> Result<(), DropReason> {
    let mut ip = flannel::decap(packet).map_err(|_| DropReason::Malformed)?;
    if !peer.spec.subnet.contains(&ip.src_addr()) {
        return Err(DropReason::SpoofedSource);
    }
    if ip.total_len() > mtu {
        return Err(DropReason::TooBig);
    }
    if !ip.decrement_ttl() {
        return Err(DropReason::TtlExceeded);
    }
    Ok(())
}

/// Decide whether a TUN->UDP task goes on after a failed read. A read can fail for one packet
/// (say, a super-packet tun-rs cannot split), which is counted and logged sparingly, so a bad
/// stream neither stops forwarding nor floods the log; only a device that is gone ends the task.
pub(crate) fn tun_read_failed(e: &std::io::Error, drops: &mut DropTally) -> ControlFlow<()> {
    static LOG: LogLimit = LogLimit::per_second();
    if matches!(
        e.raw_os_error(),
        Some(libc::EBADFD | libc::EBADF | libc::ENODEV)
    ) {
        tracing::error!("TUN device gone, stopping TUN->UDP: {e}");
        return ControlFlow::Break(());
    }
    drops.count(DropReason::IoError);
    if let Some(held) = LOG.allow() {
        tracing::warn!("TUN read failed: {e}; {held} more failed reads since the last report");
    }
    ControlFlow::Continue(())
}

/// Count and log the datagrams of a send the kernel refused. Logged at warn with the errno and
/// the peer, at most once a second, so a refusing kernel shows at once without a line per packet.
pub(crate) fn send_failed(dst: SocketAddrV4, e: &SendError, lost: usize, drops: &mut DropTally) {
    static LOG: LogLimit = LogLimit::per_second();
    let reason = match e.error.raw_os_error() {
        Some(libc::EMSGSIZE) => DropReason::TooBig,
        _ => DropReason::IoError,
    };
    drops.add(reason, lost as u64);
    if let Some(held) = LOG.allow() {
        tracing::warn!(
            peer = %dst,
            errno = e.error.raw_os_error().unwrap_or(0),
            lost,
            "UDP send refused by the kernel: {e}; {held} more refused sends since the last report"
        );
    }
}

/// Answer a packet with no peer with ICMP net-unreachable into TUN, as flanneld does.
pub(crate) fn reply_unreachable(packet: &[u8], writer: &mut TunWriter) {
    let Ok(offender) = Ipv4Packet::new_checked(packet) else {
        return;
    };
    let mut reply = [0u8; icmp::MAX_UNREACHABLE_LEN];
    if let Ok(Some(len)) = icmp::net_unreachable(&offender, &mut reply) {
        writer.push(&reply[..len]);
    }
}

/// Queue a checked packet for TUN, writing the batch out once it is full.
pub(crate) async fn write_to_tun(writer: &mut TunWriter, packet: &[u8], drops: &mut DropTally) {
    writer.push(packet);
    if writer.is_full() {
        flush_tun(writer, drops).await;
    }
}

pub(crate) async fn flush_tun(writer: &mut TunWriter, drops: &mut DropTally) {
    if let Err(e) = writer.flush().await {
        tracing::debug!("TUN write failed: {e}");
        drops.count(DropReason::IoError);
    }
}
