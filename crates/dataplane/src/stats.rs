//! Counters: packets, bytes and drops by reason for the engine, packets and bytes per peer.
//!
//! Engines add to local tallies per batch and publish them once, so a packet costs no atomic
//! operation; readers (status, metrics, tests) see totals that are at most one batch old.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why a packet or datagram was not forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// A datagram from an address that is not a peer in the table (WireGuard: a handshake from
    /// a key, or a message for a peer index, that no lease holds).
    UnknownPeer,
    /// An inner packet whose source is outside the sending peer's subnet (for WireGuard, outside
    /// the peer's allowed IPs).
    SpoofedSource,
    /// A datagram or packet that does not decode.
    Malformed,
    /// A packet from TUN that is not IPv4 (twill carries IPv4 only, as flannel's udp backend).
    NotIpv4,
    /// A packet from TUN whose destination no peer owns.
    NoRoute,
    /// A packet larger than the path or the TUN MTU allows.
    TooBig,
    /// A packet whose TTL ran out here.
    TtlExceeded,
    /// A batch datagram with the wrong magic number.
    BadMagic,
    /// A batch datagram with a version this node does not speak.
    BadVersion,
    /// The kernel refused a send or a write.
    IoError,
    /// A super-packet given up because one of its chunks was lost or came out of order.
    IncompleteSuperPacket,
    /// A WireGuard message whose MAC or AEAD tag does not verify: sent with another key or
    /// another preshared key, or changed on the way.
    BadMac,
    /// A WireGuard message seen before: a data counter already received (or too old for the
    /// window), a handshake timestamp not newer than the last, a response to no handshake.
    Replay,
    /// A WireGuard packet with no session to carry it: a data message for a session that is
    /// gone, or a packet beyond the 256 that may wait for a peer's handshake, or one still
    /// waiting when the handshake gave up.
    NoSession,
    /// A WireGuard handshake message not taken up because handshakes came too fast: while
    /// this node is under load, one without a cookie (it is answered with one instead), and
    /// one with a cookie beyond its source address's share.
    HandshakeFlood,
}

impl DropReason {
    pub const ALL: [DropReason; 15] = [
        DropReason::UnknownPeer,
        DropReason::SpoofedSource,
        DropReason::Malformed,
        DropReason::NotIpv4,
        DropReason::NoRoute,
        DropReason::TooBig,
        DropReason::TtlExceeded,
        DropReason::BadMagic,
        DropReason::BadVersion,
        DropReason::IoError,
        DropReason::IncompleteSuperPacket,
        DropReason::BadMac,
        DropReason::Replay,
        DropReason::NoSession,
        DropReason::HandshakeFlood,
    ];

    /// The label used in logs, `twill status` and Prometheus metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::UnknownPeer => "unknown_peer",
            DropReason::SpoofedSource => "spoofed_source",
            DropReason::Malformed => "malformed",
            DropReason::NotIpv4 => "not_ipv4",
            DropReason::NoRoute => "no_route",
            DropReason::TooBig => "too_big",
            DropReason::TtlExceeded => "ttl_exceeded",
            DropReason::BadMagic => "bad_magic",
            DropReason::BadVersion => "bad_version",
            DropReason::IoError => "io_error",
            DropReason::IncompleteSuperPacket => "incomplete_super_packet",
            DropReason::BadMac => "bad_mac",
            DropReason::Replay => "replay",
            DropReason::NoSession => "no_session",
            DropReason::HandshakeFlood => "handshake_flood",
        }
    }
}

/// Packets and bytes in one direction.
#[derive(Debug, Default)]
pub struct Flow {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
}

impl Flow {
    pub fn add(&self, packets: u64, bytes: u64) {
        if packets > 0 {
            self.packets.fetch_add(packets, Relaxed);
            self.bytes.fetch_add(bytes, Relaxed);
        }
    }

    pub fn packets(&self) -> u64 {
        self.packets.load(Relaxed)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }
}

/// Traffic to and from one peer; kept across table swaps while the peer stays.
#[derive(Debug, Default)]
pub struct PeerStats {
    pub tx: Flow,
    pub rx: Flow,
}

/// Totals for one engine.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Inner packets read from TUN and sent to a peer.
    pub tx: Flow,
    /// Inner packets received from peers and written to TUN.
    pub rx: Flow,
    /// Underlay datagrams sent and received (differs from packets for the batch protocol).
    pub tx_datagrams: AtomicU64,
    pub rx_datagrams: AtomicU64,
    /// TCP super-packets carried whole, as batch version 2 chunks (each also counts its
    /// segments in `tx`/`rx`).
    pub tx_super_packets: AtomicU64,
    pub rx_super_packets: AtomicU64,
    /// ICMP errors not sent because the node's ICMP limit held them back (crate::icmp_limit);
    /// their packets are counted under their drop reason all the same.
    pub icmp_rate_limited: AtomicU64,
    drops: [AtomicU64; DropReason::ALL.len()],
}

impl EngineStats {
    pub fn drop_count(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize].load(Relaxed)
    }

    /// For a dataplane that keeps its own totals (the eBPF maps): the count as it is there.
    pub fn set_drop_count(&self, reason: DropReason, count: u64) {
        self.drops[reason as usize].store(count, Relaxed);
    }

    pub fn add_drops(&self, reason: DropReason, count: u64) {
        if count > 0 {
            self.drops[reason as usize].fetch_add(count, Relaxed);
        }
    }

    pub fn drops(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL.iter().map(|&r| (r, self.drop_count(r)))
    }
}

/// Drops tallied during one batch, published with [`DropTally::publish`].
#[derive(Debug, Default)]
pub struct DropTally([u64; DropReason::ALL.len()]);

impl DropTally {
    pub fn count(&mut self, reason: DropReason) {
        self.add(reason, 1);
    }

    pub fn add(&mut self, reason: DropReason, count: u64) {
        self.0[reason as usize] += count;
    }

    pub fn publish(&mut self, stats: &EngineStats) {
        for (reason, count) in DropReason::ALL.iter().zip(self.0.iter_mut()) {
            stats.add_drops(*reason, std::mem::take(count));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_publishes_once_and_resets() {
        let stats = EngineStats::default();
        let mut tally = DropTally::default();
        tally.count(DropReason::NoRoute);
        tally.count(DropReason::NoRoute);
        tally.count(DropReason::BadMagic);
        tally.publish(&stats);
        tally.publish(&stats);
        assert_eq!(stats.drop_count(DropReason::NoRoute), 2);
        assert_eq!(stats.drop_count(DropReason::BadMagic), 1);
        assert_eq!(stats.drop_count(DropReason::Malformed), 0);
    }

    #[test]
    fn labels_are_distinct() {
        let mut labels: Vec<_> = DropReason::ALL.iter().map(|r| r.as_str()).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), DropReason::ALL.len());
    }
}
