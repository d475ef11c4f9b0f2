//! IPv6 header view: checked once, then read and patched in place. IPv6 has no header
//! checksum, so a router's hop-limit decrement is a one-byte write.

use super::WireError;
use std::net::Ipv6Addr;

pub const HEADER_LEN: usize = 40;
pub const NEXT_HEADER_TCP: u8 = 6;
pub const NEXT_HEADER_UDP: u8 = 17;
pub const NEXT_HEADER_ICMPV6: u8 = 58;

mod field {
    use std::ops::Range;
    pub const VER_TC: usize = 0;
    pub const PAYLOAD_LEN: Range<usize> = 4..6;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: Range<usize> = 8..24;
    pub const DST: Range<usize> = 24..40;
}

/// A view of an IPv6 packet in a buffer.
///
/// `new_checked` guarantees the version is 6 and the buffer holds the 40-byte header and the
/// payload its length field names, so accessors never go out of bounds. A jumbogram (payload
/// length 0 with a hop-by-hop jumbo option) is refused: no link twill runs on carries one.
/// Bytes after the payload (padding from a lower layer) are ignored by [`Ipv6Packet::packet`].
#[derive(Debug, Clone, Copy)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Wrap without checks; only for buffers this crate has just emitted.
    pub fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
    }

    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let packet = Ipv6Packet { buffer };
        packet.check()?;
        Ok(packet)
    }

    #[inline]
    fn check(&self) -> Result<(), WireError> {
        let data = self.buffer.as_ref();
        if data.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if data[field::VER_TC] >> 4 != 6 {
            return Err(WireError::BadVersion);
        }
        if self.payload_len() == 0 && self.next_header() == 0 {
            return Err(WireError::BadLength); // a jumbogram
        }
        if data.len() < self.total_len() {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    #[inline]
    pub fn payload_len(&self) -> usize {
        let data = self.buffer.as_ref();
        usize::from(u16::from_be_bytes([
            data[field::PAYLOAD_LEN.start],
            data[field::PAYLOAD_LEN.start + 1],
        ]))
    }

    /// Header and payload: what an IPv4 header's total length says.
    #[inline]
    pub fn total_len(&self) -> usize {
        HEADER_LEN + self.payload_len()
    }

    #[inline]
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NEXT_HEADER]
    }

    #[inline]
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    #[inline]
    pub fn src_addr(&self) -> Ipv6Addr {
        read_addr(self.buffer.as_ref(), field::SRC.start)
    }

    #[inline]
    pub fn dst_addr(&self) -> Ipv6Addr {
        read_addr(self.buffer.as_ref(), field::DST.start)
    }

    /// The packet up to its payload length, without lower-layer padding.
    #[inline]
    pub fn packet(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.total_len()]
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.total_len()]
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    /// Decrement the hop limit as a router does. Returns false, leaving the packet untouched,
    /// when it would reach zero.
    #[inline]
    pub fn decrement_hop_limit(&mut self) -> bool {
        let hops = self.hop_limit();
        if hops <= 1 {
            return false;
        }
        self.buffer.as_mut()[field::HOP_LIMIT] = hops - 1;
        true
    }
}

/// The fields of a plain 40-byte header (no extension headers, traffic class and flow label
/// 0) to emit.
#[derive(Debug, Clone, Copy)]
pub struct Ipv6Repr {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub next_header: u8,
    pub hop_limit: u8,
    pub payload_len: usize,
}

impl Ipv6Repr {
    pub fn total_len(&self) -> usize {
        HEADER_LEN + self.payload_len
    }

    /// Write the header into `buf[..40]`; `buf` must hold `total_len()`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let payload_len = u16::try_from(self.payload_len).map_err(|_| WireError::BadLength)?;
        if buf.len() < self.total_len() {
            return Err(WireError::Truncated);
        }
        let header = &mut buf[..HEADER_LEN];
        header.fill(0);
        header[field::VER_TC] = 0x60;
        header[field::PAYLOAD_LEN].copy_from_slice(&payload_len.to_be_bytes());
        header[field::NEXT_HEADER] = self.next_header;
        header[field::HOP_LIMIT] = self.hop_limit;
        header[field::SRC].copy_from_slice(&self.src.octets());
        header[field::DST].copy_from_slice(&self.dst.octets());
        Ok(())
    }

    /// The unfolded sum of the pseudo-header (RFC 8200 8.1) a transport checksum covers.
    pub fn pseudo_header_sum(&self) -> u32 {
        pseudo_header_sum(&self.src, &self.dst, self.next_header, self.payload_len)
    }
}

