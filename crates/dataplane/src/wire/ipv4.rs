//! IPv4 header view: checked once, then read and patched in place.

use super::{checksum, WireError};
use std::net::Ipv4Addr;

pub const MIN_HEADER_LEN: usize = 20;
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

mod field {
    use std::ops::Range;
    pub const VER_IHL: usize = 0;
    pub const TOTAL_LEN: Range<usize> = 2..4;
    pub const FLAGS_FRAG: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
}

/// A view of an IPv4 packet in a buffer.
///
/// `new_checked` guarantees the version is 4, the header length is sane and the buffer holds at
/// least `total_len` bytes, so accessors never go out of bounds. Bytes after `total_len` (padding
/// from a lower layer) are ignored by [`Ipv4Packet::packet`].
#[derive(Debug, Clone, Copy)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wrap without checks; only for buffers this crate has just emitted.
    pub fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let packet = Ipv4Packet { buffer };
        packet.check()?;
        Ok(packet)
    }

    #[inline]
    fn check(&self) -> Result<(), WireError> {
        let data = self.buffer.as_ref();
        if data.len() < MIN_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if data[field::VER_IHL] >> 4 != 4 {
            return Err(WireError::BadVersion);
        }
        let header_len = self.header_len();
        let total_len = self.total_len();
        if header_len < MIN_HEADER_LEN || total_len < header_len {
            return Err(WireError::BadLength);
        }
        if data.len() < total_len {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    #[inline]
    pub fn total_len(&self) -> usize {
        usize::from(read_u16(self.buffer.as_ref(), field::TOTAL_LEN.start))
    }

    #[inline]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    pub fn header_checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM.start)
    }

    /// True for any fragment but the first: those carry no transport header.
    pub fn is_later_fragment(&self) -> bool {
        read_u16(self.buffer.as_ref(), field::FLAGS_FRAG.start) & 0x1fff != 0
    }

    /// The Don't Fragment flag: a packet too big for the path must be answered with ICMP
    /// "fragmentation needed", never cut up.
    pub fn dont_fragment(&self) -> bool {
        read_u16(self.buffer.as_ref(), field::FLAGS_FRAG.start) & 0x4000 != 0
    }

    #[inline]
    pub fn src_addr(&self) -> Ipv4Addr {
        read_addr(self.buffer.as_ref(), field::SRC.start)
    }

    #[inline]
    pub fn dst_addr(&self) -> Ipv4Addr {
        read_addr(self.buffer.as_ref(), field::DST.start)
    }

    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(self.header())) == 0xffff
    }

    pub fn header(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.header_len()]
    }

    /// The packet up to `total_len`, without lower-layer padding.
    #[inline]
    pub fn packet(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.total_len()]
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..self.total_len()]
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Decrement the TTL as a router does, patching the checksum incrementally (RFC 1624).
    /// Returns false, leaving the packet untouched, when the TTL would reach zero.
    #[inline]
    pub fn decrement_ttl(&mut self) -> bool {
        let ttl = self.ttl();
        if ttl <= 1 {
            return false;
        }
        let data = self.buffer.as_mut();
        let old_word = u16::from_be_bytes([ttl, data[field::PROTOCOL]]);
        data[field::TTL] = ttl - 1;
        let new_word = u16::from_be_bytes([ttl - 1, data[field::PROTOCOL]]);
        let old_sum = read_u16(data, field::CHECKSUM.start);
        let new_sum = checksum::update(old_sum, old_word, new_word);
        data[field::CHECKSUM].copy_from_slice(&new_sum.to_be_bytes());
        true
    }

    pub fn fill_checksum(&mut self) {
        let header_len = self.header_len();
        let data = self.buffer.as_mut();
        data[field::CHECKSUM].fill(0);
        let sum = !checksum::fold(checksum::sum(&data[..header_len]));
        data[field::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
    }
}

/// The fields of a plain 20-byte header (no options) to emit.
#[derive(Debug, Clone, Copy)]
pub struct Ipv4Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    pub ttl: u8,
    pub payload_len: usize,
}

impl Ipv4Repr {
    pub fn total_len(&self) -> usize {
        MIN_HEADER_LEN + self.payload_len
    }

    /// Write the header into `buf[..20]` with a valid checksum; `buf` must hold `total_len()`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let total = u16::try_from(self.total_len()).map_err(|_| WireError::BadLength)?;
        if buf.len() < self.total_len() {
            return Err(WireError::Truncated);
        }
        let header = &mut buf[..MIN_HEADER_LEN];
        header.fill(0);
        header[field::VER_IHL] = 0x45;
        header[field::TOTAL_LEN].copy_from_slice(&total.to_be_bytes());
        header[field::TTL] = self.ttl;
        header[field::PROTOCOL] = self.protocol;
        header[field::SRC].copy_from_slice(&self.src.octets());
        header[field::DST].copy_from_slice(&self.dst.octets());
        Ipv4Packet::new_unchecked(header).fill_checksum();
        Ok(())
    }
}

fn read_u16(data: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([data[at], data[at + 1]])
}

fn read_addr(data: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(data[at], data[at + 1], data[at + 2], data[at + 3])
}

