//! The flannel-udp engine: one bare inner packet per datagram, so a flanneld peer interoperates.
//!
//! The speed comes from moving many packets per syscall, not from a different format: a run of
//! equal-sized packets to one peer leaves in one UDP GSO send (the kernel still puts each in its
//! own datagram), and GRO trains from the socket go to TUN in one coalesced write.

use super::{
    accept_inbound, flush_tun, reply_unreachable, route_outbound, tun_read_failed, write_to_tun,
    Shared,
};
use crate::io::udp::sender_v4;
use crate::io::{RecvBatch, Tun, TunReader, TunWriter};
use crate::stats::{DropReason, DropTally};
use crate::table::PeerTable;
use arrayvec::ArrayVec;
use std::net::SocketAddrV4;
use std::ops::ControlFlow;
use tokio::task::JoinHandle;

pub(crate) fn spawn(tun: &Tun, io: &Shared) -> Vec<JoinHandle<()>> {
    let mut tasks: Vec<JoinHandle<()>> = (0..tun.queues())
        .map(|q| tokio::spawn(tun_to_udp(tun.reader(q), tun.writer(q), io.clone())))
        .collect();
    tasks.push(tokio::spawn(udp_to_tun(tun.writer(0), io.clone())));
    tasks
}

/// Consecutive packets of one read batch bound for one peer, sendable as one GSO train.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: usize,
    count: usize,
    segment: usize,
    bytes: usize,
    endpoint: SocketAddrV4,
    peer: usize,
    /// A shorter packet ends a GSO train: only the last segment may be short.
    closed: bool,
}

impl Run {
    fn extends(&self, i: usize, len: usize, peer: usize, max_segments: usize) -> bool {
        !self.closed
            && self.peer == peer
            && self.first + self.count == i
            && len <= self.segment
            && self.count < max_segments
    }
}

async fn tun_to_udp(mut reader: TunReader, mut icmp: TunWriter, io: Shared) {
    let mut runs: ArrayVec<Run, { crate::io::tun::READ_BATCH }> = ArrayVec::new();
    let mut drops = DropTally::default();
    loop {
        let n = match reader.read_batch().await {
            Ok(n) => n,
            Err(e) => match tun_read_failed(&e, &mut drops) {
                ControlFlow::Continue(()) => continue,
                ControlFlow::Break(()) => return,
            },
        };
        drops.add(DropReason::IoError, reader.take_failed_reads());
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
        send_runs(&mut reader, &runs, &table, &io, &mut drops).await;
        flush_tun(&mut icmp, &mut drops).await;
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
        let index = match route_outbound(reader.packet_mut(i), table) {
            Ok(index) => index,
            Err(reason) => {
                if reason == DropReason::NoRoute {
                    reply_unreachable(reader.packet_mut(i), icmp);
                }
                drops.count(reason);
                continue;
            }
        };
        let endpoint = table.peers()[index].spec.endpoint;
        let max = io.udp.segments_per_send(len);
        match runs.last_mut() {
            Some(run) if run.extends(i, len, index, max) => {
                run.count += 1;
                run.bytes += len;
                run.closed = len < run.segment;
            }
            _ => runs.push(Run {
                first: i,
                count: 1,
                segment: len,
                bytes: len,
                endpoint,
                peer: index,
                closed: false,
            }),
        }
    }
}

async fn send_runs(
    reader: &mut TunReader,
    runs: &[Run],
    table: &PeerTable,
    io: &Shared,
    drops: &mut DropTally,
) {
    let (mut packets, mut bytes, mut datagrams) = (0u64, 0u64, 0u64);
    for run in runs {
        let train = reader.gather(run.first, run.count, run.segment);
        match io.udp.send(run.endpoint, train, run.segment).await {
            Ok(()) => {
                if let Some(peer) = table.peers().get(run.peer) {
                    peer.stats.tx.add(run.count as u64, run.bytes as u64);
                }
                packets += run.count as u64;
                bytes += run.bytes as u64;
                datagrams += run.count as u64;
            }
            Err(e) => {
                tracing::debug!(dst = %run.endpoint, "UDP send failed: {e}");
                for _ in 0..run.count {
                    drops.count(DropReason::IoError);
                }
            }
        }
    }
    io.stats.tx.add(packets, bytes);
    io.stats
        .tx_datagrams
        .fetch_add(datagrams, std::sync::atomic::Ordering::Relaxed);
}

async fn udp_to_tun(mut writer: TunWriter, io: Shared) {
    let mut batch = RecvBatch::default();
    let mut drops = DropTally::default();
    loop {
        if let Err(e) = io.udp.recv(&mut batch).await {
            tracing::warn!("UDP receive failed: {e}");
            continue;
        }
        let (packets, bytes, datagrams) = deliver(&mut batch, &mut writer, &io, &mut drops).await;
        flush_tun(&mut writer, &mut drops).await;
        io.stats.rx.add(packets, bytes);
        io.stats
            .rx_datagrams
            .fetch_add(datagrams, std::sync::atomic::Ordering::Relaxed);
        drops.publish(&io.stats);
    }
}

/// Check every datagram of a receive batch and queue the good ones for TUN.
async fn deliver(
    batch: &mut RecvBatch,
    writer: &mut TunWriter,
    io: &Shared,
    drops: &mut DropTally,
) -> (u64, u64, u64) {
    let table = io.table.load();
    let (mut packets, mut bytes, mut datagrams) = (0u64, 0u64, 0u64);
    for (addr, train) in batch.messages() {
        let peer = sender_v4(addr).and_then(|a| table.by_endpoint(a));
        let (mut peer_packets, mut peer_bytes) = (0u64, 0u64);
        for datagram in train {
            datagrams += 1;
            let Some(peer) = peer else {
                drops.count(DropReason::UnknownPeer);
                continue;
            };
            if let Err(reason) = accept_inbound(datagram, peer, io.mtu) {
                drops.count(reason);
                continue;
            }
            peer_packets += 1;
            peer_bytes += datagram.len() as u64;
            write_to_tun(writer, datagram, drops).await;
        }
        if let Some(peer) = peer {
            peer.stats.rx.add(peer_packets, peer_bytes);
        }
        packets += peer_packets;
        bytes += peer_bytes;
    }
    (packets, bytes, datagrams)
}
