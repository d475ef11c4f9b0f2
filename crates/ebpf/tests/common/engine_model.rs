//! What twill's userspace engine would make of a frame the programs take in: the same wire's
//! rules in Rust (twill_dataplane's own checks where it has them), the frame as it should
//! leave, or None where those rules do not carry it; and the ICMP or ICMPv6 error it answers
//! a frame it drops with, if any. The random frames are judged against it.

use super::frames::{datagram, datagram6, Ip, Ip6, ETH_IP, ETH_IPV6};
use super::test_run::{peer_subnet, LOCAL, LOCAL6, OWN, OWN6, PEER, PEER6, UDP};
use super::{DEVICE_MTU, PORT};
use ipnet::Ipv6Net;
use std::net::SocketAddr;
use twill_dataplane::engine::accept_inbound;
use twill_dataplane::stats::DropReason;
use twill_dataplane::table::{PeerSpec, PeerTable};
use twill_dataplane::wire::icmp::{self, IcmpError};
use twill_dataplane::wire::icmpv6::{self, Icmpv6Error};
use twill_dataplane::wire::ipv4::Ipv4Packet;
use twill_dataplane::wire::ipv6::Ipv6Packet;
use twill_ebpf::Side;

const ETHERNET_HEADER: usize = 14;
const IPV4_HEADER: usize = 20;
const IPV6_HEADER: usize = 40;
const UDP_HEADER: usize = 8;

/// The node the programs run on: its underlay's family, its device's MAC, to which a
/// decapsulated frame is addressed, and its one peer's IPv6 subnet (None: the peer has none).
#[derive(Debug, Clone, Copy)]
pub struct Node {
    pub over_ipv6: bool,
    pub device_mac: [u8; 6],
    pub peer_subnet6: Option<Ipv6Net>,
}

/// A frame as it leaves a program that carries it, and the inner bytes it counts.
pub struct Carried {
    pub frame: Vec<u8>,
    pub bytes: u64,
}

/// What the engine would make of `frame` coming in on `side`: carried, or None.
pub fn carried_by_userspace(node: Node, side: Side, frame: &[u8]) -> Option<Carried> {
    let (ethernet, ip) = frame.split_at_checked(ETHERNET_HEADER)?;
    let ethertype = u16::from_be_bytes([ethernet[12], ethernet[13]]);
    match (side, ethertype) {
        (Side::Egress, ETH_IP | ETH_IPV6) => encapsulated(node, ethernet, ethertype, ip),
        // Over either underlay, a peer is known by its address of that family only.
        (Side::Ingress, ETH_IP) if !node.over_ipv6 => delivered(node, ethernet, from_peer(ip)?),
        (Side::Ingress, ETH_IPV6) if node.over_ipv6 => delivered(node, ethernet, from_peer6(ip)?),
        _ => None,
    }
}

/// The frame the engine answers `frame` coming in on `side` with: an ICMP or ICMPv6 error
/// about its packet (no route, no TTL or hop limit left, too big for the device: a peer's that
/// may not be fragmented) from the device's own address,
/// into the device, then the rest of the frame past what the error quotes (outside the error's
/// length, for the stack to trim); None where it is not dropped for one of those, or not
/// answered.
pub fn answered_by_userspace(node: Node, side: Side, frame: &[u8]) -> Option<Vec<u8>> {
    let (ethernet, ip) = frame.split_at_checked(ETHERNET_HEADER)?;
    let ethertype = u16::from_be_bytes([ethernet[12], ethernet[13]]);
    // The packet, and the bytes after it in the frame.
    let (offender, reason) = match (side, ethertype) {
        (Side::Egress, ETH_IP | ETH_IPV6) => (ip.to_vec(), unroutable(node, ethertype, ip)?),
        (Side::Ingress, ETH_IP) if !node.over_ipv6 => refused_in(node, from_peer(ip)?)?,
        (Side::Ingress, ETH_IPV6) if node.over_ipv6 => refused_in(node, from_peer6(ip)?)?,
        _ => return None,
    };
    let error = match offender.first()? >> 4 {
        6 => {
            let error = match reason {
                DropReason::NoRoute => Icmpv6Error::NoRoute,
                DropReason::TooBig => Icmpv6Error::PacketTooBig {
                    mtu: u32::from(DEVICE_MTU),
                },
                _ => Icmpv6Error::HopLimitExceeded,
            };
            let mut out = [0u8; icmpv6::MAX_ERROR_LEN];
            let packet = Ipv6Packet::new_checked(&offender[..]).ok()?;
            let len = icmpv6::reply(&packet, error, OWN6, &mut out).ok()??;
            out[..len].to_vec()
        }
        _ => {
            let packet = Ipv4Packet::new_checked(&offender[..]).ok()?;
            let error = match reason {
                DropReason::NoRoute => IcmpError::NetUnreachable,
                DropReason::TooBig if packet.dont_fragment() => {
                    IcmpError::FragmentationNeeded { mtu: DEVICE_MTU }
                }
                DropReason::TooBig => return None,
                _ => IcmpError::TimeExceeded,
            };
            let mut out = [0u8; icmp::MAX_ERROR_LEN];
            let len = icmp::reply(&packet, error, OWN, &mut out).ok()??;
            out[..len].to_vec()
        }
    };
    let headers = if error[0] >> 4 == 6 { 48 } else { 28 };
    let quoted = error.len() - headers;
    let mut answer = ethernet.to_vec();
    answer[..6].copy_from_slice(&node.device_mac);
    answer[12..].copy_from_slice(&ethertype_of(&error).to_be_bytes());
    answer.extend(error);
    answer.extend_from_slice(&offender[quoted..]);
    Some(answer)
}

