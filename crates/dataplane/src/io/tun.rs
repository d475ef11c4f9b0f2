//! The TUN device on tun-rs, with virtio-net offloads when the kernel has them.
//!
//! With offloads a read can return a 64 KB TCP super-packet, which tun-rs's `gso_split` cuts
//! into MTU-sized segments, and a write can hand the kernel many TCP segments or UDP datagrams
//! that twill's [`Coalescer`] first merges (GRO, and USO where the kernel has it). So one
//! syscall moves up to 64 KB each way instead of one packet.
//!
//! Each reader and writer has its own duplicate of the queue's descriptor. A reader registers
//! its copy, for readability only, with the runtime that polls it, so a packet wakes that
//! thread and no other; a writer's copy is registered nowhere (see [`super::wait`]).

use super::devconf;
use super::gro::{Coalescer, Merge};
use super::gso;
use super::wait;
use crate::wire::virtio::GSO_NONE;
use arrayvec::ArrayVec;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, OwnedFd};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tun_rs::{DeviceBuilder, SyncDevice, VirtioNetHdr, VIRTIO_NET_HDR_LEN};

/// Packets per read batch: enough for a few 64 KB super-packets at the smallest useful MTU.
pub const READ_BATCH: usize = 256;
/// Packets per write batch, as wireguard-go's and tun-rs's IDEAL_BATCH_SIZE.
pub const WRITE_BATCH: usize = 128;
/// Slots kept free for one more read: a 64 KB super-packet splits into as many segments as its
/// MSS allows, which the peer's MSS can make far smaller than our MTU; 128 covers an MSS of 512.
const SLOTS_PER_READ: usize = 128;
/// Packets from local containers waiting for twill to read. flannel leaves flannel0 at the
/// kernel's 500, which a flood of small packets overflows (44 % loss against 37 % at 10000 in
/// docs/performance.md); TCP needs few entries, as it arrives in 64 KB super-packets.
pub const DEFAULT_TX_QUEUE_LEN: u32 = 10_000;
/// Largest read: the virtio header and a 64 KB super-packet.
const MAX_READ: usize = VIRTIO_NET_HDR_LEN + 65535;
/// A TUN whose interface was deleted reports only EPOLLERR, which a readable-only wait never
/// sees; waiting for errors too lets the next read return the error instead of hanging.
const READ_INTEREST: Interest = Interest::READABLE.add(Interest::ERROR);

#[derive(Debug, Clone)]
pub struct TunConfig {
    pub name: String,
    pub mtu: u16,
    /// flanneld gives flannel0 the lease's network address as a /32.
    pub address: Ipv4Addr,
    pub offload: bool,
    pub queues: usize,
    pub tx_queue_len: u32,
}

/// The device: its queues stay open, and the device up, for as long as this or any reader or
/// writer made from it lives.
pub struct Tun {
    queues: Vec<SyncDevice>,
    offload: bool,
    /// The kernel takes UDP GSO writes (USO, Linux 6.2), so UDP may be coalesced too.
    uso: bool,
    mtu: u16,
}

impl Tun {
    /// Create the device for IPv4 only and bring it up.
    pub fn open(config: &TunConfig) -> anyhow::Result<Tun> {
        Tun::open_dual(config, None)
    }

