//! The userspace dataplanes: directions that move packets TUN -> UDP and UDP -> TUN, each on
//! its own thread ([`directions`]).
//!
//! The per-packet rules both engines share live here: route a packet from TUN to a peer, and
//! check a packet from a peer before it reaches TUN. The engines differ only in how packets
//! are laid out in datagrams.

pub mod batch;
pub mod directions;
mod path_mtu;
mod train;
pub mod udp;
pub mod wireguard;

use crate::icmp_limit::{IcmpBudget, IcmpLimit};
use crate::io::udp::{udp_ip_headers, SendError};
use crate::io::{Tun, TunConfig, TunReader, TunWriter, UdpIo};
use crate::log_limit::LogLimit;
use crate::stats::{DropReason, DropTally, EngineStats};
use crate::table::{Peer, PeerTable, SharedTable};
use crate::wire::icmp::{self, IcmpError};
use crate::wire::icmpv6::{self, Icmpv6Error};
use crate::wire::ip::IpPacket;
use crate::wire::ipv4::Ipv4Packet;
use crate::wire::ipv6::Ipv6Packet;
use crate::wire::{self, flannel, WireError};
use directions::{Direction, Directions, Ended};
use ipnet::{Ipv4Net, Ipv6Net};
use path_mtu::PathMtu;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

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
    /// Bytes the underlay (of `underlay`'s family) and the format add to a packet sent alone:
    /// TUN MTU = underlay MTU - this. The wire's constants count an IPv4 underlay.
    pub fn overhead(self, underlay: IpAddr) -> usize {
        let over_ipv4 = match self {
            EngineKind::FlannelUdp => flannel::OVERHEAD,
            EngineKind::Batch { .. } => wire::batch::OVERHEAD,
        };
        over_ipv4 - udp_ip_headers(Ipv4Addr::UNSPECIFIED.into()) + udp_ip_headers(underlay)
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub kind: EngineKind,
    pub tun: TunConfig,
    /// This node's lease: batch datagrams name their sender by it.
    pub subnet: Ipv4Net,
    /// The lease's IPv6 subnet on a dual-stack network: its network address goes on the TUN,
    /// as the IPv4 one does, and is the source of twill's ICMPv6 errors.
    pub subnet6: Option<Ipv6Net>,
    /// Where to bind; peers send to this port on our public IP (IPv4) or PublicIPv6 (IPv6).
    pub bind: SocketAddr,
    /// Send and receive buffer of the UDP socket, bytes each.
    pub socket_buffer: usize,
}

/// A running dataplane. Dropping it stops its threads and removes the TUN device.
pub struct Engine {
    // Drop order: the threads stop and close their descriptors, then the device's own go.
    directions: Directions,
    _tun: Arc<Tun>,
    table: Arc<SharedTable>,
    stats: Arc<EngineStats>,
    offload: bool,
    mtu: u16,
}

impl Engine {
    /// Open the TUN and the socket and start forwarding, each direction on its own thread.
    pub fn start(config: &EngineConfig) -> anyhow::Result<Engine> {
        Engine::launch(
            &config.tun,
            config.subnet6.map(|s| s.network()),
            config.bind,
            config.socket_buffer,
            config.kind.overhead(config.bind.ip()),
            |tun, io| match config.kind {
                EngineKind::FlannelUdp => udp::directions(tun, io),
                EngineKind::Batch { delay } => batch::directions(tun, io, config.subnet, delay),
            },
        )
    }

    /// Open the TUN (with `address6` too, if given) and a socket bound on `bind`, and start the
    /// directions `directions` declares on them, each on its own thread. `overhead` is what the
    /// engine's format adds to a packet sent alone.
    pub(crate) fn launch(
        config: &TunConfig,
        address6: Option<Ipv6Addr>,
        bind: SocketAddr,
        socket_buffer: usize,
        overhead: usize,
        directions: impl FnOnce(&Arc<Tun>, &Shared) -> std::io::Result<Vec<Direction>>,
    ) -> anyhow::Result<Engine> {
        let udp = Arc::new(UdpIo::bind(bind, socket_buffer)?);
        let tun = Arc::new(Tun::open_dual(config, address6)?);
        let table = Arc::new(SharedTable::default());
        let stats = Arc::new(EngineStats::default());
        let mtu = usize::from(tun.mtu());
        let io = Shared {
            udp,
            table: table.clone(),
            stats: stats.clone(),
            mtu,
            own: config.address,
            own6: address6,
            path: Arc::new(PathMtu::new(mtu + overhead, udp_ip_headers(bind.ip()))),
            overhead,
            icmp: Arc::new(IcmpBudget::new(IcmpLimit::of_this_namespace())),
        };
        let directions = directions(&tun, &io)?;
        Ok(Engine {
            directions: Directions::start(directions)?,
            offload: tun.offload(),
            mtu: tun.mtu(),
            _tun: tun,
            table,
            stats,
        })
    }

