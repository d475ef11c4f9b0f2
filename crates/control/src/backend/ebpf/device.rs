//! The eBPF dataplane's device: a dummy whose egress the encapsulating program watches. The
//! whole network is routed to it, as flanneld routes it to its TUN; unlike a TUN it needs no
//! process holding it open, so it and its route outlive a restart of the daemon.
//!
//! Where the kernel has no dummy devices (CONFIG_DUMMY off, as on twill's test machine) an ifb
//! serves: to the programs and the stack it is the same (Ethernet, no ARP, and nothing leaves
//! it but what a program redirects).

use crate::host::netlink::{Link, LinkKind, Netlink};
use anyhow::{bail, Context};
use ipnet::{Ipv4Net, Ipv6Net};
use netlink_packet_route::link::InfoKind;
use rtnetlink::{LinkDummy, LinkMessageBuilder};
use twill_dataplane::io::devconf;

/// The kinds of device the dataplane makes, in the order it tries them.
const KINDS: [InfoKind; 2] = [InfoKind::Dummy, InfoKind::Ifb];

fn is_dummy(link: &Link) -> bool {
    matches!(&link.kind, LinkKind::Other(Some(kind)) if KINDS.contains(kind))
}

/// The device as [`ensure`] left it, and whether it made it.
#[derive(Debug)]
pub struct Made {
    pub link: Link,
    /// Made now, rather than adopted from an earlier run: a failed start deletes it again.
    pub created: bool,
}

/// The device `name` as the dataplane needs it: a dummy with `mtu`, `address` (and
/// `address6` on a dual-stack network, with IPv6 as quiet as the TUN's) and up. One left
/// by an earlier run is adopted as it is (its route and programs are still carrying traffic);
/// a TUN of that name that no process holds is what the userspace dataplane left, and is
/// replaced. Any other device of that name is not twill's and is refused.
pub async fn ensure(
    nl: &Netlink,
    name: &str,
    mtu: u32,
    address: Ipv4Net,
    address6: Option<Ipv6Net>,
) -> anyhow::Result<Made> {
    let found = nl.link_by_name(name).await?;
    let created = !found.as_ref().is_some_and(is_dummy);
    let link = match found {
        Some(link) if is_dummy(&link) => link,
        Some(Link {
            kind: LinkKind::Tun { held: false },
            index,
            ..
        }) => {
            nl.delete_link(index).await?;
            create(nl, name, mtu).await?
        }
        Some(Link {
            kind: LinkKind::Tun { held: true },
            ..
        }) => bail!(
            "TUN device {name} is already in use: another process holds it open, most likely \
             another twill or flanneld on this host; stop it first, or give this node another \
             --tun-name"
        ),
        Some(link) => bail!(
            "device {name} exists and is a {:?}, not twill's eBPF device (a dummy): remove it, \
             or give this node another --tun-name",
            link.kind
        ),
        None => create(nl, name, mtu).await?,
    };
    if link.mtu != mtu {
        nl.set_mtu(link.index, mtu).await?;
    }
    nl.add_address(link.index, address.into())
        .await
        .with_context(|| format!("cannot give {name} the address {address}"))?;
    // As quiet as the TUN engine's device, before it goes up.
    devconf::quiet_ipv6(name, link.index, address6.is_some())?;
    // The programs' ICMP errors enter the device from its own address.
    devconf::accept_local(link.index).with_context(|| format!("on {name}"))?;
    if let Some(address6) = address6 {
        nl.add_address(link.index, address6.into())
            .await
            .with_context(|| format!("cannot give {name} the address {address6}"))?;
    }
    if !link.up {
        nl.set_up(link.index).await?;
    }
    Ok(Made { link, created })
}

async fn create(nl: &Netlink, name: &str, mtu: u32) -> anyhow::Result<Link> {
    for kind in KINDS {
        let msg = LinkMessageBuilder::<LinkDummy>::new_with_info_kind(kind.clone())
            .name(name.to_string())
            .mtu(mtu)
            .build();
        match nl.create_link(msg).await {
            Ok(()) => return Ok(nl.created_link(name).await?),
            // This kind is not in the kernel: try the next.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => continue,
            Err(e) => {
                return Err(e).with_context(|| format!("cannot create {kind:?} device {name}"))
            }
        }
    }
    bail!("cannot create {name}: the kernel has neither dummy nor ifb devices (CONFIG_DUMMY, CONFIG_IFB)")
}

/// Removes the dummy (or ifb) `name` if there is one (its route goes with it), and the
/// segmenter named after it; anything else of that name is left alone. Whether the device was
/// removed.
pub async fn remove(nl: &Netlink, name: &str) -> anyhow::Result<bool> {
    let segmenter = twill_ebpf::Segmenter::of(name);
    if segmenter.remove()? {
        tracing::info!("removed the eBPF dataplane's segmenter {}", segmenter.send);
    }
    match nl.link_by_name(name).await? {
        Some(link) if is_dummy(&link) => {
            nl.delete_link(link.index).await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}
