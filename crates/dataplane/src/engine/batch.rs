//! The batch engine: many inner packets per UDP datagram, as docs/batch-protocol.md specifies.
//!
//! Each TUN read is a drain: its packets are grouped by peer, kept in order, and packed into as
//! few datagrams as fit under the path MTU. Nothing waits for packets that have not arrived
//! (unless `--batch-delay` asks), so batching grows with load and a lone packet leaves at once.
//! One peer's datagrams are written back to back, so a run of equal sizes (full datagrams and a
//! shorter last one: the common case) leaves in one UDP GSO send.

use super::{
    accept_inbound, flush_tun, reply_unreachable, route_outbound, tun_read_failed, write_to_tun,
    Shared,
};
use crate::io::gso;
use crate::io::tun::READ_BATCH;
use crate::io::udp::sender_v4;
use crate::io::{RecvBatch, Tun, TunReader, TunWriter};
use crate::stats::{DropReason, DropTally, EngineStats, Flow};
use crate::table::{Peer, PeerTable};
use crate::wire::batch::{self, BatchPacket, BatchWriter, Records, OVERHEAD, RECORD_PREFIX_LEN};
use crate::wire::chunk::{self, ChunkPacket, ChunkRepr, CHUNK_HEADER_LEN};
use crate::wire::ipv4::{self, Ipv4Packet};
use crate::wire::WireError;
use ipnet::Ipv4Net;
use std::io;
use std::net::{IpAddr, SocketAddrV4};
use std::ops::ControlFlow;
use std::ops::{AddAssign, Range};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tun_rs::{VirtioNetHdr, VIRTIO_NET_HDR_LEN};

/// Outer IPv4 and UDP headers: a datagram's payload may be PMTU minus this.
const UDP_IP_HEADERS: usize = 20 + 8;
/// The largest UDP payload IPv4 can carry.
const MAX_PAYLOAD: usize = 65535 - UDP_IP_HEADERS;
/// A datagram with less room than this cannot take another packet, so it is never held back.
const SMALLEST_RECORD: usize = RECORD_PREFIX_LEN + ipv4::MIN_HEADER_LEN;
/// Ends a per-peer packet list in [`Groups`].
const END: u16 = u16::MAX;

pub(crate) fn spawn(
    tun: &Tun,
    io: &Shared,
    subnet: Ipv4Net,
    delay: Option<Duration>,
) -> Vec<JoinHandle<()>> {
    let path = Arc::new(PathMtu::new(io.mtu + OVERHEAD));
    let mut tasks: Vec<JoinHandle<()>> = (0..tun.queues())
        .map(|q| {
            let sender = Sender::new(io.clone(), path.clone(), subnet, delay, q as u8);
            let mut reader = tun.reader(q);
            reader.keep_whole(true);
            tokio::spawn(tun_to_udp(reader, tun.writer(q), sender))
        })
        .collect();
    tasks.push(tokio::spawn(udp_to_tun(
        tun.writer(0),
        Receiver::new(io.clone()),
    )));
    tasks
}

/// The underlay path MTU. One for all peers: flannel gives the whole network one MTU, and the
/// TUN, whose MTU bounds every packet, is shared by all peers too.
struct PathMtu(AtomicUsize);

impl PathMtu {
    fn new(mtu: usize) -> PathMtu {
        PathMtu(AtomicUsize::new(mtu))
    }

    /// The most a datagram's payload may hold.
    fn capacity(&self) -> usize {
        (self.0.load(Relaxed) - UDP_IP_HEADERS).min(MAX_PAYLOAD)
    }

    /// A send was refused as too big: adopt what the kernel's route to `dst` allows now, if less.
    fn lower(&self, local: IpAddr, dst: SocketAddrV4) {
        match route_mtu(local, dst) {
            Ok(mtu) => {
                let old = self.0.fetch_min(mtu, Relaxed);
                if mtu < old {
                    tracing::warn!(%dst, old, new = mtu, "path MTU lowered after EMSGSIZE");
                }
            }
            Err(e) => tracing::debug!(%dst, "cannot read the route MTU: {e}"),
        }
    }
}

/// The engine's socket is not connected, so ask a connected throwaway socket (IP_MTU): it sees
/// the route's MTU, learned PMTU included.
fn route_mtu(local: IpAddr, dst: SocketAddrV4) -> io::Result<usize> {
    use nix::sys::socket::{getsockopt, sockopt};
    let probe = std::net::UdpSocket::bind((local, 0))?;
    probe.connect(dst)?;
    let mtu = getsockopt(&probe, sockopt::IpMtu)?;
    usize::try_from(mtu).map_err(|_| io::Error::other("negative IP_MTU"))
}

