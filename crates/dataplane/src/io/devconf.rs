//! A device's per-family settings, set over rtnetlink (RTM_SETLINK with IFLA_AF_SPEC) where the
//! kernel takes them there: it asks only CAP_NET_ADMIN for these, while /proc/sys is read-only
//! in a pod without privileges, which is how kube-flannel.yml runs flannel. What rtnetlink
//! cannot set goes through /proc/sys, where it is writable.

use super::rtnetlink::ask;
use anyhow::{bail, Context};
use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP};
use netlink_packet_route::address::{AddressMessage, AddressScope};
use netlink_packet_route::link::{
    AfSpecInet, AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InetDevConf, LinkAttribute, LinkMessage,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

/// The IPv6 of a device of twill's (the TUN, the eBPF dataplane's device, the segmenter's ends)
/// is quiet: the kernel makes no link-local address on it ([`no_link_local`]), so sends no
/// router solicitations or MLD reports out of it, only for the engine or the programs to drop
/// and count them. Through /proc/sys besides, where it is writable: on an IPv4-only network
/// (and on the segmenter) IPv6 off; on a dual-stack one IPv6 on, its one address the lease's,
/// taking no router advertisements. Before the device goes up. A link-local address the device
/// already has goes: one made before (by an older twill, whose device or segmenter a restart
/// adopts). All are tried; the first failure is returned.
pub fn quiet_ipv6(name: &str, index: u32, dual_stack: bool) -> anyhow::Result<()> {
    let no_link_local = no_link_local(index)
        .and_then(|()| drop_link_local(index))
        .with_context(|| format!("on {name}"));
    let knobs = match dual_stack {
        false => IPV6_OFF,
        true => IPV6_QUIET,
    };
    no_link_local.and(ipv6_sysctls(name, knobs))
}

const IPV6_OFF: &[(&str, &str)] = &[("disable_ipv6", "1")];

const IPV6_QUIET: &[(&str, &str)] = &[
    ("accept_ra", "0"),
    ("router_solicitations", "0"),
    ("disable_ipv6", "0"),
];

/// Sets the IPv6 `knobs` of device `name` through /proc/sys, in the calling thread's network
/// namespace. Where /proc/sys is read-only they stay as they are (said at debug level: the
/// device is quiet without them), and a kernel without IPv6 has none to set.
fn ipv6_sysctls(name: &str, knobs: &[(&str, &str)]) -> anyhow::Result<()> {
    for (knob, value) in knobs {
        let path = format!("/proc/sys/net/ipv6/conf/{name}/{knob}");
        match std::fs::write(&path, value) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
                tracing::debug!("cannot set IPv6 on {name}: {path} is read-only here");
                return Ok(());
            }
            Err(e) => return Err(e).with_context(|| format!("cannot write {path}")),
        }
    }
    Ok(())
}

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

/// Removes the link-local IPv6 addresses device `index` has, which [`no_link_local`] only stops
/// the kernel from making.
fn drop_link_local(index: u32) -> anyhow::Result<()> {
    let mut request = AddressMessage::default();
    request.header.family = AddressFamily::Inet6;
    let answers = match ask(RouteNetlinkMessage::GetAddress(request), NLM_F_DUMP)? {
        Ok(answers) => answers,
        Err(errno) if errno == -libc::EAFNOSUPPORT => return Ok(()),
        Err(errno) => bail!(
            "cannot list the IPv6 addresses: {}",
            std::io::Error::from_raw_os_error(-errno)
        ),
    };
    let link_local = answers.into_iter().filter_map(|answer| match answer {
        RouteNetlinkMessage::NewAddress(address)
            if address.header.index == index && address.header.scope == AddressScope::Link =>
        {
            Some(address)
        }
        _ => None,
    });
    for address in link_local {
        let deleted = ask(RouteNetlinkMessage::DelAddress(address), NLM_F_ACK)?;
        // Gone already (the device went down, or someone else removed it) is as good.
        if let Err(errno) = deleted.map(drop) {
            if errno != -libc::EADDRNOTAVAIL {
                bail!(
                    "cannot remove a link-local address: {}",
                    std::io::Error::from_raw_os_error(-errno)
                );
            }
        }
    }
    Ok(())
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
