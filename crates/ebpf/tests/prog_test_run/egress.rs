//! The egress cases: frames from the pod side, inner IPv4 and IPv6, that are carried to the
//! peer, dropped, or answered with an ICMP or ICMPv6 error.

use super::common::frames::{ethernet, Ip, Ip6, ETH_IP, ETH_IPV6};
use super::common::test_run::{HERE, HERE6, THERE6, UDP};
use super::{cases_of, inner, inner6, payload, Case, Expect};
use std::net::Ipv4Addr;
use twill_dataplane::stats::DropReason;
use twill_ebpf::Side;

/// A packet from here to a subnet no peer owns.
fn unrouted(protocol: u8) -> Ip {
    Ip::new(HERE, Ipv4Addr::new(10, 5, 9, 9), protocol)
}

const ICMP: u8 = 1;
const ICMPV6: u8 = 58;

pub(super) fn egress_cases() -> Vec<Case> {
    let packet = inner(false).packet(&payload());
    let len = packet.len() as u64;
    let with = |f: fn(&mut Ip)| {
        let mut ip = inner(false);
        f(&mut ip);
        ethernet(ETH_IP, &ip.packet(&payload()))
    };
    let mut wrong_version = packet.clone();
    wrong_version[0] = 0x65;
    let mut too_long = packet.clone();
    too_long[2..4].copy_from_slice(&(len as u16 + 10).to_be_bytes());
    let cases = [
        (
            "valid packet",
            ethernet(ETH_IP, &packet),
            Expect::Carried(len),
        ),
        (
            "IP options",
            with(|ip| ip.options = vec![1, 1, 1, 0]),
            Expect::Carried(len + 4),
        ),
        (
            "a fragment",
            with(|ip| ip.flags_fragment = 0x2000 | 10),
            Expect::Carried(len),
        ),
        (
            "no route",
            with(|ip| ip.dst = Ipv4Addr::new(10, 5, 9, 9)),
            Expect::Answered(DropReason::NoRoute),
        ),
        (
            "TTL 1",
            with(|ip| ip.ttl = 1),
            Expect::Answered(DropReason::TtlExceeded),
        ),
        // RFC 1122 3.2.2: no error about an error, or about a later fragment.
        (
            "no route, an ICMP error",
            ethernet(ETH_IP, &unrouted(ICMP).packet(&[3, 1, 0, 0, 0, 0, 0, 0])),
            Expect::Dropped(DropReason::NoRoute),
        ),
        (
            "no route, an ICMP echo",
            ethernet(ETH_IP, &unrouted(ICMP).packet(&[8, 0, 0, 0, 0, 0, 0, 1])),
            Expect::Answered(DropReason::NoRoute),
        ),
        (
            "no route, a later fragment",
            with(|ip| {
                ip.dst = Ipv4Addr::new(10, 5, 9, 9);
                ip.flags_fragment = 10;
            }),
            Expect::Dropped(DropReason::NoRoute),
        ),
        (
            "no route, a payload shorter than the 8 bytes quoted",
            ethernet(ETH_IP, &unrouted(UDP).packet(&[1, 2, 3])),
            Expect::Answered(DropReason::NoRoute),
        ),
        (
            "neither IPv4 nor IPv6",
            ethernet(0x0806, &[0; 28]),
            Expect::Dropped(DropReason::NotIpv4),
        ),
        (
            "version 6 in an IPv4 frame",
            ethernet(ETH_IP, &wrong_version),
            Expect::Dropped(DropReason::NotIpv4),
        ),
        (
            "truncated header",
            ethernet(ETH_IP, &packet[..12]),
            Expect::Refused,
        ),
        ("zero length", ethernet(ETH_IP, &[]), Expect::Refused),
        (
            "total length past the frame",
            ethernet(ETH_IP, &too_long),
            Expect::Dropped(DropReason::Malformed),
        ),
    ];
    cases_of(Side::Egress, cases)
}

/// An IPv6 packet from here to a subnet no peer owns.
fn unrouted6(next_header: u8) -> Ip6 {
    Ip6::new(HERE6, "fd10:0:0:9::9".parse().unwrap(), next_header)
}

pub(super) fn egress6_cases() -> Vec<Case> {
    let packet = inner6(false).packet(&payload());
    let len = packet.len() as u64;
    let with = |f: fn(&mut Ip6)| {
        let mut ip = inner6(false);
        f(&mut ip);
        ethernet(ETH_IPV6, &ip.packet(&payload()))
    };
    let mut wrong_version = packet.clone();
    wrong_version[0] = 0x45;
    let mut too_long = packet.clone();
    too_long[4..6].copy_from_slice(&(len as u16).to_be_bytes());
    let cases = [
        (
            "valid IPv6 packet",
            ethernet(ETH_IPV6, &packet),
            Expect::Carried(len),
        ),
        (
            "IPv6 no route",
            with(|ip| ip.dst = "fd10:0:0:9::9".parse().unwrap()),
            Expect::Answered(DropReason::NoRoute),
        ),
        (
            "IPv6 to another host of the peer's IPv6 subnet",
            with(|ip| ip.dst = "fd10:0:0:2:1::7".parse().unwrap()),
            Expect::Carried(len),
        ),
        (
            "hop limit 1",
            with(|ip| ip.hop_limit = 1),
            Expect::Answered(DropReason::TtlExceeded),
        ),
        (
            "hop limit 0",
            with(|ip| ip.hop_limit = 0),
            Expect::Answered(DropReason::TtlExceeded),
        ),
        // RFC 4443 2.4 (e): no error about an error; an informational message is answered.
        (
            "IPv6 no route, an ICMPv6 error",
            ethernet(
                ETH_IPV6,
                &unrouted6(ICMPV6).packet(&[1, 0, 0, 0, 0, 0, 0, 0]),
            ),
            Expect::Dropped(DropReason::NoRoute),
        ),
        (
            "IPv6 no route, an ICMPv6 echo",
            ethernet(
                ETH_IPV6,
                &unrouted6(ICMPV6).packet(&[128, 0, 0, 0, 0, 0, 0, 1]),
            ),
            Expect::Answered(DropReason::NoRoute),
        ),
        // As much as fits in 1280 bytes is quoted: 1232 of these 1440.
        (
            "IPv6 no route, longer than the quote",
            ethernet(ETH_IPV6, &unrouted6(UDP).packet(&[0x5a; 1400])),
            Expect::Answered(DropReason::NoRoute),
        ),
        (
            "IPv6 no route, an odd length",
            ethernet(ETH_IPV6, &unrouted6(UDP).packet(&[0xa5; 77])),
            Expect::Answered(DropReason::NoRoute),
        ),
        (
            "a jumbogram",
            ethernet(ETH_IPV6, &Ip6::new(HERE6, THERE6, 0).packet(&[])),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "version 4 in an IPv6 frame",
            ethernet(ETH_IPV6, &wrong_version),
            Expect::Dropped(DropReason::NotIpv4),
        ),
        (
            "payload length past the frame",
            ethernet(ETH_IPV6, &too_long),
            Expect::Dropped(DropReason::Malformed),
        ),
    ];
    cases_of(Side::Egress, cases)
}
