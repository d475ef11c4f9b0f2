//! The ICMP errors twill answers with, written back into TUN so a sender fails fast (or
//! learns the path MTU) instead of timing out: "network unreachable" for a destination no
//! peer owns, as flanneld does; "time exceeded" for a packet whose TTL runs out in twill, so
//! traceroute sees the hop; "fragmentation needed" for a DF packet too big for the underlay.

use super::checksum;
use super::ipv4::{Ipv4Packet, Ipv4Repr, PROTO_ICMP};
use super::WireError;
use std::net::Ipv4Addr;

const ICMP_HEADER_LEN: usize = 8;
/// RFC 792: the offending header plus the first 64 bits of its payload.
const QUOTED_PAYLOAD: usize = 8;

/// Longest reply: a 20-byte header, the ICMP header, a 60-byte offender header and 8 bytes.
pub const MAX_ERROR_LEN: usize = 20 + ICMP_HEADER_LEN + 60 + QUOTED_PAYLOAD;

/// Which error to answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcmpError {
    /// Type 3 code 0.
    NetUnreachable,
    /// Type 11 code 0: TTL exceeded in transit.
    TimeExceeded,
    /// Type 3 code 4, with the largest packet the path takes (RFC 1191).
    FragmentationNeeded { mtu: u16 },
}

impl IcmpError {
    /// Type, code, and the second word of the ICMP header.
    fn header(self) -> (u8, u8, [u8; 4]) {
        match self {
            IcmpError::NetUnreachable => (3, 0, [0; 4]),
            IcmpError::TimeExceeded => (11, 0, [0; 4]),
            IcmpError::FragmentationNeeded { mtu } => {
                let [hi, lo] = mtu.to_be_bytes();
                (3, 4, [0, 0, hi, lo])
            }
        }
    }
}

/// Write `error` about `offender`, sent from `src`, into `out` and return its length. Never
/// answers an ICMP error or a later fragment (RFC 1122 3.2.2), which returns `None`.
pub fn reply<T: AsRef<[u8]>>(
    offender: &Ipv4Packet<T>,
    error: IcmpError,
    src: Ipv4Addr,
    out: &mut [u8; MAX_ERROR_LEN],
) -> Result<Option<usize>, WireError> {
    if offender.is_later_fragment() || is_icmp_error(offender) {
        return Ok(None);
    }
    let quoted_len = offender.header_len() + offender.payload().len().min(QUOTED_PAYLOAD);
    let quoted = &offender.packet()[..quoted_len];
    let repr = Ipv4Repr {
        src,
        dst: offender.src_addr(),
        protocol: PROTO_ICMP,
        ttl: 64,
        payload_len: ICMP_HEADER_LEN + quoted_len,
    };
    let total = repr.total_len();
    repr.emit(&mut out[..total])?;
    let icmp = &mut out[20..total];
    let (kind, code, rest) = error.header();
    icmp[..4].copy_from_slice(&[kind, code, 0, 0]);
    icmp[4..ICMP_HEADER_LEN].copy_from_slice(&rest);
    icmp[ICMP_HEADER_LEN..].copy_from_slice(quoted);
    let sum = checksum::compute(icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    Ok(Some(total))
}

fn is_icmp_error<T: AsRef<[u8]>>(packet: &Ipv4Packet<T>) -> bool {
    const ERROR_TYPES: [u8; 5] = [3, 4, 5, 11, 12];
    packet.protocol() == PROTO_ICMP
        && packet
            .payload()
            .first()
            .is_some_and(|t| ERROR_TYPES.contains(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipv4::PROTO_TCP;
    use std::net::Ipv4Addr;

    fn offender(protocol: u8, payload: &[u8]) -> Vec<u8> {
        let repr = Ipv4Repr {
            src: Ipv4Addr::new(10, 5, 1, 2),
            dst: Ipv4Addr::new(10, 5, 9, 9),
            protocol,
            ttl: 63,
            payload_len: payload.len(),
        };
        let mut buf = vec![0; repr.total_len()];
        repr.emit(&mut buf).unwrap();
        buf[20..].copy_from_slice(payload);
        buf
    }

    const OWN: Ipv4Addr = Ipv4Addr::new(10, 5, 7, 0);

    fn reply_to(bad: &[u8], error: IcmpError) -> Option<Vec<u8>> {
        let view = Ipv4Packet::new_checked(bad).unwrap();
        let mut out = [0u8; MAX_ERROR_LEN];
        let len = reply(&view, error, OWN, &mut out).unwrap()?;
        Some(out[..len].to_vec())
    }

    #[test]
    fn reply_quotes_header_and_eight_bytes_from_our_own_address() {
        let bad = offender(PROTO_TCP, &[1u8; 40]);
        let out = reply_to(&bad, IcmpError::NetUnreachable).unwrap();
        let reply = Ipv4Packet::new_checked(&out[..]).unwrap();
        assert!(reply.verify_checksum());
        assert_eq!(reply.dst_addr(), Ipv4Addr::new(10, 5, 1, 2));
        assert_eq!(reply.src_addr(), OWN);
        let icmp = reply.payload();
        assert_eq!(&icmp[..2], &[3, 0]);
        assert_eq!(checksum::fold(checksum::sum(icmp)), 0xffff);
        assert_eq!(&icmp[8..], &bad[..28]);
    }

    #[test]
    fn each_error_has_its_type_code_and_mtu() {
        let bad = offender(PROTO_TCP, &[1u8; 40]);
        let icmp = |error| reply_to(&bad, error).unwrap()[20..28].to_vec();
        assert_eq!(icmp(IcmpError::TimeExceeded)[..2], [11, 0]);
        let frag = icmp(IcmpError::FragmentationNeeded { mtu: 1272 });
        assert_eq!(frag[..2], [3, 4]);
        assert_eq!(u16::from_be_bytes([frag[6], frag[7]]), 1272);
    }

    #[test]
    fn icmp_errors_get_no_reply() {
        let bad = offender(PROTO_ICMP, &[3, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(reply_to(&bad, IcmpError::TimeExceeded), None);
    }
}
