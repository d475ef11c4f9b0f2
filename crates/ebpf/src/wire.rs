//! Whether the underlay is a veth, which is no wire: it hands the other namespace what this
//! one's stack made, TCP super-packets whole and checksums still to be filled in, and hands
//! this one what the other's made, a TUN node's UDP GSO trains as one skb. A NIC, or the
//! kernel for a NIC without the offload, segments and checksums at transmit. On a veth
//! underlay the dataplane runs the segmenter (crate::segmenter) for the peers that need that.
//!
//! A device stacked on a veth is no wire either: a bridge or a bond with a veth port, a VLAN
//! or macvlan whose parent is one, hands this node the trains its veth was handed.

use anyhow::Context;
use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use std::collections::HashSet;
use std::fmt;
use twill_dataplane::io::rtnetlink as netlink;

/// The veth an underlay is, or sits on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VethUnder {
    pub underlay: String,
    pub veth: String,
}

impl fmt::Display for VethUnder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.underlay == self.veth {
            true => write!(f, "the underlay {} is a veth", self.underlay),
            false => write!(
                f,
                "the underlay {} sits on the veth {}",
                self.underlay, self.veth
            ),
        }
    }
}

/// The veth `underlay` is or sits on, if any, in the calling thread's network namespace: the
/// devices below a device are its ports (the links whose controller it is) and its parent (its
/// link, where that is in this namespace), and theirs in turn.
pub fn veth_under(underlay: &str) -> anyhow::Result<Option<VethUnder>> {
    let links = links().with_context(|| format!("listing the devices below {underlay}"))?;
    let top = links
        .iter()
        .find(|l| l.name == underlay)
        .with_context(|| format!("no device {underlay} in this network namespace"))?;
    let mut seen = HashSet::new();
    let mut todo = vec![top];
    while let Some(link) = todo.pop() {
        if !seen.insert(link.index) {
            continue;
        }
        if link.veth {
            return Ok(Some(VethUnder {
                underlay: underlay.to_string(),
                veth: link.name.clone(),
            }));
        }
        let below = |l: &&Link| l.controller == Some(link.index) || link.parent == Some(l.index);
        todo.extend(links.iter().filter(below));
    }
    Ok(None)
}

/// What [`veth_under`] reads of a device.
#[derive(Debug)]
struct Link {
    index: u32,
    name: String,
    veth: bool,
    /// The bridge or bond it is a port of.
    controller: Option<u32>,
    /// The device it is stacked on, where that is in this namespace (a veth's link is its
    /// peer, often in another).
    parent: Option<u32>,
}

fn links() -> anyhow::Result<Vec<Link>> {
    let request = RouteNetlinkMessage::GetLink(LinkMessage::default());
    let answers = netlink::ask(request, NLM_F_DUMP)?
        .map_err(|errno| std::io::Error::from_raw_os_error(-errno))?;
    Ok(answers
        .into_iter()
        .filter_map(|answer| match answer {
            RouteNetlinkMessage::NewLink(message) => Some(link(&message)),
            _ => None,
        })
        .collect())
}

fn link(message: &LinkMessage) -> Link {
    let index = message.header.index;
    let mut link = Link {
        index,
        name: String::new(),
        veth: false,
        controller: None,
        parent: None,
    };
    let mut parent_elsewhere = false;
    for attribute in &message.attributes {
        match attribute {
            LinkAttribute::IfName(name) => link.name = name.clone(),
            LinkAttribute::Controller(index) => link.controller = Some(*index),
            LinkAttribute::Link(parent) if *parent != index => link.parent = Some(*parent),
            LinkAttribute::LinkNetNsId(_) => parent_elsewhere = true,
            LinkAttribute::LinkInfo(info) => {
                link.veth = info.contains(&LinkInfo::Kind(InfoKind::Veth));
            }
            _ => {}
        }
    }
    if parent_elsewhere {
        link.parent = None;
    }
    link
}
