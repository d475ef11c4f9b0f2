//! What the coalescer reads of a packet: its family's header, then its TCP or UDP header, and
//! what it writes when segments have merged: the lengths and the pseudo-header sum.

use crate::io::gso::tcp_super_header;
use crate::wire::ipv4::{PROTO_TCP, PROTO_UDP};
use crate::wire::virtio::{self, GSO_UDP_L4, NEEDS_CSUM};
use tun_rs::VirtioNetHdr;

pub(super) const TCP_ACK: u8 = 0x10;
pub(super) const TCP_PSH: u8 = 0x08;
const UDP_HEADER: usize = 8;
const UDP_CHECKSUM_OFFSET: usize = 6;

/// The IP family of a segment: where its fields lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Family {
    /// A 20-byte header (no options), not a fragment.
    V4,
    /// A 40-byte header whose next header is the transport (no extension headers).
    V6,
}

impl Family {
    fn of(p: &[u8]) -> Option<Family> {
        match p.first()? >> 4 {
            4 if p.len() >= 20 && p[0] == 0x45 && p[6] & 0x3f == 0 && p[7] == 0 => Some(Family::V4),
            6 if p.len() >= 40 => Some(Family::V6),
            _ => None,
        }
    }

    pub fn header_len(self) -> usize {
        match self {
            Family::V4 => 20,
            Family::V6 => 40,
        }
    }

    /// The packet's length as its header says.
    fn ip_len(self, p: &[u8]) -> usize {
        match self {
            Family::V4 => usize::from(u16::from_be_bytes([p[2], p[3]])),
            Family::V6 => 40 + usize::from(u16::from_be_bytes([p[4], p[5]])),
        }
    }

    fn protocol(self, p: &[u8]) -> u8 {
        match self {
            Family::V4 => p[9],
            Family::V6 => p[6],
        }
    }

    /// Same addresses and ports, and the same TOS, DF and TTL (IPv4) or traffic class, flow
    /// label and hop limit (IPv6): what the kernel's GRO requires too, so the super-packet says
    /// what each segment said.
    pub fn same_ip_and_ports(self, a: &[u8], b: &[u8]) -> bool {
        match self {
            Family::V4 => a[1] == b[1] && a[6] == b[6] && a[8] == b[8] && a[12..24] == b[12..24],
            Family::V6 => a[..4] == b[..4] && a[6..8] == b[6..8] && a[8..44] == b[8..44],
        }
    }

    /// The unfolded sum of the pseudo-header a transport checksum of `len` bytes covers.
    pub fn pseudo_header_sum(self, p: &[u8], len: usize) -> u64 {
        let words = |range: std::ops::Range<usize>| -> u64 {
            p[range]
                .chunks_exact(2)
                .map(|w| u64::from(u16::from_be_bytes([w[0], w[1]])))
                .sum()
        };
        let addresses = match self {
            Family::V4 => words(12..20),
            Family::V6 => words(8..40),
        };
        addresses + u64::from(self.protocol(p)) + len as u64
    }

    /// Make the header say the packet is `p.len()` bytes long (IPv4: and its checksum right).
    fn set_length(self, p: &mut [u8]) {
        let total = p.len();
        match self {
            Family::V4 => {
                p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
                p[10..12].fill(0);
                let ip_sum = !tun_rs::checksum(&p[..20], 0);
                p[10..12].copy_from_slice(&ip_sum.to_be_bytes());
            }
            Family::V6 => p[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes()),
        }
    }
}

/// The fields of a segment that decide whether it may join a super-packet.
pub(super) struct Segment {
    pub family: Family,
    pub ip_len: usize,
    pub headers: usize,
    pub payload: usize,
    pub transport: Transport,
}

#[derive(Clone, Copy)]
pub(super) enum Transport {
    Tcp { seq: u32, psh: bool },
    Udp,
}

/// What a super-packet's next segment must continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    Tcp { next_seq: u32 },
    Udp,
}

impl Segment {
    /// A plain data segment: IPv4 without options or fragments, or IPv6 without extension
    /// headers, and either TCP with only ACK (and maybe PSH) set or (IPv4 only) UDP, with a
    /// payload. Anything else is written as it is.
    pub fn parse(p: &[u8]) -> Option<Segment> {
        let family = Family::of(p)?;
        let l3 = family.header_len();
        let ip_len = family.ip_len(p);
        if ip_len != p.len() || p.len() < l3 + UDP_HEADER {
            return None;
        }
        let (headers, transport) = match (family.protocol(p), family) {
            (PROTO_TCP, _) => Self::tcp(p, l3)?,
            (PROTO_UDP, Family::V4) => Self::udp(p, l3)?,
            _ => return None,
        };
        (headers < ip_len).then(|| Segment {
            family,
            ip_len,
            headers,
            payload: ip_len - headers,
            transport,
        })
    }

