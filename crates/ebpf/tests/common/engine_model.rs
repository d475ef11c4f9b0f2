//! What twill's userspace engine would make of a frame the programs take in: the same wire's
//! rules in Rust (twill_dataplane's own checks where it has them), the frame as it should
//! leave, or None where those rules do not carry it. The random frames are judged against it.

use super::frames::{datagram, datagram6, Ip, Ip6, ETH_IP, ETH_IPV6};
use super::test_run::{peer_subnet, peer_subnet6, LOCAL, LOCAL6, PEER, PEER6, UDP};
use super::{DEVICE_MTU, PORT};
use std::net::SocketAddr;
use twill_dataplane::engine::accept_inbound;
use twill_dataplane::table::{PeerSpec, PeerTable};
use twill_dataplane::wire::ipv4::Ipv4Packet;
use twill_dataplane::wire::ipv6::Ipv6Packet;
use twill_ebpf::Side;

const ETHERNET_HEADER: usize = 14;
const IPV4_HEADER: usize = 20;
const IPV6_HEADER: usize = 40;
const UDP_HEADER: usize = 8;

/// The node the programs run on: its underlay's family, and its device's MAC, to which a
/// decapsulated frame is addressed.
#[derive(Debug, Clone, Copy)]
pub struct Node {
    pub over_ipv6: bool,
    pub device_mac: [u8; 6],
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
    let len = if ethertype == ETH_IPV6 {
        let mut view = Ipv6Packet::new_checked(&mut packet[..]).ok()?;
        let routed = peer_subnet6().contains(&view.dst_addr()) && view.decrement_hop_limit();
        routed.then(|| view.total_len())?
    } else {
        let mut view = Ipv4Packet::new_checked(&mut packet[..]).ok()?;
        let routed = peer_subnet().contains(&view.dst_addr()) && view.decrement_ttl();
        routed.then(|| view.total_len())?
    };
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
    let FromPeer {
        udp,
        padding,
        endpoint,
    } = datagram;
    let port = |at: usize| u16::from_be_bytes([udp[at], udp[at + 1]]);
    if udp.len() < UDP_HEADER || (port(0), port(2), port(4)) != (PORT, PORT, udp.len() as u16) {
        return None;
    }
    let mut inner = udp[UDP_HEADER..].to_vec();
    let peers = PeerTable::new(&[PeerSpec {
        subnet: peer_subnet(),
        subnet6: Some(peer_subnet6()),
        endpoint,
        version: 1,
    }]);
    let peer = peers.get(peer_subnet())?;
    accept_inbound(&mut inner, peer, usize::from(DEVICE_MTU)).ok()?;
    let mut frame = ethernet.to_vec();
    frame[..6].copy_from_slice(&node.device_mac);
    frame[12..].copy_from_slice(&ethertype_of(&inner).to_be_bytes());
    let bytes = inner.len() as u64;
    frame.extend(inner);
    frame.extend_from_slice(padding);
    Some(Carried { frame, bytes })
}