/// A UDP packet 10.5.1.2 -> 10.5.2.2 with a valid header and `payload_len` bytes of `fill`, for
/// the wire modules' tests.
#[cfg(test)]
pub(crate) fn test_packet(payload_len: usize, ttl: u8, fill: u8) -> Vec<u8> {
    let repr = Ipv4Repr {
        src: Ipv4Addr::new(10, 5, 1, 2),
        dst: Ipv4Addr::new(10, 5, 2, 2),
        protocol: PROTO_UDP,
        ttl,
        payload_len,
    };
    let mut buf = vec![fill; repr.total_len()];
    repr.emit(&mut buf).unwrap();
    buf
}

/// A TCP segment 10.5.1.2:5001 -> 10.5.2.2:80 carrying `payload`, with valid checksums.
#[cfg(test)]
pub(crate) fn test_tcp_segment(seq: u32, payload: &[u8], flags: u8) -> Vec<u8> {
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&5001u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[4..8].copy_from_slice(&seq.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&512u16.to_be_bytes());
    test_transport_packet(PROTO_TCP, &tcp, payload, 16)
}

/// A UDP datagram 10.5.1.2:`src_port` -> 10.5.2.2:53 carrying `payload`, with valid checksums.
#[cfg(test)]
pub(crate) fn test_udp_datagram(src_port: u16, payload: &[u8]) -> Vec<u8> {
    let mut udp = [0u8; 8];
    udp[0..2].copy_from_slice(&src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&53u16.to_be_bytes());
    udp[4..6].copy_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    test_transport_packet(PROTO_UDP, &udp, payload, 6)
}

/// 10.5.1.2 -> 10.5.2.2: `header` then `payload`, the checksum at `checksum_at` in the
/// transport header filled in.
#[cfg(test)]
fn test_transport_packet(
    protocol: u8,
    header: &[u8],
    payload: &[u8],
    checksum_at: usize,
) -> Vec<u8> {
    use super::checksum;
    let repr = Ipv4Repr {
        src: Ipv4Addr::new(10, 5, 1, 2),
        dst: Ipv4Addr::new(10, 5, 2, 2),
        protocol,
        ttl: 62,
        payload_len: header.len() + payload.len(),
    };
    let mut p = vec![0u8; repr.total_len()];
    repr.emit(&mut p).unwrap();
    p[20..20 + header.len()].copy_from_slice(header);
    p[20 + header.len()..].copy_from_slice(payload);
    let pseudo = checksum::sum(&p[12..20]) + u32::from(protocol) + repr.payload_len as u32;
    let sum = !checksum::fold(pseudo + checksum::sum(&p[20..]));
    p[20 + checksum_at..22 + checksum_at].copy_from_slice(&sum.to_be_bytes());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ttl: u8) -> Vec<u8> {
        test_packet(8, ttl, 0xaa)
    }

    #[test]
    fn emitted_header_parses_and_verifies() {
        let buf = sample(64);
        let packet = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert!(packet.verify_checksum());
        assert_eq!(packet.src_addr(), Ipv4Addr::new(10, 5, 1, 2));
        assert_eq!(packet.dst_addr(), Ipv4Addr::new(10, 5, 2, 2));
        assert_eq!(packet.total_len(), 28);
        assert_eq!(packet.payload(), &[0xaa; 8]);
    }

    #[test]
    fn incremental_ttl_update_matches_full_recompute() {
        for ttl in [2u8, 3, 64, 128, 255] {
            let mut buf = sample(ttl);
            let mut packet = Ipv4Packet::new_checked(&mut buf[..]).unwrap();
            assert!(packet.decrement_ttl());
            let incremental = packet.header_checksum();
            packet.fill_checksum();
            assert_eq!(incremental, packet.header_checksum(), "ttl {ttl}");
            assert_eq!(packet.ttl(), ttl - 1);
        }
    }

    #[test]
    fn ttl_one_is_not_forwarded() {
        let mut buf = sample(1);
        let mut packet = Ipv4Packet::new_checked(&mut buf[..]).unwrap();
        assert!(!packet.decrement_ttl());
        assert_eq!(packet.ttl(), 1);
    }

    #[test]
    fn malformed_headers_are_rejected() {
        let good = sample(64);
        assert_eq!(
            Ipv4Packet::new_checked(&good[..19]).unwrap_err(),
            WireError::Truncated
        );
        let mut v6 = good.clone();
        v6[0] = 0x65;
        assert_eq!(
            Ipv4Packet::new_checked(&v6[..]).unwrap_err(),
            WireError::BadVersion
        );
        let mut short_ihl = good.clone();
        short_ihl[0] = 0x44;
        assert_eq!(
            Ipv4Packet::new_checked(&short_ihl[..]).unwrap_err(),
            WireError::BadLength
        );
        let mut long_total = good.clone();
        long_total[2..4].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(
            Ipv4Packet::new_checked(&long_total[..]).unwrap_err(),
            WireError::Truncated
        );
        let mut total_below_header = good;
        total_below_header[2..4].copy_from_slice(&10u16.to_be_bytes());
        assert_eq!(
            Ipv4Packet::new_checked(&total_below_header[..]).unwrap_err(),
            WireError::BadLength
        );
    }
}
