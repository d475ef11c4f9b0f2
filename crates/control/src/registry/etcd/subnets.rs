//! What names a lease in etcd: its IPv4 subnet and, for a dual-stack lease, its IPv6 subnet,
//! both in one key (`10.5.1.0-24&fd10:0:0:1::-64`; an IPv6-only lease's IPv4 part is
//! flanneld's empty `0.0.0.0-0`). Every read, write and delete of a lease goes
//! to the key of both, so a dual-stack lease is renewed and deleted where it lives.

use crate::lease::{ipv4_part, lease_key, Lease, LeaseAttrs};
use ipnet::{Ipv4Net, Ipv6Net};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Subnets {
    pub v4: Ipv4Net,
    pub v6: Option<Ipv6Net>,
}

impl Subnets {
    pub fn of(lease: &Lease) -> Subnets {
        Subnets {
            v4: lease.subnet,
            v6: lease.ipv6_subnet,
        }
    }

    /// The IPv4 subnet; `None` for an IPv6-only lease's empty one.
    pub fn ipv4(self) -> Option<Ipv4Net> {
        ipv4_part(self.v4)
    }

    /// The etcd key of a lease on these subnets, under `prefix`.
    pub fn key(self, prefix: &str) -> String {
        lease_key(prefix, self.v4, self.v6)
    }

    /// A lease of these subnets with `attrs`.
    pub fn lease(self, attrs: LeaseAttrs) -> Lease {
        Lease {
            ipv6_subnet: self.v6,
            ..Lease::new(self.v4, attrs)
        }
    }
}

/// `10.5.1.0/24`, or `10.5.1.0/24 and fd10:0:0:1::/64` for a dual-stack lease.
impl fmt::Display for Subnets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.v6 {
            None => write!(f, "{}", self.v4),
            Some(v6) if self.ipv4().is_none() => write!(f, "{v6}"),
            Some(v6) => write!(f, "{} and {v6}", self.v4),
        }
    }
}
