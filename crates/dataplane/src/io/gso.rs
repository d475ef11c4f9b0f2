//! virtio-net headers on TUN frames: split a super-packet into packets where the wire needs
//! them (tun-rs's `gso_split` does the segmenting), or describe a TCP super-packet that is
//! written whole.
//!
//! A frame is the 10-byte virtio-net header followed by one (super-)packet, as TUN reads and
//! writes it when offloads are on.

use crate::wire::virtio::{self, GSO_ECN, GSO_NONE, GSO_UDP_L4, NEEDS_CSUM, TCP_CHECKSUM_OFFSET};
use crate::wire::{checksum, ipv4, ipv6};
use std::io;
use tun_rs::VirtioNetHdr;
pub use tun_rs::VIRTIO_NET_HDR_LEN;

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// The header of a frame; errors if the frame is no longer than a header.
pub fn header(frame: &[u8]) -> io::Result<VirtioNetHdr> {
    if frame.len() <= VIRTIO_NET_HDR_LEN {
        return Err(invalid("TUN frame shorter than its virtio-net header"));
    }
    VirtioNetHdr::decode(&frame[..VIRTIO_NET_HDR_LEN])
}

/// A TCP super-packet, over IPv4 or over IPv6 without extension headers, whose TCP checksum
/// the kernel left to the segmenter (CHECKSUM_PARTIAL at the usual place): it can be carried
/// whole and handed to the far kernel as it is.
pub fn is_tcp_super_packet(hdr: &VirtioNetHdr, packet: &[u8]) -> bool {
    let Some(ip_len) = tcp_ip_header_len(packet, hdr.gso_type) else {
        return false;
    };
    hdr.gso_size > 0
        && hdr.flags & NEEDS_CSUM != 0
        && usize::from(hdr.csum_start) == ip_len
        && hdr.csum_offset == TCP_CHECKSUM_OFFSET
        && tcp_headers_end(packet, ip_len).is_some()
}

/// The IP header length of `packet` if it is a TCP packet of the family `gso_type` names:
/// IPv4 with TCP (its options included), or IPv6 whose next header is TCP.
pub fn tcp_ip_header_len(packet: &[u8], gso_type: u8) -> Option<usize> {
    let first = *packet.first()?;
    match first >> 4 {
        4 if virtio::is_tcpv4(gso_type) && *packet.get(9)? == ipv4::PROTO_TCP => {
            Some(usize::from(first & 0x0f) * 4)
        }
        6 if virtio::is_tcpv6(gso_type) && *packet.get(6)? == ipv6::NEXT_HEADER_TCP => {
            Some(ipv6::HEADER_LEN)
        }
        _ => None,
    }
}

/// Where the TCP header of `packet` (IP header `ip_len` bytes) ends, if it is whole and sane.
pub fn tcp_headers_end(packet: &[u8], ip_len: usize) -> Option<usize> {
    let tcp_len = usize::from(*packet.get(ip_len + 12)? >> 4) * 4;
    let end = ip_len + tcp_len;
    ((20..=60).contains(&tcp_len) && end <= packet.len()).then_some(end)
}

/// The header that asks the kernel to segment a TCP super-packet (IPv4, or IPv6 without
/// extension headers, as `gso_type` says) at `gso_size` bytes of payload and fill in every
/// segment's checksum; the TCP checksum field must hold the pseudo-header sum. None if
/// `packet` is not TCP of that family with a whole TCP header. `GSO_NONE` takes either family.
pub fn tcp_super_header(packet: &[u8], gso_type: u8, gso_size: u16) -> Option<VirtioNetHdr> {
    let family = match gso_type {
        GSO_NONE => virtio::tcp_gso_type(packet.first()? >> 4)?,
        _ => gso_type,
    };
    let ip_len = tcp_ip_header_len(packet, family)?;
    let end = tcp_headers_end(packet, ip_len)?;
    Some(VirtioNetHdr {
        flags: NEEDS_CSUM,
        gso_type,
        hdr_len: end as u16,
        gso_size,
        csum_start: ip_len as u16,
        csum_offset: TCP_CHECKSUM_OFFSET,
    })
}

/// Split `packet`, read from TUN with the virtio-net header `hdr` (see [`header`]), into packets,
/// one per slot, as the wire needs them: a plain packet gets its checksum finished, a
/// super-packet is segmented. Returns the number of packets; `sizes[i]` is the length of the
/// packet in `slots[i]`.
pub fn split<B: AsRef<[u8]> + AsMut<[u8]>>(
    mut hdr: VirtioNetHdr,
    packet: &mut [u8],
    slots: &mut [B],
    sizes: &mut [usize],
) -> io::Result<usize> {
    if hdr.gso_type == GSO_NONE {
        if hdr.flags & NEEDS_CSUM != 0 {
            finish_checksum(packet, &hdr)?;
        }
        let slot = slots
            .first_mut()
            .and_then(|s| s.as_mut().get_mut(..packet.len()))
            .ok_or_else(|| invalid("TUN packet longer than its slot"))?;
        slot.copy_from_slice(packet);
        sizes[0] = packet.len();
        return Ok(1);
    }
    if hdr.gso_size == 0 {
        return Err(invalid("super-packet with a zero segment size"));
    }
    let is_v6 = match packet.first().map(|b| b >> 4) {
        Some(4) => false,
        Some(6) => true,
        _ => return Err(invalid("super-packet that is neither IPv4 nor IPv6")),
    };
    // The kernel's hdr_len can cover the whole first packet on a forwarding path, so it is
    // worked out from the transport header, as wireguard-go and tun-rs do.
    let start = usize::from(hdr.csum_start);
    let end = if hdr.gso_type & !GSO_ECN == GSO_UDP_L4 {
        Some(start + 8).filter(|&end| end <= packet.len())
    } else {
        tcp_headers_end(packet, start)
    };
    hdr.hdr_len = end.ok_or_else(|| invalid("super-packet with a broken transport header"))? as u16;
    tun_rs::gso_split(packet, hdr, slots, sizes, 0, is_v6)
}