/// Why a packet of `ethertype`'s family from the stack is dropped, if for no route or no TTL
/// or hop limit left.
fn unroutable(node: Node, ethertype: u16, ip: &[u8]) -> Option<DropReason> {
    routed_out(node, ethertype, &mut ip.to_vec())?.err()
}

/// A packet of `ethertype`'s family from the stack, routed as the engine routes it: its total
/// length once its TTL or hop limit is decremented, or why it is dropped (no route, none left);
/// None where it does not decode.
fn routed_out(node: Node, ethertype: u16, packet: &mut [u8]) -> Option<Result<usize, DropReason>> {
    let (routed, hops_left, len) = if ethertype == ETH_IPV6 {
        let mut view = Ipv6Packet::new_checked(&mut packet[..]).ok()?;
        let routed = node
            .peer_subnet6
            .is_some_and(|subnet6| subnet6.contains(&view.dst_addr()));
        (
            routed,
            routed && view.decrement_hop_limit(),
            view.total_len(),
        )
    } else {
        let mut view = Ipv4Packet::new_checked(&mut packet[..]).ok()?;
        let routed = peer_subnet().contains(&view.dst_addr());
        (routed, routed && view.decrement_ttl(), view.total_len())
    };
    Some(match (routed, hops_left) {
        (false, _) => Err(DropReason::NoRoute),
        (true, false) => Err(DropReason::TtlExceeded),
        (true, true) => Ok(len),
    })
}

/// The inner packet of a datagram from the peer the engine drops for its TTL or hop limit, or
/// for its size, as it came with the padding after the datagram, and which of those.
fn refused_in(node: Node, datagram: FromPeer<'_>) -> Option<(Vec<u8>, DropReason)> {
    let (mut inner, endpoint) = inner_of(&datagram)?;
    let offender = [&inner[..], datagram.padding].concat();
    let checked = accept_inbound(
        &mut inner,
        &peer_at(node, endpoint),
        usize::from(DEVICE_MTU),
    );
    match checked {
        Err(reason @ (DropReason::TtlExceeded | DropReason::TooBig)) => Some((offender, reason)),
        _ => None,
    }
}

/// The ethertype of a packet of its version (IPv4's for anything but 6).
pub fn ethertype_of(packet: &[u8]) -> u16 {
    match packet.first().map(|b| b >> 4) {
        Some(6) => ETH_IPV6,
        _ => ETH_IP,
    }
}

/// A datagram to the peer around `packet[..len]`, in a frame of `ethernet`'s MACs, with the
/// bytes after `len` riding along: as flanneld's socket sends it over IPv4 (DF, TTL 64, the
/// network's port both ways), and over IPv6 with hop limit 64 and a zero UDP checksum.
fn to_peer(node: Node, ethernet: &[u8], packet: &[u8], len: usize) -> Carried {
    let ports = (PORT, PORT);
    let mut frame = if node.over_ipv6 {
        datagram6(&Ip6::new(LOCAL6, PEER6, UDP), ports, &packet[..len])
    } else {
        let mut outer = Ip::new(LOCAL, PEER, UDP);
        outer.flags_fragment = 0x4000;
        datagram(&outer, ports, &packet[..len])
    };
    frame[..12].copy_from_slice(&ethernet[..12]);
    frame.extend_from_slice(&packet[len..]);
    Carried {
        frame,
        bytes: len as u64,
    }
}

