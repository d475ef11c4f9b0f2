//! The ICMPv6 errors twill answers IPv6 packets with (RFC 4443), the counterparts of
//! [`super::icmp`]'s: "no route to destination" for a destination no peer owns, "hop limit
//! exceeded" for a packet whose hop limit runs out in twill, and "packet too big" for one the
//! path cannot carry (IPv6 routers never fragment, so every too-big packet gets one).

use super::checksum;
use super::ipv6::{self, Ipv6Packet, Ipv6Repr, NEXT_HEADER_ICMPV6};
use super::WireError;
use std::net::Ipv6Addr;

const ICMP_HEADER_LEN: usize = 8;
/// RFC 4443 2.4 (c): as much of the offender as fits without the error exceeding the minimum
/// IPv6 MTU.
pub const MAX_ERROR_LEN: usize = 1280;
/// Error messages are types 0..=127; informational ones (echo) 128..=255.
const FIRST_INFORMATIONAL: u8 = 128;

/// Which error to answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icmpv6Error {
    /// Type 1 code 0.
    NoRoute,
    /// Type 3 code 0: hop limit exceeded in transit.
    HopLimitExceeded,
    /// Type 2 code 0, with the largest packet the path takes (RFC 8201).
    PacketTooBig { mtu: u32 },
}

impl Icmpv6Error {
    /// Type, code, and the second word of the ICMPv6 header.
    fn header(self) -> (u8, u8, [u8; 4]) {
        match self {
            Icmpv6Error::NoRoute => (1, 0, [0; 4]),
            Icmpv6Error::HopLimitExceeded => (3, 0, [0; 4]),
            Icmpv6Error::PacketTooBig { mtu } => (2, 0, mtu.to_be_bytes()),
        }
    }
}

/// Write `error` about `offender`, sent from `src`, into `out` and return its length. Returns
/// `None` where RFC 4443 2.4 (e) forbids an answer: to an ICMPv6 error, to a packet sent to a
/// multicast address (but for "packet too big"), or from an address that is not one host's.
pub fn reply<T: AsRef<[u8]>>(
    offender: &Ipv6Packet<T>,
    error: Icmpv6Error,
    src: Ipv6Addr,
    out: &mut [u8; MAX_ERROR_LEN],
) -> Result<Option<usize>, WireError> {
    let to = offender.src_addr();
    let to_group = offender.dst_addr().is_multicast();
    let too_big = matches!(error, Icmpv6Error::PacketTooBig { .. });
    if is_icmp_error(offender) || to.is_unspecified() || to.is_multicast() || (to_group && !too_big)
    {
        return Ok(None);
    }
    let packet = offender.packet();
    let quoted = &packet[..packet
        .len()
        .min(MAX_ERROR_LEN - ipv6::HEADER_LEN - ICMP_HEADER_LEN)];
    let repr = Ipv6Repr {
        src,
        dst: to,
        next_header: NEXT_HEADER_ICMPV6,
        hop_limit: 64,
        payload_len: ICMP_HEADER_LEN + quoted.len(),
    };
    let total = repr.total_len();
    repr.emit(&mut out[..total])?;
    let icmp = &mut out[ipv6::HEADER_LEN..total];
    let (kind, code, rest) = error.header();
    icmp[..4].copy_from_slice(&[kind, code, 0, 0]);
    icmp[4..ICMP_HEADER_LEN].copy_from_slice(&rest);
    icmp[ICMP_HEADER_LEN..].copy_from_slice(quoted);
    let sum = !checksum::fold(repr.pseudo_header_sum() + checksum::sum(icmp));
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    Ok(Some(total))
}