/// Datagrams, inner packets and inner bytes: what the counters are made of.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    datagrams: u64,
    packets: u64,
    bytes: u64,
    /// TCP super-packets carried whole (their segments count in `packets` too).
    super_packets: u64,
}

impl AddAssign for Counts {
    fn add_assign(&mut self, other: Counts) {
        self.datagrams += other.datagrams;
        self.packets += other.packets;
        self.bytes += other.bytes;
        self.super_packets += other.super_packets;
    }
}

impl Counts {
    fn publish_tx(&self, stats: &EngineStats) {
        self.publish(&stats.tx, &stats.tx_datagrams, &stats.tx_super_packets);
    }

    fn publish_rx(&self, stats: &EngineStats) {
        self.publish(&stats.rx, &stats.rx_datagrams, &stats.rx_super_packets);
    }

    fn publish(&self, flow: &Flow, datagrams: &AtomicU64, super_packets: &AtomicU64) {
        flow.add(self.packets, self.bytes);
        datagrams.fetch_add(self.datagrams, Relaxed);
        super_packets.fetch_add(self.super_packets, Relaxed);
    }
}

async fn tun_to_udp(mut reader: TunReader, mut icmp: TunWriter, mut tx: Sender) {
    loop {
        let read = tokio::select! {
            read = reader.read_batch() => read,
            () = until(tx.held.deadline) => {
                tx.send_held().await;
                continue;
            }
        };
        let n = match read {
            Ok(n) => n,
            Err(e) => match tun_read_failed(&e, &mut tx.drops) {
                ControlFlow::Continue(()) => continue,
                ControlFlow::Break(()) => return,
            },
        };
        tx.drops
            .add(DropReason::IoError, reader.take_failed_reads());
        tx.drain(&mut reader, n, &mut icmp).await;
        if reader.whole().is_some() {
            tx.send_whole(&mut reader, &mut icmp).await;
        }
        flush_tun(&mut icmp, &mut tx.drops).await;
        tx.publish();
    }
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The socket and the path MTU it learns, shared by the TUN queues.
struct Link {
    io: Shared,
    path: Arc<PathMtu>,
}

impl Link {
    /// One send syscall; returns whether it went out. Lost packets are counted here.
    async fn send(
        &self,
        dst: SocketAddrV4,
        datagrams: &[u8],
        segment: usize,
        packets: u64,
    ) -> bool {
        let Err(e) = self.io.udp.send(dst, datagrams, segment).await else {
            return true;
        };
        // A GSO train over the device MTU is refused with EINVAL rather than EMSGSIZE.
        if matches!(e.raw_os_error(), Some(libc::EMSGSIZE | libc::EINVAL)) {
            if let Ok(local) = self.io.udp.local_addr() {
                self.path.lower(local.ip(), dst);
            }
        }
        let reason = match e.raw_os_error() {
            Some(libc::EMSGSIZE) => DropReason::TooBig,
            _ => DropReason::IoError,
        };
        tracing::debug!(%dst, "UDP send failed: {e}");
        self.io.stats.add_drops(reason, packets);
        false
    }
}

/// The TUN -> UDP half for one TUN queue.
struct Sender {
    link: Link,
    subnet: Ipv4Net,
    delay: Option<Duration>,
    /// This queue's chunk stream and the number of its next super-packet.
    stream: u8,
    next_seq: u32,
    groups: Groups,
    train: Train,
    held: Held,
    drops: DropTally,
    sent: Counts,
}

impl Sender {
    fn new(
        io: Shared,
        path: Arc<PathMtu>,
        subnet: Ipv4Net,
        delay: Option<Duration>,
        stream: u8,
    ) -> Sender {
        Sender {
            link: Link { io, path },
            subnet,
            delay,
            stream,
            next_seq: 0,
            groups: Groups::default(),
            train: Train::default(),
            held: Held::default(),
            drops: DropTally::default(),
            sent: Counts::default(),
        }
    }

    /// Route the packets of one read and send each peer's share.
    async fn drain(&mut self, reader: &mut TunReader, n: usize, icmp: &mut TunWriter) {
        let table = self.link.io.table.load();
        self.group(reader, n, &table, icmp);
        for g in 0..self.groups.groups.len() {
            let Group { peer, head, .. } = self.groups.groups[g];
            self.pack(reader, head, &table.peers()[peer]).await;
        }
    }

    fn group(&mut self, reader: &mut TunReader, n: usize, table: &PeerTable, icmp: &mut TunWriter) {
        self.groups.clear(table.len());
        for i in 0..n {
            match route_outbound(reader.packet_mut(i), table) {
                Ok(peer) => self.groups.add(peer, i),
                Err(reason) => {
                    if reason == DropReason::NoRoute {
                        reply_unreachable(reader.packet_mut(i), icmp);
                    }
                    self.drops.count(reason);
                }
            }
        }
    }

    /// Pack one peer's packets (after those of its held datagram) into datagrams and send them.
    async fn pack(&mut self, reader: &mut TunReader, head: u16, peer: &Peer) {
        let capacity = self.link.path.capacity();
        let mut held = self.held.take(peer.spec.endpoint);
        let view = BatchPacket::new_checked(&held[..]).ok();
        let mut source = Source {
            held: view.as_ref().map(BatchPacket::records),
            packet: head,
        };
        let mut hold = None;
        loop {
            let mut writer = BatchWriter::new(self.train.space(capacity), self.subnet);
            let mut bytes = 0;
            while let Some(packet) = source.peek(reader) {
                let len = packet.len();
                if !writer.push(packet) {
                    break;
                }
                bytes += len as u64;
                source.advance(&self.groups.next);
            }
            let more = source.peek(reader).is_some();
            if writer.is_empty() {
                if !more {
                    break;
                }
                self.drops.count(DropReason::TooBig);
                source.advance(&self.groups.next);
                continue;
            }
            let counts = Counts {
                datagrams: 1,
                packets: writer.count() as u64,
                bytes,
                super_packets: 0,
            };
            let len = writer.finish();
            if !more && self.delay.is_some() && capacity - len >= SMALLEST_RECORD {
                hold = Some((len, counts));
                break;
            }
            self.close(peer, len, counts).await;
            if !more {
                break;
            }
        }
        if let Some(delay) = self.delay {
            let (len, counts) = hold.unwrap_or_default();
            held.clear();
            held.extend_from_slice(self.train.open(len));
            self.held.put(peer.spec.endpoint, held, counts, delay);
        }
        self.send_train(peer, 0).await;
    }

    /// Send the super-packet that ended the read: whole, as chunks, to a peer that reads them;
    /// split into packets like any other to one that does not (or to no peer at all).
    async fn send_whole(&mut self, reader: &mut TunReader, icmp: &mut TunWriter) {
        let table = self.link.io.table.load();
        let (hdr, frame) = reader
            .whole()
            .expect("called only with a whole super-packet");
        let packet = &mut frame[VIRTIO_NET_HDR_LEN..];
        let dst = Ipv4Packet::new_checked(&*packet).map(|ip| ip.dst_addr());
        let peer = dst.ok().and_then(|dst| table.route(dst));
        if peer.is_none_or(|p| table.peers()[p].spec.version < chunk::VERSION) {
            match reader.split_whole() {
                Ok(n) => self.drain(reader, n, icmp).await,
                Err(e) => {
                    tracing::debug!("cannot split a TUN super-packet: {e}");
                    self.drops.count(DropReason::Malformed);
                }
            }
            return;
        }
        let peer = match route_outbound(packet, &table) {
            Ok(peer) => &table.peers()[peer],
            Err(reason) => return self.drops.count(reason),
        };
        if self.held.deadline.is_some() {
            self.send_held().await;
        }
        self.send_chunks(&hdr, frame, peer).await;
    }

    /// Cut a super-packet frame into chunk datagrams filling the path MTU, sent as GSO trains.
    async fn send_chunks(&mut self, hdr: &VirtioNetHdr, frame: &[u8], peer: &Peer) {
        let packet = &frame[VIRTIO_NET_HDR_LEN..];
        let capacity = self.link.path.capacity();
        let mut chunk = ChunkRepr {
            sender: self.subnet,
            seq: self.next_seq,
            total: packet.len() as u16,
            offset: 0,
            gso_size: hdr.gso_size,
            gso_type: hdr.gso_type,
            stream: self.stream,
        };
        self.next_seq = self.next_seq.wrapping_add(1);
        for part in packet.chunks(capacity - CHUNK_HEADER_LEN) {
            let space = self.train.space(capacity);
            chunk.emit(space);
            space[CHUNK_HEADER_LEN..][..part.len()].copy_from_slice(part);
            let last = usize::from(chunk.offset) + part.len() == packet.len();
            let counts = Counts {
                datagrams: 1,
                ..if last {
                    super_counts(packet, hdr.gso_size)
                } else {
                    Counts::default()
                }
            };
            self.close(peer, CHUNK_HEADER_LEN + part.len(), counts)
                .await;
            chunk.offset += part.len() as u16;
        }
        self.send_train(peer, 0).await;
    }

    /// A datagram of `len` bytes was written after the train: add it, or send the train first.
    async fn close(&mut self, peer: &Peer, len: usize, counts: Counts) {
        let segment = if self.train.is_empty() {
            len
        } else {
            self.train.segment
        };
        if !self
            .train
            .accepts(len, self.link.io.udp.segments_per_send(segment))
        {
            self.send_train(peer, len).await;
        }
        self.train.push(len, counts);
    }

    /// Send the train; `pending` bytes written after it stay, as the start of the next one.
    async fn send_train(&mut self, peer: &Peer, pending: usize) {
        if self.train.is_empty() {
            return;
        }
        let (datagrams, segment, counts) = self.train.closed();
        let dst = peer.spec.endpoint;
        if self
            .link
            .send(dst, datagrams, segment, counts.packets)
            .await
        {
            peer.stats.tx.add(counts.packets, counts.bytes);
            self.sent += counts;
        }
        self.train.restart(pending);
    }

    /// Send the held datagrams, each on its own: they are all partly empty.
    async fn send_held(&mut self) {
        let table = self.link.io.table.load();
        for i in 0..self.held.slots.len() {
            let slot = &mut self.held.slots[i];
            if slot.datagram.is_empty() {
                continue;
            }
            let (endpoint, counts) = (slot.endpoint, slot.counts);
            let mut datagram = std::mem::take(&mut slot.datagram);
            let len = datagram.len();
            if self
                .link
                .send(endpoint, &datagram, len, counts.packets)
                .await
            {
                if let Some(peer) = table.by_endpoint(endpoint) {
                    peer.stats.tx.add(counts.packets, counts.bytes);
                }
                self.sent += counts;
            }
            datagram.clear();
            self.held.slots[i].datagram = datagram;
        }
        self.held.deadline = None;
        self.publish();
    }

    fn publish(&mut self) {
        let stats = &self.link.io.stats;
        std::mem::take(&mut self.sent).publish_tx(stats);
        self.drops.publish(stats);
    }
}

/// A drain's packets grouped by peer in read order, without moving them: one linked list per
/// peer threaded through `next`.
struct Groups {
    next: [u16; READ_BATCH],
    groups: Vec<Group>,
    /// Table index -> position in `groups`, or END.
    group_of_peer: Vec<u16>,
}

#[derive(Debug, Clone, Copy)]
struct Group {
    peer: usize,
    head: u16,
    tail: u16,
}

impl Default for Groups {
    fn default() -> Groups {
        Groups {
            next: [END; READ_BATCH],
            groups: Vec::with_capacity(READ_BATCH),
            group_of_peer: Vec::new(),
        }
    }
}

impl Groups {
    fn clear(&mut self, peers: usize) {
        for group in self.groups.drain(..) {
            self.group_of_peer[group.peer] = END;
        }
        self.group_of_peer.resize(peers, END);
    }

    fn add(&mut self, peer: usize, packet: usize) {
        let packet = packet as u16;
        self.next[usize::from(packet)] = END;
        match self.group_of_peer[peer] {
            END => {
                self.group_of_peer[peer] = self.groups.len() as u16;
                self.groups.push(Group {
                    peer,
                    head: packet,
                    tail: packet,
                });
            }
            g => {
                let group = &mut self.groups[usize::from(g)];
                self.next[usize::from(group.tail)] = packet;
                group.tail = packet;
            }
        }
    }
}

/// One peer's packets in order: those of its held datagram first, then this drain's.
struct Source<'h> {
    held: Option<Records<'h>>,
    packet: u16,
}

