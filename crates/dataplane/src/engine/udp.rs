//! The flannel-udp engine: one bare inner packet per datagram, so a flanneld peer interoperates.
//!
//! The speed comes from moving many packets per syscall, not from a different format: a run of
//! equal-sized packets to one peer leaves in one UDP GSO send (the kernel still puts each in its
//! own datagram), and GRO trains from the socket go to TUN in one coalesced write.

use super::directions::Direction;
use super::{
    accept_inbound, flush_tun, next_tun_batch, route_outbound, send_failed, write_to_tun, Shared,
};
use crate::io::udp::{sender, SendError};
use crate::io::{RecvBatch, Tun, TunReader, TunWriter, UdpReceiver};
use crate::stats::{DropReason, DropTally};
use crate::table::PeerTable;
use arrayvec::ArrayVec;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

/// TUN -> UDP for each queue, and UDP -> TUN.
pub(crate) fn directions(tun: &Arc<Tun>, io: &Shared) -> io::Result<Vec<Direction>> {
    let mut directions = Vec::new();
    for q in 0..tun.queues() {
        let (tun, icmp, io) = (tun.clone(), tun.writer(q)?, io.clone());
        directions.push(Direction::new(format!("twill tun{q}>udp"), move || {
            Ok(tun_to_udp(tun.reader(q)?, icmp, io))
        }));
    }
    let (writer, io) = (tun.writer(0)?, io.clone());
    directions.push(Direction::new("twill udp>tun", move || {
        Ok(udp_to_tun(io.udp.receiver()?, writer, io))
    }));
    Ok(directions)
}

/// Consecutive packets of one read batch bound for one peer, sendable as one GSO train.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: usize,
    count: usize,
    segment: usize,
    bytes: usize,
    endpoint: SocketAddr,
    peer: usize,
    /// How many segments of `segment` bytes one send may carry: fixed by the run's first
    /// packet, since every later one is at most that long.
    max_segments: usize,
    /// A shorter packet ends a GSO train: only the last segment may be short.
    closed: bool,
}

impl Run {
    fn start(
        first: usize,
        len: usize,
        peer: usize,
        endpoint: SocketAddr,
        max_segments: usize,
    ) -> Run {
        Run {
            first,
            count: 1,
            segment: len,
            bytes: len,
            endpoint,
            peer,
            max_segments,
            closed: false,
        }
    }

    /// Adds packet `i` if it continues the train; `false` leaves the run as it was.
    fn extend(&mut self, i: usize, len: usize, peer: usize) -> bool {
        let fits = !self.closed
            && self.peer == peer
            && self.first + self.count == i
            && len <= self.segment
            && self.count < self.max_segments;
        if fits {
            self.count += 1;
            self.bytes += len;
            self.closed = len < self.segment;
        }
        fits
    }

    /// Packets and bytes of the run that went out, given what a refused send lost.
    fn sent(&self, refused: &SendError) -> (usize, usize) {
        let last = self.count - 1;
        let len = |i| {
            if i == last {
                self.bytes - last * self.segment
            } else {
                self.segment
            }
        };
        let lost_bytes: usize = (0..self.count)
            .filter(|&i| !refused.was_sent(i))
            .map(len)
            .sum();
        (self.count - refused.lost(), self.bytes - lost_bytes)
    }
}

async fn tun_to_udp(mut reader: TunReader, mut icmp: TunWriter, io: Shared) {
    let mut runs: ArrayVec<Run, { crate::io::tun::READ_BATCH }> = ArrayVec::new();
    let mut drops = DropTally::default();
    loop {
        let Some(n) = next_tun_batch(&mut reader, &mut drops).await else {
            return;
        };
        let table = io.table.load();
        classify(
            &mut reader,
            n,
            &table,
            &io,
            &mut runs,
            &mut drops,
            &mut icmp,
        );
        send_runs(&mut reader, &runs, &table, &io, &mut drops, &mut icmp);
        flush_tun(&mut icmp, &mut drops);
        drops.publish(&io.stats);
    }
}

/// Route each packet and group the routable ones into GSO runs.
fn classify(
    reader: &mut TunReader,
    n: usize,
    table: &PeerTable,
    io: &Shared,
    runs: &mut ArrayVec<Run, { crate::io::tun::READ_BATCH }>,
    drops: &mut DropTally,
    icmp: &mut TunWriter,
) {
    runs.clear();
    for i in 0..n {
        let len = reader.packet_len(i);
        let routed = match route_outbound(reader.packet_mut(i), table) {
            Ok(_) if len > io.largest_packet() => Err(DropReason::TooBig),
            routed => routed,
        };
        let index = match routed {
            Ok(index) => index,
            Err(reason) => {
                io.answer_drop(reason, reader.packet_mut(i), icmp);
                drops.count(reason);
                continue;
            }
        };
        let extended = runs.last_mut().is_some_and(|run| run.extend(i, len, index));
        if !extended {
            let endpoint = table.peers()[index].spec.endpoint;
            runs.push(Run::start(
                i,
                len,
                index,
                endpoint,
                io.udp.segments_per_send(len),
            ));
        }
    }
}

