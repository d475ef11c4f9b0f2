//! TUN -> UDP: route each packet to its peer by destination (the peer's allowed IPs), encrypt
//! it with the peer's session straight into a GSO train, and send each train in one syscall.
//!
//! Unlike the flannel-udp engine, the TTL is left alone: the kernel's WireGuard device does not
//! touch it either, and flannel's wireguard backend is that device.

use super::peer_map::PeerMap;
use super::peers::{Families, Sealed, WgPeer};
use super::Wg;
use crate::engine::train::{Counts, Train};
use crate::engine::{flush_tun, next_tun_batch, routed, send_failed};
use crate::io::{TunReader, TunWriter};
use crate::stats::{DropReason, DropTally};
use crate::table::PeerTable;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;

/// A data message adds its header (type, receiver, counter: 16 bytes) and the AEAD tag (16).
pub const DATA_OVERHEAD: usize = 32;
/// A handshake initiation, the longest message that is not data.
pub const HANDSHAKE_INIT_LEN: usize = 148;

pub(super) async fn tun_to_udp(mut reader: TunReader, mut icmp: TunWriter, wg: Wg) {
    let mut train = Outgoing::new();
    let mut padded = vec![0u8; wg.io.mtu];
    let mut drops = DropTally::default();
    loop {
        let Some(n) = next_tun_batch(&mut reader, &mut drops).await else {
            return;
        };
        let table = wg.io.table.load();
        let peers = wg.peers.load();
        for i in 0..n {
            let packet = reader.packet_mut(i);
            let routed = match route(packet, &table, &peers, wg.crypto.families) {
                Ok(to) if packet.len() > wg.underlay(to.endpoint).largest_packet() => {
                    Err(DropReason::TooBig)
                }
                routed => routed,
            };
            let to = match routed {
                Ok(to) => to,
                Err(reason) => {
                    wg.io.answer_drop(reason, packet, &mut icmp);
                    drops.count(reason);
                    continue;
                }
            };
            let packet = pad(packet, &mut padded);
            train.seal(&wg, &table, to, packet, &mut drops);
        }
        train.send(&wg, &table, &mut drops);
        flush_tun(&mut icmp, &mut drops);
        drops.publish(&wg.io.stats);
    }
}

/// Where a packet read from TUN goes.
#[derive(Clone, Copy)]
struct To<'p> {
    /// The peer's index in the routing table, for its counters.
    index: usize,
    peer: &'p WgPeer,
    /// Where its datagrams go now.
    endpoint: SocketAddr,
}

/// The peer for a packet read from TUN. A packet of a family this device does not carry has
/// no peer here, as in the kernel's device, whose peers' allowed IPs hold none of it.
fn route<'p>(
    packet: &[u8],
    table: &PeerTable,
    peers: &'p PeerMap,
    families: Families,
) -> Result<To<'p>, DropReason> {
    let (ip, index) = routed(packet, table)?;
    if !families.carry(&ip) {
        return Err(DropReason::NoRoute);
    }
    let peer = peers.by_subnet(table.peers()[index].spec.subnet);
    let peer = peer.ok_or(DropReason::NoRoute)?;
    Ok(To {
        index,
        peer,
        endpoint: peer.endpoint(),
    })
}

/// WireGuard pads the plaintext to a multiple of 16 bytes, never past the MTU, so that a
/// packet's length shows less of what it carries. Copies only a packet that needs padding.
fn pad<'a>(packet: &'a [u8], room: &'a mut [u8]) -> &'a [u8] {
    let len = packet.len();
    let padded = len.next_multiple_of(16).min(room.len().max(len));
    if padded == len {
        return packet;
    }
    room[..len].copy_from_slice(packet);
    room[len..padded].fill(0);
    &room[..padded]
}

/// Encrypted datagrams for one peer, back to back, all the same length but the last: one UDP
/// GSO send.
struct Outgoing {
    train: Train,
    endpoint: SocketAddr,
    /// The peer's index in the routing table, for its counters.
    peer: usize,
}

/// A refused send names each lost datagram by a bit of a u128.
const MAX_SEGMENTS: usize = 128;

impl Outgoing {
    fn new() -> Outgoing {
        Outgoing {
            train: Train::default(),
            endpoint: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            peer: 0,
        }
    }

    /// Whether a datagram of `len` bytes to `to` may join.
    fn takes(&self, wg: &Wg, to: &To, len: usize) -> bool {
        let limit = || {
            let io = wg.underlay(to.endpoint);
            io.udp
                .segments_per_send(self.train.segment)
                .min(MAX_SEGMENTS)
        };
        self.train.is_empty()
            || (self.endpoint == to.endpoint
                && self.peer == to.index
                && self.train.accepts(len, limit()))
    }