impl<'h> Source<'h> {
    fn peek<'a>(&'a self, reader: &'a mut TunReader) -> Option<&'a [u8]> {
        // Held datagrams are our own, so their records always frame.
        if let Some(Ok(record)) = self.held.clone().and_then(|mut r| r.next()) {
            return Some(record);
        }
        (self.packet != END).then(|| &*reader.packet_mut(usize::from(self.packet)))
    }

    fn advance(&mut self, next: &[u16; READ_BATCH]) {
        if self.held.as_mut().and_then(Iterator::next).is_none() {
            self.held = None;
            self.packet = next[usize::from(self.packet)];
        }
    }
}

/// Closed datagrams to one peer, back to back: sendable as one GSO train while all are
/// `segment` bytes but the last, which may be shorter. After them lies the datagram being
/// written.
struct Train {
    buf: Vec<u8>,
    len: usize,
    segment: usize,
    last: usize,
    counts: Counts,
}

impl Default for Train {
    fn default() -> Train {
        Train {
            // A full GSO send plus the next datagram, which is written before it is known
            // whether it joins.
            buf: vec![0; 2 * 65535],
            len: 0,
            segment: 0,
            last: 0,
            counts: Counts::default(),
        }
    }
}

impl Train {
    fn is_empty(&self) -> bool {
        self.counts.datagrams == 0
    }