    /// Create the device and bring it up, with `address6` as a /128 beside the IPv4 address on
    /// a dual-stack network. If the kernel refuses offloads, retry without and log it, since a
    /// plain TUN still works, only slower.
    pub fn open_dual(config: &TunConfig, address6: Option<Ipv6Addr>) -> anyhow::Result<Tun> {
        let first = match build(config, config.offload) {
            Ok(dev) => dev,
            Err(e) if config.offload && e.kind() != io::ErrorKind::NotFound => {
                tracing::warn!("TUN offloads unavailable ({e}); using a plain TUN");
                build(config, false).map_err(|e| open_error(config, e))?
            }
            Err(e) => return Err(open_error(config, e)),
        };
        let offload = config.offload && first.tcp_gso();
        let uso = offload && first.udp_gso();
        let index = nix::net::if_::if_nametoindex(config.name.as_str())
            .map_err(|e| anyhow::anyhow!("TUN device {} vanished once made: {e}", config.name))?;
        // Before the link is up, or the kernel has already queued a router solicitation. A
        // TUN whose IPv6 is not quiet still carries traffic: said, not a reason to stop.
        if let Err(e) = devconf::quiet_ipv6(&config.name, index, address6.is_some()) {
            tracing::warn!("{e:#}");
        }
        if let Some(address) = address6 {
            first.add_address_v6(address, 128u8).map_err(|e| {
                anyhow::anyhow!(
                    "cannot give TUN device {} the address {address}: {e}",
                    config.name
                )
            })?;
        }
        accept_local(&config.name, index);
        first
            .enabled(true)
            .map_err(|e| anyhow::anyhow!("cannot bring TUN device {} up: {e}", config.name))?;
        let mut queues = vec![first];
        for _ in 1..config.queues {
            queues.push(queues[0].try_clone()?);
        }
        // Readers take what is queued without waiting; every duplicate shares this flag.
        for queue in &queues {
            queue.set_nonblocking(true)?;
        }
        tracing::info!(
            name = %config.name, mtu = config.mtu, offload, uso, queues = queues.len(),
            "TUN device up"
        );
        Ok(Tun {
            queues,
            offload,
            uso,
            mtu: config.mtu,
        })
    }

    pub fn offload(&self) -> bool {
        self.offload
    }

    pub fn mtu(&self) -> u16 {
        self.mtu
    }

    pub fn queues(&self) -> usize {
        self.queues.len()
    }

    /// A reader of `queue`, woken by the runtime this is called in: call it on the thread that
    /// will read.
    pub fn reader(&self, queue: usize) -> io::Result<TunReader> {
        let fd = super::register(self.dup(queue)?, Interest::READABLE)?;
        Ok(TunReader::new(fd, self.mtu, self.offload))
    }

    /// A writer of `queue`; it writes from any thread and waits in no runtime.
    pub fn writer(&self, queue: usize) -> io::Result<TunWriter> {
        let merge = Merge {
            tcp: self.offload,
            udp: self.uso,
        };
        Ok(TunWriter::new(self.dup(queue)?, self.offload, merge))
    }

    /// A descriptor of `queue`'s open file (non-blocking, see [`Tun::open`]).
    fn dup(&self, queue: usize) -> io::Result<OwnedFd> {
        self.queues[queue].as_fd().try_clone_to_owned()
    }
}

fn build(config: &TunConfig, offload: bool) -> io::Result<SyncDevice> {
    DeviceBuilder::new()
        .name(&config.name)
        .mtu(config.mtu)
        .ipv4(config.address, 32u8, None)
        .offload(offload)
        .multi_queue(config.queues > 1)
        .tx_queue_len(config.tx_queue_len)
        .enable(false)
        .build_sync()
}

/// twill's ICMP errors come from the TUN's own address, so that a peer's anti-spoofing check
/// passes them; the kernel drops a packet whose source is one of its own addresses as a
/// martian unless the device accepts local sources. Nothing else can arrive with one: the
/// engine lets in only packets from inside the sending peer's subnet, never ours.
fn accept_local(name: &str, index: u32) {
    if let Err(e) = devconf::accept_local(index) {
        tracing::warn!("{name}: {e:#}: twill's ICMP errors to local senders will be dropped");
    }
}

/// The device file every TUN is made through.
pub const TUN_DEVICE: &str = "/dev/net/tun";

/// Fails in one line when this host (or container) has no [`TUN_DEVICE`], before anything is
/// set up that would need it.
pub fn require_device(who: &str) -> anyhow::Result<()> {
    match std::path::Path::new(TUN_DEVICE).try_exists() {
        Ok(true) => Ok(()),
        _ => Err(no_device(who)),
    }
}

