//! The TUN -> UDP half: group a drain's packets by peer, pack them into datagrams, send each
//! peer's datagrams as GSO trains; TCP super-packets go whole, as chunks.

use super::super::{counted_tun_read, flush_tun, route_outbound, routed, send_failed, Shared};
use super::held::Held;
use super::{super_counts, Counts};
use crate::engine::train::Train;
use crate::io::tun::READ_BATCH;
use crate::io::udp::SendError;
use crate::io::{TunReader, TunWriter};
use crate::stats::{DropReason, DropTally};
use crate::table::{Peer, PeerTable};
use crate::wire::batch::{BatchPacket, BatchWriter, Records, RECORD_PREFIX_LEN};
use crate::wire::chunk::{self, ChunkRepr, CHUNK_HEADER_LEN};
use crate::wire::ipv4;
use ipnet::Ipv4Net;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::time::Duration;
use tokio::time::Instant;
use tun_rs::{VirtioNetHdr, VIRTIO_NET_HDR_LEN};

/// A datagram with less room than this cannot take another packet, so it is never held back.
const SMALLEST_RECORD: usize = RECORD_PREFIX_LEN + ipv4::MIN_HEADER_LEN;
/// Ends a per-peer packet list in [`Groups`].
const END: u16 = u16::MAX;

pub(super) async fn tun_to_udp(mut reader: TunReader, mut icmp: TunWriter, mut tx: Sender) {
    loop {
        let read = tokio::select! {
            read = reader.read_batch() => read,
            () = until(tx.held.deadline) => {
                tx.send_held();
                tx.too_big.answer(&tx.io, &mut icmp);
                continue;
            }
        };
        let n = match counted_tun_read(read, &mut reader, &mut tx.drops) {
            ControlFlow::Continue(Some(n)) => n,
            ControlFlow::Continue(None) => continue,
            ControlFlow::Break(()) => return,
        };
        tx.drain(&mut reader, n, &mut icmp);
        if reader.whole().is_some() {
            tx.send_whole(&mut reader, &mut icmp);
        }
        tx.too_big.answer(&tx.io, &mut icmp);
        flush_tun(&mut icmp, &mut tx.drops);
        tx.publish();
    }
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The TUN -> UDP half for one TUN queue.
pub(super) struct Sender {
    io: Shared,
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
    too_big: TooBig,
}

impl Sender {
    pub fn new(io: Shared, subnet: Ipv4Net, delay: Option<Duration>, stream: u8) -> Sender {
        Sender {
            io,
            subnet,
            delay,
            stream,
            next_seq: 0,
            groups: Groups::default(),
            train: Train::default(),
            held: Held::default(),
            drops: DropTally::default(),
            sent: Counts::default(),
            too_big: TooBig::default(),
        }
    }

    /// Route the packets of one read and send each peer's share.
    fn drain(&mut self, reader: &mut TunReader, n: usize, icmp: &mut TunWriter) {
        let table = self.io.table.load();
        self.group(reader, n, &table, icmp);
        for g in 0..self.groups.groups.len() {
            let Group { peer, head, .. } = self.groups.groups[g];
            self.pack(reader, head, &table.peers()[peer], icmp);
        }
    }

    fn group(&mut self, reader: &mut TunReader, n: usize, table: &PeerTable, icmp: &mut TunWriter) {
        self.groups.clear(table.len());
        for i in 0..n {
            match route_outbound(reader.packet_mut(i), table) {
                Ok(peer) => self.groups.add(peer, i),
                Err(reason) => {
                    self.io.answer_drop(reason, reader.packet_mut(i), icmp);
                    self.drops.count(reason);
                }
            }
        }
    }

    /// Pack one peer's packets (after those of its held datagram) into datagrams and send them.
    fn pack(&mut self, reader: &mut TunReader, head: u16, peer: &Peer, icmp: &mut TunWriter) {
        let capacity = self.io.path.capacity();
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
                if let Some(packet) = source.peek(reader) {
                    self.io.answer_drop(DropReason::TooBig, packet, icmp);
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
            self.close(peer, len, counts);
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
        self.send_train(peer, 0);
    }

    /// Send the super-packet that ended the read: whole, as chunks, to a peer that reads them;
    /// split into packets like any other to one that does not (or to no peer at all).
    fn send_whole(&mut self, reader: &mut TunReader, icmp: &mut TunWriter) {
        let table = self.io.table.load();
        let (hdr, frame) = reader
            .whole()
            .expect("called only with a whole super-packet");
        let packet = &mut frame[VIRTIO_NET_HDR_LEN..];
        let peer = routed(&*packet, &table).ok().map(|(_, peer)| peer);
        if peer.is_none_or(|p| table.peers()[p].spec.version < chunk::VERSION) {
            match reader.split_whole() {
                Ok(n) => self.drain(reader, n, icmp),
                Err(e) => {
                    tracing::debug!("cannot split a TUN super-packet: {e}");
                    self.drops.count(DropReason::Malformed);
                }
            }
            return;
        }
        let peer = match route_outbound(packet, &table) {
            Ok(peer) => &table.peers()[peer],
            Err(reason) => {
                self.io.answer_drop(reason, packet, icmp);
                return self.drops.count(reason);
            }
        };
        if self.held.deadline.is_some() {
            self.send_held();
        }
        self.send_chunks(&hdr, frame, peer);
    }

    /// Cut a super-packet frame into chunk datagrams filling the path MTU, sent as GSO trains.
    fn send_chunks(&mut self, hdr: &VirtioNetHdr, frame: &[u8], peer: &Peer) {
        let packet = &frame[VIRTIO_NET_HDR_LEN..];
        let capacity = self.io.path.capacity();
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
                    super_counts(packet, hdr.gso_type, hdr.gso_size)
                } else {
                    Counts::default()
                }
            };
            self.close(peer, CHUNK_HEADER_LEN + part.len(), counts);
            chunk.offset += part.len() as u16;
        }
        self.send_train(peer, 0);
    }

    /// A datagram of `len` bytes was written after the train: add it, or send the train first.
    fn close(&mut self, peer: &Peer, len: usize, counts: Counts) {
        let segment = if self.train.is_empty() {
            len
        } else {
            self.train.segment
        };
        if !self
            .train
            .accepts(len, self.io.udp.segments_per_send(segment))
        {
            self.send_train(peer, len);
        }
        self.train.push(len, counts);
    }

    /// Send the train; `pending` bytes written after it stay, as the start of the next one.
    fn send_train(&mut self, peer: &Peer, pending: usize) {
        if self.train.is_empty() {
            return;
        }
        let (datagrams, segment, counts) = self.train.closed();
        let dst = peer.spec.endpoint;
        let sent = match self.io.send(dst, datagrams, segment) {
            Ok(()) => counts,
            Err(e) => {
                let sent = self.train.sent(&e);
                let lost = counts.packets - sent.packets;
                refused(
                    &self.io,
                    dst,
                    &e,
                    lost,
                    (datagrams, segment),
                    (&mut self.drops, &mut self.too_big),
                );
                sent
            }
        };
        peer.stats.tx.add(sent.packets, sent.bytes);
        self.sent += sent;
        self.train.restart(pending);
    }

    /// Send the held datagrams, each on its own: they are all partly empty.
    fn send_held(&mut self) {
        let table = self.io.table.load();
        for i in 0..self.held.slots.len() {
            let slot = &mut self.held.slots[i];
            if slot.datagram.is_empty() {
                continue;
            }
            let (endpoint, counts) = (slot.endpoint, slot.counts);
            let mut datagram = std::mem::take(&mut slot.datagram);
            let len = datagram.len();
            match self.io.send(endpoint, &datagram, len) {
                Ok(()) => {
                    if let Some(peer) = table.by_endpoint(endpoint) {
                        peer.stats.tx.add(counts.packets, counts.bytes);
                    }
                    self.sent += counts;
                }
                Err(e) => {
                    let tallies = (&mut self.drops, &mut self.too_big);
                    refused(
                        &self.io,
                        endpoint,
                        &e,
                        counts.packets,
                        (&datagram, len),
                        tallies,
                    );
                }
            }
            datagram.clear();
            self.held.slots[i].datagram = datagram;
        }
        self.held.deadline = None;
        self.publish();
    }

    fn publish(&mut self) {
        let stats = &self.io.stats;
        std::mem::take(&mut self.sent).publish_tx(stats);
        self.drops.publish(stats);
    }
}