    /// Where the next datagram is written.
    fn space(&mut self, capacity: usize) -> &mut [u8] {
        &mut self.buf[self.len..self.len + capacity]
    }

    /// The datagram written after the train, not (yet) part of it.
    fn open(&self, len: usize) -> &[u8] {
        &self.buf[self.len..self.len + len]
    }

    fn accepts(&self, len: usize, max_segments: usize) -> bool {
        self.is_empty()
            || (len <= self.segment
                && self.last == self.segment
                && (self.counts.datagrams as usize) < max_segments)
    }

    fn push(&mut self, len: usize, counts: Counts) {
        if self.is_empty() {
            self.segment = len;
        }
        self.last = len;
        self.len += len;
        self.counts += counts;
    }

    fn closed(&self) -> (&[u8], usize, Counts) {
        (&self.buf[..self.len], self.segment, self.counts)
    }

    /// Forget the sent train, moving the `pending` bytes written after it to the front.
    fn restart(&mut self, pending: usize) {
        self.buf.copy_within(self.len..self.len + pending, 0);
        self.len = 0;
        self.counts = Counts::default();
    }
}

/// Not-full datagrams kept back under `--batch-delay`, at most one per peer, all sent when the
/// first one's delay is up.
#[derive(Default)]
struct Held {
    /// Slots stay once made, so their buffers are reused; an empty datagram means none held.
    slots: Vec<HeldSlot>,
    deadline: Option<Instant>,
}