fn send_runs(
    reader: &mut TunReader,
    runs: &[Run],
    table: &PeerTable,
    io: &Shared,
    drops: &mut DropTally,
    icmp: &mut TunWriter,
) {
    let (mut packets, mut bytes, mut datagrams) = (0u64, 0u64, 0u64);
    for run in runs {
        let train = reader.gather(run.first, run.count, run.segment);
        let (sent, sent_bytes) = match io.send(run.endpoint, train, run.segment) {
            Ok(()) => (run.count, run.bytes),
            Err(e) => {
                send_failed(run.endpoint, &e, e.lost(), drops);
                if e.error.raw_os_error() == Some(libc::EMSGSIZE) {
                    // The path MTU was just learned lower: tell each sender what fits now.
                    let lost = train.chunks(run.segment).enumerate();
                    for (_, packet) in lost.filter(|(j, _)| !e.was_sent(*j)) {
                        io.answer_drop(DropReason::TooBig, packet, icmp);
                    }
                }
                run.sent(&e)
            }
        };
        if let Some(peer) = table.peers().get(run.peer) {
            peer.stats.tx.add(sent as u64, sent_bytes as u64);
        }
        packets += sent as u64;
        bytes += sent_bytes as u64;
        datagrams += sent as u64;
    }
    io.stats.tx.add(packets, bytes);
    io.stats
        .tx_datagrams
        .fetch_add(datagrams, std::sync::atomic::Ordering::Relaxed);
}

async fn udp_to_tun(udp: UdpReceiver, mut writer: TunWriter, io: Shared) {
    let mut batch = RecvBatch::default();
    let mut drops = DropTally::default();
    loop {
        if let Err(e) = udp.recv(&mut batch).await {
            tracing::warn!("UDP receive failed: {e}");
            continue;
        }
        let (packets, bytes, datagrams) = deliver(&mut batch, &mut writer, &io, &mut drops);
        flush_tun(&mut writer, &mut drops);
        io.stats.rx.add(packets, bytes);
        io.stats
            .rx_datagrams
            .fetch_add(datagrams, std::sync::atomic::Ordering::Relaxed);
        drops.publish(&io.stats);
    }
}

/// Check every datagram of a receive batch and queue the good ones for TUN.
fn deliver(
    batch: &mut RecvBatch,
    writer: &mut TunWriter,
    io: &Shared,
    drops: &mut DropTally,
) -> (u64, u64, u64) {
    let table = io.table.load();
    let (mut packets, mut bytes, mut datagrams) = (0u64, 0u64, 0u64);
    for (addr, train) in batch.messages() {
        let peer = table.by_endpoint(sender(addr));
        let (mut peer_packets, mut peer_bytes) = (0u64, 0u64);
        for datagram in train {
            datagrams += 1;
            let Some(peer) = peer else {
                drops.count(DropReason::UnknownPeer);
                continue;
            };
            if let Err(reason) = accept_inbound(datagram, peer, io.mtu) {
                io.answer_drop(reason, datagram, writer);
                drops.count(reason);
                continue;
            }
            peer_packets += 1;
            peer_bytes += datagram.len() as u64;
            write_to_tun(writer, datagram, drops);
        }
        if let Some(peer) = peer {
            peer.stats.rx.add(peer_packets, peer_bytes);
        }
        packets += peer_packets;
        bytes += peer_bytes;
    }
    (packets, bytes, datagrams)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::udp::{segments_per_send, MAX_GSO_BYTES};

    fn endpoint() -> SocketAddr {
        SocketAddr::from(([192, 0, 2, 1], 8285))
    }

    /// Group packets of these lengths, all to one peer, as `classify` does.
    fn runs_of(lens: &[usize]) -> Vec<Run> {
        let mut runs: Vec<Run> = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            if !runs.last_mut().is_some_and(|run| run.extend(i, len, 0)) {
                runs.push(Run::start(
                    i,
                    len,
                    0,
                    endpoint(),
                    segments_per_send(64, len),
                ));
            }
        }
        runs
    }

    #[test]
    fn a_shorter_last_packet_never_takes_a_full_run_past_one_send() {
        // 44 x 1472 fill a send; the 1272-byte packet after them must not join (it used to:
        // the limit was taken from its own length, 51 segments, and the kernel refused the
        // 66,040-byte send with EMSGSIZE, losing all 45 packets).
        let mut lens = vec![1472; 44];
        lens.push(1272);
        let runs = runs_of(&lens);
        assert_eq!(runs.iter().map(|r| r.count).collect::<Vec<_>>(), [44, 1]);
        assert!(runs.iter().all(|r| r.bytes <= MAX_GSO_BYTES));
    }

    #[test]
    fn every_run_fits_one_send_whatever_the_lengths() {
        for first in [1, 100, 576, 1272, 1400, 1472, 9000, 65507] {
            for last in [1, first / 2, first] {
                let mut lens = vec![first; 200];
                lens.push(last.max(1));
                for run in runs_of(&lens) {
                    assert!(run.bytes <= MAX_GSO_BYTES, "{first}/{last}: {run:?}");
                    assert!(run.count <= 64);
                }
            }
        }
    }

    #[test]
    fn a_partly_refused_run_counts_what_went_out() {
        let run = runs_of(&[1000, 1000, 400])[0];
        let refused = |failed| SendError {
            failed,
            error: std::io::Error::from_raw_os_error(libc::EMSGSIZE),
        };
        assert_eq!(run.sent(&refused(0b010)), (2, 1400));
        assert_eq!(run.sent(&refused(0b100)), (2, 2000));
        assert_eq!(run.sent(&refused(0b111)), (0, 0));
    }
}
