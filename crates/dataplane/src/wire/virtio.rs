//! The virtio-net header values twill reads and writes: on TUN frames (offloads on) and, for
//! TCP super-packets, in batch version 2 chunk headers.

/// `flags`: the checksum at `csum_start + csum_offset` is left to whoever segments the packet.
pub const NEEDS_CSUM: u8 = 1;
/// `gso_type` values.
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_TCPV6: u8 = 4;
pub const GSO_UDP_L4: u8 = 5;
/// Or-ed into a TCP `gso_type` when the super-packet carries ECN's CWR.
pub const GSO_ECN: u8 = 0x80;
/// Where the checksum lies in a TCP header.
pub const TCP_CHECKSUM_OFFSET: u16 = 16;

/// TCP over IPv4, with or without the ECN bit.
pub fn is_tcpv4(gso_type: u8) -> bool {
    gso_type & !GSO_ECN == GSO_TCPV4
}

/// TCP over IPv6, with or without the ECN bit.
pub fn is_tcpv6(gso_type: u8) -> bool {
    gso_type & !GSO_ECN == GSO_TCPV6
}

/// TCP over either family: what a chunk datagram may carry.
pub fn is_tcp(gso_type: u8) -> bool {
    is_tcpv4(gso_type) || is_tcpv6(gso_type)
}

/// The TCP GSO type of a packet of IP version `version`, if it is 4 or 6.
pub fn tcp_gso_type(version: u8) -> Option<u8> {
    match version {
        4 => Some(GSO_TCPV4),
        6 => Some(GSO_TCPV6),
        _ => None,
    }
}