    /// Fires when one of the engine's directions stops forwarding on its own.
    pub fn ended(&self) -> Ended {
        self.directions.ended()
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

/// What every direction of one engine shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub udp: Arc<UdpIo>,
    pub table: Arc<SharedTable>,
    pub stats: Arc<EngineStats>,
    /// The TUN's MTU.
    pub mtu: usize,
    /// This node's own address in the network (the TUN's): the source of twill's ICMP errors,
    /// inside our subnet, so a peer's anti-spoofing check lets them through.
    pub own: Ipv4Addr,
    /// The TUN's IPv6 address on a dual-stack network, the source of ICMPv6 errors; without
    /// one, IPv6 drops are counted and not answered.
    pub own6: Option<Ipv6Addr>,
    /// The underlay path MTU, one for all peers.
    pub path: Arc<PathMtu>,
    /// What the engine's format adds to a packet sent alone (see [`EngineKind::overhead`]).
    pub overhead: usize,
    /// What the ICMP limit lets the engine answer with (crate::icmp_limit), for all directions.
    pub icmp: Arc<IcmpBudget>,
}

impl Shared {
    /// Send a train. A send refused as too big first teaches the path MTU what the route allows
    /// now (a GSO train over the device MTU is refused with EINVAL rather than EMSGSIZE); the
    /// caller counts what was lost.
    pub fn send(&self, dst: SocketAddr, datagrams: &[u8], segment: usize) -> Result<(), SendError> {
        let result = self.udp.send(dst, datagrams, segment);
        if let Err(e) = &result {
            if matches!(e.error.raw_os_error(), Some(libc::EMSGSIZE | libc::EINVAL)) {
                if let Ok(local) = self.udp.local_addr() {
                    self.path.lower(local.ip(), dst);
                }
            }
        }
        result
    }

    /// The largest inner packet the path takes now: the TUN MTU until the kernel refuses a
    /// send as too big and the path MTU is learned lower.
    pub fn largest_packet(&self) -> usize {
        self.path.get().saturating_sub(self.overhead).min(self.mtu)
    }

    /// Answer a packet dropped for `reason` with the ICMP error a router would send, if any.
    pub fn answer_drop(&self, reason: DropReason, packet: &[u8], writer: &mut TunWriter) {
        match IpPacket::new_checked(packet) {
            Ok(IpPacket::V4(offender)) => self.answer_v4(reason, &offender, writer),
            Ok(IpPacket::V6(offender)) => self.answer_v6(reason, &offender, writer),
            Err(_) => {}
        }
    }

    fn answer_v4(&self, reason: DropReason, offender: &Ipv4Packet<&[u8]>, writer: &mut TunWriter) {
        let error = match reason {
            DropReason::NoRoute => IcmpError::NetUnreachable,
            DropReason::TtlExceeded => IcmpError::TimeExceeded,
            DropReason::TooBig if offender.dont_fragment() => IcmpError::FragmentationNeeded {
                mtu: u16::try_from(self.largest_packet()).unwrap_or(u16::MAX),
            },
            _ => return,
        };
        let mut reply = [0u8; icmp::MAX_ERROR_LEN];
        if let Ok(Some(len)) = icmp::reply(offender, error, self.own, &mut reply) {
            let carries_mtu = matches!(error, IcmpError::FragmentationNeeded { .. });
            self.within_limit(carries_mtu, || writer.push(&reply[..len]));
        }
    }

    /// As [`Shared::answer_v4`]; every too-big IPv6 packet is answered, as IPv6 routers never
    /// fragment.
    fn answer_v6(&self, reason: DropReason, offender: &Ipv6Packet<&[u8]>, writer: &mut TunWriter) {
        let error = match reason {
            DropReason::NoRoute => Icmpv6Error::NoRoute,
            DropReason::TtlExceeded => Icmpv6Error::HopLimitExceeded,
            DropReason::TooBig => Icmpv6Error::PacketTooBig {
                mtu: u32::try_from(self.largest_packet()).unwrap_or(u32::MAX),
            },
            _ => return,
        };
        let Some(own) = self.own6 else {
            return;
        };
        let mut reply = [0u8; icmpv6::MAX_ERROR_LEN];
        if let Ok(Some(len)) = icmpv6::reply(offender, error, own, &mut reply) {
            let carries_mtu = matches!(error, Icmpv6Error::PacketTooBig { .. });
            self.within_limit(carries_mtu, || writer.push(&reply[..len]));
        }
    }

