//! Coalescing before TUN writes: consecutive segments of one TCP (over IPv4 or IPv6) or UDP
//! (over IPv4) flow become one super-packet that the kernel takes in one write (virtio-net GSO,
//! USO for UDP), as a NIC's GRO would.
//!
//! tun-rs has a GRO too, but it copies every packet to the heap before looking at it and needs
//! each packet in a buffer of its own. Here a packet is copied once, straight into the
//! super-packet it joins, and nothing is allocated after start-up. Only consecutive segments
//! merge: the engines deliver a peer's GRO train in order, and a train is one flow.

mod segment;

pub(crate) use segment::checksum_valid;
use segment::{finish_super_packet, same_tcp_flow, Family, Flow, Segment, Transport, TCP_PSH};
use tun_rs::VIRTIO_NET_HDR_LEN;

/// A super-packet is one IP packet: at most 64 KB.
const MAX_PACKET: usize = 65535;
/// The kernel refuses (EINVAL) a UDP GSO write of more segments than its UDP_MAX_SEGMENTS:
/// 128 on this project's 6.18 kernel (measured), 64 on older ones. 64-byte datagrams would
/// reach that long before 64 KB.
const MAX_UDP_SEGMENTS: usize = 64;

/// Buffers of virtio header + packet, ready to write, with the last one open for merging.
pub struct Coalescer {
    slots: Vec<Vec<u8>>,
    len: usize,
    open: Option<Open>,
    merge: Merge,
}

/// Which transports a coalescer merges. TCP needs a TUN with virtio-net headers; UDP also needs
/// the kernel's USO (Linux 6.2), as an older kernel refuses UDP GSO writes.
#[derive(Debug, Clone, Copy)]
pub struct Merge {
    pub tcp: bool,
    pub udp: bool,
}

/// The super-packet being built in the last slot.
#[derive(Debug, Clone, Copy)]
struct Open {
    family: Family,
    flow: Flow,
    headers: usize,
    gso_size: usize,
    segments: usize,
    /// The first segment's checksum was checked (done when the second one arrives).
    first_verified: bool,
    /// A short (or TCP PSH) segment ended it.
    closed: bool,
}

