//! twill's batch format: several inner IP packets in one UDP datagram, each behind a u16 length.
//! The byte layout and the receiver's rules are specified in docs/batch-protocol.md.
//!
//! This layer only frames: it finds the records and proves they lie inside the datagram. Whether
//! a record is one well-formed IPv4 or IPv6 packet is checked per record, with the same rule as a flannel
//! udp datagram ([`super::flannel::decap`]), so one bad packet never costs its neighbours.

use super::batch_header::{check_header, emit_header, field, parse_sender, RECORD_VERSION};
use super::WireError;
use ipnet::Ipv4Net;
use std::iter::FusedIterator;

// The header every version shares lives below this module and `chunk`, in `batch_header`; its
// public pieces are named here too, where users of the format find them.
pub use super::batch_header::{version, HEADER_LEN, HIGHEST_VERSION, MAGIC};

pub const DEFAULT_PORT: u16 = 8286;
/// The version of record datagrams.
pub const VERSION: u8 = RECORD_VERSION;
pub const RECORD_PREFIX_LEN: usize = 2;

/// Bytes the underlay and this format add around a packet sent alone (outer IPv4 + UDP + header +
/// length prefix), hence MTU = iface - 42: any packet the TUN accepts fits in one datagram.
pub const OVERHEAD: usize = 20 + 8 + HEADER_LEN + RECORD_PREFIX_LEN;

/// A view of a batch datagram (the UDP payload).
///
/// `new_checked` guarantees the magic and version are twill's, the header is whole and the sender
/// subnet is a valid network, so the header accessors never fail. Records are checked lazily, one
/// at a time, by [`BatchPacket::records`].
#[derive(Debug, Clone, Copy)]
pub struct BatchPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BatchPacket<T> {
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let packet = BatchPacket { buffer };
        packet.check()?;
        Ok(packet)
    }

    fn check(&self) -> Result<(), WireError> {
        check_header(self.buffer.as_ref(), VERSION)
    }

    /// The sender's lease subnet, to be compared with the lease of the peer it came from.
    pub fn sender(&self) -> Ipv4Net {
        parse_sender(self.buffer.as_ref()).expect("sender validated by new_checked")
    }

    /// Reserved: senders write 0 and receivers ignore bits they do not know.
    pub fn flags(&self) -> u16 {
        let data = self.buffer.as_ref();
        u16::from_be_bytes([data[field::FLAGS.start], data[field::FLAGS.start + 1]])
    }

    pub fn records(&self) -> Records<'_> {
        Records {
            rest: &self.buffer.as_ref()[HEADER_LEN..],
        }
    }
}

/// The records of a datagram in order. Yields `Err(Truncated)` once if the datagram ends inside a
/// record (its prefix or its body), then stops: after a broken length nothing later can be found.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<&'a [u8], WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let split = split_record(self.rest);
        self.rest = split.map_or(&[], |(_, rest)| rest);
        Some(split.map(|(record, _)| record))
    }
}

impl FusedIterator for Records<'_> {}

fn split_record(data: &[u8]) -> Result<(&[u8], &[u8]), WireError> {
    let (prefix, rest) = data
        .split_first_chunk::<RECORD_PREFIX_LEN>()
        .ok_or(WireError::Truncated)?;
    rest.split_at_checked(usize::from(u16::from_be_bytes(*prefix)))
        .ok_or(WireError::Truncated)
}

/// Packs packets into one datagram payload; the buffer's length is the capacity (PMTU - 28).
#[derive(Debug)]
pub struct BatchWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
    count: usize,
}

impl<'a> BatchWriter<'a> {
    /// Write the header for `sender` (its network address, host bits cleared).
    ///
    /// Panics if `buf` is shorter than [`HEADER_LEN`]: a capacity that small is a caller bug.
    pub fn new(buf: &'a mut [u8], sender: Ipv4Net) -> Self {
        emit_header(buf, VERSION, sender);
        BatchWriter {
            buf,
            len: HEADER_LEN,
            count: 0,
        }
    }

    /// Append `packet` as one record. Returns false, writing nothing, if it does not fit in
    /// the remaining capacity or is longer than a u16 length can say.
    pub fn push(&mut self, packet: &[u8]) -> bool {
        let Ok(prefix) = u16::try_from(packet.len()) else {
            return false;
        };
        let end = self.len + RECORD_PREFIX_LEN + packet.len();
        let Some(record) = self.buf.get_mut(self.len..end) else {
            return false;
        };
        let (prefix_field, body) = record.split_at_mut(RECORD_PREFIX_LEN);
        prefix_field.copy_from_slice(&prefix.to_be_bytes());
        body.copy_from_slice(packet);
        self.len = end;
        self.count += 1;
        true
    }

