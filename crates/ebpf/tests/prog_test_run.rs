//! The programs on crafted frames through BPF_PROG_TEST_RUN, with their real maps: each frame
//! gets the verdict expected, and the counters move by exactly what it should count (a drop
//! under its reason, or a packet to or from the peer). Every ingress frame goes through the
//! TC program and through the XDP one. Inner packets are IPv4 and IPv6, over the IPv4 underlay
//! and over the IPv6 one.

mod common;

use anyhow::Result;
use common::engine_model::answered_by_userspace;
use common::frames::{datagram, datagram6, ethernet, hex, udp, Ip, Ip6, ETH_IP, ETH_IPV6};
use common::test_run::{
    peer_subnet, peer_subnet6, test_bench, test_bench6, test_bench_limited, TestBench, HERE, HERE6,
    LOCAL, LOCAL6, PEER, PEER6, THERE, THERE6, UDP,
};
use common::{DEVICE_MTU, PORT};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4};
use std::time::{Duration, Instant};
use twill_dataplane::icmp_limit::IcmpLimit;
use twill_dataplane::stats::DropReason;
use twill_ebpf::{Counters, Side, Takes, TestOutput, Verdict};

const STRANGER: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 66);

/// What a frame should come to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Left to the stack, unchanged, nothing counted.
    Untouched,
    /// Dropped and counted under the reason.
    Dropped(DropReason),
    /// Refused by BPF_PROG_TEST_RUN itself (EINVAL): the kernel does not build an skb of an
    /// IPv4 frame shorter than an IPv4 header, so no such frame reaches the program (nor does
    /// the stack ever send one through a device).
    Refused,
    /// Encapsulated to the peer (egress) or decapsulated from it (ingress), counted as one
    /// packet of this many inner bytes.
    Carried(u64),
    /// Dropped and counted under the reason, and answered with the ICMP or ICMPv6 error the
    /// userspace engine answers it with, sent into the device (at XDP: passed on untouched,
    /// for twill_ingress to answer).
    Answered(DropReason),
}

struct Case {
    name: &'static str,
    side: Side,
    frame: Vec<u8>,
    expect: Expect,
}