impl Coalescer {
    pub fn new(slots: usize, merge: Merge) -> Coalescer {
        Coalescer {
            slots: (0..slots)
                .map(|_| Vec::with_capacity(VIRTIO_NET_HDR_LEN + MAX_PACKET))
                .collect(),
            len: 0,
            open: None,
            merge,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn is_full(&self) -> bool {
        self.len == self.slots.len()
    }

    /// Add a packet, merging it into the previous one where it may; the caller keeps
    /// [`Coalescer::is_full`] false before calling.
    pub fn push(&mut self, packet: &[u8]) {
        let segment = Segment::parse(packet).filter(|s| match s.transport {
            Transport::Tcp { .. } => self.merge.tcp,
            Transport::Udp => self.merge.udp,
        });
        if let Some(seg) = &segment {
            if self.try_merge(seg, packet) {
                return;
            }
        }
        self.start(packet, segment);
    }

    fn start(&mut self, packet: &[u8], segment: Option<Segment>) {
        self.close();
        let slot = &mut self.slots[self.len];
        slot.clear();
        slot.resize(VIRTIO_NET_HDR_LEN, 0);
        slot.extend_from_slice(packet);
        self.len += 1;
        self.open = segment.map(|s| Open {
            family: s.family,
            flow: s.flow_after(),
            headers: s.headers,
            gso_size: s.payload,
            segments: 1,
            first_verified: false,
            closed: s.ends_train(),
        });
    }

    fn try_merge(&mut self, seg: &Segment, packet: &[u8]) -> bool {
        let Some(open) = self.open.as_mut() else {
            return false;
        };
        let slot = &mut self.slots[self.len - 1];
        let head = &slot[VIRTIO_NET_HDR_LEN..];
        if open.closed
            || seg.family != open.family
            || seg.headers != open.headers
            || seg.payload > open.gso_size
            || head.len() + seg.payload > MAX_PACKET
            || !continues(open, seg, head, packet)
        {
            return false;
        }
        // A merged super-packet gets a fresh checksum from the kernel, so a corrupt segment
        // must be kept out here, where its own checksum still tells.
        if (!open.first_verified && !checksum_valid(head)) || !checksum_valid(packet) {
            open.closed = true;
            return false;
        }
        open.first_verified = true;
        slot.extend_from_slice(&packet[seg.headers..seg.ip_len]);
        if seg.ends_train() {
            slot[VIRTIO_NET_HDR_LEN + seg.family.header_len() + 13] |= TCP_PSH;
        }
        open.flow = seg.flow_after();
        open.segments += 1;
        open.closed = seg.ends_train() || seg.payload < open.gso_size;
        true
    }

    /// Seal the super-packet in the last slot, if one is being built.
    fn close(&mut self) {
        if let Some(open) = self.open.take() {
            if open.segments > 1 {
                let (hdr_room, packet) = self.slots[self.len - 1].split_at_mut(VIRTIO_NET_HDR_LEN);
                let hdr = finish_super_packet(packet, open.family, open.flow, open.gso_size as u16);
                hdr.encode(hdr_room).expect("a virtio header fits its slot");
            }
        }
    }

    /// The buffers to write, each with its virtio header filled in; empties the coalescer.
    pub fn drain(&mut self) -> impl Iterator<Item = &[u8]> {
        self.close();
        let len = std::mem::take(&mut self.len);
        self.slots[..len].iter().map(Vec::as_slice)
    }
}

/// Whether `seg` (the bytes `packet`) continues the super-packet `head` of `open`.
fn continues(open: &Open, seg: &Segment, head: &[u8], packet: &[u8]) -> bool {
    match (open.flow, seg.transport) {
        (Flow::Tcp { next_seq }, Transport::Tcp { seq, .. }) => {
            seq == next_seq && same_tcp_flow(open.family, head, packet, seg.headers)
        }
        (Flow::Udp, Transport::Udp) => {
            open.segments < MAX_UDP_SEGMENTS && open.family.same_ip_and_ports(head, packet)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::segment::TCP_ACK;
    use super::*;
    use crate::io::gso;
    use crate::wire::ipv4::{test_tcp_segment, test_udp_datagram};
    use crate::wire::ipv6::test_tcp_segment6;
    use crate::wire::virtio::{GSO_TCPV4, GSO_TCPV6, GSO_UDP_L4};
    use tun_rs::VirtioNetHdr;

    const ALL: Merge = Merge {
        tcp: true,
        udp: true,
    };

    fn drained(c: &mut Coalescer) -> Vec<Vec<u8>> {
        c.drain().map(<[u8]>::to_vec).collect()
    }

    #[test]
    fn in_order_segments_become_one_gso_packet() {
        let mut c = Coalescer::new(4, ALL);
        let payloads: [&[u8]; 3] = [&[1; 100], &[2; 100], &[3; 40]];
        let mut seq = 1000;
        for p in payloads {
            c.push(&test_tcp_segment(seq, p, TCP_ACK));
            seq += p.len() as u32;
        }
        let out = drained(&mut c);
        assert_eq!(out.len(), 1);
        let hdr = VirtioNetHdr::decode(&out[0][..VIRTIO_NET_HDR_LEN]).unwrap();
        assert_eq!((hdr.gso_type, hdr.gso_size, hdr.hdr_len), (1, 100, 40));
        assert_eq!((hdr.flags, hdr.csum_start, hdr.csum_offset), (1, 20, 16));
        let packet = &out[0][VIRTIO_NET_HDR_LEN..];
        assert_eq!(packet.len(), 40 + 240);
        assert_eq!(usize::from(u16::from_be_bytes([packet[2], packet[3]])), 280);
        assert_eq!(tun_rs::checksum(&packet[..20], 0), 0xffff);
        assert_eq!(&packet[40..140], &[1; 100]);
        assert_eq!(&packet[240..], &[3; 40]);
        assert!(c.is_empty());
    }

    #[test]
    fn a_gap_psh_or_other_flow_starts_a_new_packet() {
        let mut c = Coalescer::new(8, ALL);
        c.push(&test_tcp_segment(0, &[0; 50], TCP_ACK | TCP_PSH));
        c.push(&test_tcp_segment(50, &[0; 50], TCP_ACK));
        c.push(&test_tcp_segment(999, &[0; 50], TCP_ACK));
        let mut other = test_tcp_segment(1049, &[0; 50], TCP_ACK);
        other[22..24].copy_from_slice(&81u16.to_be_bytes());
        c.push(&other);
        c.push(&test_tcp_segment(2000, &[], TCP_ACK));
        let out = drained(&mut c);
        assert_eq!(out.len(), 5);
        for slot in &out {
            let hdr = VirtioNetHdr::decode(&slot[..VIRTIO_NET_HDR_LEN]).unwrap();
            assert_eq!(hdr.gso_type, 0, "nothing merged, so no GSO");
        }
    }

    #[test]
    fn a_segment_with_a_bad_checksum_is_not_merged() {
        let mut c = Coalescer::new(4, ALL);
        c.push(&test_tcp_segment(0, &[7; 64], TCP_ACK));
        let mut bad = test_tcp_segment(64, &[7; 64], TCP_ACK);
        bad[60] ^= 0xff;
        c.push(&bad);
        let out = drained(&mut c);
        assert_eq!(out.len(), 2);
        assert_eq!(&out[1][VIRTIO_NET_HDR_LEN..], &bad[..]);
    }

    #[test]
    fn every_super_packet_is_sealed_not_only_the_last() {
        let mut c = Coalescer::new(4, ALL);
        c.push(&test_tcp_segment(0, &[1; 50], TCP_ACK));
        c.push(&test_tcp_segment(50, &[1; 50], TCP_ACK | TCP_PSH));
        c.push(&test_tcp_segment(100, &[2; 50], TCP_ACK));
        c.push(&test_tcp_segment(150, &[2; 50], TCP_ACK));
        for slot in drained(&mut c) {
            let hdr = VirtioNetHdr::decode(&slot[..VIRTIO_NET_HDR_LEN]).unwrap();
            let packet = &slot[VIRTIO_NET_HDR_LEN..];
            assert_eq!(hdr.gso_type, GSO_TCPV4);
            assert_eq!(usize::from(u16::from_be_bytes([packet[2], packet[3]])), 140);
        }
    }

    #[test]
    fn longer_segment_ends_the_train() {
        let mut c = Coalescer::new(4, ALL);
        c.push(&test_tcp_segment(0, &[0; 50], TCP_ACK));
        c.push(&test_tcp_segment(50, &[0; 60], TCP_ACK));
        assert_eq!(drained(&mut c).len(), 2);
    }

    #[test]
    fn udp_datagrams_of_one_flow_become_one_uso_packet() {
        let mut c = Coalescer::new(4, ALL);
        for fill in [1, 2] {
            c.push(&test_udp_datagram(4000, &[fill; 64]));
        }
        c.push(&test_udp_datagram(4000, &[3; 10]));
        let out = drained(&mut c);
        assert_eq!(out.len(), 1);
        let hdr = VirtioNetHdr::decode(&out[0][..VIRTIO_NET_HDR_LEN]).unwrap();
        assert_eq!(
            (hdr.gso_type, hdr.gso_size, hdr.hdr_len),
            (GSO_UDP_L4, 64, 28)
        );
        assert_eq!((hdr.flags, hdr.csum_start, hdr.csum_offset), (1, 20, 6));
        let packet = &out[0][VIRTIO_NET_HDR_LEN..];
        assert_eq!(packet.len(), 28 + 138);
        assert_eq!(u16::from_be_bytes([packet[2], packet[3]]), 166);
        assert_eq!(
            u16::from_be_bytes([packet[24], packet[25]]),
            146,
            "UDP length"
        );
        assert_eq!(tun_rs::checksum(&packet[..20], 0), 0xffff);
        assert_eq!(&packet[28..92], &[1; 64]);
        assert_eq!(&packet[156..], &[3; 10]);
    }

    #[test]
    fn uso_packets_stay_within_the_kernels_segment_limit() {
        let mut c = Coalescer::new(8, ALL);
        for _ in 0..MAX_UDP_SEGMENTS * 2 + 1 {
            c.push(&test_udp_datagram(4000, &[0; 16]));
        }
        let segments: Vec<usize> = drained(&mut c)
            .iter()
            .map(|slot| (slot.len() - VIRTIO_NET_HDR_LEN - 28) / 16)
            .collect();
        assert_eq!(segments, [MAX_UDP_SEGMENTS, MAX_UDP_SEGMENTS, 1]);
    }

    #[test]
    fn udp_of_another_flow_a_bad_checksum_or_tcp_is_not_merged() {
        let mut c = Coalescer::new(8, ALL);
        c.push(&test_udp_datagram(4000, &[0; 32]));
        c.push(&test_udp_datagram(4001, &[0; 32]));
        let mut bad = test_udp_datagram(4001, &[0; 32]);
        bad[40] ^= 1;
        c.push(&bad);
        c.push(&test_tcp_segment(0, &[0; 32], TCP_ACK));
        let out = drained(&mut c);
        assert_eq!(out.len(), 4);
        assert_eq!(&out[2][VIRTIO_NET_HDR_LEN..], &bad[..]);
    }

    #[test]
    fn udp_without_a_checksum_merges_and_a_longer_datagram_ends_the_train() {
        let mut c = Coalescer::new(4, ALL);
        for len in [32, 32, 48] {
            let mut datagram = test_udp_datagram(4000, &vec![5; len]);
            datagram[26..28].fill(0);
            c.push(&datagram);
        }
        let out = drained(&mut c);
        assert_eq!(out.len(), 2);
        let hdr = VirtioNetHdr::decode(&out[0][..VIRTIO_NET_HDR_LEN]).unwrap();
        assert_eq!((hdr.gso_type, hdr.gso_size), (GSO_UDP_L4, 32));
    }

    #[test]
    fn without_uso_udp_is_written_as_it_came_and_tcp_still_merges() {
        let mut c = Coalescer::new(
            8,
            Merge {
                tcp: true,
                udp: false,
            },
        );
        for _ in 0..3 {
            c.push(&test_udp_datagram(4000, &[0; 32]));
        }
        c.push(&test_tcp_segment(0, &[1; 50], TCP_ACK));
        c.push(&test_tcp_segment(50, &[1; 50], TCP_ACK));
        let gso_types: Vec<u8> = drained(&mut c)
            .iter()
            .map(|slot| {
                VirtioNetHdr::decode(&slot[..VIRTIO_NET_HDR_LEN])
                    .unwrap()
                    .gso_type
            })
            .collect();
        assert_eq!(gso_types, [0, 0, 0, GSO_TCPV4]);
    }

    #[test]
    fn a_tcp_header_longer_than_its_packet_is_written_as_it_came() {
        let mut c = Coalescer::new(4, ALL);
        let mut short = test_tcp_segment(0, &[], TCP_ACK);
        short[32] = 15 << 4;
        c.push(&short);
        c.push(&short);
        assert_eq!(drained(&mut c).len(), 2);
    }

    #[test]
    fn ipv6_tcp_segments_become_one_tcpv6_gso_packet_that_splits_back() {
        let mut c = Coalescer::new(4, ALL);
        let mut originals = Vec::new();
        let mut seq = 7;
        for fill in [1u8, 2, 3] {
            let len = if fill == 3 { 40 } else { 100 };
            originals.push(test_tcp_segment6(seq, &vec![fill; len], TCP_ACK));
            seq += len as u32;
        }
        for segment in &originals {
            c.push(segment);
        }
        let mut out = drained(&mut c);
        assert_eq!(out.len(), 1);
        let hdr = VirtioNetHdr::decode(&out[0][..VIRTIO_NET_HDR_LEN]).unwrap();
        assert_eq!(
            (hdr.gso_type, hdr.gso_size, hdr.hdr_len),
            (GSO_TCPV6, 100, 60)
        );
        assert_eq!((hdr.csum_start, hdr.csum_offset), (40, 16));
        let packet = &mut out[0][VIRTIO_NET_HDR_LEN..];
        assert_eq!(packet.len(), 60 + 240);
        assert_eq!(
            u16::from_be_bytes([packet[4], packet[5]]),
            260,
            "payload length"
        );
        let (mut slots, mut sizes) = (vec![vec![0u8; 200]; 4], [0; 4]);
        assert_eq!(gso::split(hdr, packet, &mut slots, &mut sizes).unwrap(), 3);
        for (i, original) in originals.iter().enumerate() {
            assert_eq!(&slots[i][..sizes[i]], &original[..], "segment {i}");
        }
    }

    #[test]
    fn families_never_merge_and_ipv6_udp_is_written_as_it_came() {
        let mut c = Coalescer::new(8, ALL);
        c.push(&test_tcp_segment6(0, &[1; 50], TCP_ACK));
        c.push(&test_tcp_segment(50, &[1; 50], TCP_ACK));
        let udp6 = crate::wire::ipv6::test_packet(40, 64, 0);
        c.push(&udp6);
        c.push(&udp6);
        let mut bad = test_tcp_segment6(100, &[1; 50], TCP_ACK);
        c.push(&test_tcp_segment6(50, &[1; 50], TCP_ACK));
        bad[70] ^= 1;
        c.push(&bad);
        assert_eq!(drained(&mut c).len(), 6, "nothing merged");
    }
}
