//! A flannel udp datagram off the wire: decap it, then do to the inner packet everything the
//! udp engine does (read the header, forward with TTL - 1, or answer with each ICMP error).

#![no_main]

use libfuzzer_sys::fuzz_target;
use twill_dataplane::wire::flannel;
use twill_dataplane::wire::icmp::{self, IcmpError, MAX_ERROR_LEN};
use std::net::Ipv4Addr;
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
    let errors = [
        IcmpError::NetUnreachable,
        IcmpError::TimeExceeded,
        IcmpError::FragmentationNeeded { mtu: 1272 },
    ];
    for error in errors {
        let mut reply = [0u8; MAX_ERROR_LEN];
        let own = Ipv4Addr::new(10, 5, 1, 0);
        if let Ok(Some(len)) = icmp::reply(&packet, error, own, &mut reply) {
            let reply = Ipv4Packet::new_checked(&reply[..len]).expect("a reply we emitted");
            assert!(reply.verify_checksum());
        }
    }
});
