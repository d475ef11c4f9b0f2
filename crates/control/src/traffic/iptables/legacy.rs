//! A fingerprint of the legacy (x_tables) tables flannel's chains live in, read as
//! iptables-legacy-save reads them, with two getsockopt calls per table (`IPT_SO_GET_INFO`,
//! `IPT_SO_GET_ENTRIES`), without starting it: equal fingerprints mean nothing in those tables
//! changed, so the check needs no `iptables-legacy-save`.
//!
//! x_tables keeps no generation number, so the fingerprint is a hash of every entry of the
//! `nat` and `filter` tables, with the packet and byte counters (which traffic moves) zeroed.

use super::super::failure::Failure;
use super::super::ruleset::Family;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// `IPT_SO_GET_INFO` and `IPT_SO_GET_ENTRIES` (and ip6tables' `IP6T_SO_*`, the same numbers at
/// the IPv6 level).
const SO_GET_INFO: libc::c_int = 64;
const SO_GET_ENTRIES: libc::c_int = 65;
/// `XT_TABLE_MAXNAMELEN`.
const NAME_LEN: usize = 32;
/// `struct ipt_getinfo` (and `ip6t_getinfo`): the name, the hooks, then `num_entries` and
/// `size`, the entries' total length.
const GETINFO_LEN: usize = 84;
const GETINFO_SIZE_AT: usize = 80;
/// `struct ipt_get_entries`: the name, the size, then the entries at an 8-byte boundary.
const GET_ENTRIES_HEADER: usize = 40;

/// Where an entry keeps its length and its counters, per family (`struct ipt_entry`,
/// `struct ip6t_entry`).
struct Layout {
    next_offset_at: usize,
    counters_at: usize,
}

const COUNTERS_LEN: usize = 16;

fn layout(family: Family) -> Layout {
    match family {
        Family::Ipv4 => Layout {
            next_offset_at: 90,
            counters_at: 96,
        },
        Family::Ipv6 => Layout {
            next_offset_at: 142,
            counters_at: 152,
        },
    }
}

/// The tables flannel's chains live in.
const TABLES: [&str; 2] = ["nat", "filter"];

/// The fingerprint of `families`' `nat` and `filter` tables. A table that does not exist is
/// not asked for: asking would make the kernel instantiate it.
pub fn fingerprint(families: &[Family]) -> Result<u64, Failure> {
    let mut hasher = DefaultHasher::new();
    for &family in families {
        let existing = existing_tables(family).map_err(Failure::Io)?;
        for table in TABLES {
            table.hash(&mut hasher);
            if existing.iter().any(|t| t == table) {
                let entries = entries(family, table).map_err(Failure::Io)?;
                entries.hash(&mut hasher);
            }
        }
    }
    Ok(hasher.finish())
}

/// The legacy tables this network namespace has (`/proc/net/ip_tables_names`).
fn existing_tables(family: Family) -> io::Result<Vec<String>> {
    let file = match family {
        Family::Ipv4 => "/proc/net/ip_tables_names",
        Family::Ipv6 => "/proc/net/ip6_tables_names",
    };
    match std::fs::read_to_string(file) {
        Ok(text) => Ok(text.lines().map(String::from).collect()),
        // A kernel without legacy iptables has no such file, and no tables.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Every entry of `table`, its counters zeroed. The calls are those of iptables-legacy-save;
/// any socket of the family reaches them (x_tables checks CAP_NET_ADMIN, not the socket type),
/// so a UDP one does, which needs no CAP_NET_RAW.
fn entries(family: Family, table: &str) -> io::Result<Vec<u8>> {
    let (domain, level) = match family {
        Family::Ipv4 => (AddressFamily::Inet, libc::SOL_IP),
        Family::Ipv6 => (AddressFamily::Inet6, libc::SOL_IPV6),
    };
    let socket = socket(domain, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
    let mut name = [0u8; NAME_LEN];
    name[..table.len()].copy_from_slice(table.as_bytes());
    // The table may change between the two calls; the kernel then answers EAGAIN.
    for _ in 0..3 {
        let mut info = [0u8; GETINFO_LEN];
        info[..NAME_LEN].copy_from_slice(&name);
        get(&socket, level, SO_GET_INFO, &mut info)?;
        let size = u32::from_ne_bytes(info[GETINFO_SIZE_AT..][..4].try_into().expect("4 bytes"));
        let mut entries = vec![0u8; GET_ENTRIES_HEADER + size as usize];
        entries[..NAME_LEN].copy_from_slice(&name);
        entries[NAME_LEN..][..4].copy_from_slice(&size.to_ne_bytes());
        match get(&socket, level, SO_GET_ENTRIES, &mut entries) {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
            Err(e) => return Err(e),
            Ok(()) => {
                let mut entries = entries.split_off(GET_ENTRIES_HEADER);
                zero_counters(&mut entries, &layout(family));
                return Ok(entries);
            }
        }
    }
    Err(io::Error::other(format!(
        "the legacy {table} table kept changing while it was read"
    )))
}

/// `getsockopt(socket, level, option, buf)`, the whole of `buf` in and out.
fn get(
    socket: &OwnedFd,
    level: libc::c_int,
    option: libc::c_int,
    buf: &mut [u8],
) -> io::Result<()> {
    let mut len = libc::socklen_t::try_from(buf.len()).map_err(io::Error::other)?;
    // SAFETY: `buf` is valid for `len` bytes of writes, and `len` outlives the call.
    let done = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            level,
            option,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Zeroes each entry's packet and byte counters, walking the entries by their `next_offset`.
fn zero_counters(entries: &mut [u8], layout: &Layout) {
    let mut at = 0;
    while let Some(next) = entries
        .get(at + layout.next_offset_at..at + layout.next_offset_at + 2)
        .map(|b| usize::from(u16::from_ne_bytes([b[0], b[1]])))
    {
        let counters = at + layout.counters_at..at + layout.counters_at + COUNTERS_LEN;
        if let Some(counters) = entries.get_mut(counters) {
            counters.fill(0);
        }
        if next == 0 {
            break;
        }
        at += next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two IPv4 entries of 120 bytes with counters set, as the kernel lays them out.
    fn two_entries() -> Vec<u8> {
        let mut entries = vec![0u8; 240];
        for at in [0, 120] {
            entries[at + 90..at + 92].copy_from_slice(&120u16.to_ne_bytes());
            entries[at + 96..at + 112].fill(0xab);
            entries[at + 112] = 7;
        }
        entries
    }

    #[test]
    fn counters_are_zeroed_and_nothing_else() {
        let mut entries = two_entries();
        zero_counters(&mut entries, &layout(Family::Ipv4));
        for at in [0, 120] {
            assert!(entries[at + 96..at + 112].iter().all(|&b| b == 0));
            assert_eq!(entries[at + 112], 7);
            assert_eq!(entries[at + 90], 120u16.to_ne_bytes()[0]);
        }
    }

    #[test]
    fn a_garbled_length_cannot_make_it_loop_or_panic() {
        let mut entries = two_entries();
        entries[90..92].copy_from_slice(&0u16.to_ne_bytes());
        zero_counters(&mut entries, &layout(Family::Ipv4));
        let mut short = vec![0u8; 100];
        zero_counters(&mut short, &layout(Family::Ipv4));
        let mut huge = two_entries();
        huge[90..92].copy_from_slice(&u16::MAX.to_ne_bytes());
        zero_counters(&mut huge, &layout(Family::Ipv4));
    }
}
