//! A flannel udp datagram off the wire: decap it, then do to the inner packet, IPv4 or IPv6,
//! everything the udp engine does (read the header, forward with TTL or hop limit - 1, or
//! answer with each ICMP or ICMPv6 error).

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::{Ipv4Addr, Ipv6Addr};
use twill_dataplane::wire::icmp::{self, IcmpError};
use twill_dataplane::wire::icmpv6::{self, Icmpv6Error};
use twill_dataplane::wire::ip::IpPacket;
use twill_dataplane::wire::ipv4::Ipv4Packet;
use twill_dataplane::wire::ipv6::{self, Ipv6Packet};
use twill_dataplane::wire::{checksum, flannel};

fuzz_target!(|data: &[u8]| {
    match flannel::decap(data) {
        Ok(IpPacket::V4(packet)) => ipv4(&packet),
        Ok(IpPacket::V6(packet)) => ipv6(&packet),
        Err(_) => {}
    }
});

fn ipv4(packet: &Ipv4Packet<&[u8]>) {
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
        let mut reply = [0u8; icmp::MAX_ERROR_LEN];
        let own = Ipv4Addr::new(10, 5, 1, 0);
        if let Ok(Some(len)) = icmp::reply(packet, error, own, &mut reply) {
            let reply = Ipv4Packet::new_checked(&reply[..len]).expect("a reply we emitted");
            assert!(reply.verify_checksum());
        }
    }
}

fn ipv6(packet: &Ipv6Packet<&[u8]>) {
    let _ = (packet.src_addr(), packet.dst_addr(), packet.next_header());
    let mut copy = packet.packet().to_vec();
    let mut forwarded = Ipv6Packet::new_checked(&mut copy[..]).expect("decap checked it");
    let hops = packet.hop_limit();
    assert_eq!(forwarded.decrement_hop_limit(), hops > 1);
    let errors = [
        Icmpv6Error::NoRoute,
        Icmpv6Error::HopLimitExceeded,
        Icmpv6Error::PacketTooBig { mtu: 1280 },
    ];
    for error in errors {
        let mut reply = [0u8; icmpv6::MAX_ERROR_LEN];
        let own = Ipv6Addr::new(0xfd10, 0, 0, 1, 0, 0, 0, 0);
        if let Ok(Some(len)) = icmpv6::reply(packet, error, own, &mut reply) {
            let reply = Ipv6Packet::new_checked(&reply[..len]).expect("a reply we emitted");
            let pseudo = ipv6::pseudo_header_sum(
                &reply.src_addr(),
                &reply.dst_addr(),
                reply.next_header(),
                reply.payload_len(),
            );
            assert_eq!(checksum::fold(pseudo + checksum::sum(reply.payload())), 0xffff);
        }
    }
}
