//! The two-host lab's addressing plan, shared by every path's setup (`paths`, and the
//! wireguard-go reference path beside it): the flannel network, each host's container subnet,
//! the underlay MTU, and each host paired with the other.

use twill_lab::{Host, Ipv4Net, Lab};

/// The flannel network all container subnets lie in.
pub(crate) const NETWORK: &str = "10.5.0.0/16";
pub(crate) const UNDERLAY_MTU: u32 = 1500;

/// Container subnet of host `i`.
pub(crate) fn subnet(i: usize) -> Ipv4Net {
    Ipv4Net::new([10, 5, i as u8 + 1, 0].into(), 24).expect("/24 is a valid prefix")
}

/// Host `i` and the other host (`peer`), whose container subnet is `subnet(1 - i)`.
pub(crate) fn pairs(lab: &Lab) -> [(usize, &Host, &Host); 2] {
    [(0, lab.host(0), lab.host(1)), (1, lab.host(1), lab.host(0))]
}
