//! Coalescing before TUN writes: consecutive segments of one TCP or UDP flow become one
//! super-packet that the kernel takes in one write (virtio-net GSO, USO for UDP), as a NIC's
//! GRO would.
//!
//! tun-rs has a GRO too, but it copies every packet to the heap before looking at it and needs
//! each packet in a buffer of its own. Here a packet is copied once, straight into the
//! super-packet it joins, and nothing is allocated after start-up. Only consecutive segments
//! merge: the engines deliver a peer's GRO train in order, and a train is one flow.

use super::gso::tcp_super_header;
use crate::wire::ipv4::{PROTO_TCP, PROTO_UDP};
use crate::wire::virtio::{GSO_TCPV4, GSO_UDP_L4, NEEDS_CSUM};
use tun_rs::{VirtioNetHdr, VIRTIO_NET_HDR_LEN};

/// A super-packet is one IPv4 packet: at most 64 KB.
const MAX_PACKET: usize = 65535;
/// The kernel refuses (EINVAL) a UDP GSO write of more segments than its UDP_MAX_SEGMENTS:
/// 128 on this project's 6.18 kernel (measured), 64 on older ones. 64-byte datagrams would
/// reach that long before 64 KB.
const MAX_UDP_SEGMENTS: usize = 64;
const TCP_ACK: u8 = 0x10;
const TCP_PSH: u8 = 0x08;
const UDP_HEADER: usize = 8;
const UDP_CHECKSUM_OFFSET: usize = 6;

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
    flow: Flow,
    headers: usize,
    gso_size: usize,
    segments: usize,
    /// The first segment's checksum was checked (done when the second one arrives).
    first_verified: bool,
    /// A short (or TCP PSH) segment ended it.
    closed: bool,
}

/// What a super-packet's next segment must continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Tcp { next_seq: u32 },
    Udp,
}

/// The fields of a segment that decide whether it may join a super-packet.
struct Segment {
    ip_len: usize,
    headers: usize,
    payload: usize,
    transport: Transport,
}

#[derive(Clone, Copy)]
enum Transport {
    Tcp { seq: u32, psh: bool },
    Udp,
}

impl Segment {
    /// A plain data segment: IPv4 without options or fragments, and either TCP with only ACK
    /// (and maybe PSH) set or UDP, with a payload. Anything else is written as it is.
    fn parse(p: &[u8]) -> Option<Segment> {
        if p.len() < 20 + UDP_HEADER || p[0] != 0x45 || p[6] & 0x3f != 0 || p[7] != 0 {
            return None;
        }
        let ip_len = usize::from(u16::from_be_bytes([p[2], p[3]]));
        if ip_len != p.len() {
            return None;
        }
        let (headers, transport) = match p[9] {
            PROTO_TCP => Self::tcp(p)?,
            PROTO_UDP => Self::udp(p)?,
            _ => return None,
        };
        (headers < ip_len).then(|| Segment {
            ip_len,
            headers,
            payload: ip_len - headers,
            transport,
        })
    }

    fn tcp(p: &[u8]) -> Option<(usize, Transport)> {
        let headers = 20 + usize::from(*p.get(32)? >> 4) * 4;
        let flags = *p.get(33)?;
        if headers < 40 || (flags != TCP_ACK && flags != TCP_ACK | TCP_PSH) {
            return None;
        }
        let seq = u32::from_be_bytes([p[24], p[25], p[26], p[27]]);
        let psh = flags & TCP_PSH != 0;
        Some((headers, Transport::Tcp { seq, psh }))
    }

    fn udp(p: &[u8]) -> Option<(usize, Transport)> {
        let udp_len = usize::from(u16::from_be_bytes([p[24], p[25]]));
        (udp_len == p.len() - 20).then_some((20 + UDP_HEADER, Transport::Udp))
    }

    /// What the next segment must continue for this one to be followed.
    fn flow_after(&self) -> Flow {
        match self.transport {
            Transport::Tcp { seq, .. } => Flow::Tcp {
                next_seq: seq.wrapping_add(self.payload as u32),
            },
            Transport::Udp => Flow::Udp,
        }
    }

