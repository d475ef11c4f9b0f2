//! The 12-byte header every datagram of twill's batch format starts with, whatever its version:
//! magic, version, sender prefix length, flags, sender subnet (docs/batch-protocol.md). Record
//! datagrams ([`super::batch`], version 1) and chunk datagrams ([`super::chunk`], version 2) both
//! stand on it, so it lives below them and imports neither.

use super::WireError;
use ipnet::Ipv4Net;
use std::net::Ipv4Addr;

/// The first byte is not 0x4_ or 0x6_, so a bare IP packet (flannel udp) sent to this port by
/// mistake is rejected as a bad magic, not misread.
pub const MAGIC: [u8; 4] = *b"TWLB";
/// The version byte of record datagrams.
pub const RECORD_VERSION: u8 = 1;
/// The version byte of chunk datagrams.
pub const CHUNK_VERSION: u8 = 2;
/// The highest version this node reads: 2 adds chunk datagrams ([`super::chunk`]).
pub const HIGHEST_VERSION: u8 = CHUNK_VERSION;
pub const HEADER_LEN: usize = 12;

pub(super) mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    pub const PREFIX_LEN: usize = 5;
    pub const FLAGS: Range<usize> = 6..8;
    pub const SUBNET: Range<usize> = 8..12;
}

/// The version byte of a datagram that starts with twill's magic.
pub fn version(data: &[u8]) -> Option<u8> {
    data.starts_with(&MAGIC)
        .then(|| data.get(field::VERSION).copied())?
}

/// The header every datagram starts with, whatever its version; checked in this order.
/// Magic and version come first and before the length check: they are the bytes every
/// version shares, so a short datagram of another version still counts as a bad version.
pub(crate) fn check_header(data: &[u8], version: u8) -> Result<(), WireError> {
    if data.len() <= field::VERSION {
        return Err(WireError::Truncated);
    }
    if data[field::MAGIC] != MAGIC {
        return Err(WireError::BadMagic);
    }
    if data[field::VERSION] != version {
        return Err(WireError::UnsupportedVersion);
    }
    if data.len() < HEADER_LEN {
        return Err(WireError::Truncated);
    }
    parse_sender(data).map(drop)
}

/// The sender subnet of a datagram whose header is at least [`HEADER_LEN`] long.
pub(crate) fn parse_sender(data: &[u8]) -> Result<Ipv4Net, WireError> {
    let addr = Ipv4Addr::from(read_u32(data, field::SUBNET.start));
    Ipv4Net::new(addr, data[field::PREFIX_LEN])
        .ok()
        .filter(|net| net.network() == addr)
        .ok_or(WireError::BadSender)
}

/// Write the header for `sender` (its network address, host bits cleared) with flags 0.
/// Panics if `buf` is shorter than [`HEADER_LEN`]: a capacity that small is a caller bug.
pub(crate) fn emit_header(buf: &mut [u8], version: u8, sender: Ipv4Net) {
    let header = &mut buf[..HEADER_LEN];
    header[field::MAGIC].copy_from_slice(&MAGIC);
    header[field::VERSION] = version;
    header[field::PREFIX_LEN] = sender.prefix_len();
    header[field::FLAGS].fill(0);
    header[field::SUBNET].copy_from_slice(&sender.network().octets());
}

pub(crate) fn read_u32(data: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}