/// Count what a refused send of `train` (datagrams, segment size) lost, and keep the packets
/// that no longer fit the path, to answer them.
fn refused(
    io: &Shared,
    dst: SocketAddr,
    e: &SendError,
    lost_packets: u64,
    (datagrams, segment): (&[u8], usize),
    (drops, too_big): (&mut DropTally, &mut TooBig),
) {
    send_failed(dst, e, lost_packets as usize, drops);
    if e.error.raw_os_error() == Some(libc::EMSGSIZE) {
        let lost = datagrams.chunks(segment).enumerate();
        for (_, datagram) in lost.filter(|(j, _)| !e.was_sent(*j)) {
            too_big.note(datagram, io.largest_packet());
        }
    }
}

/// Packets of datagrams the kernel refused as too big that no longer fit the path, kept until
/// the ICMP writer is at hand to answer each with "fragmentation needed". Rare: only the
/// datagrams sent before the path MTU was learned lower.
#[derive(Default)]
struct TooBig(Vec<Vec<u8>>);

impl TooBig {
    fn note(&mut self, datagram: &[u8], largest: usize) {
        let Ok(batch) = BatchPacket::new_checked(datagram) else {
            return; // a chunk of a super-packet: TCP sends it again, at the smaller size
        };
        let records = batch.records().filter_map(Result::ok);
        self.0
            .extend(records.filter(|r| r.len() > largest).map(<[u8]>::to_vec));
    }

    fn answer(&mut self, io: &Shared, icmp: &mut TunWriter) {
        for packet in self.0.drain(..) {
            io.answer_drop(DropReason::TooBig, &packet, icmp);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