struct HeldSlot {
    endpoint: SocketAddrV4,
    datagram: Vec<u8>,
    counts: Counts,
}

impl Held {
    /// The peer's held datagram, to be packed again in front of its new packets.
    fn take(&mut self, endpoint: SocketAddrV4) -> Vec<u8> {
        self.slots
            .iter_mut()
            .find(|s| s.endpoint == endpoint)
            .map(|s| std::mem::take(&mut s.datagram))
            .unwrap_or_default()
    }

    /// Hold `datagram` (or, if empty, just keep its buffer) for the peer at `endpoint`.
    fn put(&mut self, endpoint: SocketAddrV4, datagram: Vec<u8>, counts: Counts, delay: Duration) {
        if !datagram.is_empty() && self.deadline.is_none() {
            self.deadline = Some(Instant::now() + delay);
        }
        let slot = HeldSlot {
            endpoint,
            datagram,
            counts,
        };
        match self.slots.iter_mut().find(|s| s.endpoint == endpoint) {
            Some(existing) => *existing = slot,
            None => self.slots.push(slot),
        }
    }
}

/// The UDP -> TUN half.
struct Receiver {
    io: Shared,
    /// Where each record of the datagram at hand lies; reused, so no allocation per datagram.
    records: Vec<Range<usize>>,
    supers: Reassembly,
    drops: DropTally,
}

async fn udp_to_tun(mut writer: TunWriter, mut rx: Receiver) {
    let mut batch = RecvBatch::default();
    loop {
        if let Err(e) = rx.io.udp.recv(&mut batch).await {
            tracing::warn!("UDP receive failed: {e}");
            continue;
        }
        let got = rx.deliver(&mut batch, &mut writer).await;
        flush_tun(&mut writer, &mut rx.drops).await;
        got.publish_rx(&rx.io.stats);
        rx.drops.publish(&rx.io.stats);
    }
}

impl Receiver {
    fn new(io: Shared) -> Receiver {
        Receiver {
            io,
            records: Vec::new(),
            supers: Reassembly::default(),
            drops: DropTally::default(),
        }
    }