fn no_device(who: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{who} needs the TUN device {TUN_DEVICE}, which is not here (in a container, mount \
         the host's {TUN_DEVICE}: kube-flannel.yml's DaemonSet does not; vxlan and host-gw \
         need no TUN)"
    )
}

fn open_error(config: &TunConfig, e: io::Error) -> anyhow::Error {
    if e.kind() == io::ErrorKind::NotFound {
        return no_device(&format!("TUN device {}", config.name));
    }
    if e.raw_os_error() == Some(libc::EPERM) {
        anyhow::anyhow!(
            "cannot create TUN device {}: permission denied (twill needs root or CAP_NET_ADMIN)",
            config.name
        )
    } else {
        anyhow::anyhow!("cannot create TUN device {}: {e}", config.name)
    }
}

/// Reads packets from TUN into one buffer, packet `i` at `i * stride`.
///
/// Keeping the packets in one buffer lets an engine send a run of equal-sized packets to one
/// peer as a single UDP GSO send after moving them together, instead of copying each.
///
/// With [`TunReader::keep_whole`], a TCP super-packet is not split: the batch ends before it and
/// [`TunReader::whole`] hands it over as read, for an engine that carries it in one piece.
pub struct TunReader {
    dev: AsyncFd<OwnedFd>,
    /// Whether reads start with a virtio-net header (offloads on).
    vnet_hdr: bool,
    keep_whole: bool,
    /// One frame as read: virtio-net header and (super-)packet.
    raw: Vec<u8>,
    /// The header and length of the super-packet frame in `raw` kept whole by the last batch.
    whole: Option<(VirtioNetHdr, usize)>,
    buf: Vec<u8>,
    stride: usize,
    sizes: [usize; READ_BATCH],
    len: usize,
    failed_reads: u64,
    /// The last drained batch held only its first read.
    sparse: bool,
}

impl TunReader {
    fn new(dev: AsyncFd<OwnedFd>, mtu: u16, vnet_hdr: bool) -> TunReader {
        let stride = usize::from(mtu);
        TunReader {
            dev,
            vnet_hdr,
            keep_whole: false,
            raw: vec![0; MAX_READ],
            whole: None,
            buf: vec![0; stride * READ_BATCH],
            stride,
            sizes: [0; READ_BATCH],
            len: 0,
            failed_reads: 0,
            sparse: false,
        }
    }

    /// Keep TCP super-packets whole (see [`TunReader::whole`]); only possible with offloads.
    pub fn keep_whole(&mut self, keep: bool) {
        self.keep_whole = keep && self.vnet_hdr;
    }

    /// Wait for at least one packet, then take whatever else is already queued, never waiting
    /// for more. Returns the number of packets now in the batch; a super-packet kept whole
    /// ends the batch and is not counted.
    ///
    /// While traffic is sparse (the last batch was a single read), a packet that wakes the
    /// reader is returned alone: on a request/response flow nothing else is queued, and the
    /// read that would find that out is better made after the packet has been sent. Under load
    /// the queue is drained first, so runs of packets still leave in one send.
    pub async fn read_batch(&mut self) -> io::Result<usize> {
        self.len = 0;
        self.whole = None;
        let woken = self.read_first().await?;
        if !(woken && self.sparse) {
            self.sparse = self.drain().await == 0;
        }
        Ok(self.len)
    }