/// `side`'s cases from (name, frame, expectation).
fn cases_of(
    side: Side,
    cases: impl IntoIterator<Item = (&'static str, Vec<u8>, Expect)>,
) -> Vec<Case> {
    cases
        .into_iter()
        .map(|(name, frame, expect)| Case {
            name,
            side,
            frame,
            expect,
        })
        .collect()
}

/// The inner packet HERE -> THERE (or back, for `from_peer`) with a small UDP payload.
fn inner(from_peer: bool) -> Ip {
    match from_peer {
        false => Ip::new(HERE, THERE, UDP),
        true => Ip::new(THERE, HERE, UDP),
    }
}

fn payload() -> Vec<u8> {
    udp(4000, 5000, b"twill table test")
}

/// A datagram from the peer to this node on flannel's port around `inner`.
fn from_peer(inner: &[u8]) -> Vec<u8> {
    datagram(&Ip::new(PEER, LOCAL, UDP), (PORT, PORT), inner)
}

/// A packet from here to a subnet no peer owns.
fn unrouted(protocol: u8) -> Ip {
    Ip::new(HERE, Ipv4Addr::new(10, 5, 9, 9), protocol)
}

const ICMP: u8 = 1;
const ICMPV6: u8 = 58;

fn egress_cases() -> Vec<Case> {
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

/// The inner IPv6 packet HERE6 -> THERE6 (or back, for `from_peer`).
fn inner6(from_peer: bool) -> Ip6 {
    match from_peer {
        false => Ip6::new(HERE6, THERE6, UDP),
        true => Ip6::new(THERE6, HERE6, UDP),
    }
}

/// An IPv6 packet from here to a subnet no peer owns.
fn unrouted6(next_header: u8) -> Ip6 {
    Ip6::new(HERE6, "fd10:0:0:9::9".parse().unwrap(), next_header)
}

fn egress6_cases() -> Vec<Case> {
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

fn ingress6_cases() -> Vec<Case> {
    let packet = inner6(true).packet(&payload());
    let len = packet.len() as u64;
    let with = |f: fn(&mut Ip6)| {
        let mut ip = inner6(true);
        f(&mut ip);
        from_peer(&ip.packet(&payload()))
    };
    let mut trailing = packet.clone();
    trailing.extend_from_slice(&[0; 4]);
    let big = inner6(true).packet(&vec![0u8; usize::from(DEVICE_MTU) - 39]);
    let cases = [
        (
            "valid IPv6 datagram",
            from_peer(&packet),
            Expect::Carried(len),
        ),
        (
            "IPv6 inner source outside the peer's IPv6 subnet",
            with(|ip| ip.src = "fd10:0:0:3::4".parse().unwrap()),
            Expect::Dropped(DropReason::SpoofedSource),
        ),
        (
            "IPv6 inner source another host of the peer's IPv6 subnet",
            with(|ip| ip.src = "fd10:0:0:2:1::4".parse().unwrap()),
            Expect::Carried(len),
        ),
        (
            "IPv6 inner source this node's",
            with(|ip| ip.src = HERE6),
            Expect::Dropped(DropReason::SpoofedSource),
        ),
        (
            "IPv6 hop limit 1",
            with(|ip| ip.hop_limit = 1),
            Expect::Answered(DropReason::TtlExceeded),
        ),
        (
            "IPv6 larger than the device MTU",
            from_peer(&big),
            Expect::Dropped(DropReason::TooBig),
        ),
        (
            "truncated IPv6 packet",
            from_peer(&packet[..packet.len() - 1]),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "IPv6 header cut short",
            from_peer(&packet[..30]),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "bytes after the IPv6 packet",
            from_peer(&trailing),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "inner jumbogram",
            from_peer(&Ip6::new(THERE6, HERE6, 0).packet(&[])),
            Expect::Dropped(DropReason::Malformed),
        ),
    ];
    cases_of(Side::Ingress, cases)
}

/// A datagram from the peer to this node over the IPv6 underlay around `inner`.
fn from_peer6(inner: &[u8]) -> Vec<u8> {
    datagram6(&Ip6::new(PEER6, LOCAL6, UDP), (PORT, PORT), inner)
}

/// A fragment from the peer to this node over the IPv6 underlay: a Fragment header right after
/// the IPv6 header (offset in 8-byte units, more to come or not, identification), then `rest`.
fn fragment6(offset: u16, more: bool, id: u32, rest: &[u8]) -> Vec<u8> {
    let mut fragment = vec![UDP, 0];
    fragment.extend_from_slice(&(offset << 3 | u16::from(more)).to_be_bytes());
    fragment.extend_from_slice(&id.to_be_bytes());
    fragment.extend_from_slice(rest);
    ethernet(ETH_IPV6, &Ip6::new(PEER6, LOCAL6, 44).packet(&fragment))
}

/// Over the IPv6 underlay: the inner checks of both families, as over the IPv4 one, and the
/// outer IPv6 header's own.
fn ingress_over6_cases() -> Vec<Case> {
    let packet = inner(true).packet(&payload());
    let packet6 = inner6(true).packet(&payload());
    let (len, len6) = (packet.len() as u64, packet6.len() as u64);
    let outer_with = |f: fn(&mut Ip6)| {
        let mut outer = Ip6::new(PEER6, LOCAL6, UDP);
        f(&mut outer);
        datagram6(&outer, (PORT, PORT), &packet)
    };
    let whole = from_peer6(&packet);
    let mut checksummed = whole.clone();
    checksummed[14 + 46..14 + 48].copy_from_slice(&[0x12, 0x34]);
    let mut udp_len_short = whole.clone();
    udp_len_short[14 + 44..14 + 46].copy_from_slice(&(8 + len as u16 - 1).to_be_bytes());
    let mut payload_len_past = whole.clone();
    payload_len_past[14 + 4..14 + 6].copy_from_slice(&(8 + len as u16 + 10).to_be_bytes());
    let with = |f: fn(&mut Ip)| {
        let mut ip = inner(true);
        f(&mut ip);
        from_peer6(&ip.packet(&payload()))
    };
    let with6 = |f: fn(&mut Ip6)| {
        let mut ip = inner6(true);
        f(&mut ip);
        from_peer6(&ip.packet(&payload()))
    };
    let big = inner(true).packet(&vec![0u8; usize::from(DEVICE_MTU)]);
    let short = inner(true).packet(&[]);
    // A first fragment's part: the UDP header and the inner packet's first 16 bytes.
    let datagram_head = udp(PORT, PORT, &packet)[..24].to_vec();
    let cases = [
        (
            "valid datagram, UDP checksum 0",
            whole.clone(),
            Expect::Carried(len),
        ),
        (
            "valid datagram, a UDP checksum",
            checksummed,
            Expect::Carried(len),
        ),
        (
            "valid IPv6 in IPv6",
            from_peer6(&packet6),
            Expect::Carried(len6),
        ),
        (
            "the shortest IPv4 inner packet, shorter than an IPv6 header",
            from_peer6(&short),
            Expect::Carried(short.len() as u64),
        ),
        (
            "spoofed inner source",
            with(|ip| ip.src = Ipv4Addr::new(10, 5, 3, 4)),
            Expect::Dropped(DropReason::SpoofedSource),
        ),
        (
            "IPv6 inner source outside the peer's IPv6 subnet",
            with6(|ip| ip.src = "fd10:0:0:3::4".parse().unwrap()),
            Expect::Dropped(DropReason::SpoofedSource),
        ),
        (
            "inner TTL 1",
            with(|ip| ip.ttl = 1),
            Expect::Answered(DropReason::TtlExceeded),
        ),
        (
            "IPv6 hop limit 1",
            with6(|ip| ip.hop_limit = 1),
            Expect::Answered(DropReason::TtlExceeded),
        ),
        (
            "larger than the device MTU",
            from_peer6(&big),
            Expect::Dropped(DropReason::TooBig),
        ),
        (
            "truncated inner packet",
            from_peer6(&packet[..packet.len() - 1]),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "zero length",
            from_peer6(&[]),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "UDP length not the payload's",
            udp_len_short,
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "payload length past the frame",
            payload_len_past,
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "unknown IPv6 peer",
            outer_with(|ip| ip.src = Ipv6Addr::new(0xfd00, 0x200, 0, 0, 0, 0, 0, 0x66)),
            Expect::Dropped(DropReason::UnknownPeer),
        ),
        (
            "peer's IPv6 address, other port",
            datagram6(&Ip6::new(PEER6, LOCAL6, UDP), (PORT + 1, PORT), &packet),
            Expect::Dropped(DropReason::UnknownPeer),
        ),
        (
            "from the peer's IPv4 address: known by its IPv6 one only",
            from_peer(&packet),
            Expect::Dropped(DropReason::UnknownPeer),
        ),
        (
            "not our port",
            datagram6(&Ip6::new(PEER6, LOCAL6, UDP), (PORT, 9999), &packet),
            Expect::Untouched,
        ),
        (
            "not our IPv6 address",
            outer_with(|ip| ip.dst = "fd00:200::9".parse().unwrap()),
            Expect::Untouched,
        ),
        (
            "an extension header first",
            outer_with(|ip| ip.next_header = 0),
            Expect::Untouched,
        ),
        (
            "first fragment to our port",
            fragment6(0, true, 7, &datagram_head),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "later fragment of that datagram",
            fragment6(3, false, 7, &packet[..24]),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "later fragment of a datagram not seen",
            fragment6(3, false, 8, &packet[..24]),
            Expect::Untouched,
        ),
        (
            "atomic fragment to our port (offset 0, no more)",
            fragment6(0, false, 9, &udp(PORT, PORT, &packet)),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "first fragment to another port",
            fragment6(0, true, 10, &udp(PORT, 9999, &packet)[..24]),
            Expect::Untouched,
        ),
        (
            "fragment of another protocol",
            {
                let mut frame = fragment6(0, true, 11, &datagram_head);
                frame[14 + 40] = 6;
                frame
            },
            Expect::Untouched,
        ),
        (
            "TCP to us",
            outer_with(|ip| ip.next_header = 6),
            Expect::Untouched,
        ),
        (
            "truncated outer headers",
            whole[..14 + 44].to_vec(),
            Expect::Untouched,
        ),
    ];
    cases_of(Side::Ingress, cases)
}

fn ingress_cases() -> Vec<Case> {
    let packet = inner(true).packet(&payload());
    let len = packet.len() as u64;
    let with = |f: fn(&mut Ip)| {
        let mut ip = inner(true);
        f(&mut ip);
        from_peer(&ip.packet(&payload()))
    };
    let outer_with = |f: fn(&mut Ip)| {
        let mut outer = Ip::new(PEER, LOCAL, UDP);
        f(&mut outer);
        datagram(&outer, (PORT, PORT), &packet)
    };
    let mut wrong_version = packet.clone();
    wrong_version[0] = 0x65;
    let mut trailing = packet.clone();
    trailing.extend_from_slice(&[0; 4]);
    let big = inner(true).packet(&vec![0u8; usize::from(DEVICE_MTU)]);
    let whole = from_peer(&packet);
    let cases = [
        ("valid datagram", whole.clone(), Expect::Carried(len)),
        (
            "inner IP options",
            with(|ip| ip.options = vec![1, 1, 1, 0]),
            Expect::Carried(len + 4),
        ),
        (
            "inner fragment",
            with(|ip| ip.flags_fragment = 0x2000 | 10),
            Expect::Carried(len),
        ),
        (
            "not our port",
            datagram(&Ip::new(PEER, LOCAL, UDP), (PORT, 9999), &packet),
            Expect::Untouched,
        ),
        (
            "not our address",
            outer_with(|ip| ip.dst = Ipv4Addr::new(10, 200, 0, 9)),
            Expect::Untouched,
        ),
        (
            "TCP to us",
            outer_with(|ip| ip.protocol = 6),
            Expect::Untouched,
        ),
        ("ARP", ethernet(0x0806, &[0; 28]), Expect::Untouched),
        (
            "truncated outer headers",
            whole[..14 + 24].to_vec(),
            Expect::Untouched,
        ),
        (
            "outer later fragment",
            outer_with(|ip| ip.flags_fragment = 100),
            Expect::Untouched,
        ),
        (
            "outer first fragment",
            outer_with(|ip| ip.flags_fragment = 0x2000),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "outer later fragment of that first fragment",
            outer_with(|ip| ip.flags_fragment = 100),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "outer later fragment of another datagram",
            outer_with(|ip| {
                ip.flags_fragment = 100;
                ip.id = 7;
            }),
            Expect::Untouched,
        ),
        (
            "outer IP options, to our port",
            outer_with(|ip| ip.options = vec![1, 1, 1, 0]),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "outer IP options, to another port",
            datagram(
                &Ip {
                    options: vec![1, 1, 1, 0],
                    ..Ip::new(PEER, LOCAL, UDP)
                },
                (PORT, 9999),
                &packet,
            ),
            Expect::Untouched,
        ),
        (
            "unknown peer",
            outer_with(|ip| ip.src = STRANGER),
            Expect::Dropped(DropReason::UnknownPeer),
        ),
        (
            "peer's address, other port",
            datagram(&Ip::new(PEER, LOCAL, UDP), (PORT + 1, PORT), &packet),
            Expect::Dropped(DropReason::UnknownPeer),
        ),
        (
            "spoofed inner source",
            with(|ip| ip.src = Ipv4Addr::new(10, 5, 3, 4)),
            Expect::Dropped(DropReason::SpoofedSource),
        ),
        (
            "zero length",
            from_peer(&[]),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "wrong inner version",
            from_peer(&wrong_version),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "truncated inner packet",
            from_peer(&packet[..packet.len() - 1]),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "bytes after the inner packet",
            from_peer(&trailing),
            Expect::Dropped(DropReason::Malformed),
        ),
        (
            "inner TTL 1",
            with(|ip| ip.ttl = 1),
            Expect::Answered(DropReason::TtlExceeded),
        ),
        (
            "larger than the device MTU",
            from_peer(&big),
            Expect::Dropped(DropReason::TooBig),
        ),
    ];
    cases_of(Side::Ingress, cases)
}

/// The frame a carried packet should leave as.
fn carried(case: &Case, via: Via, bench: &TestBench) -> Vec<u8> {
    let inner = forwarded_inner(case);
    let device_mac = bench.device_mac;
    match (case.side, via) {
        (Side::Egress, _) if bench.over_ipv6 => {
            datagram6(&Ip6::new(LOCAL6, PEER6, UDP), (PORT, PORT), &inner)
        }
        (Side::Egress, _) => {
            let mut outer = Ip::new(LOCAL, PEER, UDP);
            outer.flags_fragment = 0x4000;
            datagram(&outer, (PORT, PORT), &inner)
        }
        (Side::Ingress, Via::Tc | Via::Segmented) => {
            let mut frame = ethernet(ethertype_of(&inner), &inner);
            frame[..6].copy_from_slice(&device_mac);
            frame
        }
        // The mark for twill_ingress in the metadata (which BPF_PROG_TEST_RUN hands back
        // before the frame), then the outer Ethernet header as it came (twill_ingress
        // readdresses it at TC) but for the inner packet's ethertype.
        (Side::Ingress, Via::Xdp) => {
            let ethertype = ethertype_of(&inner).to_be_bytes();
            [&XDP_MARK[..], &case.frame[..12], &ethertype, &inner[..]].concat()
        }
        (Side::Segmented, _) => unreachable!("every case is an egress or an ingress one"),
    }
}

fn ethertype_of(packet: &[u8]) -> u16 {
    match packet[0] >> 4 {
        6 => ETH_IPV6,
        _ => ETH_IP,
    }
}

/// The inner packet of a carried frame, its TTL or hop limit decremented.
fn forwarded_inner(case: &Case) -> Vec<u8> {
    let mut inner = case.frame[14..].to_vec();
    if case.side == Side::Ingress {
        let outer6 = u16::from_be_bytes([case.frame[12], case.frame[13]]) == ETH_IPV6;
        inner.drain(..if outer6 { 48 } else { 28 });
    }
    if inner[0] >> 4 == 6 {
        inner[7] -= 1;
        return inner;
    }
    let header_len = usize::from(inner[0] & 0x0f) * 4;
    inner[8] -= 1;
    inner[10..12].fill(0);
    let sum = common::frames::checksum(&inner[..header_len]);
    inner[10..12].copy_from_slice(&sum.to_be_bytes());
    inner
}

/// What twill_xdp_ingress puts in the metadata of a frame it decapsulated (a u32, "twDp").
const XDP_MARK: [u8; 4] = 0x7477_4470u32.to_ne_bytes();

/// Which program an ingress frame goes through: the TC one, or the XDP one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Tc,
    Xdp,
    /// twill_segmented, at the segmenter's receiving end, in place of the case's TC program.
    Segmented,
}

/// Every egress and ingress case over the IPv4 underlay, of both inner families.
fn egress_and_ingress_cases() -> Vec<Case> {
    egress_cases()
        .into_iter()
        .chain(egress6_cases())
        .chain(ingress_cases())
        .chain(ingress6_cases())
        .collect()
}

#[test]
fn every_crafted_frame_gets_its_verdict_and_counter() -> Result<()> {
    let cases = egress_and_ingress_cases();
    run_cases(&test_bench("ebpf-table")?, &cases, Via::Tc)
}

/// The XDP program makes every check the TC ingress program makes, under the same reasons.
/// (Maps of its own: the fragments the TC run remembered would change the verdicts.)
#[test]
fn the_xdp_program_gives_every_ingress_frame_the_tc_programs_verdict() -> Result<()> {
    let cases: Vec<Case> = ingress_cases()
        .into_iter()
        .chain(ingress6_cases())
        .collect();
    run_cases(&test_bench("ebpf-tablex")?, &cases, Via::Xdp)
}

/// What comes back from the segmenter, a datagram of a train or a packet for a peer, is judged
/// there as twill_ingress and twill_egress judge it. (What is not ours goes to be sent there,
/// not to the stack: those ingress cases are left out.)
#[test]
fn the_segmented_program_gives_every_frame_its_tc_programs_verdict() -> Result<()> {
    let cases: Vec<Case> = egress_and_ingress_cases()
        .into_iter()
        .filter(|c| !(c.side == Side::Ingress && c.expect == Expect::Untouched))
        .collect();
    run_cases(&test_bench("ebpf-tables")?, &cases, Via::Segmented)
}

fn run_cases(bench: &TestBench, cases: &[Case], via: Via) -> Result<()> {
    let mut failures = Vec::new();
    for case in cases {
        let before = bench.dataplane.counters()?;
        let run = match via {
            Via::Tc => bench.dataplane.test_run(case.side, &case.frame),
            Via::Xdp => bench.dataplane.test_run_xdp(&case.frame),
            Via::Segmented => bench.dataplane.test_run(Side::Segmented, &case.frame),
        };
        // XDP needs no skb: a frame too short for one is looked at, and is not ours.
        let expect = match (via, case.expect) {
            (Via::Xdp, Expect::Refused | Expect::Answered(_)) => Expect::Untouched,
            (_, expect) => expect,
        };
        let output = match (run, expect) {
            (Err(_), Expect::Refused) => continue,
            (Ok(output), _) => output,
            (Err(e), _) => {
                failures.push(format!("{:?} {}: {e:#}", case.side, case.name));
                continue;
            }
        };
        let after = bench.dataplane.counters()?;
        let moved = Moved {
            before: &before,
            after: &after,
        };
        if let Err(why) = check(case, expect, via, &output, moved, bench) {
            failures.push(format!("{:?} {}: {why}", case.side, case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{via:?}: {} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    Ok(())
}

/// The counters before and after a case.
struct Moved<'a> {
    before: &'a Counters,
    after: &'a Counters,
}

fn check(
    case: &Case,
    expect: Expect,
    via: Via,
    output: &TestOutput,
    Moved { before, after }: Moved<'_>,
    bench: &TestBench,
) -> Result<(), String> {
    let (verdict, frame) = (&output.verdict, &output.frame);
    let carried_verdict = match via {
        Via::Tc | Via::Segmented => Verdict::Redirect,
        // Up the underlay's stack, where GRO and then twill_ingress take it.
        Via::Xdp => Verdict::Pass,
    };
    let (want_verdict, want_frame) = match expect {
        Expect::Untouched => (Verdict::Pass, Some(case.frame.clone())),
        Expect::Dropped(_) => (Verdict::Drop, None),
        Expect::Refused => return Err("BPF_PROG_TEST_RUN ran it".into()),
        Expect::Carried(_) => (carried_verdict, Some(carried(case, via, bench))),
        // The drop counter says why; the engine's rules say what the answer is.
        Expect::Answered(_) => {
            let answer = answered_by_userspace(bench.node(), case.side, &case.frame);
            (
                Verdict::Redirect,
                Some(answer.ok_or("the engine would not answer it")?),
            )
        }
    };
    if *verdict != want_verdict {
        return Err(format!("verdict {verdict:?}, expected {want_verdict:?}"));
    }
    if let Some(want) = want_frame {
        if *frame != want {
            return Err(format!(
                "frame\n  got  {}\n  want {}",
                hex(frame),
                hex(&want)
            ));
        }
    }
    for reason in DropReason::ALL {
        let moved = after.drop_count(reason) - before.drop_count(reason);
        let want =
            u64::from(expect == Expect::Dropped(reason) || expect == Expect::Answered(reason));
        if moved != want {
            return Err(format!(
                "{} moved by {moved}, expected {want}",
                reason.as_str()
            ));
        }
    }
    let peer = |c: &Counters| c.peers.get(&peer_subnet()).copied().unwrap_or_default();
    let (total, peer_before, peer_after) = match case.side {
        Side::Egress => ((before.tx, after.tx), peer(before).tx, peer(after).tx),
        Side::Ingress => ((before.rx, after.rx), peer(before).rx, peer(after).rx),
        Side::Segmented => unreachable!("every case is an egress or an ingress one"),
    };
    let want = match expect {
        Expect::Carried(bytes) => (1, bytes),
        _ => (0, 0),
    };
    let moved = (
        total.1.packets - total.0.packets,
        total.1.bytes - total.0.bytes,
    );
    let peer_moved = (
        peer_after.packets - peer_before.packets,
        peer_after.bytes - peer_before.bytes,
    );
    if moved != want || peer_moved != want {
        return Err(format!(
            "traffic moved {moved:?} (peer {peer_moved:?}), expected {want:?}"
        ));
    }
    Ok(())
}

/// Over the IPv6 underlay, egress sends both families in outer IPv6 to the peer's IPv6 address
/// (UDP checksum 0), and ingress takes only datagrams from the peer's IPv6 address, under the
/// same checks and counters; at TC and at XDP.
#[test]
fn over_the_ipv6_underlay_every_crafted_frame_gets_its_verdict_and_counter() -> Result<()> {
    let cases: Vec<Case> = egress_cases()
        .into_iter()
        .chain(egress6_cases())
        .chain(ingress_over6_cases())
        .collect();
    run_cases(&test_bench6("ebpf-table6")?, &cases, Via::Tc)?;
    run_cases(
        &test_bench6("ebpf-table6x")?,
        &ingress_over6_cases(),
        Via::Xdp,
    )
}

/// A peer whose IPv6 subnet is taken away (its lease lost it, or it never had one) sends no IPv6
/// of its own, and nothing is routed to its former IPv6 subnet; given back, both work again.
#[test]
fn a_peer_without_an_ipv6_subnet_gets_no_ipv6_either_way() -> Result<()> {
    let bench = test_bench("ebpf-no6")?;
    let endpoint = SocketAddrV4::new(PEER, PORT);
    let valid = |name| {
        let mut cases: Vec<Case> = egress6_cases().into_iter().take(1).collect();
        cases.extend(ingress6_cases().into_iter().take(1));
        cases.iter_mut().for_each(|c| c.name = name);
        cases
    };
    bench
        .dataplane
        .set_peer(peer_subnet(), None, endpoint, Takes::SuperPackets)?;
    let mut refused = valid("IPv6 once the peer has no IPv6 subnet");
    refused[0].expect = Expect::Answered(DropReason::NoRoute);
    refused[1].expect = Expect::Dropped(DropReason::SpoofedSource);
    run_cases(&bench, &refused, Via::Tc)?;
    run_cases(&bench, &refused[1..], Via::Xdp)?;
    bench.dataplane.set_peer(
        peer_subnet(),
        Some(peer_subnet6()),
        endpoint,
        Takes::SuperPackets,
    )?;
    let carried = valid("IPv6 once the peer has its IPv6 subnet again");
    run_cases(&bench, &carried, Via::Tc)?;
    run_cases(&bench, &carried[1..], Via::Xdp)
}

/// The programs answer within the node's ICMP limit: a burst at once, then nothing until the
/// rate has paid for more. What is held back is dropped and counted under its reason as ever,
/// and counted as held back. Both families, no route and TTL alike.
#[test]
fn answers_beyond_the_icmp_limit_are_held_back_and_counted() -> Result<()> {
    // One a second, bursts of three: the frames below run in far less than the second that
    // would pay for a fourth answer.
    let limit = IcmpLimit {
        per_second: 1,
        burst: 3,
    };
    let bench = test_bench_limited("ebpf-limit", limit)?;
    let named = |names: [&str; 3]| -> Vec<Case> {
        let all: Vec<Case> = egress_cases().into_iter().chain(egress6_cases()).collect();
        let mut picked: Vec<Case> = all
            .into_iter()
            .filter(|c| names.contains(&c.name))
            .collect();
        assert_eq!(picked.len(), 3, "{names:?}");
        picked.sort_by_key(|c| names.iter().position(|n| *n == c.name));
        picked
    };
    let answerable = named(["no route", "TTL 1", "IPv6 no route"]);
    let held_back: Vec<Case> = named(["no route", "TTL 1", "IPv6 no route"])
        .into_iter()
        .map(|mut c| {
            if let Expect::Answered(reason) = c.expect {
                c.expect = Expect::Dropped(reason);
            }
            c
        })
        .collect();
    let started = Instant::now();
    run_cases(&bench, &answerable, Via::Tc)?;
    run_cases(&bench, &held_back, Via::Tc)?;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "the frames took {took:?}: the rate paid for more answers meanwhile"
    );
    assert_eq!(bench.dataplane.counters()?.icmp_rate_limited, 3);
    Ok(())
}