    /// Check every datagram of a receive batch and queue the packets that pass for TUN.
    async fn deliver(&mut self, batch: &mut RecvBatch, writer: &mut TunWriter) -> Counts {
        let table = self.io.table.load();
        let mut got = Counts::default();
        for (addr, train) in batch.messages() {
            let peer = sender_v4(addr).and_then(|a| table.by_endpoint(a));
            let mut from_peer = Counts::default();
            for datagram in train {
                from_peer.datagrams += 1;
                let got = match batch::version(datagram) {
                    Some(chunk::VERSION) => self.reassemble(datagram, peer, writer).await,
                    _ => self.unpack(datagram, peer, writer).await,
                };
                match got {
                    Ok(packets) => from_peer += packets,
                    Err(reason) => self.drops.count(reason),
                }
            }
            if let Some(peer) = peer {
                peer.stats.rx.add(from_peer.packets, from_peer.bytes);
            }
            got += from_peer;
        }
        got
    }

    /// Queue a datagram's good records for TUN; `Err` drops the whole datagram.
    async fn unpack(
        &mut self,
        datagram: &mut [u8],
        peer: Option<&Peer>,
        writer: &mut TunWriter,
    ) -> Result<Counts, DropReason> {
        let peer = self.frame(datagram, peer)?;
        let mut got = Counts::default();
        for i in 0..self.records.len() {
            let packet = &mut datagram[self.records[i].clone()];
            if let Err(reason) = accept_inbound(packet, peer, self.io.mtu) {
                self.drops.count(reason);
                continue;
            }
            got.packets += 1;
            got.bytes += packet.len() as u64;
            write_to_tun(writer, packet, &mut self.drops).await;
        }
        Ok(got)
    }

    /// Add a chunk to its super-packet, and write the super-packet to TUN once it is whole.
    async fn reassemble(
        &mut self,
        datagram: &[u8],
        peer: Option<&Peer>,
        writer: &mut TunWriter,
    ) -> Result<Counts, DropReason> {
        let chunk = ChunkPacket::new_checked(datagram).map_err(|_| DropReason::Malformed)?;
        let repr = chunk.repr();
        let peer = peer
            .filter(|p| p.spec.subnet == repr.sender)
            .ok_or(DropReason::UnknownPeer)?;
        let slot = self.supers.slot(peer.spec.endpoint, repr.stream);
        let lost = slot.add(&repr, chunk.payload());
        self.drops.add(DropReason::IncompleteSuperPacket, lost);
        let Some(frame) = slot.complete() else {
            return Ok(Counts::default());
        };
        let packet = &mut frame[VIRTIO_NET_HDR_LEN..];
        let hdr = accept_super(packet, peer, self.io.mtu, repr.gso_type, repr.gso_size)?;
        let got = super_counts(packet, repr.gso_size);
        writer.write_super(frame, hdr).await.map_err(|e| {
            tracing::debug!("TUN write of a super-packet failed: {e}");
            DropReason::IoError
        })?;
        Ok(got)
    }

    /// The header and sender checks, then where the records lie; a record running past the end
    /// costs only the records from there on. Records are noted as ranges, not slices, because
    /// each is then changed in place (TTL) on its way to TUN.
    fn frame<'p>(
        &mut self,
        datagram: &[u8],
        peer: Option<&'p Peer>,
    ) -> Result<&'p Peer, DropReason> {
        let batch = BatchPacket::new_checked(datagram).map_err(|e| match e {
            WireError::BadMagic => DropReason::BadMagic,
            WireError::UnsupportedVersion => DropReason::BadVersion,
            _ => DropReason::Malformed,
        })?;
        let peer = peer
            .filter(|p| p.spec.subnet == batch.sender())
            .ok_or(DropReason::UnknownPeer)?;
        self.records.clear();
        for record in batch.records() {
            match record {
                Ok(record) => self.records.push(span(datagram, record)),
                Err(_) => self.drops.count(DropReason::Malformed),
            }
        }
        Ok(peer)
    }
}

/// The checks of [`accept_inbound`] for a super-packet, plus: it is TCP, and each segment the
/// kernel cuts from it fits the TUN. Returns the virtio-net header to write it with, made here
/// rather than taken from the wire.
fn accept_super(
    packet: &mut [u8],
    peer: &Peer,
    mtu: usize,
    gso_type: u8,
    gso_size: u16,
) -> Result<VirtioNetHdr, DropReason> {
    let is_tcp = Ipv4Packet::new_checked(&*packet).is_ok_and(|ip| ip.protocol() == ipv4::PROTO_TCP);
    let hdr = gso::tcp_super_header(packet, gso_type, gso_size)
        .filter(|_| is_tcp)
        .ok_or(DropReason::Malformed)?;
    if usize::from(hdr.hdr_len) + usize::from(gso_size) > mtu {
        return Err(DropReason::TooBig);
    }
    accept_inbound(packet, peer, usize::from(u16::MAX))?;
    Ok(hdr)
}