    /// Read the batch's first packet, waiting for one if none is queued; returns whether it
    /// had to wait.
    async fn read_first(&mut self) -> io::Result<bool> {
        match self.read_into(0, ReadMode::NoWait).await {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.len = self.read_into(0, ReadMode::Wait).await?;
                Ok(true)
            }
            read => {
                self.len = read?;
                Ok(false)
            }
        }
    }

    /// Add what is already queued to the batch, as room allows; returns how many reads found
    /// something.
    async fn drain(&mut self) -> usize {
        let mut reads = 0;
        while self.whole.is_none() && READ_BATCH - self.len >= SLOTS_PER_READ {
            match self.read_into(self.len, ReadMode::NoWait).await {
                Ok(n) => self.len += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // Keep what was read so far; the engine counts the failure from `failed_reads`.
                Err(e) => {
                    tracing::debug!("TUN read failed after {} packets: {e}", self.len);
                    self.failed_reads += 1;
                    break;
                }
            }
            reads += 1;
        }
        reads
    }

    async fn read_into(&mut self, first: usize, mode: ReadMode) -> io::Result<usize> {
        if !self.vnet_hdr {
            let slot = &mut self.buf[first * self.stride..(first + 1) * self.stride];
            self.sizes[first] = read(&self.dev, slot, mode).await?;
            return Ok(1);
        }
        let len = read(&self.dev, &mut self.raw, mode).await?;
        let hdr = gso::header(&self.raw[..len])?;
        if self.keep_whole && gso::is_tcp_super_packet(&hdr, &self.raw[VIRTIO_NET_HDR_LEN..len]) {
            self.whole = Some((hdr, len));
            return Ok(0);
        }
        self.split_frame(hdr, len, first)
    }

    /// Split the frame in `raw[..len]`, whose header is `hdr`, into the batch's slots from
    /// `first` on. A plain packet gets only the one slot it needs: listing all 256 costs more
    /// than a small packet's read.
    fn split_frame(&mut self, hdr: VirtioNetHdr, len: usize, first: usize) -> io::Result<usize> {
        let wanted = if hdr.gso_type == GSO_NONE {
            1
        } else {
            READ_BATCH - first
        };
        let mut slots: ArrayVec<&mut [u8], READ_BATCH> = ArrayVec::new();
        slots.extend(
            self.buf
                .chunks_exact_mut(self.stride)
                .skip(first)
                .take(wanted),
        );
        let packet = &mut self.raw[VIRTIO_NET_HDR_LEN..len];
        gso::split(hdr, packet, &mut slots, &mut self.sizes[first..])
    }

    /// The TCP super-packet frame that ended the last batch, if one was kept whole, with its
    /// virtio-net header decoded.
    pub fn whole(&mut self) -> Option<(VirtioNetHdr, &mut [u8])> {
        self.whole.map(|(hdr, len)| (hdr, &mut self.raw[..len]))
    }

    /// Split the whole super-packet after all into the batch's slots (its packets were sent):
    /// for a peer that cannot take it whole. Returns the packets now in the batch.
    pub fn split_whole(&mut self) -> io::Result<usize> {
        let (hdr, len) = self
            .whole
            .take()
            .ok_or_else(|| io::Error::other("no super-packet was kept whole"))?;
        self.len = self.split_frame(hdr, len, 0)?;
        Ok(self.len)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Reads that failed after the first of a batch, since the last call.
    pub fn take_failed_reads(&mut self) -> u64 {
        std::mem::take(&mut self.failed_reads)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn packet_mut(&mut self, i: usize) -> &mut [u8] {
        let start = i * self.stride;
        &mut self.buf[start..start + self.sizes[i]]
    }

    pub fn packet_len(&self, i: usize) -> usize {
        self.sizes[i]
    }

    /// Move packets `first..first + count` together so they lie back to back, each
    /// `segment` bytes but the last, and return them as one slice for a GSO send.
    /// The caller guarantees every packet but the last is exactly `segment` bytes.
    pub fn gather(&mut self, first: usize, count: usize, segment: usize) -> &[u8] {
        let base = first * self.stride;
        let mut end = base;
        for i in first..first + count {
            let len = self.sizes[i];
            let from = i * self.stride;
            // Full-sized segments already sit at their place: stride == segment.
            if from != end {
                self.buf.copy_within(from..from + len, end);
            }
            end += if i + 1 < first + count { segment } else { len };
        }
        &self.buf[base..end]
    }
}

async fn read(dev: &AsyncFd<OwnedFd>, buf: &mut [u8], mode: ReadMode) -> io::Result<usize> {
    let read_now = |fd: &OwnedFd| Ok(nix::unistd::read(fd, buf)?);
    match mode {
        ReadMode::Wait => dev.async_io(READ_INTEREST, read_now).await,
        // Through the runtime's readiness, so an empty read clears it: the wait that follows
        // then sleeps at once instead of making a second empty read.
        ReadMode::NoWait => dev.try_io(Interest::READABLE, read_now),
    }
}

enum ReadMode {
    Wait,
    NoWait,
}

/// Collects packets for TUN and writes them, merged into super-packets by [`Coalescer`] when
/// the device takes virtio-net headers.
pub struct TunWriter {
    dev: OwnedFd,
    packets: Coalescer,
    /// Whether each write starts with a virtio-net header (offloads on).
    vnet_hdr: bool,
    /// Segments of a super-packet this device cannot take whole; made on first use.
    segments: Vec<u8>,
    segment_sizes: Vec<usize>,
}

impl TunWriter {
    fn new(dev: OwnedFd, vnet_hdr: bool, merge: Merge) -> TunWriter {
        TunWriter {
            dev,
            packets: Coalescer::new(WRITE_BATCH, merge),
            vnet_hdr,
            segments: Vec::new(),
            segment_sizes: Vec::new(),
        }
    }

    /// Queue a copy of `packet`; the caller flushes when [`TunWriter::is_full`].
    pub fn push(&mut self, packet: &[u8]) {
        self.packets.push(packet);
    }

    pub fn is_full(&self) -> bool {
        self.packets.is_full()
    }

    pub fn len(&self) -> usize {
        self.packets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    /// Write everything queued, one write per (super-)packet. A failed write loses that packet,
    /// as a congested link would; the rest are still written and the first error is returned.
    pub fn flush(&mut self) -> io::Result<()> {
        let skip = if self.vnet_hdr { 0 } else { VIRTIO_NET_HDR_LEN };
        let mut result = Ok(());
        for buf in self.packets.drain() {
            if let Err(e) = write(&self.dev, &buf[skip..]) {
                result = result.and(Err(e));
            }
        }
        result
    }

    /// Write a TCP super-packet after everything queued, so order is kept. `frame` is room for
    /// the virtio-net header, then the packet; `hdr` says how the kernel segments it. A device
    /// without offloads cannot take it whole, so it is split here instead.
    pub fn write_super(&mut self, frame: &mut [u8], hdr: VirtioNetHdr) -> io::Result<()> {
        let queued = self.flush();
        hdr.encode(&mut frame[..VIRTIO_NET_HDR_LEN])?;
        if self.vnet_hdr {
            write(&self.dev, frame)?;
        } else {
            self.write_segments(hdr, frame)?;
        }
        queued
    }

    fn write_segments(&mut self, hdr: VirtioNetHdr, frame: &mut [u8]) -> io::Result<()> {
        if self.segments.is_empty() {
            self.segments = vec![0; 4 * MAX_READ];
        }
        let stride = usize::from(hdr.hdr_len) + usize::from(hdr.gso_size);
        let mut slots: Vec<&mut [u8]> = self.segments.chunks_exact_mut(stride).collect();
        self.segment_sizes.resize(slots.len(), 0);
        let packet = &mut frame[VIRTIO_NET_HDR_LEN..];
        let n = gso::split(hdr, packet, &mut slots, &mut self.segment_sizes)?;
        for (slot, &len) in slots.iter().zip(&self.segment_sizes[..n]) {
            write(&self.dev, &slot[..len])?;
        }
        Ok(())
    }
}

/// One frame to the TUN, which takes it whole or not at all.
fn write(dev: &OwnedFd, frame: &[u8]) -> io::Result<()> {
    wait::until_writable(dev.as_fd(), || Ok(nix::unistd::write(dev, frame)?)).map(drop)
}
