//! The two-host lab's addressing plan, shared by every path's setup (`paths`, and the
//! wireguard-go reference path beside it): the flannel network, each host's container subnet
//! in either family, the underlay MTU, and each host paired with the other.

use anyhow::{Context, Result};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::net::IpAddr;
use twill_lab::{Host, Lab};

/// The flannel network all container subnets lie in.
pub(crate) const NETWORK: &str = "10.5.0.0/16";
/// The network's IPv6 half on a dual-stack lab (`IPv6Network`; its subnets are /64, flannel's
/// default `IPv6SubnetLen`).
pub(crate) const NETWORK6: &str = "fd10::/56";
pub(crate) const UNDERLAY_MTU: u32 = 1500;

/// Container subnet of host `i`.
pub(crate) fn subnet(i: usize) -> Ipv4Net {
    Ipv4Net::new([10, 5, i as u8 + 1, 0].into(), 24).expect("/24 is a valid prefix")
}

/// Container IPv6 subnet of host `i` on a dual-stack lab: fd10:0:0:<i + 1>::/64.
pub(crate) fn subnet6(i: usize) -> Ipv6Net {
    let network = [0xfd10, 0, 0, i as u16 + 1, 0, 0, 0, 0];
    Ipv6Net::new(network.into(), 64).expect("/64 is a valid prefix")
}

/// Host `i` and the other host (`peer`), whose container subnet is `subnet(1 - i)`.
pub(crate) fn pairs(lab: &Lab) -> [(usize, &Host, &Host); 2] {
    [(0, lab.host(0), lab.host(1)), (1, lab.host(1), lab.host(0))]
}

/// The address families a path's lab carries: IPv4 always, IPv6 on a dual-stack lab. A kernel
/// path sets up each family the same way, with these values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    V4,
    V6,
}

impl Family {
    /// Container subnet of host `i` in this family.
    pub(crate) fn subnet(self, i: usize) -> IpNet {
        match self {
            Family::V4 => subnet(i).into(),
            Family::V6 => subnet6(i).into(),
        }
    }

    /// The host's underlay address in this family (its PublicIP or PublicIPv6).
    pub(crate) fn underlay_ip(self, host: &Host) -> Result<IpAddr> {
        match self {
            Family::V4 => Ok(host.underlay_ip.into()),
            Family::V6 => host
                .underlay_ipv6
                .map(IpAddr::from)
                .context("the lab has no IPv6 underlay"),
        }
    }

    /// Host `i`'s lease's network address as one address (/32, /128): what flannel puts on
    /// its devices.
    pub(crate) fn device_address(self, i: usize) -> IpNet {
        let subnet = self.subnet(i);
        IpNet::new(subnet.network(), subnet.max_prefix_len()).expect("a full-length prefix")
    }
}