    fn ends_train(&self) -> bool {
        matches!(self.transport, Transport::Tcp { psh: true, .. })
    }
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
            slot[VIRTIO_NET_HDR_LEN + 33] |= TCP_PSH;
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
                finish_super_packet(&mut self.slots[self.len - 1], &open);
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
            seq == next_seq && same_tcp_flow(head, packet, seg.headers)
        }
        (Flow::Udp, Transport::Udp) => {
            open.segments < MAX_UDP_SEGMENTS && same_ip_and_ports(head, packet)
        }
        _ => false,
    }
}

/// Same addresses, ports, TOS, DF and TTL: what the kernel's GRO requires too, so the
/// super-packet says what each segment said.
fn same_ip_and_ports(a: &[u8], b: &[u8]) -> bool {
    a[1] == b[1] && a[6] == b[6] && a[8] == b[8] && a[12..24] == b[12..24]
}

/// [`same_ip_and_ports`], and the same ack, window and TCP options.
fn same_tcp_flow(a: &[u8], b: &[u8], headers: usize) -> bool {
    same_ip_and_ports(a, b)
        && a[28..32] == b[28..32]
        && a[34..36] == b[34..36]
        && a[40..headers] == b[40..headers]
}

/// Whether the TCP or UDP checksum of `packet` (IPv4 with a 20-byte header) verifies; a UDP
/// checksum of zero means the sender sent none.
pub(crate) fn checksum_valid(packet: &[u8]) -> bool {
    let protocol = packet[9];
    if protocol == PROTO_UDP && packet[26..28] == [0, 0] {
        return true;
    }
    let len = packet.len() - 20;
    tun_rs::checksum(&packet[20..], pseudo_header_sum(packet, len)) == 0xffff
}

fn pseudo_header_sum(packet: &[u8], transport_len: usize) -> u64 {
    let word = |i: usize| u64::from(u16::from_be_bytes([packet[i], packet[i + 1]]));
    word(12) + word(14) + word(16) + word(18) + u64::from(packet[9]) + transport_len as u64
}

/// Fix the IPv4 (and UDP) lengths of the merged packet and hand the transport checksum to the
/// kernel: the field holds the pseudo-header sum, as `CHECKSUM_PARTIAL` wants.
fn finish_super_packet(slot: &mut [u8], open: &Open) {
    let packet = &mut slot[VIRTIO_NET_HDR_LEN..];
    let total = packet.len();
    packet[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    packet[10..12].fill(0);
    let ip_sum = !tun_rs::checksum(&packet[..20], 0);
    packet[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    let gso_size = open.gso_size as u16;
    let hdr = match open.flow {
        Flow::Tcp { .. } => tcp_super_header(packet, GSO_TCPV4, gso_size)
            .expect("a merged packet has a whole TCP header"),
        Flow::Udp => {
            packet[24..26].copy_from_slice(&((total - 20) as u16).to_be_bytes());
            udp_super_header(gso_size)
        }
    };
    let pseudo = tun_rs::checksum(&[], pseudo_header_sum(packet, total - 20));
    let at = usize::from(hdr.csum_start) + usize::from(hdr.csum_offset);
    packet[at..at + 2].copy_from_slice(&pseudo.to_be_bytes());
    hdr.encode(&mut slot[..VIRTIO_NET_HDR_LEN])
        .expect("a virtio header fits its slot");
}

/// The header that asks the kernel to cut a UDP/IPv4 super-packet into datagrams of
/// `gso_size` payload bytes, each with its own UDP header and checksum.
fn udp_super_header(gso_size: u16) -> VirtioNetHdr {
    VirtioNetHdr {
        flags: NEEDS_CSUM,
        gso_type: GSO_UDP_L4,
        hdr_len: (20 + UDP_HEADER) as u16,
        gso_size,
        csum_start: 20,
        csum_offset: UDP_CHECKSUM_OFFSET as u16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipv4::{test_tcp_segment, test_udp_datagram};

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
}
