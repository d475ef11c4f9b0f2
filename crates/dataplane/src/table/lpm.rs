//! Longest-prefix match over one address family: one hash map per distinct prefix length.

use imbl::shared_ptr::DefaultSharedPtr;
use imbl::GenericHashMap;
use rustc_hash::FxBuildHasher;
use std::hash::Hash;

pub(super) type Map<K> = GenericHashMap<K, usize, FxBuildHasher, DefaultSharedPtr>;

/// An address as an integer: `u32` for IPv4, `u128` for IPv6.
pub(super) trait Bits: Copy + Eq + Hash {
    /// The address with all but its first `len` bits cleared.
    fn masked(self, len: u8) -> Self;
}

impl Bits for u32 {
    fn masked(self, len: u8) -> u32 {
        self & u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
    }
}

impl Bits for u128 {
    fn masked(self, len: u8) -> u128 {
        self & u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
    }
}

/// Networks -> peer index. flannel leases of one family all share one subnet length, so a
/// lookup is normally a single map's probe.
#[derive(Debug, Clone)]
pub(super) struct Lpm<K: Bits> {
    /// Longest prefix first.
    by_len: Vec<(u8, Map<K>)>,
}

impl<K: Bits> Default for Lpm<K> {
    fn default() -> Lpm<K> {
        Lpm { by_len: Vec::new() }
    }
}

impl<K: Bits> Lpm<K> {
    /// Points the network (`network` with `len` bits, host bits cleared) at `index`.
    pub fn insert(&mut self, network: K, len: u8, index: usize) {
        match self.by_len.iter_mut().find(|(l, _)| *l == len) {
            Some((_, map)) => {
                map.insert(network, index);
            }
            None => {
                let mut map = Map::default();
                map.insert(network, index);
                self.by_len.push((len, map));
                self.by_len.sort_by_key(|(l, _)| std::cmp::Reverse(*l));
            }
        }
    }

    pub fn remove(&mut self, network: K, len: u8) {
        if let Some((_, map)) = self.by_len.iter_mut().find(|(l, _)| *l == len) {
            map.remove(&network);
        }
        self.by_len.retain(|(_, map)| !map.is_empty());
    }

    /// The index of exactly this network.
    pub fn exact(&self, network: K, len: u8) -> Option<usize> {
        let (_, map) = self.by_len.iter().find(|(l, _)| *l == len)?;
        map.get(&network).copied()
    }

    /// The index of the longest network holding `addr`.
    pub fn lookup(&self, addr: K) -> Option<usize> {
        self.by_len
            .iter()
            .find_map(|(len, map)| map.get(&addr.masked(*len)).copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_keep_the_prefix_bits() {
        assert_eq!(0x0a05_0307u32.masked(24), 0x0a05_0300);
        assert_eq!(0xffff_ffffu32.masked(0), 0);
        assert_eq!(u128::MAX.masked(128), u128::MAX);
        assert_eq!(u128::MAX.masked(64), u128::MAX << 64);
        assert_eq!(u128::MAX.masked(0), 0);
    }
}