/// A packet of `ethertype`'s family for the peer's subnet of that family with TTL or hop limit
/// left, in flannel's datagram to the peer; bytes after its total length ride along.
fn encapsulated(node: Node, ethernet: &[u8], ethertype: u16, ip: &[u8]) -> Option<Carried> {
    let mut packet = ip.to_vec();
    let len = routed_out(node, ethertype, &mut packet)?.ok()?;
    Some(to_peer(node, ethernet, &packet, len))
}

/// The UDP part of a datagram from the peer, as its IP header frames it.
struct FromPeer<'a> {
    udp: &'a [u8],
    /// Bytes after the datagram's total length (a lower layer's padding), which ride along
    /// for the stack to trim as it trims any.
    padding: &'a [u8],
    endpoint: SocketAddr,
}

/// A whole, unfragmented, optionless IPv4 datagram of UDP from the peer to this node.
fn from_peer(ip: &[u8]) -> Option<FromPeer<'_>> {
    let outer = Ipv4Packet::new_checked(ip).ok()?;
    let fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0;
    let ours = outer.header_len() == IPV4_HEADER
        && outer.protocol() == UDP
        && outer.src_addr() == PEER
        && outer.dst_addr() == LOCAL
        && !fragment;
    ours.then(|| FromPeer {
        udp: &ip[IPV4_HEADER..outer.total_len()],
        padding: &ip[outer.total_len()..],
        endpoint: SocketAddr::new(PEER.into(), PORT),
    })
}

/// The same over the IPv6 underlay: UDP right after the IPv6 header (no extension header, no
/// fragment), from the peer's IPv6 address to this node's. The UDP checksum is not judged: a
/// twill node takes a zero one (UDP_NO_CHECK6_RX), and the inner packet has its own.
fn from_peer6(ip: &[u8]) -> Option<FromPeer<'_>> {
    let outer = Ipv6Packet::new_checked(ip).ok()?;
    let ours =
        outer.next_header() == UDP && outer.src_addr() == PEER6 && outer.dst_addr() == LOCAL6;
    ours.then(|| FromPeer {
        udp: &ip[IPV6_HEADER..outer.total_len()],
        padding: &ip[outer.total_len()..],
        endpoint: SocketAddr::new(PEER6.into(), PORT),
    })
}

/// A UDP datagram from the peer to this node's port, its UDP length its IP length's, whose
/// payload passes the engine's own inbound checks (one well-formed IPv4 or IPv6 packet, from
/// inside the peer's subnet of its family, fitting the device, TTL or hop limit left): the
/// inner packet, TTL or hop limit decremented, addressed to twill's device in a frame of its
/// ethertype, the padding after it.
fn delivered(node: Node, ethernet: &[u8], datagram: FromPeer<'_>) -> Option<Carried> {
    let (mut inner, endpoint) = inner_of(&datagram)?;
    accept_inbound(
        &mut inner,
        &peer_at(node, endpoint),
        usize::from(DEVICE_MTU),
    )
    .ok()?;
    let mut frame = ethernet.to_vec();
    frame[..6].copy_from_slice(&node.device_mac);
    frame[12..].copy_from_slice(&ethertype_of(&inner).to_be_bytes());
    let bytes = inner.len() as u64;
    frame.extend(inner);
    frame.extend_from_slice(datagram.padding);
    Some(Carried { frame, bytes })
}

/// The payload of a UDP datagram from the peer to this node's port whose UDP length is its IP
/// length's, and the peer's endpoint.
fn inner_of(datagram: &FromPeer<'_>) -> Option<(Vec<u8>, SocketAddr)> {
    let udp = datagram.udp;
    let port = |at: usize| u16::from_be_bytes([udp[at], udp[at + 1]]);
    if udp.len() < UDP_HEADER || (port(0), port(2), port(4)) != (PORT, PORT, udp.len() as u16) {
        return None;
    }
    Some((udp[UDP_HEADER..].to_vec(), datagram.endpoint))
}

/// The peer, with its subnets, at `endpoint`.
fn peer_at(node: Node, endpoint: SocketAddr) -> twill_dataplane::table::Peer {
    let peers = PeerTable::new(&[PeerSpec {
        subnet: peer_subnet(),
        subnet6: node.peer_subnet6,
        endpoint,
        version: 1,
    }]);
    peers.get(peer_subnet()).expect("the one peer").clone()
}