/// Super-packets being put together from chunks: one slot per (peer, sender stream), since
/// each stream sends its super-packets one after the other.
#[derive(Default)]
struct Reassembly {
    slots: Vec<SuperSlot>,
}

impl Reassembly {
    fn slot(&mut self, endpoint: SocketAddrV4, stream: u8) -> &mut SuperSlot {
        let key = (endpoint, stream);
        let i = match self.slots.iter().position(|s| s.key == key) {
            Some(i) => i,
            None => {
                self.slots.push(SuperSlot::new(key));
                self.slots.len() - 1
            }
        };
        &mut self.slots[i]
    }
}

/// One stream's super-packet in progress. Chunks must come in order: a gap means a lost chunk,
/// and the super-packet is given up (TCP sends its data again).
struct SuperSlot {
    key: (SocketAddrV4, u8),
    state: SlotState,
    seq: u32,
    total: usize,
    /// Bytes of the super-packet received so far, in order.
    next: usize,
    gso: (u8, u16),
    /// Room for the virtio-net header, then the super-packet.
    frame: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Idle,
    Building,
    /// `seq` was given up; its remaining chunks are dropped without counting it again.
    Broken,
}

impl SuperSlot {
    fn new(key: (SocketAddrV4, u8)) -> SuperSlot {
        SuperSlot {
            key,
            state: SlotState::Idle,
            seq: 0,
            total: 0,
            next: 0,
            gso: (0, 0),
            frame: vec![0; VIRTIO_NET_HDR_LEN + usize::from(u16::MAX)],
        }
    }

    /// Take a chunk; returns how many super-packets were given up because of it.
    fn add(&mut self, chunk: &ChunkRepr, payload: &[u8]) -> u64 {
        let mut lost = 0;
        if chunk.offset == 0 {
            lost = u64::from(self.state == SlotState::Building);
            self.state = SlotState::Building;
            self.seq = chunk.seq;
            self.total = usize::from(chunk.total);
            self.next = 0;
            self.gso = (chunk.gso_type, chunk.gso_size);
        } else if !self.continues(chunk) {
            return self.give_up(chunk.seq);
        }
        let at = VIRTIO_NET_HDR_LEN + self.next;
        self.frame[at..at + payload.len()].copy_from_slice(payload);
        self.next += payload.len();
        lost
    }

    fn continues(&self, chunk: &ChunkRepr) -> bool {
        self.state == SlotState::Building
            && chunk.seq == self.seq
            && usize::from(chunk.offset) == self.next
            && usize::from(chunk.total) == self.total
            && (chunk.gso_type, chunk.gso_size) == self.gso
    }

    fn give_up(&mut self, seq: u32) -> u64 {
        let lost = match self.state {
            SlotState::Building => 1 + u64::from(seq != self.seq),
            SlotState::Broken if seq == self.seq => 0,
            _ => 1,
        };
        self.state = SlotState::Broken;
        self.seq = seq;
        lost
    }

    /// The frame, once every byte of the super-packet is in.
    fn complete(&mut self) -> Option<&mut [u8]> {
        if self.state != SlotState::Building || self.next < self.total {
            return None;
        }
        self.state = SlotState::Idle;
        Some(&mut self.frame[..VIRTIO_NET_HDR_LEN + self.total])
    }
}

/// A super-packet counts as the segments the kernel cuts it into, so counters agree whether
/// it travels whole or split.
fn super_counts(packet: &[u8], gso_size: u16) -> Counts {
    let ihl = usize::from(packet[0] & 0x0f) * 4;
    let headers = gso::tcp_headers_end(packet, ihl).unwrap_or(packet.len());
    Counts {
        datagrams: 0,
        super_packets: 1,
        packets: (packet.len() - headers)
            .div_ceil(usize::from(gso_size).max(1))
            .max(1) as u64,
        bytes: packet.len() as u64,
    }
}

