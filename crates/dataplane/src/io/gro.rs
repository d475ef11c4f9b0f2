//! TCP coalescing before TUN writes: consecutive in-order segments of one flow become one
//! super-packet that the kernel takes in one write (virtio-net GSO), as a NIC's GRO would.
//!
//! tun-rs has a GRO too, but it copies every packet to the heap before looking at it and needs
//! each packet in a buffer of its own. Here a packet is copied once, straight into the
//! super-packet it joins, and nothing is allocated after start-up. Only consecutive segments
//! merge: the engines deliver a peer's GRO train in order, and a train is one flow.

use super::gso::tcp_super_header;
use crate::wire::virtio::GSO_TCPV4;
use tun_rs::VIRTIO_NET_HDR_LEN;

/// A super-packet is one IPv4 packet: at most 64 KB.
const MAX_PACKET: usize = 65535;
const TCP_ACK: u8 = 0x10;
const TCP_PSH: u8 = 0x08;

/// Buffers of virtio header + packet, ready to write, with the last one open for merging.
pub struct Coalescer {
    slots: Vec<Vec<u8>>,
    len: usize,
    open: Option<Open>,
}

/// The super-packet being built in the last slot.
#[derive(Debug, Clone, Copy)]
struct Open {
    headers: usize,
    gso_size: usize,
    next_seq: u32,
    segments: usize,
    /// The first segment's checksum was checked (done when the second one arrives).
    first_verified: bool,
    /// A short or PSH segment ended it.
    closed: bool,
}

/// The fields of a segment that decide whether it may join a super-packet.
struct Segment {
    ip_len: usize,
    headers: usize,
    seq: u32,
    payload: usize,
    psh: bool,
}

impl Segment {
    /// A plain in-order data segment: IPv4 without options or fragments, TCP with only ACK (and
    /// maybe PSH) set, and a payload. Anything else is written as it is.
    fn parse(p: &[u8]) -> Option<Segment> {
        if p.len() < 40 || p[0] != 0x45 || p[9] != 6 || p[6] & 0x3f != 0 || p[7] != 0 {
            return None;
        }
        let ip_len = usize::from(u16::from_be_bytes([p[2], p[3]]));
        let headers = 20 + usize::from(p[32] >> 4) * 4;
        let flags = p[33];
        if ip_len != p.len() || headers < 40 || headers >= ip_len {
            return None;
        }
        if flags != TCP_ACK && flags != TCP_ACK | TCP_PSH {
            return None;
        }
        Some(Segment {
            ip_len,
            headers,
            seq: u32::from_be_bytes([p[24], p[25], p[26], p[27]]),
            payload: ip_len - headers,
            psh: flags & TCP_PSH != 0,
        })
    }
}

impl Coalescer {
    pub fn new(slots: usize) -> Coalescer {
        Coalescer {
            slots: (0..slots)
                .map(|_| Vec::with_capacity(VIRTIO_NET_HDR_LEN + MAX_PACKET))
                .collect(),
            len: 0,
            open: None,
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

    /// Add a packet, merging it into the previous one where it may when `merge` is set; the
    /// caller keeps [`Coalescer::is_full`] false before calling.
    pub fn push(&mut self, packet: &[u8], merge: bool) {
        let segment = Segment::parse(packet).filter(|_| merge);
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
            headers: s.headers,
            gso_size: s.payload,
            next_seq: s.seq.wrapping_add(s.payload as u32),
            segments: 1,
            first_verified: false,
            closed: s.psh,
        });
    }

