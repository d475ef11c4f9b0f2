//! An inner packet of either family, told apart by its version nibble: what the userspace
//! engines carry.

use super::ipv4::Ipv4Packet;
use super::ipv6::Ipv6Packet;
use super::WireError;
use std::net::IpAddr;

/// A checked IPv4 or IPv6 packet.
#[derive(Debug, Clone, Copy)]
pub enum IpPacket<T: AsRef<[u8]>> {
    V4(Ipv4Packet<T>),
    V6(Ipv6Packet<T>),
}

impl<T: AsRef<[u8]>> IpPacket<T> {
    /// Checks the packet as its version nibble says; any other version is `BadVersion`.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        match buffer.as_ref().first().map(|b| b >> 4) {
            Some(4) => Ipv4Packet::new_checked(buffer).map(IpPacket::V4),
            Some(6) => Ipv6Packet::new_checked(buffer).map(IpPacket::V6),
            Some(_) => Err(WireError::BadVersion),
            None => Err(WireError::Truncated),
        }
    }

    /// The packet's length by its own header (IPv4 total length, IPv6 40 + payload length).
    #[inline]
    pub fn total_len(&self) -> usize {
        match self {
            IpPacket::V4(ip) => ip.total_len(),
            IpPacket::V6(ip) => ip.total_len(),
        }
    }

    #[inline]
    pub fn src_addr(&self) -> IpAddr {
        match self {
            IpPacket::V4(ip) => ip.src_addr().into(),
            IpPacket::V6(ip) => ip.src_addr().into(),
        }
    }

    #[inline]
    pub fn dst_addr(&self) -> IpAddr {
        match self {
            IpPacket::V4(ip) => ip.dst_addr().into(),
            IpPacket::V6(ip) => ip.dst_addr().into(),
        }
    }

    /// The packet up to its own length, without lower-layer padding.
    #[inline]
    pub fn packet(&self) -> &[u8] {
        match self {
            IpPacket::V4(ip) => ip.packet(),
            IpPacket::V6(ip) => ip.packet(),
        }
    }

    pub fn into_inner(self) -> T {
        match self {
            IpPacket::V4(ip) => ip.into_inner(),
            IpPacket::V6(ip) => ip.into_inner(),
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IpPacket<T> {
    /// Decrement the TTL or hop limit as a router does; false, leaving the packet untouched,
    /// when it would reach zero.
    #[inline]
    pub fn decrement_hop_limit(&mut self) -> bool {
        match self {
            IpPacket::V4(ip) => ip.decrement_ttl(),
            IpPacket::V6(ip) => ip.decrement_hop_limit(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ipv4, ipv6};

    #[test]
    fn the_version_nibble_picks_the_family() {
        let v4 = ipv4::test_packet(8, 64, 0);
        let v6 = ipv6::test_packet(8, 64, 0);
        assert!(matches!(
            IpPacket::new_checked(&v4[..]),
            Ok(IpPacket::V4(_))
        ));
        assert!(matches!(
            IpPacket::new_checked(&v6[..]),
            Ok(IpPacket::V6(_))
        ));
        let mut other = v4;
        other[0] = 0x55;
        let err = |b: &[u8]| IpPacket::new_checked(b).unwrap_err();
        assert_eq!(err(&other), WireError::BadVersion);
        assert_eq!(err(&[]), WireError::Truncated);
        assert_eq!(err(&v6[..30]), WireError::Truncated);
    }

    #[test]
    fn both_families_decrement_to_one_and_stop() {
        for mut buf in [ipv4::test_packet(8, 2, 0), ipv6::test_packet(8, 2, 0)] {
            let mut ip = IpPacket::new_checked(&mut buf[..]).unwrap();
            assert!(ip.decrement_hop_limit());
            assert!(!ip.decrement_hop_limit());
        }
    }
}