/// The unfolded sum of an IPv6 pseudo-header: addresses, upper-layer length, next header.
pub fn pseudo_header_sum(src: &Ipv6Addr, dst: &Ipv6Addr, next_header: u8, len: usize) -> u32 {
    use super::checksum::sum;
    sum(&src.octets()) + sum(&dst.octets()) + u32::from(next_header) + len as u32
}

fn read_addr(data: &[u8], at: usize) -> Ipv6Addr {
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&data[at..at + 16]);
    Ipv6Addr::from(octets)
}

/// A UDP datagram fd10:0:0:1::2 -> fd10:0:0:2::2 with `payload_len` bytes of `fill` after an
/// 8-byte header, for the wire and engine tests.
#[cfg(test)]
pub(crate) fn test_packet(payload_len: usize, hop_limit: u8, fill: u8) -> Vec<u8> {
    let repr = Ipv6Repr {
        src: "fd10:0:0:1::2".parse().unwrap(),
        dst: "fd10:0:0:2::2".parse().unwrap(),
        next_header: NEXT_HEADER_UDP,
        hop_limit,
        payload_len,
    };
    let mut buf = vec![fill; repr.total_len()];
    repr.emit(&mut buf).unwrap();
    buf
}

/// A TCP segment fd10:0:0:1::2:5001 -> fd10:0:0:2::2:80 carrying `payload`, checksum valid.
#[cfg(test)]
pub(crate) fn test_tcp_segment6(seq: u32, payload: &[u8], flags: u8) -> Vec<u8> {
    use super::checksum;
    let repr = Ipv6Repr {
        src: "fd10:0:0:1::2".parse().unwrap(),
        dst: "fd10:0:0:2::2".parse().unwrap(),
        next_header: NEXT_HEADER_TCP,
        hop_limit: 62,
        payload_len: 20 + payload.len(),
    };
    let mut p = vec![0u8; repr.total_len()];
    repr.emit(&mut p).unwrap();
    let tcp = &mut p[HEADER_LEN..];
    tcp[0..2].copy_from_slice(&5001u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[4..8].copy_from_slice(&seq.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&512u16.to_be_bytes());
    tcp[20..].copy_from_slice(payload);
    let sum = !checksum::fold(repr.pseudo_header_sum() + checksum::sum(tcp));
    tcp[16..18].copy_from_slice(&sum.to_be_bytes());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emitted_header_parses() {
        let buf = test_packet(8, 64, 0xaa);
        let packet = Ipv6Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(
            packet.src_addr(),
            "fd10:0:0:1::2".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            packet.dst_addr(),
            "fd10:0:0:2::2".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!((packet.total_len(), packet.next_header()), (48, 17));
        assert_eq!(packet.payload(), &[0xaa; 8]);
    }

    #[test]
    fn hop_limit_one_is_not_forwarded() {
        let mut buf = test_packet(8, 2, 0);
        let mut packet = Ipv6Packet::new_checked(&mut buf[..]).unwrap();
        assert!(packet.decrement_hop_limit());
        assert_eq!(packet.hop_limit(), 1);
        assert!(!packet.decrement_hop_limit());
        assert_eq!(packet.hop_limit(), 1);
    }

    #[test]
    fn malformed_headers_are_rejected() {
        let good = test_packet(8, 64, 0);
        let err = |b: &[u8]| Ipv6Packet::new_checked(b).unwrap_err();
        assert_eq!(err(&good[..39]), WireError::Truncated);
        assert_eq!(err(&good[..47]), WireError::Truncated);
        let mut v4 = good.clone();
        v4[0] = 0x45;
        assert_eq!(err(&v4), WireError::BadVersion);
        let mut jumbo = good;
        jumbo[4..7].fill(0);
        assert_eq!(err(&jumbo), WireError::BadLength);
    }

    #[test]
    fn padding_after_the_payload_is_not_the_packet() {
        let mut buf = test_packet(8, 64, 1);
        buf.extend_from_slice(&[0; 6]);
        let packet = Ipv6Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(packet.packet().len(), 48);
    }
}
