//! A device's per-family settings, set over rtnetlink (RTM_SETLINK with IFLA_AF_SPEC) rather
//! than through /proc/sys: the kernel asks only CAP_NET_ADMIN for these, while /proc/sys is
//! read-only in a pod without privileges, which is how kube-flannel.yml runs flannel.

use super::rtnetlink::ask;
use anyhow::bail;
use netlink_packet_core::NLM_F_ACK;
use netlink_packet_route::link::{
    AfSpecInet, AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InetDevConf, LinkAttribute, LinkMessage,
};
use netlink_packet_route::RouteNetlinkMessage;

/// The kernel makes no IPv6 address of its own on device `index` (addr_gen_mode none): no
/// link-local address, so no duplicate address detection, router solicitations or MLD
/// reports from one. Set before the device goes up, or the address is already made. Nothing
/// to do where the kernel has no IPv6 (or the device none: an MTU under 1280).
pub fn no_link_local(index: u32) -> anyhow::Result<()> {
    let inet6 = vec![AfSpecInet6::AddrGenMode(In6AddrGenMode::None)];
    match set(index, AfSpecUnspec::Inet6(inet6))? {
        Ok(()) => Ok(()),
        Err(errno) if errno == -libc::EAFNOSUPPORT => Ok(()),
        Err(errno) => bail!(
            "cannot turn off link-local addresses on device {index}: {}",
            std::io::Error::from_raw_os_error(-errno)
        ),
    }
}

/// Device `index` takes in packets whose source is one of this host's addresses
/// (net.ipv4.conf.<device>.accept_local).
pub fn accept_local(index: u32) -> anyhow::Result<()> {
    let mut conf = InetDevConf::default();
    // A request carries only the knobs that are not zero: the others are left as they are.
    conf.accept_local = 1;
    if let Err(errno) = set(
        index,
        AfSpecUnspec::Inet(vec![AfSpecInet::DevConfRequest(conf)]),
    )? {
        bail!(
            "cannot set accept_local on device {index}: {}",
            std::io::Error::from_raw_os_error(-errno)
        );
    }
    Ok(())
}

/// One family's settings on device `index`; `Err(-errno)` when the kernel refuses them.
fn set(index: u32, family: AfSpecUnspec) -> anyhow::Result<Result<(), i32>> {
    let mut message = LinkMessage::default();
    message.header.index = index;
    message.attributes = vec![LinkAttribute::AfSpecUnspec(vec![family])];
    Ok(ask(RouteNetlinkMessage::SetLink(message), NLM_F_ACK)?.map(drop))
}