/// An ICMPv6 error right behind the IPv6 header. One behind extension headers is not looked
/// for: twill would answer it once, and the answer itself is never answered.
fn is_icmp_error<T: AsRef<[u8]>>(packet: &Ipv6Packet<T>) -> bool {
    packet.next_header() == NEXT_HEADER_ICMPV6
        && packet
            .payload()
            .first()
            .is_some_and(|&t| t < FIRST_INFORMATIONAL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipv6::NEXT_HEADER_TCP;

    const OWN: Ipv6Addr = Ipv6Addr::new(0xfd10, 0, 0, 7, 0, 0, 0, 0);

    fn offender(next_header: u8, dst: &str, payload: &[u8]) -> Vec<u8> {
        let repr = Ipv6Repr {
            src: "fd10:0:0:1::2".parse().unwrap(),
            dst: dst.parse().unwrap(),
            next_header,
            hop_limit: 63,
            payload_len: payload.len(),
        };
        let mut buf = vec![0; repr.total_len()];
        repr.emit(&mut buf).unwrap();
        buf[40..].copy_from_slice(payload);
        buf
    }

    fn reply_to(bad: &[u8], error: Icmpv6Error) -> Option<Vec<u8>> {
        let view = Ipv6Packet::new_checked(bad).unwrap();
        let mut out = [0u8; MAX_ERROR_LEN];
        let len = reply(&view, error, OWN, &mut out).unwrap()?;
        Some(out[..len].to_vec())
    }

    fn checksum_ok(reply: &[u8]) -> bool {
        let ip = Ipv6Packet::new_checked(reply).unwrap();
        let pseudo = ipv6::pseudo_header_sum(
            &ip.src_addr(),
            &ip.dst_addr(),
            ip.next_header(),
            ip.payload_len(),
        );
        checksum::fold(pseudo + checksum::sum(ip.payload())) == 0xffff
    }

    #[test]
    fn reply_quotes_the_offender_from_our_own_address() {
        let bad = offender(NEXT_HEADER_TCP, "fd10:0:0:9::9", &[1u8; 40]);
        let out = reply_to(&bad, Icmpv6Error::NoRoute).unwrap();
        let reply = Ipv6Packet::new_checked(&out[..]).unwrap();
        assert_eq!(reply.src_addr(), OWN);
        assert_eq!(
            reply.dst_addr(),
            "fd10:0:0:1::2".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(reply.next_header(), NEXT_HEADER_ICMPV6);
        assert!(checksum_ok(&out));
        assert_eq!(&reply.payload()[..2], &[1, 0]);
        assert_eq!(&reply.payload()[8..], &bad[..]);
    }

    #[test]
    fn each_error_has_its_type_and_a_big_offender_is_cut_to_1280() {
        let bad = offender(NEXT_HEADER_TCP, "fd10:0:0:9::9", &[1u8; 1400]);
        let too_big = reply_to(&bad, Icmpv6Error::PacketTooBig { mtu: 1380 }).unwrap();
        assert_eq!(too_big.len(), MAX_ERROR_LEN);
        assert!(checksum_ok(&too_big));
        assert_eq!(too_big[40..42], [2, 0]);
        assert_eq!(too_big[44..48], 1380u32.to_be_bytes());
        let hops = reply_to(&bad, Icmpv6Error::HopLimitExceeded).unwrap();
        assert_eq!(hops[40..42], [3, 0]);
    }

    #[test]
    fn errors_multicast_and_unspecified_sources_get_no_reply() {
        let error = offender(
            NEXT_HEADER_ICMPV6,
            "fd10:0:0:9::9",
            &[1, 0, 0, 0, 0, 0, 0, 0],
        );
        assert_eq!(reply_to(&error, Icmpv6Error::NoRoute), None);
        let echo = offender(
            NEXT_HEADER_ICMPV6,
            "fd10:0:0:9::9",
            &[128, 0, 0, 0, 0, 0, 0, 0],
        );
        assert!(reply_to(&echo, Icmpv6Error::NoRoute).is_some());
        let group = offender(NEXT_HEADER_TCP, "ff02::1", &[0; 8]);
        assert_eq!(reply_to(&group, Icmpv6Error::NoRoute), None);
        let big = Icmpv6Error::PacketTooBig { mtu: 1280 };
        assert!(reply_to(&group, big).is_some());
        let mut unspecified = offender(NEXT_HEADER_TCP, "fd10:0:0:9::9", &[0; 8]);
        unspecified[8..24].fill(0);
        assert_eq!(reply_to(&unspecified, Icmpv6Error::NoRoute), None);
    }
}
