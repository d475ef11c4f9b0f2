//! Batch version 2 chunk datagrams: one TCP super-packet (up to 64 KB, as TUN hands it over with
//! TSO) cut into datagram-sized chunks, so neither end segments, coalesces or checksums it.
//! Layout and receiver rules: docs/batch-protocol.md, "Version 2".

use super::batch_header::{
    check_header, emit_header, parse_sender, read_u32, CHUNK_VERSION, HEADER_LEN,
};
use super::{virtio, WireError};
use ipnet::Ipv4Net;

pub const VERSION: u8 = CHUNK_VERSION;
pub const CHUNK_HEADER_LEN: usize = HEADER_LEN + 12;
/// The smallest super-packet: an IPv4 header and a TCP header (IPv6's is 20 bytes longer).
const MIN_TOTAL: usize = 40;

mod field {
    pub const SEQ: usize = 12;
    pub const TOTAL: usize = 16;
    pub const OFFSET: usize = 18;
    pub const GSO_SIZE: usize = 20;
    pub const GSO_TYPE: usize = 22;
    pub const STREAM: usize = 23;
}

/// Everything a chunk header says besides the common batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRepr {
    pub sender: Ipv4Net,
    /// Which super-packet of this stream; consecutive super-packets differ by one.
    pub seq: u32,
    /// The super-packet's length: its IPv4 Total Length, or 40 + its IPv6 Payload Length.
    pub total: u16,
    /// Where this chunk's bytes go in the super-packet.
    pub offset: u16,
    /// The TCP payload per segment (MSS) the receiving kernel segments at.
    pub gso_size: u16,
    pub gso_type: u8,
    /// The sender's TUN queue: each stream is reassembled on its own, so queues never interleave.
    pub stream: u8,
}

impl ChunkRepr {
    /// Write the header into `buf[..CHUNK_HEADER_LEN]`; the chunk's bytes follow it.
    pub fn emit(&self, buf: &mut [u8]) {
        emit_header(buf, VERSION, self.sender);
        let h = &mut buf[HEADER_LEN..CHUNK_HEADER_LEN];
        h[0..4].copy_from_slice(&self.seq.to_be_bytes());
        h[4..6].copy_from_slice(&self.total.to_be_bytes());
        h[6..8].copy_from_slice(&self.offset.to_be_bytes());
        h[8..10].copy_from_slice(&self.gso_size.to_be_bytes());
        h[10] = self.gso_type;
        h[11] = self.stream;
    }
}

/// A view of a chunk datagram. `new_checked` guarantees a valid common header, a known GSO
/// type, a non-zero MSS, and a non-empty chunk lying inside the super-packet it names.
#[derive(Debug, Clone, Copy)]
pub struct ChunkPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ChunkPacket<T> {
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let data = buffer.as_ref();
        check_header(data, VERSION)?;
        if data.len() <= CHUNK_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let packet = ChunkPacket { buffer };
        let repr = packet.repr();
        let end = usize::from(repr.offset) + packet.payload().len();
        if usize::from(repr.total) < MIN_TOTAL || end > usize::from(repr.total) {
            return Err(WireError::BadLength);
        }
        // The only super-packets a chunk carries: TCP over IPv4 or IPv6, with or without ECN.
        if !virtio::is_tcp(repr.gso_type) || repr.gso_size == 0 {
            return Err(WireError::BadGso);
        }
        Ok(packet)
    }

    pub fn repr(&self) -> ChunkRepr {
        let data = self.buffer.as_ref();
        let u16_at = |at: usize| u16::from_be_bytes([data[at], data[at + 1]]);
        ChunkRepr {
            sender: parse_sender(data).expect("sender validated by new_checked"),
            seq: read_u32(data, field::SEQ),
            total: u16_at(field::TOTAL),
            offset: u16_at(field::OFFSET),
            gso_size: u16_at(field::GSO_SIZE),
            gso_type: data[field::GSO_TYPE],
            stream: data[field::STREAM],
        }
    }

    /// This chunk's bytes of the super-packet.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[CHUNK_HEADER_LEN..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::virtio::{GSO_ECN, GSO_TCPV4};

    fn repr() -> ChunkRepr {
        ChunkRepr {
            sender: "10.5.1.0/24".parse().unwrap(),
            seq: 7,
            total: 3000,
            offset: 1400,
            gso_size: 1418,
            gso_type: GSO_TCPV4 | GSO_ECN,
            stream: 3,
        }
    }

    fn datagram(repr: &ChunkRepr, chunk: usize) -> Vec<u8> {
        let mut buf = vec![0xab; CHUNK_HEADER_LEN + chunk];
        repr.emit(&mut buf);
        buf
    }

    #[test]
    fn round_trip() {
        let wire = datagram(&repr(), 1400);
        let chunk = ChunkPacket::new_checked(&wire[..]).unwrap();
        assert_eq!(chunk.repr(), repr());
        assert_eq!(chunk.payload(), &[0xab; 1400][..]);
    }

    #[test]
    fn version_one_is_not_a_chunk() {
        let mut wire = datagram(&repr(), 10);
        wire[4] = 1;
        assert_eq!(
            ChunkPacket::new_checked(&wire[..]).unwrap_err(),
            WireError::UnsupportedVersion
        );
    }

    #[test]
    fn chunk_must_lie_inside_the_super_packet() {
        assert_eq!(
            ChunkPacket::new_checked(&datagram(&repr(), 1601)[..]).unwrap_err(),
            WireError::BadLength
        );
        ChunkPacket::new_checked(&datagram(&repr(), 1600)[..]).unwrap();
        let tiny = ChunkRepr {
            total: 39,
            offset: 0,
            ..repr()
        };
        assert_eq!(
            ChunkPacket::new_checked(&datagram(&tiny, 10)[..]).unwrap_err(),
            WireError::BadLength
        );
    }

    #[test]
    fn empty_chunk_is_truncated() {
        assert_eq!(
            ChunkPacket::new_checked(&datagram(&repr(), 0)[..]).unwrap_err(),
            WireError::Truncated
        );
    }

    #[test]
    fn only_tcpv4_with_a_segment_size() {
        for (gso_type, gso_size) in [(3, 1418), (0, 1418), (GSO_TCPV4, 0)] {
            let r = ChunkRepr {
                gso_type,
                gso_size,
                ..repr()
            };
            assert_eq!(
                ChunkPacket::new_checked(&datagram(&r, 10)[..]).unwrap_err(),
                WireError::BadGso
            );
        }
    }
}
