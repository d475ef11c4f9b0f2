//! Mutations of the frames the programs take in, for random_frames: a frame cut, bits flipped,
//! a header field set or nudged (by where it lies in the frame: the headers of flannel's
//! datagram over either underlay, or the packet on egress), bytes added, and over the IPv6
//! underlay a Fragment header put in.

use proptest::collection::vec;
use proptest::prelude::*;
use twill_ebpf::Side;

const IPV4_HEADER: usize = 20;
const IPV6_HEADER: usize = 40;
const UDP_HEADER: usize = 8;

/// The family of the underlay the node is on, and so of the datagrams from its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Underlay {
    V4,
    V6,
}

/// A header field, by where it lies in the frame: in the Ethernet header, the first IP header
/// (the packet on egress, the outer one on ingress), the UDP header and the inner IP header of
/// a datagram.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub offset: usize,
    pub width: usize,
}

pub const FIRST_IP: usize = 14;

/// The fields of an IP header at `at` that its decoders judge: of IPv4, version and IHL,
/// total length, fragment bits, TTL and protocol; of IPv6, its payload length, next header
/// and hop limit (its version is IPv4's first byte).
fn ip_fields(at: usize) -> [Field; 7] {
    [(0, 1), (2, 2), (6, 2), (8, 1), (9, 1), (4, 2), (7, 1)].map(|(offset, width)| Field {
        offset: at + offset,
        width,
    })
}

/// The fields worth changing in what `side`'s program takes in over `underlay`. Of an outer
/// IPv6 header, also the ends of its addresses (another peer, another node).
fn fields(side: Side, underlay: Underlay) -> Vec<Field> {
    let field = |offset, width| Field { offset, width };
    let mut fields = vec![field(12, 2)];
    fields.extend(ip_fields(FIRST_IP));
    if side == Side::Egress {
        return fields;
    }
    let udp_at = match underlay {
        Underlay::V4 => FIRST_IP + IPV4_HEADER,
        Underlay::V6 => {
            fields.extend([field(FIRST_IP + 22, 2), field(FIRST_IP + 38, 2)]);
            FIRST_IP + IPV6_HEADER
        }
    };
    fields.extend([0, 2, 4].map(|offset| field(udp_at + offset, 2)));
    fields.extend(ip_fields(udp_at + UDP_HEADER));
    fields
}

#[derive(Debug, Clone)]
pub enum Mutation {
    /// Cut the frame to this share (in 1/256ths) of its length.
    Truncate(u8),
    /// Flip these bits of the byte at this share (in 1/65536ths) of the frame.
    Flip(u16, u8),
    /// Set the field to this value (its low bytes, for a one-byte field).
    Set(Field, u16),
    /// Add this to the field, e.g. a length a few bytes off.
    Nudge(Field, i16),
    /// Bytes after the frame: padding from a lower layer, or junk.
    Append(Vec<u8>),
    /// Over the IPv6 underlay, a Fragment header after the outer IPv6 header, of this offset
    /// and M flag (the low 16 bits of its second word) and identification (one of a few, so
    /// that later fragments meet the first ones remembered).
    Fragment(u16, u8),
}

pub fn mutation(side: Side, underlay: Underlay) -> impl Strategy<Value = Mutation> {
    let field = || proptest::sample::select(fields(side, underlay));
    let header_fields = prop_oneof![
        any::<u8>().prop_map(Mutation::Truncate),
        (any::<u16>(), 1u8..=255).prop_map(|(at, bits)| Mutation::Flip(at, bits)),
        (field(), prop_oneof![0u16..64, any::<u16>()]).prop_map(|(f, v)| Mutation::Set(f, v)),
        (field(), -8i16..=8).prop_map(|(f, by)| Mutation::Nudge(f, by)),
        vec(any::<u8>(), 1..8).prop_map(Mutation::Append),
    ];
    let fragment = prop_oneof![Just(0u16), Just(1), any::<u16>()];
    let fragment = (fragment, 0u8..4).prop_map(|(bits, id)| Mutation::Fragment(bits, id));
    match (side, underlay) {
        (Side::Ingress, Underlay::V6) => prop_oneof![5 => header_fields, 1 => fragment].boxed(),
        _ => header_fields.boxed(),
    }
}

impl Mutation {
    pub fn apply(&self, frame: &mut Vec<u8>) {
        let len = frame.len();
        let share = |of: usize, scale: usize| len * of / scale;
        match self {
            Mutation::Truncate(keep) => frame.truncate(share(usize::from(*keep), 256)),
            Mutation::Flip(at, bits) => {
                let at = share(usize::from(*at), 65_536);
                if let Some(byte) = frame.get_mut(at) {
                    *byte ^= *bits;
                }
            }
            Mutation::Set(field, value) => set(frame, *field, |_| *value),
            Mutation::Nudge(field, by) => set(frame, *field, |old| old.wrapping_add_signed(*by)),
            Mutation::Append(bytes) => frame.extend_from_slice(bytes),
            Mutation::Fragment(bits, id) => fragment(frame, *bits, *id),
        }
    }
}

/// Puts a Fragment header after the IPv6 header at FIRST_IP, in the chain and in the payload
/// length, if the frame still holds that header.
fn fragment(frame: &mut Vec<u8>, bits: u16, id: u8) {
    let after = FIRST_IP + IPV6_HEADER;
    if frame.len() < after {
        return;
    }
    let next_header = std::mem::replace(&mut frame[FIRST_IP + 6], 44);
    let [b0, b1] = bits.to_be_bytes();
    let header = [next_header, 0, b0, b1, 0, 0, 0, id];
    frame.splice(after..after, header);
    let payload_len = Field {
        offset: FIRST_IP + 4,
        width: 2,
    };
    set(frame, payload_len, |len| len.wrapping_add(8));
}

/// Rewrites `field` with `new` of its value, if the frame still holds it.
fn set(frame: &mut [u8], field: Field, new: impl Fn(u16) -> u16) {
    let Some(bytes) = frame.get_mut(field.offset..field.offset + field.width) else {
        return;
    };
    match bytes {
        [byte] => *byte = new(u16::from(*byte)) as u8,
        [hi, lo] => [*hi, *lo] = new(u16::from_be_bytes([*hi, *lo])).to_be_bytes(),
        _ => unreachable!("fields are one or two bytes"),
    }
}
