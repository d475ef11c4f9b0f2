//! A flannel udp datagram off the wire: decap it, then do to the inner packet everything the
//! udp engine does (read the header, forward with TTL - 1, or answer net-unreachable).

#![no_main]

use libfuzzer_sys::fuzz_target;
use twill_dataplane::wire::flannel;
use twill_dataplane::wire::icmp::{self, MAX_UNREACHABLE_LEN};
use twill_dataplane::wire::ipv4::Ipv4Packet;

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = flannel::decap(data) else {
        return;
    };
    let _ = (packet.src_addr(), packet.dst_addr(), packet.protocol());
    let _ = (packet.header(), packet.payload(), packet.verify_checksum());
    let mut copy = packet.packet().to_vec();
    let mut forwarded = Ipv4Packet::new_checked(&mut copy[..]).expect("decap checked it");
    if forwarded.decrement_ttl() {
        assert!(!packet.verify_checksum() || forwarded.verify_checksum());
    }
    let mut reply = [0u8; MAX_UNREACHABLE_LEN];
    if let Ok(Some(len)) = icmp::net_unreachable(&packet, &mut reply) {
        let reply = Ipv4Packet::new_checked(&reply[..len]).expect("a reply we emitted");
        assert!(reply.verify_checksum());
    }
});
