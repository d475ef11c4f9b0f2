//! UDP -> TUN: every datagram of a receive batch (GRO trains included) goes through
//! [`Crypto::open`](super::Crypto::open); inner packets go to TUN, coalesced, and handshake
//! replies straight back to their sender.

use super::open::Opened;
use super::peers::WgPeer;
use super::send::send_one;
use super::Wg;
use crate::engine::{flush_tun, write_to_tun};
use crate::io::udp::sender;
use crate::io::{RecvBatch, TunWriter, UdpReceiver};
use crate::stats::{DropReason, DropTally};
use crate::table::PeerTable;
use ipnet::Ipv4Net;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;

pub(super) async fn udp_to_tun(udp: UdpReceiver, mut writer: TunWriter, wg: Wg) {
    let mut batch = RecvBatch::default();
    let mut buf = vec![0u8; crate::io::udp::MAX_DATAGRAM_TRAIN];
    let mut drops = DropTally::default();
    loop {
        if let Err(e) = udp.recv(&mut batch).await {
            tracing::warn!("UDP receive failed: {e}");
            continue;
        }
        deliver(&mut batch, &mut buf, &mut writer, &wg, &mut drops);
        flush_tun(&mut writer, &mut drops);
        drops.publish(&wg.io.stats);
    }
}

fn deliver(
    batch: &mut RecvBatch,
    buf: &mut [u8],
    writer: &mut TunWriter,
    wg: &Wg,
    drops: &mut DropTally,
) {
    let table = wg.io.table.load();
    let peers = wg.peers.load();
    let mut received = Received::default();
    for (addr, train) in batch.messages() {
        let from = sender(addr);
        for datagram in train {
            received.datagrams += 1;
            match wg.crypto.open(&peers, from, datagram, buf, wg.io.mtu) {
                Opened::Packet(peer, len) => {
                    received.add(peer.subnet, len as u64, &table);
                    write_to_tun(writer, &buf[..len], drops);
                }
                Opened::Reply(peer, len) => reply(wg, from, peer, buf, len, drops),
                Opened::Cookie(len) => {
                    drops.count(DropReason::HandshakeFlood);
                    send_one(wg, from, &buf[..len], drops);
                }
                Opened::Nothing => {}
                Opened::Dropped(reason) => drops.count(reason),
            }
        }
    }
    received.publish(wg, &table);
}

/// Answer a handshake message, then send what waited for the session it made.
fn reply(
    wg: &Wg,
    to: SocketAddr,
    peer: Option<&WgPeer>,
    buf: &mut [u8],
    len: usize,
    drops: &mut DropTally,
) {
    send_one(wg, to, &buf[..len], drops);
    let Some(peer) = peer else { return };
    while let Some(len) = peer.next_staged(buf) {
        send_one(wg, peer.endpoint(), &buf[..len], drops);
    }
}

/// Inner packets and bytes of one receive batch, in total and per peer (a run of one peer's
/// packets is counted once: a GRO train comes from one sender).
#[derive(Default)]
struct Received {
    datagrams: u64,
    packets: u64,
    bytes: u64,
    run: Option<(Ipv4Net, u64, u64)>,
}

impl Received {
    fn add(&mut self, subnet: Ipv4Net, bytes: u64, table: &PeerTable) {
        self.packets += 1;
        self.bytes += bytes;
        match &mut self.run {
            Some((s, packets, b)) if *s == subnet => {
                *packets += 1;
                *b += bytes;
            }
            _ => {
                self.end_run(table);
                self.run = Some((subnet, 1, bytes));
            }
        }
    }

    fn end_run(&mut self, table: &PeerTable) {
        let Some((subnet, packets, bytes)) = self.run.take() else {
            return;
        };
        if let Some(peer) = table.get(subnet) {
            peer.stats.rx.add(packets, bytes);
        }
    }

    fn publish(mut self, wg: &Wg, table: &PeerTable) {
        self.end_run(table);
        wg.io.stats.rx.add(self.packets, self.bytes);
        wg.io.stats.rx_datagrams.fetch_add(self.datagrams, Relaxed);
    }
}