    /// Bytes written so far, header included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Records written so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// True while no record has been written (the header alone is not worth sending).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The datagram payload is `buf[..finish()]`.
    pub fn finish(self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::flannel;
    use crate::wire::ip::IpPacket;
    use crate::wire::ipv4::test_packet;

    fn sender() -> Ipv4Net {
        "10.5.1.0/24".parse().unwrap()
    }

    fn inner(payload_len: usize) -> Vec<u8> {
        test_packet(payload_len, 64, payload_len as u8)
    }

    fn datagram(packets: &[&[u8]]) -> Vec<u8> {
        let mut buf = vec![0; 1472];
        let mut writer = BatchWriter::new(&mut buf, sender());
        for packet in packets {
            assert!(writer.push(packet));
        }
        let len = writer.finish();
        buf.truncate(len);
        buf
    }

    fn records(wire: &[u8]) -> Vec<Result<Vec<u8>, WireError>> {
        let batch = BatchPacket::new_checked(wire).unwrap();
        batch.records().map(|r| r.map(<[u8]>::to_vec)).collect()
    }

    #[test]
    fn round_trip_keeps_order_and_sender() {
        let (a, b) = (inner(10), inner(300));
        let wire = datagram(&[&a, &b]);
        assert_eq!(
            wire.len(),
            HEADER_LEN + 2 * RECORD_PREFIX_LEN + a.len() + b.len()
        );
        let batch = BatchPacket::new_checked(&wire[..]).unwrap();
        assert_eq!(batch.sender(), sender());
        assert_eq!(batch.flags(), 0);
        assert_eq!(records(&wire), vec![Ok(a), Ok(b)]);
    }

    #[test]
    fn version_is_read_only_behind_the_magic() {
        assert_eq!(version(&datagram(&[])), Some(VERSION));
        assert_eq!(version(&inner(10)), None, "a bare IPv4 packet");
        assert_eq!(version(b"TWLB"), None, "no version byte");
        assert_eq!(version(b"TWLX\x02"), None);
    }

    #[test]
    fn header_only_datagram_has_no_records() {
        assert!(records(&datagram(&[])).is_empty());
    }

    #[test]
    fn writer_clears_host_bits() {
        let mut buf = [0; HEADER_LEN];
        let writer = BatchWriter::new(&mut buf, "10.5.1.7/24".parse().unwrap());
        assert_eq!(writer.finish(), HEADER_LEN);
        assert_eq!(
            BatchPacket::new_checked(&buf[..]).unwrap().sender(),
            sender()
        );
    }

    #[test]
    fn short_header_is_truncated() {
        let wire = datagram(&[]);
        for len in [0, 4, 5, HEADER_LEN - 1] {
            let err = BatchPacket::new_checked(&wire[..len]).unwrap_err();
            assert_eq!(err, WireError::Truncated, "len {len}");
        }
    }

    #[test]
    fn flannel_packet_is_a_bad_magic() {
        let wire = inner(40);
        let err = BatchPacket::new_checked(&wire[..]).unwrap_err();
        assert_eq!(err, WireError::BadMagic);
    }

    #[test]
    fn other_version_is_unsupported_even_when_short() {
        let mut wire = datagram(&[&inner(10)]);
        wire[field::VERSION] = 2;
        for len in [field::VERSION + 1, wire.len()] {
            let err = BatchPacket::new_checked(&wire[..len]).unwrap_err();
            assert_eq!(err, WireError::UnsupportedVersion);
        }
    }

    #[test]
    fn invalid_sender_is_rejected() {
        let mut long_prefix = datagram(&[]);
        long_prefix[field::PREFIX_LEN] = 33;
        let mut host_bits = datagram(&[]);
        host_bits[field::SUBNET.end - 1] = 1;
        for wire in [long_prefix, host_bits] {
            let err = BatchPacket::new_checked(&wire[..]).unwrap_err();
            assert_eq!(err, WireError::BadSender);
        }
    }

    #[test]
    fn unknown_flags_are_ignored() {
        let packet = inner(10);
        let mut wire = datagram(&[&packet]);
        wire[field::FLAGS].copy_from_slice(&[0xff, 0xff]);
        assert_eq!(BatchPacket::new_checked(&wire[..]).unwrap().flags(), 0xffff);
        assert_eq!(records(&wire), vec![Ok(packet)]);
    }

    #[test]
    fn record_past_the_end_keeps_earlier_records() {
        let (a, b) = (inner(10), inner(20));
        let wire = datagram(&[&a, &b]);
        let cut = &wire[..wire.len() - 1];
        assert_eq!(records(cut), vec![Ok(a), Err(WireError::Truncated)]);
    }

    #[test]
    fn trailing_byte_is_a_truncated_prefix() {
        let a = inner(10);
        let mut wire = datagram(&[&a]);
        wire.push(0);
        assert_eq!(records(&wire), vec![Ok(a), Err(WireError::Truncated)]);
    }

    #[test]
    fn zero_length_record_is_framed_but_not_a_packet() {
        let a = inner(10);
        let wire = datagram(&[&[], &a]);
        assert_eq!(records(&wire), vec![Ok(vec![]), Ok(a)]);
        assert_eq!(flannel::decap(&[][..]).unwrap_err(), WireError::Truncated);
    }

    #[test]
    fn record_that_is_not_one_ip_packet_is_rejected_alone() {
        let good = inner(10);
        let mut padded = inner(10);
        padded.push(0);
        let version5 = [0x50; 40];
        let wire = datagram(&[&version5, &padded, &good]);
        let batch = BatchPacket::new_checked(&wire[..]).unwrap();
        let decoded: Vec<_> = batch
            .records()
            .map(|record| flannel::decap(record.unwrap()).map(IpPacket::into_inner))
            .collect();
        assert_eq!(
            decoded,
            vec![
                Err(WireError::BadVersion),
                Err(WireError::BadLength),
                Ok(&good[..])
            ]
        );
    }

    #[test]
    fn push_that_does_not_fit_writes_nothing() {
        let packet = inner(10);
        let capacity = HEADER_LEN + RECORD_PREFIX_LEN + packet.len();
        let mut buf = vec![0xee; capacity + 1];
        let mut writer = BatchWriter::new(&mut buf[..capacity], sender());
        assert!(writer.push(&packet));
        assert!(!writer.push(&[1]));
        assert_eq!((writer.count(), writer.len()), (1, capacity));
        assert_eq!(buf[capacity], 0xee);
    }

    #[test]
    fn packet_longer_than_u16_is_refused() {
        let mut buf = vec![0; 70_000];
        let mut writer = BatchWriter::new(&mut buf, sender());
        assert!(!writer.push(&[0; 65_536]));
        assert!(writer.is_empty());
        assert!(writer.push(&[0; 65_535]));
        assert!(!writer.is_empty());
    }
}
