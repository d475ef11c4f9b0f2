//! Which of an interface's addresses twill uses, in flanneld's order (its pkg/ip
//! `GetInterfaceIP4Addrs`/`IP6Addrs`): global unicast (private and unique-local included) before
//! link-local, configured (permanent) before autoconfigured, stable before temporary, the
//! kernel's order among equals; never a deprecated one. twill also leaves out what no other host
//! can reach a node at (loopback, multicast, unspecified, IPv4-mapped) and what failed the
//! duplicate address check, and puts an IPv6 address whose check is still running after the
//! others of its kind.

use super::netlink::HostAddress;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const IFA_F_TEMPORARY: u32 = libc::IFA_F_TEMPORARY;
const IFA_F_DADFAILED: u32 = libc::IFA_F_DADFAILED;
const IFA_F_DEPRECATED: u32 = libc::IFA_F_DEPRECATED;
const IFA_F_TENTATIVE: u32 = libc::IFA_F_TENTATIVE;
const IFA_F_PERMANENT: u32 = libc::IFA_F_PERMANENT;

/// The usable IPv4 addresses of interface `index`, best first.
pub fn ipv4(addresses: &[HostAddress], index: u32) -> Vec<Ipv4Addr> {
    ranked(addresses, index)
        .into_iter()
        .filter_map(|ip| match ip {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        })
        .collect()
}

/// The usable IPv6 addresses of interface `index`, best first.
pub fn ipv6(addresses: &[HostAddress], index: u32) -> Vec<Ipv6Addr> {
    ranked(addresses, index)
        .into_iter()
        .filter_map(|ip| match ip {
            IpAddr::V6(v6) => Some(v6),
            IpAddr::V4(_) => None,
        })
        .collect()
}

fn ranked(addresses: &[HostAddress], index: u32) -> Vec<IpAddr> {
    let mut usable: Vec<&HostAddress> = addresses
        .iter()
        .filter(|a| a.index == index && usable(a))
        .collect();
    // Stable: among equals, the kernel's order stands.
    usable.sort_by_key(|a| {
        let has = |flag: u32| a.flags & flag != 0;
        (
            link_local(a.ip),
            has(IFA_F_TENTATIVE),
            !has(IFA_F_PERMANENT),
            has(IFA_F_TEMPORARY),
        )
    });
    usable.into_iter().map(|a| a.ip).collect()
}

fn usable(address: &HostAddress) -> bool {
    if address.flags & (IFA_F_DEPRECATED | IFA_F_DADFAILED) != 0 {
        return false;
    }
    match address.ip {
        IpAddr::V4(ip) => {
            !(ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || ip.is_broadcast())
        }
        IpAddr::V6(ip) => {
            !(ip.is_unspecified() || ip.is_loopback() || ip.is_multicast())
                && ip.to_ipv4_mapped().is_none()
        }
    }
}

fn link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => ip.is_link_local(),
        IpAddr::V6(ip) => ip.is_unicast_link_local(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(index: u32, ip: &str, flags: u32) -> HostAddress {
        HostAddress {
            index,
            ip: ip.parse().unwrap(),
            flags,
        }
    }

    #[test]
    fn addresses_are_ranked_as_flanneld_ranks_them() {
        let p = IFA_F_PERMANENT;
        let addresses = [
            on(2, "fe80::1", p),
            on(2, "169.254.0.9", p),
            on(2, "fd00:200::a8bb:ccff:fedd:1", 0),
            on(2, "fd00:200::7", p | IFA_F_TEMPORARY),
            on(2, "fd00:200::2", p),
            on(2, "2001:db8::3", p | IFA_F_DEPRECATED),
            on(2, "2001:db8::4", p | IFA_F_TENTATIVE),
            on(2, "2001:db8::5", p | IFA_F_DADFAILED),
            on(2, "10.0.0.9", 0),
            on(2, "10.0.0.1", p),
            on(2, "10.0.0.2", p | IFA_F_DEPRECATED),
            on(1, "127.0.0.1", p),
            on(1, "::1", p),
            on(3, "10.9.9.9", p),
        ];
        let v6: Vec<String> = ipv6(&addresses, 2).iter().map(|a| a.to_string()).collect();
        assert_eq!(
            v6,
            [
                "fd00:200::2",
                "fd00:200::7",
                "fd00:200::a8bb:ccff:fedd:1",
                "2001:db8::4",
                "fe80::1"
            ],
            "global first, then tentative, then link-local; permanent before autoconfigured, \
             stable before temporary; never deprecated or DAD-failed"
        );
        let v4: Vec<String> = ipv4(&addresses, 2).iter().map(|a| a.to_string()).collect();
        assert_eq!(v4, ["10.0.0.1", "10.0.0.9", "169.254.0.9"]);
        assert!(ipv4(&addresses, 1).is_empty() && ipv6(&addresses, 1).is_empty());
    }
}
