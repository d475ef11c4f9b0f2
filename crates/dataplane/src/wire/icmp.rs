//! ICMP "destination network unreachable", written back into TUN for packets with no peer,
//! as flanneld does, so the sender fails fast instead of timing out.

use super::checksum;
use super::ipv4::{Ipv4Packet, Ipv4Repr, PROTO_ICMP};
use super::WireError;

const ICMP_HEADER_LEN: usize = 8;
const TYPE_DEST_UNREACHABLE: u8 = 3;
const CODE_NET_UNREACHABLE: u8 = 0;
/// RFC 792: the offending header plus the first 64 bits of its payload.
const QUOTED_PAYLOAD: usize = 8;

/// Longest reply: a 20-byte header, the ICMP header, a 60-byte offender header and 8 bytes.
pub const MAX_UNREACHABLE_LEN: usize = 20 + ICMP_HEADER_LEN + 60 + QUOTED_PAYLOAD;

/// Write the reply to `offender` into `out` and return its length. Never answers an ICMP error
/// or a later fragment (RFC 1122 3.2.2), which returns `None`.
pub fn net_unreachable<T: AsRef<[u8]>>(
    offender: &Ipv4Packet<T>,
    out: &mut [u8; MAX_UNREACHABLE_LEN],
) -> Result<Option<usize>, WireError> {
    if offender.is_later_fragment() || is_icmp_error(offender) {
        return Ok(None);
    }
    let quoted_len = offender.header_len() + offender.payload().len().min(QUOTED_PAYLOAD);
    let quoted = &offender.packet()[..quoted_len];
    let repr = Ipv4Repr {
        src: offender.dst_addr(),
        dst: offender.src_addr(),
        protocol: PROTO_ICMP,
        ttl: 64,
        payload_len: ICMP_HEADER_LEN + quoted_len,
    };
    let total = repr.total_len();
    repr.emit(&mut out[..total])?;
    let icmp = &mut out[20..total];
    icmp[..ICMP_HEADER_LEN].fill(0);
    icmp[0] = TYPE_DEST_UNREACHABLE;
    icmp[1] = CODE_NET_UNREACHABLE;
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

    #[test]
    fn reply_quotes_header_and_eight_bytes() {
        let bad = offender(PROTO_TCP, &[1u8; 40]);
        let view = Ipv4Packet::new_checked(&bad[..]).unwrap();
        let mut out = [0u8; MAX_UNREACHABLE_LEN];
        let len = net_unreachable(&view, &mut out).unwrap().unwrap();
        let reply = Ipv4Packet::new_checked(&out[..len]).unwrap();
        assert!(reply.verify_checksum());
        assert_eq!(reply.dst_addr(), Ipv4Addr::new(10, 5, 1, 2));
        assert_eq!(reply.src_addr(), Ipv4Addr::new(10, 5, 9, 9));
        let icmp = reply.payload();
        assert_eq!(&icmp[..2], &[3, 0]);
        assert_eq!(checksum::fold(checksum::sum(icmp)), 0xffff);
        assert_eq!(&icmp[8..], &bad[..28]);
    }

    #[test]
    fn icmp_errors_get_no_reply() {
        let bad = offender(PROTO_ICMP, &[3, 0, 0, 0, 0, 0, 0, 0]);
        let view = Ipv4Packet::new_checked(&bad[..]).unwrap();
        let mut out = [0u8; MAX_UNREACHABLE_LEN];
        assert_eq!(net_unreachable(&view, &mut out).unwrap(), None);
    }
}
