//! Super-packets put back together from their chunks, per (peer, sender stream).

use crate::wire::chunk::ChunkRepr;
use std::net::SocketAddr;
use tun_rs::VIRTIO_NET_HDR_LEN;

/// Super-packets being put together from chunks: one slot per (peer, sender stream), since
/// each stream sends its super-packets one after the other.
#[derive(Default)]
pub(super) struct Reassembly {
    slots: Vec<SuperSlot>,
}

impl Reassembly {
    pub fn slot(&mut self, endpoint: SocketAddr, stream: u8) -> &mut SuperSlot {
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
pub(super) struct SuperSlot {
    key: (SocketAddr, u8),
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
    fn new(key: (SocketAddr, u8)) -> SuperSlot {
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
    pub fn add(&mut self, chunk: &ChunkRepr, payload: &[u8]) -> u64 {
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
    pub fn complete(&mut self) -> Option<&mut [u8]> {
        if self.state != SlotState::Building || self.next < self.total {
            return None;
        }
        self.state = SlotState::Idle;
        Some(&mut self.frame[..VIRTIO_NET_HDR_LEN + self.total])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        SuperSlot::new((SocketAddr::new([192, 0, 2, 1].into(), 8286), 0))
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
}
