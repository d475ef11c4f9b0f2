//! What the kernel backends read and write, as plain values: links, routes, neighbours and
//! fdb entries, of either address family (nexthop objects: IPv4 only).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

use ipnet::IpNet;
use netlink_packet_route::link::InfoKind;

/// An Ethernet address, written the way flannel writes VtepMAC (`d6:60:f1:85:5a:fc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// A random unicast, locally administered address. flanneld sets its own instead of the
    /// kernel's because udev (MACAddressPolicy=persistent) may otherwise rewrite a kernel-chosen
    /// one after creation, leaving a stale VtepMAC in the lease.
    pub fn random() -> Self {
        let mut bytes: [u8; 6] = rand::random();
        bytes[0] = (bytes[0] & 0xfe) | 0x02;
        MacAddr(bytes)
    }

    pub(super) fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(MacAddr)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for MacAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid MAC address {s:?}");
        let parts: Vec<u8> = s
            .split(':')
            .map(|p| {
                (p.len() == 2)
                    .then(|| u8::from_str_radix(p, 16).ok())
                    .flatten()
            })
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        MacAddr::from_slice(&parts).ok_or_else(bad)
    }
}

/// VXLAN settings, both as requested on creation and as the kernel reports them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VxlanParams {
    pub vni: u32,
    /// The underlay address tunnelled packets leave from: IPv4 for `flannel.<VNI>`, IPv6 for
    /// `flannel-v6.<VNI>`.
    pub local: Option<IpAddr>,
    /// Index of the underlay device (`dev <iface>`).
    pub dev: Option<u32>,
    /// 0 = not set, the kernel then uses [`crate::backend_kind::KERNEL_VXLAN_PORT`].
    pub port: u16,
    pub learning: bool,
    /// VXLAN's group-based policy extension.
    pub gbp: bool,
}

/// IPIP tunnel settings, both as requested on creation and as the kernel reports them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IpipParams {
    pub local: Option<Ipv4Addr>,
    pub remote: Option<Ipv4Addr>,
}

/// What a link is, as far as the backends care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkKind {
    Vxlan(VxlanParams),
    Ipip(IpipParams),
    /// A TUN, and whether a process holds it open (then it is that process's device).
    Tun {
        held: bool,
    },
    Other(Option<InfoKind>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub mac: Option<MacAddr>,
    pub kind: LinkKind,
    /// Administratively up (IFF_UP): the kernel drops every route through a link set down.
    pub up: bool,
}

/// A unicast route in the main table, IPv4 or IPv6 (the gateway of the destination's family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Route {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    pub oif: u32,
    pub onlink: bool,
    /// The nexthop object the route goes through (`nhid`); then `gateway`, `oif` and `onlink`
    /// are that nexthop's, and only the id is written.
    pub nhid: Option<u32>,
}

/// A nexthop object with one IPv4 gateway (`ip nexthop add id <id> via <gateway> dev <oif>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nexthop {
    pub id: u32,
    pub gateway: Ipv4Addr,
    pub oif: u32,
    pub onlink: bool,
}

/// A nexthop object as the kernel lists it: whoever made it said so in its protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedNexthop {
    pub id: u32,
    pub protocol: u8,
    /// What it is, if one IPv4 gateway on a device; `None` for any other kind (a group, a
    /// blackhole, IPv6), which twill never makes.
    pub gateway: Option<Nexthop>,
}

/// A neighbour entry: ARP for IPv4, NDP for IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Neighbour {
    pub ip: IpAddr,
    pub mac: MacAddr,
}

/// A VXLAN forwarding entry: frames for `mac` are tunnelled to `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FdbEntry {
    pub mac: MacAddr,
    pub dst: IpAddr,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_round_trips_in_flannels_format() {
        let mac: MacAddr = "d6:60:f1:85:5a:fc".parse().unwrap();
        assert_eq!(mac.0, [0xd6, 0x60, 0xf1, 0x85, 0x5a, 0xfc]);
        assert_eq!(mac.to_string(), "d6:60:f1:85:5a:fc");
        for bad in [
            "",
            "d6:60:f1:85:5a",
            "d6:60:f1:85:5a:fc:00",
            "d6:60:f1:85:5a:zz",
            "d6:60:f1:85:5a:fcc",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn random_mac_is_unicast_and_locally_administered() {
        for _ in 0..64 {
            let first = MacAddr::random().0[0];
            assert_eq!(first & 0x01, 0, "multicast bit set");
            assert_eq!(first & 0x02, 0x02, "local bit clear");
        }
    }
}