    /// Encrypt `packet` for its peer onto the train, sending the train first if the datagram
    /// can not join it. A handshake initiation (no session yet) goes out at once on its own.
    fn seal(&mut self, wg: &Wg, table: &PeerTable, to: To, packet: &[u8], drops: &mut DropTally) {
        let sealed_len = packet.len() + DATA_OVERHEAD;
        if !self.takes(wg, &to, sealed_len) {
            self.send(wg, table, drops);
        }
        let slot = self.train.space(sealed_len.max(HANDSHAKE_INIT_LEN));
        match to.peer.seal(&wg.crypto.params, packet, slot) {
            Sealed::Data(len) => self.push(to.endpoint, to.index, len),
            Sealed::Handshake(len) => send_one(wg, to.endpoint, self.train.open(len), drops),
            Sealed::Staged => {}
            Sealed::Dropped => drops.count(DropReason::NoSession),
        }
    }

    fn push(&mut self, endpoint: SocketAddr, peer: usize, len: usize) {
        if self.train.is_empty() {
            (self.endpoint, self.peer) = (endpoint, peer);
        }
        let inner = (len - DATA_OVERHEAD) as u64;
        let counts = Counts {
            datagrams: 1,
            packets: 1,
            bytes: inner,
            super_packets: 0,
        };
        self.train.push(len, counts);
    }

    fn send(&mut self, wg: &Wg, table: &PeerTable, drops: &mut DropTally) {
        if self.train.is_empty() {
            return;
        }
        let (datagrams, segment, counts) = self.train.closed();
        let io = wg.underlay(self.endpoint);
        let sent = match io.send(self.endpoint, datagrams, segment) {
            Ok(()) => counts,
            Err(e) => {
                send_failed(self.endpoint, &e, e.lost(), drops);
                self.train.sent(&e)
            }
        };
        if let Some(peer) = table.peers().get(self.peer) {
            peer.stats.tx.add(sent.packets, sent.bytes);
        }
        sent.publish_tx(&io.stats);
        self.train.restart(0);
    }
}

/// Send one message that is not data (a handshake or keepalive, a cookie), on the socket of
/// `to`'s family.
pub(super) fn send_one(wg: &Wg, to: SocketAddr, message: &[u8], drops: &mut DropTally) {
    let io = wg.underlay(to);
    match io.send(to, message, message.len()) {
        Ok(()) => {
            io.stats.tx_datagrams.fetch_add(1, Relaxed);
        }
        Err(e) => send_failed(to, &e, e.lost(), drops),
    }
}

#[cfg(test)]
mod tests {
    use super::super::pair::Node;
    use super::*;
    use std::net::SocketAddrV4;

    #[test]
    fn an_ipv6_packet_routes_by_the_ipv6_subnets_on_a_device_that_carries_ipv6() {
        let (a, b) = (Node::new(1, None), Node::new(2, None));
        a.knows(&[b.spec()]);
        let table = PeerTable::new(&[crate::table::PeerSpec {
            subnet: b.subnet,
            subnet6: Some(b.subnet6),
            endpoint: SocketAddrV4::new(b.subnet.network(), 0).into(),
            version: 0,
        }]);
        let peers = a.peers.load();
        let to_b = |packet: &[u8], families| {
            route(packet, &table, &peers, families).map(|to| (to.index, to.peer.subnet))
        };
        let (v4, v6) = (a.packet_to(&b, 100), a.packet6_to(&b, 100));
        assert_eq!(to_b(&v6, Families::Both), Ok((0, b.subnet)));
        assert_eq!(to_b(&v6, Families::Ipv6), Ok((0, b.subnet)));
        assert_eq!(to_b(&v6, Families::Ipv4), Err(DropReason::NoRoute));
        assert_eq!(to_b(&v4, Families::Ipv6), Err(DropReason::NoRoute));
        assert_eq!(
            to_b(&a.packet6_to(&a, 100), Families::Both),
            Err(DropReason::NoRoute)
        );
    }

    #[test]
    fn padding_rounds_up_to_16_but_never_past_the_mtu() {
        let mut room = [0xffu8; 1420];
        assert_eq!(pad(&[1; 64], &mut room).len(), 64);
        let padded = pad(&[1; 65], &mut room).to_vec();
        assert_eq!(padded.len(), 80);
        assert!(padded[65..].iter().all(|&b| b == 0));
        assert_eq!(pad(&[1; 1415], &mut room).len(), 1420);
        assert_eq!(pad(&[1; 1420], &mut room).len(), 1420);
    }
}
