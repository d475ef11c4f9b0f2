//! Frames as they reach the programs: Ethernet, IPv4, IPv6, flannel's udp datagrams.

use std::net::{Ipv4Addr, Ipv6Addr};

pub const ETH_IP: u16 = 0x0800;
pub const ETH_IPV6: u16 = 0x86dd;

/// An Ethernet frame of `ethertype` around `payload` (MACs zero, as a dummy's).
pub fn ethernet(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![0u8; 12];
    frame.extend_from_slice(&ethertype.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// An IPv4 header's fields; `packet` emits one with a correct checksum and `options` (a
/// multiple of 4 bytes) after the first 20 bytes.
#[derive(Debug, Clone)]
pub struct Ip {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    pub ttl: u8,
    /// The identification field, which ties the fragments of one datagram together.
    pub id: u16,
    pub flags_fragment: u16,
    pub options: Vec<u8>,
}

impl Ip {
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8) -> Ip {
        Ip {
            src,
            dst,
            protocol,
            ttl: 64,
            id: 0,
            flags_fragment: 0,
            options: Vec::new(),
        }
    }

    pub fn packet(&self, payload: &[u8]) -> Vec<u8> {
        let header_len = 20 + self.options.len();
        let mut p = vec![0u8; header_len];
        p[0] = 0x40 | (header_len / 4) as u8;
        p[2..4].copy_from_slice(&((header_len + payload.len()) as u16).to_be_bytes());
        p[4..6].copy_from_slice(&self.id.to_be_bytes());
        p[6..8].copy_from_slice(&self.flags_fragment.to_be_bytes());
        p[8] = self.ttl;
        p[9] = self.protocol;
        p[12..16].copy_from_slice(&self.src.octets());
        p[16..20].copy_from_slice(&self.dst.octets());
        p[20..].copy_from_slice(&self.options);
        let sum = checksum(&p);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        p.extend_from_slice(payload);
        p
    }
}

/// An IPv6 header's fields (no extension headers); `packet` emits it around a payload.
#[derive(Debug, Clone)]
pub struct Ip6 {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub next_header: u8,
    pub hop_limit: u8,
}

impl Ip6 {
    pub fn new(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8) -> Ip6 {
        Ip6 {
            src,
            dst,
            next_header,
            hop_limit: 64,
        }
    }

    pub fn packet(&self, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
        p[6] = self.next_header;
        p[7] = self.hop_limit;
        p[8..24].copy_from_slice(&self.src.octets());
        p[24..40].copy_from_slice(&self.dst.octets());
        p.extend_from_slice(payload);
        p
    }
}

/// The Internet checksum of `data` (even length).
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A UDP header and payload (checksum 0, as flanneld's kernel socket may and twill sends).
pub fn udp(src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::with_capacity(8 + payload.len());
    d.extend_from_slice(&src_port.to_be_bytes());
    d.extend_from_slice(&dst_port.to_be_bytes());
    d.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(payload);
    d
}

/// flannel's wire: an Ethernet frame with `outer` around UDP `ports` around `inner`.
pub fn datagram(outer: &Ip, ports: (u16, u16), inner: &[u8]) -> Vec<u8> {
    ethernet(ETH_IP, &outer.packet(&udp(ports.0, ports.1, inner)))
}

/// Bytes as hex, for messages.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