/// Where `inner`, a subslice of `outer`, lies in it.
fn span(outer: &[u8], inner: &[u8]) -> Range<usize> {
    let start = inner.as_ptr() as usize - outer.as_ptr() as usize;
    start..start + inner.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: Counts = Counts {
        datagrams: 1,
        packets: 2,
        bytes: 100,
        super_packets: 0,
    };

    fn walk(groups: &Groups, head: u16) -> Vec<u16> {
        std::iter::successors(Some(head), |&p| {
            Some(groups.next[usize::from(p)]).filter(|&n| n != END)
        })
        .collect()
    }

    #[test]
    fn groups_keep_each_peers_packets_in_read_order() {
        let mut groups = Groups::default();
        groups.clear(3);
        for (packet, peer) in [2, 0, 2, 1, 0].into_iter().enumerate() {
            groups.add(peer, packet);
        }
        let lists: Vec<(usize, Vec<u16>)> = groups
            .groups
            .iter()
            .map(|g| (g.peer, walk(&groups, g.head)))
            .collect();
        assert_eq!(lists, vec![(2, vec![0, 2]), (0, vec![1, 4]), (1, vec![3])]);
        // The next drain may see a smaller table.
        groups.clear(1);
        groups.add(0, 0);
        groups.add(0, 1);
        assert_eq!(walk(&groups, groups.groups[0].head), vec![0, 1]);
    }

    #[test]
    fn train_takes_equal_datagrams_then_one_shorter() {
        let mut train = Train::default();
        train.push(1400, ONE);
        assert!(train.accepts(1400, 64));
        assert!(!train.accepts(1401, 64), "a longer datagram cannot follow");
        train.push(1400, ONE);
        train.push(900, ONE);
        assert!(!train.accepts(900, 64), "nothing follows a shorter one");
        let (datagrams, segment, counts) = train.closed();
        assert_eq!((datagrams.len(), segment, counts.packets), (3700, 1400, 6));
    }

    #[test]
    fn train_stops_at_the_gso_segment_limit() {
        let mut train = Train::default();
        train.push(1000, ONE);
        train.push(1000, ONE);
        assert!(!train.accepts(1000, 2));
    }

    #[test]
    fn restart_keeps_the_datagram_written_after_the_train() {
        let mut train = Train::default();
        train.space(10)[..4].copy_from_slice(b"sent");
        train.push(4, ONE);
        train.space(10)[..4].copy_from_slice(b"next");
        train.restart(4);
        assert!(train.is_empty());
        assert_eq!(&train.buf[..4], b"next");
    }
    fn chunk(seq: u32, offset: u16, total: u16) -> ChunkRepr {
        ChunkRepr {
            sender: "10.5.1.0/24".parse().unwrap(),
            seq,
            total,
            offset,
            gso_size: 1000,
            gso_type: crate::wire::virtio::GSO_TCPV4,
            stream: 0,
        }
    }

    fn slot() -> SuperSlot {
        SuperSlot::new((SocketAddrV4::new([192, 0, 2, 1].into(), 8286), 0))
    }

    #[test]
    fn chunks_in_order_make_the_super_packet() {
        let mut slot = slot();
        assert_eq!(slot.add(&chunk(1, 0, 300), &[1; 200]), 0);
        assert!(slot.complete().is_none());
        assert_eq!(slot.add(&chunk(1, 200, 300), &[2; 100]), 0);
        let frame = slot.complete().unwrap();
        assert_eq!(&frame[VIRTIO_NET_HDR_LEN..][..200], &[1; 200][..]);
        assert_eq!(&frame[VIRTIO_NET_HDR_LEN + 200..], &[2; 100][..]);
        assert!(slot.complete().is_none(), "handed over once");
    }

    #[test]
    fn a_lost_chunk_gives_up_its_super_packet_once() {
        let mut slot = slot();
        slot.add(&chunk(1, 0, 300), &[0; 100]);
        assert_eq!(slot.add(&chunk(1, 200, 300), &[0; 100]), 1, "gap at 100");
        assert!(slot.complete().is_none());
        assert_eq!(
            slot.add(&chunk(1, 250, 300), &[0; 50]),
            0,
            "counted already"
        );
        assert_eq!(slot.add(&chunk(2, 0, 100), &[0; 100]), 0);
        assert!(slot.complete().is_some(), "the next one is whole");
    }

    #[test]
    fn lost_tail_and_lost_head_each_count() {
        let mut slot = slot();
        slot.add(&chunk(1, 0, 300), &[0; 100]);
        assert_eq!(slot.add(&chunk(2, 0, 300), &[0; 100]), 1, "1 never ended");
        assert_eq!(
            slot.add(&chunk(3, 100, 300), &[0; 100]),
            2,
            "2 never ended, 3 never began"
        );
        assert_eq!(slot.add(&chunk(4, 100, 300), &[0; 100]), 1, "4 never began");
    }

    #[test]
    fn super_packets_count_as_their_segments() {
        let mut packet = vec![0u8; 40 + 2500];
        packet[0] = 0x45;
        packet[32] = 5 << 4;
        let counts = super_counts(&packet, 1000);
        assert_eq!(
            (counts.packets, counts.bytes, counts.super_packets),
            (3, 2540, 1)
        );
    }
}