/// CHECKSUM_PARTIAL: the field at csum_start + csum_offset holds the pseudo-header sum, and
/// the sum over everything from csum_start completes it.
fn finish_checksum(packet: &mut [u8], hdr: &VirtioNetHdr) -> io::Result<()> {
    let start = usize::from(hdr.csum_start);
    let at = start + usize::from(hdr.csum_offset);
    if at + 2 > packet.len() {
        return Err(invalid("checksum field past the end of the packet"));
    }
    let sum = !checksum::fold(checksum::sum(&packet[start..]));
    packet[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::gro::checksum_valid;
    use crate::wire::ipv4::{test_tcp_segment, Ipv4Packet};
    use crate::wire::virtio::GSO_TCPV4;

    /// A TCP/IPv4 packet with `payload` bytes and the pseudo-header sum in its checksum field,
    /// as TUN hands out a CHECKSUM_PARTIAL packet.
    fn partial_tcp(payload: usize) -> Vec<u8> {
        let bytes: Vec<u8> = (0..payload).map(|i| i as u8).collect();
        let mut p = test_tcp_segment(0, &bytes, 0x10);
        let pseudo = checksum::sum(&p[12..20]) + 6 + (p.len() as u32 - 20);
        p[36..38].copy_from_slice(&checksum::fold(pseudo).to_be_bytes());
        p
    }

    #[test]
    fn plain_partial_packet_gets_its_checksum() {
        let packet = partial_tcp(100);
        let hdr = tcp_super_header(&packet, GSO_NONE, 0).unwrap();
        let (mut slots, mut sizes) = (vec![vec![0u8; 1500]; 2], [0; 2]);
        let mut p = packet.clone();
        assert_eq!(split(hdr, &mut p, &mut slots, &mut sizes).unwrap(), 1);
        assert!(checksum_valid(&slots[0][..sizes[0]]));
    }

    #[test]
    fn super_packet_splits_into_valid_segments() {
        let packet = partial_tcp(3000);
        let hdr = tcp_super_header(&packet, GSO_TCPV4, 1400).unwrap();
        assert!(is_tcp_super_packet(&hdr, &packet));
        let (mut slots, mut sizes) = (vec![vec![0u8; 1500]; 4], [0; 4]);
        let mut p = packet.clone();
        assert_eq!(split(hdr, &mut p, &mut slots, &mut sizes).unwrap(), 3);
        assert_eq!(sizes[..3], [1440, 1440, 240]);
        let mut payload = Vec::new();
        for (slot, &len) in slots.iter().zip(&sizes[..3]) {
            let seg = &slot[..len];
            assert!(checksum_valid(seg));
            assert!(Ipv4Packet::new_checked(seg).unwrap().verify_checksum());
            payload.extend_from_slice(&seg[40..]);
        }
        assert_eq!(payload, packet[40..]);
    }

    #[test]
    fn broken_frames_are_errors_not_panics() {
        let packet = partial_tcp(3000);
        let hdr = tcp_super_header(&packet, GSO_TCPV4, 1400).unwrap();
        let (mut slots, mut sizes) = (vec![vec![0u8; 1500]; 4], [0; 4]);
        assert!(
            header(&[0; 10]).is_err(),
            "a frame no longer than its header"
        );
        assert!(split(hdr, &mut [], &mut slots, &mut sizes).is_err());
        assert!(split(hdr, &mut packet[..30].to_vec(), &mut slots, &mut sizes).is_err());
        let too_many = VirtioNetHdr {
            gso_size: 100,
            ..hdr
        };
        assert!(split(too_many, &mut packet.clone(), &mut slots, &mut sizes).is_err());
        let bad_offset = VirtioNetHdr {
            gso_type: GSO_NONE,
            csum_offset: 5000,
            ..hdr
        };
        assert!(split(bad_offset, &mut packet.clone(), &mut slots, &mut sizes).is_err());
    }

    #[test]
    fn only_partial_tcp_super_packets_travel_whole() {
        let packet = partial_tcp(3000);
        let hdr = tcp_super_header(&packet, GSO_TCPV4, 1400).unwrap();
        assert!(!is_tcp_super_packet(
            &VirtioNetHdr { flags: 0, ..hdr },
            &packet
        ));
        assert!(!is_tcp_super_packet(
            &VirtioNetHdr {
                gso_type: GSO_UDP_L4,
                ..hdr
            },
            &packet
        ));
        assert!(!is_tcp_super_packet(&hdr, &packet[..30]));
    }

    #[test]
    fn an_ipv6_tcp_super_packet_travels_whole_only_as_tcpv6() {
        use crate::wire::ipv6::test_tcp_segment6;
        use crate::wire::virtio::GSO_TCPV6;
        let packet = test_tcp_segment6(0, &[5; 3000], 0x10);
        let hdr = tcp_super_header(&packet, GSO_TCPV6, 1400).unwrap();
        assert_eq!((hdr.csum_start, hdr.hdr_len), (40, 60));
        assert!(is_tcp_super_packet(&hdr, &packet));
        assert!(tcp_super_header(&packet, GSO_TCPV4, 1400).is_none());
        let as_v4 = VirtioNetHdr {
            gso_type: GSO_TCPV4,
            ..hdr
        };
        assert!(!is_tcp_super_packet(&as_v4, &packet));
        let v4 = partial_tcp(3000);
        assert!(tcp_super_header(&v4, GSO_TCPV6, 1400).is_none());
    }
}
