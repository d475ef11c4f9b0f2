//! A batch datagram off the wire: a version 2 chunk must lie inside its super-packet; a version 1
//! datagram's records are walked and each decoded as the inner IPv4 or IPv6 packet the engine would forward.

#![no_main]

use libfuzzer_sys::fuzz_target;
use twill_dataplane::wire::batch::BatchPacket;
use twill_dataplane::wire::chunk::ChunkPacket;
use twill_dataplane::wire::ip::IpPacket;

fuzz_target!(|data: &[u8]| {
    if let Ok(chunk) = ChunkPacket::new_checked(data) {
        let repr = chunk.repr();
        let end = usize::from(repr.offset) + chunk.payload().len();
        assert!(!chunk.payload().is_empty() && end <= usize::from(repr.total));
    }
    let Ok(batch) = BatchPacket::new_checked(data) else {
        return;
    };
    let _ = (batch.sender(), batch.flags());
    let range = data.as_ptr_range();
    for record in batch.records() {
        let Ok(record) = record else {
            break;
        };
        assert!(range.start <= record.as_ptr() && record.as_ptr_range().end <= range.end);
        if let Ok(packet) = IpPacket::new_checked(record) {
            assert!(packet.total_len() <= record.len());
            let _ = (packet.src_addr(), packet.dst_addr(), packet.packet());
        }
    }
});
