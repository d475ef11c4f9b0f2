//! Which address families a flannel network has, and so what each of its leases holds:
//! IPv4 (flannel's default), both (`EnableIPv6`), or IPv6 alone (`EnableIPv4` false).

use std::fmt;

/// The address families of a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stack {
    Ipv4,
    Dual,
    Ipv6,
}

impl Stack {
    /// The network with these families, if it has any.
    pub fn of(ipv4: bool, ipv6: bool) -> Option<Stack> {
        match (ipv4, ipv6) {
            (true, false) => Some(Stack::Ipv4),
            (true, true) => Some(Stack::Dual),
            (false, true) => Some(Stack::Ipv6),
            (false, false) => None,
        }
    }

    pub fn has_ipv4(self) -> bool {
        self != Stack::Ipv6
    }

    pub fn has_ipv6(self) -> bool {
        self != Stack::Ipv4
    }
}

impl fmt::Display for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stack::Ipv4 => "IPv4-only",
            Stack::Dual => "dual-stack",
            Stack::Ipv6 => "IPv6-only",
        })
    }
}
