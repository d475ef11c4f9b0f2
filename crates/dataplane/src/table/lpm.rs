//! Longest-prefix match over one address family: one hash map per distinct prefix length.

use imbl::shared_ptr::DefaultSharedPtr;
use imbl::GenericHashMap;
use rustc_hash::FxBuildHasher;
use std::hash::Hash;

pub(super) type Map<K> = GenericHashMap<K, usize, FxBuildHasher, DefaultSharedPtr>;

/// An address (or its first half) as an integer: `u32` for IPv4, `u64` and `u128` for IPv6.
pub(super) trait Bits: Copy + Eq + Hash {
    /// The netmask of a prefix of `len` bits.
    fn mask(len: u8) -> Self;
    fn and(self, mask: Self) -> Self;
}

impl Bits for u32 {
    fn mask(len: u8) -> u32 {
        u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
    }

    fn and(self, mask: u32) -> u32 {
        self & mask
    }
}

impl Bits for u64 {
    fn mask(len: u8) -> u64 {
        u64::MAX.checked_shl(64 - u32::from(len)).unwrap_or(0)
    }

    fn and(self, mask: u64) -> u64 {
        self & mask
    }
}

impl Bits for u128 {
    fn mask(len: u8) -> u128 {
        u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
    }

    fn and(self, mask: u128) -> u128 {
        self & mask
    }
}

/// Networks -> peer index. flannel leases of one family all share one subnet length, so a
/// lookup is normally a single map's probe.
#[derive(Debug, Clone)]
pub(super) struct Lpm<K: Bits> {
    /// Longest prefix first.
    by_len: Vec<Level<K>>,
}

/// The networks of one prefix length, and its netmask, computed once rather than per lookup.
#[derive(Debug, Clone)]
struct Level<K: Bits> {
    len: u8,
    mask: K,
    map: Map<K>,
}

impl<K: Bits> Default for Lpm<K> {
    fn default() -> Lpm<K> {
        Lpm { by_len: Vec::new() }
    }
}

impl<K: Bits> Lpm<K> {
    /// Points the network (`network` with `len` bits, host bits cleared) at `index`.
    pub fn insert(&mut self, network: K, len: u8, index: usize) {
        match self.by_len.iter_mut().find(|level| level.len == len) {
            Some(level) => {
                level.map.insert(network, index);
            }
            None => {
                let mut map = Map::default();
                map.insert(network, index);
                let mask = K::mask(len);
                self.by_len.push(Level { len, mask, map });
                self.by_len
                    .sort_by_key(|level| std::cmp::Reverse(level.len));
            }
        }
    }

    pub fn remove(&mut self, network: K, len: u8) {
        if let Some(level) = self.by_len.iter_mut().find(|level| level.len == len) {
            level.map.remove(&network);
        }
        self.by_len.retain(|level| !level.map.is_empty());
    }

    /// The index of exactly this network.
    pub fn exact(&self, network: K, len: u8) -> Option<usize> {
        let level = self.by_len.iter().find(|level| level.len == len)?;
        level.map.get(&network).copied()
    }

    /// The index of the longest network holding `addr`.
    #[inline]
    pub fn lookup(&self, addr: K) -> Option<usize> {
        self.by_len
            .iter()
            .find_map(|level| level.map.get(&addr.and(level.mask)).copied())
    }
}

/// IPv6 networks in two tables: those of up to 64 bits keyed by their first half, which
/// hashes and compares as one word (flannel's IPv6 subnets are /64 by default, and rarely
/// longer), and the longer ones keyed whole. Every long network is longer than every short
/// one, so the long table is asked first.
#[derive(Debug, Clone, Default)]
pub(super) struct Lpm6 {
    short: Lpm<u64>,
    long: Lpm<u128>,
}

impl Lpm6 {
    pub fn insert(&mut self, network: u128, len: u8, index: usize) {
        match len {
            0..=64 => self.short.insert(high(network), len, index),
            _ => self.long.insert(network, len, index),
        }
    }

    pub fn remove(&mut self, network: u128, len: u8) {
        match len {
            0..=64 => self.short.remove(high(network), len),
            _ => self.long.remove(network, len),
        }
    }

    pub fn exact(&self, network: u128, len: u8) -> Option<usize> {
        match len {
            0..=64 => self.short.exact(high(network), len),
            _ => self.long.exact(network, len),
        }
    }

    #[inline]
    pub fn lookup(&self, addr: u128) -> Option<usize> {
        self.long
            .lookup(addr)
            .or_else(|| self.short.lookup(high(addr)))
    }
}

fn high(addr: u128) -> u64 {
    (addr >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_keep_the_prefix_bits() {
        assert_eq!(0x0a05_0307u32.and(u32::mask(24)), 0x0a05_0300);
        assert_eq!(u32::mask(0), 0);
        assert_eq!(u128::mask(128), u128::MAX);
        assert_eq!(u128::mask(64), u128::MAX << 64);
        assert_eq!(u128::mask(0), 0);
        assert_eq!(u64::mask(48), u64::MAX << 16);
        assert_eq!(u64::mask(0), 0);
    }

    #[test]
    fn an_ipv6_network_longer_than_64_bits_wins_over_a_shorter_one() {
        let mut lpm = Lpm6::default();
        let net = |s: &str| u128::from(s.parse::<std::net::Ipv6Addr>().unwrap());
        lpm.insert(net("fd10:0:0:1::"), 64, 0);
        lpm.insert(net("fd10:0:0:1:8000::"), 65, 1);
        lpm.insert(net("fd10::"), 48, 2);
        assert_eq!(lpm.lookup(net("fd10:0:0:1:8000::9")), Some(1));
        assert_eq!(lpm.lookup(net("fd10:0:0:1::9")), Some(0));
        assert_eq!(lpm.lookup(net("fd10:0:0:2::9")), Some(2));
        assert_eq!(lpm.exact(net("fd10:0:0:1:8000::"), 65), Some(1));
        lpm.remove(net("fd10:0:0:1:8000::"), 65);
        assert_eq!(lpm.lookup(net("fd10:0:0:1:8000::9")), Some(0));
    }
}
