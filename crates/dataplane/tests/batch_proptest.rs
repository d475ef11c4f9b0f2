//! Properties of the batch codec: what fits round-trips exactly, and no input, random or a
//! damaged valid datagram, makes the decoder panic or point outside the datagram.

use ipnet::Ipv4Net;
use proptest::prelude::*;
use std::net::Ipv4Addr;
use twill_dataplane::wire::batch::{BatchPacket, BatchWriter, HEADER_LEN, RECORD_PREFIX_LEN};
use twill_dataplane::wire::WireError;

fn sender() -> impl Strategy<Value = Ipv4Net> {
    (any::<u32>(), 0u8..=32).prop_map(|(addr, len)| {
        Ipv4Net::new(Ipv4Addr::from(addr), len)
            .expect("prefix length in range")
            .trunc()
    })
}

fn packets() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..600), 0..12)
}

/// Push every packet, checking each answer against the size rule; return the accepted ones.
fn emit(buf: &mut [u8], sender: Ipv4Net, packets: &[Vec<u8>]) -> (usize, Vec<Vec<u8>>) {
    let capacity = buf.len();
    let mut writer = BatchWriter::new(buf, sender);
    let mut accepted = Vec::new();
    for packet in packets {
        let fits = writer.len() + RECORD_PREFIX_LEN + packet.len() <= capacity;
        let before = (writer.len(), writer.count());
        assert_eq!(
            writer.push(packet),
            fits,
            "len {} at {}",
            packet.len(),
            before.0
        );
        if fits {
            accepted.push(packet.clone());
        } else {
            assert_eq!((writer.len(), writer.count()), before);
        }
    }
    assert_eq!(writer.count(), accepted.len());
    assert_eq!(writer.is_empty(), accepted.is_empty());
    (writer.finish(), accepted)
}

/// Decode everything the decoder is willing to yield, checking the framing invariants on the way:
/// every record lies inside the datagram, records are back to back, and an error ends the stream.
fn decode(wire: &[u8]) -> Result<(Vec<Vec<u8>>, Option<WireError>), WireError> {
    let batch = BatchPacket::new_checked(wire)?;
    let sender = batch.sender();
    assert_eq!(sender, sender.trunc());
    let mut records = batch.records();
    let mut offset = HEADER_LEN;
    let mut out = Vec::new();
    for item in records.by_ref() {
        match item {
            Ok(record) => {
                let start = record.as_ptr() as usize - wire.as_ptr() as usize;
                assert_eq!(start, offset + RECORD_PREFIX_LEN);
                assert!(start + record.len() <= wire.len());
                offset = start + record.len();
                out.push(record.to_vec());
            }
            Err(err) => {
                assert_eq!(err, WireError::Truncated);
                assert!(records.next().is_none());
                return Ok((out, Some(err)));
            }
        }
    }
    assert_eq!(offset, wire.len(), "a clean end consumes every byte");
    Ok((out, None))
}

fn valid_datagram(sender: Ipv4Net, packets: &[Vec<u8>]) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut buf = vec![0; 4096];
    let (len, accepted) = emit(&mut buf, sender, packets);
    buf.truncate(len);
    (buf, accepted)
}

proptest! {
    #[test]
    fn what_fits_round_trips_in_order(
        sender in sender(),
        packets in packets(),
        capacity in HEADER_LEN..2000,
    ) {
        let mut buf = vec![0; capacity];
        let (len, accepted) = emit(&mut buf, sender, &packets);
        let wire = &buf[..len];
        prop_assert_eq!(BatchPacket::new_checked(wire).unwrap().sender(), sender);
        prop_assert_eq!(decode(wire), Ok((accepted, None)));
    }

    #[test]
    fn arbitrary_bytes_never_escape(bytes in prop::collection::vec(any::<u8>(), 0..2000)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn arbitrary_records_after_a_valid_header_never_escape(
        sender in sender(),
        tail in prop::collection::vec(any::<u8>(), 0..2000),
    ) {
        let (mut wire, _) = valid_datagram(sender, &[]);
        wire.extend_from_slice(&tail);
        prop_assert!(decode(&wire).is_ok());
    }

    #[test]
    fn damaged_datagrams_never_escape(
        sender in sender(),
        packets in packets(),
        writes in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let (mut wire, _) = valid_datagram(sender, &packets);
        for (at, byte) in writes {
            let at = at.index(wire.len());
            wire[at] = byte;
        }
        wire.truncate(cut.index(wire.len() + 1));
        let _ = decode(&wire);
    }

    #[test]
    fn truncation_keeps_exactly_the_whole_records(
        sender in sender(),
        packets in packets(),
        cut in any::<prop::sample::Index>(),
    ) {
        let (wire, accepted) = valid_datagram(sender, &packets);
        let cut = HEADER_LEN + cut.index(wire.len() - HEADER_LEN + 1);
        let ends: Vec<usize> = accepted
            .iter()
            .scan(HEADER_LEN, |end, p| {
                *end += RECORD_PREFIX_LEN + p.len();
                Some(*end)
            })
            .collect();
        let whole = accepted[..ends.iter().take_while(|&&end| end <= cut).count()].to_vec();
        let on_boundary = cut == HEADER_LEN || ends.contains(&cut);
        let expected_err = (!on_boundary).then_some(WireError::Truncated);
        prop_assert_eq!(decode(&wire[..cut]), Ok((whole, expected_err)));
    }
}