    fn try_merge(&mut self, seg: &Segment, packet: &[u8]) -> bool {
        let Some(open) = self.open.as_mut() else {
            return false;
        };
        let slot = &mut self.slots[self.len - 1];
        let head = &slot[VIRTIO_NET_HDR_LEN..];
        let fits = !open.closed
            && seg.headers == open.headers
            && seg.seq == open.next_seq
            && seg.payload <= open.gso_size
            && head.len() + seg.payload <= MAX_PACKET
            && same_flow(head, packet, seg.headers);
        if !fits {
            return false;
        }
        // A merged super-packet gets a fresh checksum from the kernel, so a corrupt segment
        // must be kept out here, where its own checksum still tells.
        if (!open.first_verified && !tcp_checksum_valid(head)) || !tcp_checksum_valid(packet) {
            open.closed = true;
            return false;
        }
        open.first_verified = true;
        slot.extend_from_slice(&packet[seg.headers..seg.ip_len]);
        if seg.psh {
            slot[VIRTIO_NET_HDR_LEN + 33] |= TCP_PSH;
        }
        open.next_seq = open.next_seq.wrapping_add(seg.payload as u32);
        open.segments += 1;
        open.closed = seg.psh || seg.payload < open.gso_size;
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

/// Same addresses, ports, TOS, DF, TTL, ack, window and TCP options: what the kernel's GRO
/// requires too, so the super-packet says what each segment said.
fn same_flow(a: &[u8], b: &[u8], headers: usize) -> bool {
    a[1] == b[1]
        && a[6] == b[6]
        && a[8] == b[8]
        && a[12..20] == b[12..20]
        && a[20..24] == b[20..24]
        && a[28..32] == b[28..32]
        && a[34..36] == b[34..36]
        && a[40..headers] == b[40..headers]
}

/// Whether the TCP checksum of `packet` (IPv4 with a 20-byte header) verifies.
pub(crate) fn tcp_checksum_valid(packet: &[u8]) -> bool {
    let tcp_len = packet.len() - 20;
    tun_rs::checksum(&packet[20..], pseudo_header_sum(packet, tcp_len)) == 0xffff
}

fn pseudo_header_sum(packet: &[u8], tcp_len: usize) -> u64 {
    let word = |i: usize| u64::from(u16::from_be_bytes([packet[i], packet[i + 1]]));
    word(12) + word(14) + word(16) + word(18) + 6 + tcp_len as u64
}

/// Fix the IPv4 header of the merged packet and hand the TCP checksum to the kernel: the field
/// holds the pseudo-header sum, as `CHECKSUM_PARTIAL` wants.
fn finish_super_packet(slot: &mut [u8], open: &Open) {
    let packet = &mut slot[VIRTIO_NET_HDR_LEN..];
    let total = packet.len();
    packet[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    packet[10..12].fill(0);
    let ip_sum = !tun_rs::checksum(&packet[..20], 0);
    packet[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    let pseudo = tun_rs::checksum(&[], pseudo_header_sum(packet, total - 20));
    packet[36..38].copy_from_slice(&pseudo.to_be_bytes());
    tcp_super_header(packet, GSO_TCPV4, open.gso_size as u16)
        .expect("a merged packet has a whole TCP header")
        .encode(&mut slot[..VIRTIO_NET_HDR_LEN])
        .expect("a virtio header fits its slot");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipv4::test_tcp_segment;
    use tun_rs::VirtioNetHdr;

    fn drained(c: &mut Coalescer) -> Vec<Vec<u8>> {
        c.drain().map(<[u8]>::to_vec).collect()
    }

    #[test]
    fn in_order_segments_become_one_gso_packet() {
        let mut c = Coalescer::new(4);
        let payloads: [&[u8]; 3] = [&[1; 100], &[2; 100], &[3; 40]];
        let mut seq = 1000;
        for p in payloads {
            c.push(&test_tcp_segment(seq, p, TCP_ACK), true);
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
        let mut c = Coalescer::new(8);
        c.push(&test_tcp_segment(0, &[0; 50], TCP_ACK | TCP_PSH), true);
        c.push(&test_tcp_segment(50, &[0; 50], TCP_ACK), true);
        c.push(&test_tcp_segment(999, &[0; 50], TCP_ACK), true);
        let mut other = test_tcp_segment(1049, &[0; 50], TCP_ACK);
        other[22..24].copy_from_slice(&81u16.to_be_bytes());
        c.push(&other, true);
        c.push(&test_tcp_segment(2000, &[], TCP_ACK), true);
        let out = drained(&mut c);
        assert_eq!(out.len(), 5);
        for slot in &out {
            let hdr = VirtioNetHdr::decode(&slot[..VIRTIO_NET_HDR_LEN]).unwrap();
            assert_eq!(hdr.gso_type, 0, "nothing merged, so no GSO");
        }
    }

    #[test]
    fn a_segment_with_a_bad_checksum_is_not_merged() {
        let mut c = Coalescer::new(4);
        c.push(&test_tcp_segment(0, &[7; 64], TCP_ACK), true);
        let mut bad = test_tcp_segment(64, &[7; 64], TCP_ACK);
        bad[60] ^= 0xff;
        c.push(&bad, true);
        let out = drained(&mut c);
        assert_eq!(out.len(), 2);
        assert_eq!(&out[1][VIRTIO_NET_HDR_LEN..], &bad[..]);
    }

    #[test]
    fn every_super_packet_is_sealed_not_only_the_last() {
        let mut c = Coalescer::new(4);
        c.push(&test_tcp_segment(0, &[1; 50], TCP_ACK), true);
        c.push(&test_tcp_segment(50, &[1; 50], TCP_ACK | TCP_PSH), true);
        c.push(&test_tcp_segment(100, &[2; 50], TCP_ACK), true);
        c.push(&test_tcp_segment(150, &[2; 50], TCP_ACK), true);
        for slot in drained(&mut c) {
            let hdr = VirtioNetHdr::decode(&slot[..VIRTIO_NET_HDR_LEN]).unwrap();
            let packet = &slot[VIRTIO_NET_HDR_LEN..];
            assert_eq!(hdr.gso_type, GSO_TCPV4);
            assert_eq!(usize::from(u16::from_be_bytes([packet[2], packet[3]])), 140);
        }
    }

    #[test]
    fn longer_segment_ends_the_train() {
        let mut c = Coalescer::new(4);
        c.push(&test_tcp_segment(0, &[0; 50], TCP_ACK), true);
        c.push(&test_tcp_segment(50, &[0; 60], TCP_ACK), true);
        assert_eq!(drained(&mut c).len(), 2);
    }
}
