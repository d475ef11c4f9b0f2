//! The not-full datagrams the batch sender holds back under `--batch-delay`.

use super::Counts;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// Not-full datagrams kept back under `--batch-delay`, at most one per peer, all sent when the
/// first one's delay is up.
#[derive(Default)]
pub(super) struct Held {
    /// Slots stay once made, so their buffers are reused; an empty datagram means none held.
    pub slots: Vec<HeldSlot>,
    pub deadline: Option<Instant>,
}

pub(super) struct HeldSlot {
    pub endpoint: SocketAddr,
    pub datagram: Vec<u8>,
    pub counts: Counts,
}

impl Held {
    /// The peer's held datagram, to be packed again in front of its new packets.
    pub fn take(&mut self, endpoint: SocketAddr) -> Vec<u8> {
        self.slots
            .iter_mut()
            .find(|s| s.endpoint == endpoint)
            .map(|s| std::mem::take(&mut s.datagram))
            .unwrap_or_default()
    }

    /// Hold `datagram` (or, if empty, just keep its buffer) for the peer at `endpoint`.
    pub fn put(
        &mut self,
        endpoint: SocketAddr,
        datagram: Vec<u8>,
        counts: Counts,
        delay: Duration,
    ) {
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
