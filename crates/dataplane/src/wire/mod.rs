//! Zero-copy packet views and emitters, in the style of smoltcp: a view checks its bounds once
//! in `new_checked`, and accessors then read fields in place. Parsing and emitting live here;
//! what to do with a packet lives in the engines.

pub mod batch;
mod batch_header;
pub mod checksum;
pub mod chunk;
pub mod flannel;
pub mod icmp;
pub mod icmpv6;
pub mod ip;
pub mod ipv4;
pub mod ipv6;
pub mod virtio;

/// Why a packet or datagram was rejected by a decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("truncated: shorter than its headers or its length field")]
    Truncated,
    #[error("wrong IP version")]
    BadVersion,
    #[error("length field inconsistent with the buffer")]
    BadLength,
    #[error("bad magic number")]
    BadMagic,
    #[error("unsupported protocol version")]
    UnsupportedVersion,
    #[error("sender subnet is not a valid IPv4 network")]
    BadSender,
    #[error("segmentation offload type or size the receiver cannot take")]
    BadGso,
}
