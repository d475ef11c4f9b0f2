//! The subnets other leases hold, of one address family, for picking a free one.

use ipnet::{Ipv4Net, Ipv6Net};
use std::collections::BTreeSet;

/// Taken subnets as (network address, prefix length), sorted, so that whether a subnet is free
/// costs O(log K) lookups per prefix length instead of a pass over every lease: a node joining
/// a network of 60,000 leases looks past all of them for a free one. IPv4 addresses are held in
/// the low 32 bits; `width` says which family the set holds.
pub(super) struct Taken {
    width: u8,
    subnets: BTreeSet<(u128, u8)>,
}

impl Taken {
    pub fn v4(subnets: impl Iterator<Item = Ipv4Net>) -> Taken {
        Taken {
            width: 32,
            subnets: subnets
                .map(|s| (u128::from(u32::from(s.network())), s.prefix_len()))
                .collect(),
        }
    }

    pub fn v6(subnets: impl Iterator<Item = Ipv6Net>) -> Taken {
        Taken {
            width: 128,
            subnets: subnets
                .map(|s| (u128::from(s.network()), s.prefix_len()))
                .collect(),
        }
    }

    pub fn is_free_v4(&self, subnet: Ipv4Net) -> bool {
        debug_assert_eq!(self.width, 32);
        self.is_free(u128::from(u32::from(subnet.network())), subnet.prefix_len())
    }

    pub fn is_free_v6(&self, subnet: Ipv6Net) -> bool {
        debug_assert_eq!(self.width, 128);
        self.is_free(u128::from(subnet.network()), subnet.prefix_len())
    }

    /// Whether no taken subnet overlaps `first`/`len`: none starts inside it, and none of a
    /// shorter prefix contains it.
    fn is_free(&self, first: u128, len: u8) -> bool {
        let last = first | self.host_bits(len);
        let inside = self
            .subnets
            .range((first, 0)..=(last, self.width))
            .next()
            .is_some();
        let around = (0..len).any(|outer| {
            let network = first & !self.host_bits(outer);
            self.subnets.contains(&(network, outer))
        });
        !inside && !around
    }

    /// The host part of a `/len` in this family, as a mask.
    fn host_bits(&self, len: u8) -> u128 {
        match self.width - len {
            128 => u128::MAX,
            host => (1u128 << host) - 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn net6(s: &str) -> Ipv6Net {
        s.parse().unwrap()
    }

    #[test]
    fn a_subnet_is_free_unless_a_lease_overlaps_it_either_way() {
        let taken = Taken::v4(
            ["10.5.1.0/24", "10.6.0.0/16", "10.7.3.128/25"]
                .into_iter()
                .map(net),
        );
        assert!(!taken.is_free_v4(net("10.5.1.0/24")), "the same subnet");
        assert!(taken.is_free_v4(net("10.5.2.0/24")));
        assert!(taken.is_free_v4(net("10.5.0.0/24")));
        assert!(!taken.is_free_v4(net("10.6.9.0/24")), "inside a taken /16");
        assert!(!taken.is_free_v4(net("10.7.3.0/24")), "holds a taken /25");
        assert!(!taken.is_free_v4(net("10.0.0.0/8")), "holds them all");
        assert!(!taken.is_free_v4(net("0.0.0.0/0")));
        assert!(taken.is_free_v4(net("10.7.4.0/24")));
    }

    #[test]
    fn an_ipv6_subnet_is_free_unless_a_lease_overlaps_it_either_way() {
        let taken = Taken::v6(
            ["fd10:0:0:1::/64", "fd10:0:1::/48", "fd10:0:0:2:8000::/65"]
                .into_iter()
                .map(net6),
        );
        assert!(
            !taken.is_free_v6(net6("fd10:0:0:1::/64")),
            "the same subnet"
        );
        assert!(taken.is_free_v6(net6("fd10:0:0:3::/64")));
        assert!(
            !taken.is_free_v6(net6("fd10:0:1:7::/64")),
            "inside a taken /48"
        );
        assert!(
            !taken.is_free_v6(net6("fd10:0:0:2::/64")),
            "holds a taken /65"
        );
        assert!(!taken.is_free_v6(net6("fd10::/32")), "holds them all");
        assert!(!taken.is_free_v6(net6("::/0")));
        assert!(taken.is_free_v6(net6("fd11::/64")));
        let top = Taken::v6(std::iter::once(net6("ffff:ffff:ffff:ffff::/64")));
        assert!(!top.is_free_v6(net6("ffff:ffff:ffff:ffff::/64")));
        assert!(top.is_free_v6(net6("ffff:ffff:ffff:fffe::/64")));
    }
}