    fn tcp(p: &[u8], l3: usize) -> Option<(usize, Transport)> {
        let headers = l3 + usize::from(*p.get(l3 + 12)? >> 4) * 4;
        let flags = *p.get(l3 + 13)?;
        if headers < l3 + 20 || (flags != TCP_ACK && flags != TCP_ACK | TCP_PSH) {
            return None;
        }
        let seq = u32::from_be_bytes([p[l3 + 4], p[l3 + 5], p[l3 + 6], p[l3 + 7]]);
        let psh = flags & TCP_PSH != 0;
        Some((headers, Transport::Tcp { seq, psh }))
    }

    fn udp(p: &[u8], l3: usize) -> Option<(usize, Transport)> {
        let udp_len = usize::from(u16::from_be_bytes([p[l3 + 4], p[l3 + 5]]));
        (udp_len == p.len() - l3).then_some((l3 + UDP_HEADER, Transport::Udp))
    }

    /// What the next segment must continue for this one to be followed.
    pub fn flow_after(&self) -> Flow {
        match self.transport {
            Transport::Tcp { seq, .. } => Flow::Tcp {
                next_seq: seq.wrapping_add(self.payload as u32),
            },
            Transport::Udp => Flow::Udp,
        }
    }

    pub fn ends_train(&self) -> bool {
        matches!(self.transport, Transport::Tcp { psh: true, .. })
    }
}

/// [`Family::same_ip_and_ports`], and the same ack, window and TCP options.
pub(super) fn same_tcp_flow(family: Family, a: &[u8], b: &[u8], headers: usize) -> bool {
    let l3 = family.header_len();
    family.same_ip_and_ports(a, b)
        && a[l3 + 8..l3 + 12] == b[l3 + 8..l3 + 12]
        && a[l3 + 14..l3 + 16] == b[l3 + 14..l3 + 16]
        && a[l3 + 20..headers] == b[l3 + 20..headers]
}

/// Whether the TCP or UDP checksum of `packet` (IPv4 with a 20-byte header, or IPv6 without
/// extension headers) verifies; an IPv4 UDP checksum of zero means the sender sent none.
pub(crate) fn checksum_valid(packet: &[u8]) -> bool {
    let Some(family) = Family::of(packet) else {
        return false;
    };
    let l3 = family.header_len();
    let protocol = family.protocol(packet);
    if family == Family::V4 && protocol == PROTO_UDP && packet[26..28] == [0, 0] {
        return true;
    }
    let len = packet.len() - l3;
    tun_rs::checksum(&packet[l3..], family.pseudo_header_sum(packet, len)) == 0xffff
}

/// Fix the IP (and UDP) lengths of the merged `packet` and hand the transport checksum to the
/// kernel: the field holds the pseudo-header sum, as `CHECKSUM_PARTIAL` wants. Returns the
/// virtio-net header to write it with.
pub(super) fn finish_super_packet(
    packet: &mut [u8],
    family: Family,
    flow: Flow,
    gso_size: u16,
) -> VirtioNetHdr {
    let (total, l3) = (packet.len(), family.header_len());
    family.set_length(packet);
    let hdr = match flow {
        Flow::Tcp { .. } => {
            let gso_type = virtio::tcp_gso_type(packet[0] >> 4).expect("IPv4 or IPv6");
            tcp_super_header(packet, gso_type, gso_size)
                .expect("a merged packet has a whole TCP header")
        }
        Flow::Udp => {
            packet[l3 + 4..l3 + 6].copy_from_slice(&((total - l3) as u16).to_be_bytes());
            udp_super_header(l3, gso_size)
        }
    };
    let pseudo = tun_rs::checksum(&[], family.pseudo_header_sum(packet, total - l3));
    let at = usize::from(hdr.csum_start) + usize::from(hdr.csum_offset);
    packet[at..at + 2].copy_from_slice(&pseudo.to_be_bytes());
    hdr
}

/// The header that asks the kernel to cut a UDP super-packet (IP header `l3` bytes) into
/// datagrams of `gso_size` payload bytes, each with its own UDP header and checksum.
fn udp_super_header(l3: usize, gso_size: u16) -> VirtioNetHdr {
    VirtioNetHdr {
        flags: NEEDS_CSUM,
        gso_type: GSO_UDP_L4,
        hdr_len: (l3 + UDP_HEADER) as u16,
        gso_size,
        csum_start: l3 as u16,
        csum_offset: UDP_CHECKSUM_OFFSET as u16,
    }
}
