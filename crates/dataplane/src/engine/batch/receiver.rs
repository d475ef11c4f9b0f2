//! The UDP -> TUN half: check each datagram's sender, unpack its records, reassemble chunked
//! super-packets, and write what passes to TUN.

use super::super::{accept_inbound, flush_tun, write_to_tun, Shared};
use super::reassembly::Reassembly;
use super::{super_counts, Counts};
use crate::io::gso;
use crate::io::udp::sender;
use crate::io::{RecvBatch, TunWriter, UdpReceiver};
use crate::stats::{DropReason, DropTally};
use crate::table::Peer;
use crate::wire::batch::{self, BatchPacket};
use crate::wire::chunk::{self, ChunkPacket};
use crate::wire::WireError;
use std::ops::Range;
use tun_rs::{VirtioNetHdr, VIRTIO_NET_HDR_LEN};

/// The UDP -> TUN half.
pub(super) struct Receiver {
    pub io: Shared,
    /// Where each record of the datagram at hand lies; reused, so no allocation per datagram.
    records: Vec<Range<usize>>,
    supers: Reassembly,
    drops: DropTally,
}

pub(super) async fn udp_to_tun(udp: UdpReceiver, mut writer: TunWriter, mut rx: Receiver) {
    let mut batch = RecvBatch::default();
    loop {
        if let Err(e) = udp.recv(&mut batch).await {
            tracing::warn!("UDP receive failed: {e}");
            continue;
        }
        let got = rx.deliver(&mut batch, &mut writer);
        flush_tun(&mut writer, &mut rx.drops);
        got.publish_rx(&rx.io.stats);
        rx.drops.publish(&rx.io.stats);
    }
}

impl Receiver {
    pub fn new(io: Shared) -> Receiver {
        Receiver {
            io,
            records: Vec::new(),
            supers: Reassembly::default(),
            drops: DropTally::default(),
        }
    }

    /// Check every datagram of a receive batch and queue the packets that pass for TUN.
    fn deliver(&mut self, batch: &mut RecvBatch, writer: &mut TunWriter) -> Counts {
        let table = self.io.table.load();
        let mut got = Counts::default();
        for (addr, train) in batch.messages() {
            let peer = table.by_endpoint(sender(addr));
            let mut from_peer = Counts::default();
            for datagram in train {
                from_peer.datagrams += 1;
                let got = match batch::version(datagram) {
                    Some(chunk::VERSION) => self.reassemble(datagram, peer, writer),
                    _ => self.unpack(datagram, peer, writer),
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
    fn unpack(
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
                self.io.answer_drop(reason, packet, writer);
                self.drops.count(reason);
                continue;
            }
            got.packets += 1;
            got.bytes += packet.len() as u64;
            write_to_tun(writer, packet, &mut self.drops);
        }
        Ok(got)
    }

    /// Add a chunk to its super-packet, and write the super-packet to TUN once it is whole.
    fn reassemble(
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
        let got = super_counts(packet, repr.gso_type, repr.gso_size);
        writer.write_super(frame, hdr).map_err(|e| {
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

/// The checks of [`accept_inbound`] for a super-packet, plus: it is TCP of the family its GSO
/// type names, and each segment the kernel cuts from it fits the TUN. Returns the virtio-net
/// header to write it with, made here rather than taken from the wire.
fn accept_super(
    packet: &mut [u8],
    peer: &Peer,
    mtu: usize,
    gso_type: u8,
    gso_size: u16,
) -> Result<VirtioNetHdr, DropReason> {
    let hdr = gso::tcp_super_header(packet, gso_type, gso_size).ok_or(DropReason::Malformed)?;
    if usize::from(hdr.hdr_len) + usize::from(gso_size) > mtu {
        return Err(DropReason::TooBig);
    }
    accept_inbound(packet, peer, usize::from(u16::MAX))?;
    Ok(hdr)
}

/// Where `inner`, a subslice of `outer`, lies in it.
fn span(outer: &[u8], inner: &[u8]) -> Range<usize> {
    let start = inner.as_ptr() as usize - outer.as_ptr() as usize;
    start..start + inner.len()
}
