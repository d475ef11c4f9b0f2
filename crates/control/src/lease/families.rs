//! What a lease holds of each address family: an IPv4 value, an IPv6 value, or both.
//!
//! flanneld has no such type: an IPv6-only lease is, on its wire, an IPv4 lease with the empty
//! subnet `0.0.0.0-0` and `"PublicIP":"0.0.0.0"`. Those sentinels live only where the bytes are
//! read and written (the etcd key and JSON, the Kubernetes annotations); between them a lease
//! cannot hold an IPv4 part that is not there.

use ipnet::{Ipv4Net, Ipv6Net};
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// An IPv4 value, an IPv6 value, or one of each: never neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Families<V4, V6> {
    V4(V4),
    V6(V6),
    Dual(V4, V6),
}

/// A lease's subnets: an IPv4 network's, an IPv6-only network's, or a dual-stack one's.
pub type Subnets = Families<Ipv4Net, Ipv6Net>;

/// A lease's public addresses: `PublicIP`, `PublicIPv6`, or both.
pub type PublicAddrs = Families<Ipv4Addr, Ipv6Addr>;

impl<V4: Copy, V6: Copy> Families<V4, V6> {
    /// The values present; `None` when neither is.
    pub fn from_parts(v4: Option<V4>, v6: Option<V6>) -> Option<Self> {
        match (v4, v6) {
            (Some(v4), None) => Some(Families::V4(v4)),
            (None, Some(v6)) => Some(Families::V6(v6)),
            (Some(v4), Some(v6)) => Some(Families::Dual(v4, v6)),
            (None, None) => None,
        }
    }

    /// The IPv4 value; `None` on an IPv6-only lease.
    pub fn v4(&self) -> Option<V4> {
        match *self {
            Families::V4(v4) | Families::Dual(v4, _) => Some(v4),
            Families::V6(_) => None,
        }
    }

    /// The IPv6 value; `None` on an IPv4-only lease.
    pub fn v6(&self) -> Option<V6> {
        match *self {
            Families::V6(v6) | Families::Dual(_, v6) => Some(v6),
            Families::V4(_) => None,
        }
    }

    /// The same IPv4 value (if any) with `v6` as the IPv6 one.
    pub fn with_v6(self, v6: V6) -> Self {
        match self.v4() {
            Some(v4) => Families::Dual(v4, v6),
            None => Families::V6(v6),
        }
    }

    /// The same without its IPv6 value; `None` if that was all it held.
    pub fn without_v6(self) -> Option<Self> {
        self.v4().map(Families::V4)
    }
}

impl From<Ipv4Net> for Subnets {
    fn from(subnet: Ipv4Net) -> Self {
        Families::V4(subnet)
    }
}

impl From<Ipv6Net> for Subnets {
    fn from(subnet: Ipv6Net) -> Self {
        Families::V6(subnet)
    }
}

impl From<Ipv4Addr> for PublicAddrs {
    fn from(addr: Ipv4Addr) -> Self {
        Families::V4(addr)
    }
}

impl From<Ipv6Addr> for PublicAddrs {
    fn from(addr: Ipv6Addr) -> Self {
        Families::V6(addr)
    }
}

/// `10.5.1.0/24`, `fd10:0:0:1::/64`, or `10.5.1.0/24 and fd10:0:0:1::/64`.
impl<V4: fmt::Display, V6: fmt::Display> fmt::Display for Families<V4, V6> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Families::V4(v4) => v4.fmt(f),
            Families::V6(v6) => v6.fmt(f),
            Families::Dual(v4, v6) => write!(f, "{v4} and {v6}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_is_there_or_not() {
        let v4: Ipv4Net = "10.5.1.0/24".parse().unwrap();
        let v6: Ipv6Net = "fd10:0:0:1::/64".parse().unwrap();
        assert_eq!(Subnets::from_parts(None, None), None);
        let only4 = Subnets::from_parts(Some(v4), None).unwrap();
        let only6 = Subnets::from_parts(None, Some(v6)).unwrap();
        let dual = Subnets::from_parts(Some(v4), Some(v6)).unwrap();
        assert_eq!((only4.v4(), only4.v6()), (Some(v4), None));
        assert_eq!((only6.v4(), only6.v6()), (None, Some(v6)));
        assert_eq!((dual.v4(), dual.v6()), (Some(v4), Some(v6)));
        assert_eq!(only4.with_v6(v6), dual);
        assert_eq!(only6.with_v6(v6), only6);
        assert_eq!(dual.without_v6(), Some(only4));
        assert_eq!(only6.without_v6(), None);
        let shown = [only4, only6, dual].map(|s| s.to_string());
        assert_eq!(
            shown,
            [
                "10.5.1.0/24",
                "fd10:0:0:1::/64",
                "10.5.1.0/24 and fd10:0:0:1::/64"
            ]
        );
    }
}
