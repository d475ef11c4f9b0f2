//! flannel's udp backend format: the UDP payload is the bare inner IP packet, nothing else.
//!
//! So encapsulation copies nothing; what matters is the checking. A datagram is accepted only if
//! it is exactly one well-formed IPv4 or IPv6 packet (flanneld's udp sends IPv4 only; twill
//! sends IPv6 to a peer whose lease has an IPv6 subnet, which no flanneld lease of udp has): flanneld writes whatever arrives into its TUN, and
//! silently truncates what does not fit; twill rejects both with a reason.

use super::ip::IpPacket;
use super::WireError;

pub const DEFAULT_PORT: u16 = 8285;

/// Bytes the underlay adds around each inner packet (outer IPv4 + UDP), hence MTU = iface - 28.
pub const OVERHEAD: usize = 20 + 8;

/// Check a received datagram and view it as the inner packet.
pub fn decap<T: AsRef<[u8]>>(datagram: T) -> Result<IpPacket<T>, WireError> {
    let len = datagram.as_ref().len();
    let packet = IpPacket::new_checked(datagram)?;
    if packet.total_len() != len {
        return Err(WireError::BadLength);
    }
    Ok(packet)
}

/// The datagram payload for an inner packet read from TUN: the packet itself, cut to the
/// length its header says.
pub fn encap<T: AsRef<[u8]>>(packet: &IpPacket<T>) -> &[u8] {
    packet.packet()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipv4::test_packet;

    fn packet(payload_len: usize) -> Vec<u8> {
        test_packet(payload_len, 64, 7)
    }

    #[test]
    fn round_trip_is_the_bare_packet() {
        let inner = packet(100);
        let view = IpPacket::new_checked(&inner[..]).unwrap();
        let wire = encap(&view).to_vec();
        assert_eq!(wire, inner);
        assert_eq!(decap(&wire[..]).unwrap().packet(), &inner[..]);
    }

    #[test]
    fn trailing_bytes_are_a_bad_length() {
        for mut wire in [packet(10), crate::wire::ipv6::test_packet(10, 64, 7)] {
            wire.push(0);
            assert_eq!(decap(&wire[..]).unwrap_err(), WireError::BadLength);
        }
    }

    #[test]
    fn an_ipv6_packet_is_its_own_datagram() {
        let inner = crate::wire::ipv6::test_packet(100, 64, 7);
        let packet = decap(&inner[..]).unwrap();
        assert!(matches!(packet, IpPacket::V6(_)));
        assert_eq!(packet.packet(), &inner[..]);
    }

    #[test]
    fn short_datagram_is_truncated() {
        let wire = packet(10);
        assert_eq!(
            decap(&wire[..wire.len() - 1]).unwrap_err(),
            WireError::Truncated
        );
    }
}
