//! The ingress cases: datagrams from the peer, and frames that only look like them, over the
//! IPv4 underlay and over the IPv6 one, around inner IPv4 and IPv6 packets.

use super::common::frames::{datagram, datagram6, ethernet, udp, Ip, Ip6, ETH_IPV6};
use super::common::test_run::{HERE6, LOCAL, LOCAL6, PEER, PEER6, THERE6, UDP};
use super::common::{DEVICE_MTU, PORT};
use super::{cases_of, inner, inner6, payload, Case, Expect};
use std::net::{Ipv4Addr, Ipv6Addr};
use twill_dataplane::stats::DropReason;
use twill_ebpf::Side;

const STRANGER: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 66);

/// A datagram from the peer to this node on flannel's port around `inner`.
fn from_peer(inner: &[u8]) -> Vec<u8> {
    datagram(&Ip::new(PEER, LOCAL, UDP), (PORT, PORT), inner)
}

pub(super) fn ingress6_cases() -> Vec<Case> {
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
            Expect::Answered(DropReason::TooBig),
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
pub(super) fn ingress_over6_cases() -> Vec<Case> {
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
    let big_unfragmentable =
        unfragmentable(inner(true)).packet(&vec![0u8; usize::from(DEVICE_MTU)]);
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
            "larger than the device MTU, not to be fragmented",
            from_peer6(&big_unfragmentable),
            Expect::Answered(DropReason::TooBig),
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

pub(super) fn ingress_cases() -> Vec<Case> {
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
    let big_unfragmentable =
        unfragmentable(inner(true)).packet(&vec![0u8; usize::from(DEVICE_MTU)]);
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
        (
            "larger than the device MTU, not to be fragmented",
            from_peer(&big_unfragmentable),
            Expect::Answered(DropReason::TooBig),
        ),
    ];
    cases_of(Side::Ingress, cases)
}

/// `ip` with Don't Fragment set: too big, it is answered with fragmentation needed.
fn unfragmentable(ip: Ip) -> Ip {
    Ip {
        flags_fragment: 0x4000,
        ..ip
    }
}