    /// Sends an answer (`send`) if the ICMP limit lets it go now, else counts it held back.
    /// An error that carries a path MTU always goes, as the kernel's do.
    fn within_limit(&self, carries_mtu: bool, send: impl FnOnce()) {
        if carries_mtu || self.icmp.spend() {
            send();
        } else {
            self.stats.icmp_rate_limited.fetch_add(1, Relaxed);
        }
    }
}

/// Route a packet read from TUN: find its peer's index and decrement its TTL or hop limit as
/// flanneld does.
#[inline]
pub fn route_outbound(packet: &mut [u8], table: &PeerTable) -> Result<usize, DropReason> {
    let (mut ip, peer) = routed(packet, table)?;
    if !ip.decrement_hop_limit() {
        return Err(DropReason::TtlExceeded);
    }
    Ok(peer)
}

/// A packet read from TUN, and the index of the peer its destination routes to in its family.
/// A packet neither IPv4 nor IPv6 is `not_ipv4`.
#[inline]
pub(crate) fn routed<T: AsRef<[u8]>>(
    packet: T,
    table: &PeerTable,
) -> Result<(IpPacket<T>, usize), DropReason> {
    let ip = IpPacket::new_checked(packet).map_err(|e| match e {
        WireError::BadVersion => DropReason::NotIpv4,
        _ => DropReason::Malformed,
    })?;
    let peer = match &ip {
        IpPacket::V4(ip) => table.route(ip.dst_addr()),
        IpPacket::V6(ip) => table.route6(ip.dst_addr()),
    };
    Ok((ip, peer.ok_or(DropReason::NoRoute)?))
}

/// Check a packet that arrived from `peer` before it goes to TUN: it must decode, come from
/// inside the peer's subnet of its family, fit the TUN, and have TTL or hop limit left
/// (flanneld decrements here too).
#[inline]
pub fn accept_inbound(packet: &mut [u8], peer: &Peer, mtu: usize) -> Result<(), DropReason> {
    let mut ip = flannel::decap(packet).map_err(|_| DropReason::Malformed)?;
    check_from(&ip, peer.spec.subnet, peer.spec.subnet6, mtu)?;
    if !ip.decrement_hop_limit() {
        return Err(DropReason::TtlExceeded);
    }
    Ok(())
}

/// What every engine checks of a packet from a peer before it goes to TUN: it comes from
/// inside the peer's subnet of its family (an IPv6 packet from a peer without an IPv6 subnet
/// is spoofed), and fits the TUN.
#[inline]
pub(crate) fn check_from<T: AsRef<[u8]>>(
    ip: &IpPacket<T>,
    subnet: Ipv4Net,
    subnet6: Option<Ipv6Net>,
    mtu: usize,
) -> Result<(), DropReason> {
    let inside = match ip {
        IpPacket::V4(ip) => subnet.contains(&ip.src_addr()),
        IpPacket::V6(ip) => subnet6.is_some_and(|s| holds6(s, ip.src_addr())),
    };
    if !inside {
        return Err(DropReason::SpoofedSource);
    }
    if ip.total_len() > mtu {
        return Err(DropReason::TooBig);
    }
    Ok(())
}

/// Whether `net` (host bits cleared, as the table keeps it) holds `addr`: one masked compare,
/// where `Ipv6Net::contains` computes the network and broadcast addresses and compares both.
#[inline]
fn holds6(net: Ipv6Net, addr: Ipv6Addr) -> bool {
    let mask = u128::MAX
        .checked_shl(128 - u32::from(net.prefix_len()))
        .unwrap_or(0);
    (u128::from(addr) ^ u128::from(net.addr())) & mask == 0
}

/// The next batch of packets from TUN, read again after a failed read; `None` once the device
/// is gone.
pub(crate) async fn next_tun_batch(reader: &mut TunReader, drops: &mut DropTally) -> Option<usize> {
    loop {
        let read = reader.read_batch().await;
        match counted_tun_read(read, reader, drops) {
            ControlFlow::Continue(Some(n)) => return Some(n),
            ControlFlow::Continue(None) => {}
            ControlFlow::Break(()) => return None,
        }
    }
}

/// What a TUN read means for its reader: packets to forward, a failed read to count and get
/// past, or the end. A read can fail for one packet (say, a super-packet tun-rs cannot split),
/// which is counted and logged sparingly, so a bad stream neither stops forwarding nor floods
/// the log; only a device that is gone ends the reader.
pub(crate) fn counted_tun_read(
    read: std::io::Result<usize>,
    reader: &mut TunReader,
    drops: &mut DropTally,
) -> ControlFlow<(), Option<usize>> {
    static LOG: LogLimit = LogLimit::per_second();
    let e = match read {
        Ok(n) => {
            drops.add(DropReason::IoError, reader.take_failed_reads());
            return ControlFlow::Continue(Some(n));
        }
        Err(e) => e,
    };
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
    ControlFlow::Continue(None)
}

/// Count and log the datagrams of a send the kernel refused. Logged at warn with the errno and
/// the peer, at most once a second, so a refusing kernel shows at once without a line per packet.
pub(crate) fn send_failed(dst: SocketAddr, e: &SendError, lost: usize, drops: &mut DropTally) {
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

/// Queue a checked packet for TUN, writing the batch out once it is full.
pub(crate) fn write_to_tun(writer: &mut TunWriter, packet: &[u8], drops: &mut DropTally) {
    writer.push(packet);
    if writer.is_full() {
        flush_tun(writer, drops);
    }
}

pub(crate) fn flush_tun(writer: &mut TunWriter, drops: &mut DropTally) {
    if let Err(e) = writer.flush() {
        tracing::debug!("TUN write failed: {e}");
        drops.count(DropReason::IoError);
    }
}
