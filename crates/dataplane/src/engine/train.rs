//! A GSO train being built: datagrams to one peer back to back, and what each carries, so that
//! a send the kernel refuses in part is counted exactly. The batch and WireGuard senders build
//! them.

use crate::io::udp::SendError;
use crate::stats::{EngineStats, Flow};
use std::ops::AddAssign;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Most datagrams one GSO send carries (the kernel's UDP_MAX_SEGMENTS).
const MAX_TRAIN: usize = 64;

/// Closed datagrams to one peer, back to back: sendable as one GSO train while all are
/// `segment` bytes but the last, which may be shorter. After them lies the datagram being
/// written.
pub(crate) struct Train {
    buf: Vec<u8>,
    len: usize,
    pub segment: usize,
    last: usize,
    counts: Counts,
    /// What each datagram of the train carries, so a partly refused send is counted exactly.
    per_datagram: Vec<Counts>,
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
            per_datagram: Vec::with_capacity(MAX_TRAIN),
        }
    }
}

impl Train {
    pub fn is_empty(&self) -> bool {
        self.counts.datagrams == 0
    }

    /// Where the next datagram is written.
    pub fn space(&mut self, capacity: usize) -> &mut [u8] {
        &mut self.buf[self.len..self.len + capacity]
    }

    /// The datagram written after the train, not (yet) part of it.
    pub fn open(&self, len: usize) -> &[u8] {
        &self.buf[self.len..self.len + len]
    }

    pub fn accepts(&self, len: usize, max_segments: usize) -> bool {
        self.is_empty()
            || (len <= self.segment
                && self.last == self.segment
                && (self.counts.datagrams as usize) < max_segments)
    }

    pub fn push(&mut self, len: usize, counts: Counts) {
        if self.is_empty() {
            self.segment = len;
        }
        self.last = len;
        self.len += len;
        self.counts += counts;
        self.per_datagram.push(counts);
    }

    /// What of the train went out, given what a refused send lost.
    pub fn sent(&self, refused: &SendError) -> Counts {
        let mut sent = Counts::default();
        for (i, counts) in self.per_datagram.iter().enumerate() {
            if refused.was_sent(i) {
                sent += *counts;
            }
        }
        sent
    }

    pub fn closed(&self) -> (&[u8], usize, Counts) {
        (&self.buf[..self.len], self.segment, self.counts)
    }

    /// Forget the sent train, moving the `pending` bytes written after it to the front.
    pub fn restart(&mut self, pending: usize) {
        self.buf.copy_within(self.len..self.len + pending, 0);
        self.len = 0;
        self.counts = Counts::default();
        self.per_datagram.clear();
    }
}

/// Datagrams, inner packets and inner bytes: what the counters are made of.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counts {
    pub datagrams: u64,
    pub packets: u64,
    pub bytes: u64,
    /// TCP super-packets carried whole (their segments count in `packets` too).
    pub super_packets: u64,
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
    pub fn publish_tx(&self, stats: &EngineStats) {
        self.publish(&stats.tx, &stats.tx_datagrams, &stats.tx_super_packets);
    }

    pub fn publish_rx(&self, stats: &EngineStats) {
        self.publish(&stats.rx, &stats.rx_datagrams, &stats.rx_super_packets);
    }

    fn publish(&self, flow: &Flow, datagrams: &AtomicU64, super_packets: &AtomicU64) {
        flow.add(self.packets, self.bytes);
        datagrams.fetch_add(self.datagrams, Relaxed);
        super_packets.fetch_add(self.super_packets, Relaxed);
    }
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

    #[test]
    fn a_partly_refused_train_counts_what_went_out() {
        let mut train = Train::default();
        let two = Counts { packets: 2, ..ONE };
        train.push(1000, ONE);
        train.push(1000, two);
        train.push(500, ONE);
        let refused = SendError {
            failed: 0b010,
            error: std::io::Error::from_raw_os_error(libc::EMSGSIZE),
        };
        let sent = train.sent(&refused);
        assert_eq!((sent.datagrams, sent.packets, sent.bytes), (2, 4, 200));
    }
}
