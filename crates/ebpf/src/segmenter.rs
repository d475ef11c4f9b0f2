//! The segmenter: on a veth underlay, which hands the other namespace what this one's stack
//! made (TCP super-packets whole, checksums still to be filled in, UDP GSO trains as one skb),
//! a veth pair of twill's own that checksums and segments at transmit as a NIC does. What a
//! peer must read from a socket as datagrams (a TUN node, flanneld), and a train of datagrams a
//! TUN node sent this node, go out of its sending end and come back at its receiving end as
//! one packet each, where `twill_segmented` sends or takes them in. Traffic between eBPF nodes
//! never passes it, and moves as super-packets (docs/decisions.md, "A veth underlay is not a
//! wire").
//!
//! Like twill's device it needs no process holding it, and outlives the daemon.

use crate::device::{self, Device};
use anyhow::{bail, Context};
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::RouteNetlinkMessage;
use twill_dataplane::io::devconf;
use twill_dataplane::io::rtnetlink as netlink;

/// The segmenter of twill's device `device`: the pair's two names, made from the device's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segmenter {
    /// Where packets are sent to be segmented: transmit checksumming (and TSO) off.
    pub send: String,
    /// Where they come back one by one, at twill_segmented.
    pub receive: String,
}

/// The ends of a segmenter as [`Segmenter::ensure`] left them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ends {
    pub send: Device,
    /// Made now, rather than adopted from an earlier run: a failed start deletes it again.
    pub created: bool,
}

impl Segmenter {
    pub fn of(device: &str) -> Segmenter {
        // Device names have 15 bytes at most; the suffixes take 5.
        let stem: String = device.chars().take(10).collect();
        Segmenter {
            send: format!("{stem}-segs"),
            receive: format!("{stem}-segr"),
        }
    }

    /// The pair as the programs need it: made if it is not there (an earlier run's is adopted),
    /// with `mtu` (the underlay's: trains of its datagrams pass it too), without IPv6 (the
    /// kernel's own router solicitations would only reach the program), up, and transmit
    /// checksumming off on the sending end.
    pub(crate) fn ensure(&self, mtu: u16) -> anyhow::Result<Ends> {
        let found = [&self.send, &self.receive]
            .map(|name| device::driver(name).is_ok_and(|driver| driver == "veth"));
        let created = found != [true, true];
        if created {
            self.remove()?;
            self.create(mtu)?;
        }
        // IPv6 quiet before the ends go up (the kernel's router solicitations out of the
        // sending end would reach twill_segmented, and be counted as drops); up once both ends
        // exist (a veth whose peer is not there yet refuses to open).
        for name in [&self.send, &self.receive] {
            let index = nix::net::if_::if_nametoindex(name.as_str())
                .with_context(|| format!("{name} vanished once made"))?;
            devconf::quiet_ipv6(name, index, false)?;
        }
        for name in [&self.send, &self.receive] {
            set_up(name)?;
        }
        device::checksum_in_software(&self.send).with_context(|| format!("on {}", self.send))?;
        Ok(Ends {
            send: Device::lookup(&self.send)?,
            created,
        })
    }

    fn create(&self, mtu: u16) -> anyhow::Result<()> {
        let end = |name: &str| {
            let mut message = LinkMessage::default();
            message.attributes = vec![
                LinkAttribute::IfName(name.to_string()),
                LinkAttribute::Mtu(u32::from(mtu)),
            ];
            message
        };
        let mut send = end(&self.send);
        send.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(end(&self.receive)))),
        ]));
        let flags = NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK;
        let answer = netlink::ask(RouteNetlinkMessage::NewLink(send), flags)?;
        if let Err(errno) = answer {
            bail!(
                "cannot make the segmenter {} / {}: {}",
                self.send,
                self.receive,
                std::io::Error::from_raw_os_error(-errno)
            );
        }
        tracing::info!(
            send = %self.send,
            receive = %self.receive,
            "a veth underlay: made the segmenter, through which what TUN and flanneld peers \
             read from a socket is segmented and checksummed as a NIC sends it"
        );
        Ok(())
    }

    /// Deletes the pair (one end takes the other with it); false when it was not there.
    pub fn remove(&self) -> anyhow::Result<bool> {
        let mut removed = false;
        for name in [&self.send, &self.receive] {
            let Ok(index) = nix::net::if_::if_nametoindex(name.as_str()) else {
                continue;
            };
            let mut message = LinkMessage::default();
            message.header.index = index;
            let answer = netlink::ask(RouteNetlinkMessage::DelLink(message), NLM_F_ACK)?;
            match answer {
                // Gone with its other end in between.
                Ok(_) => removed = true,
                Err(errno) if errno == -libc::ENODEV => removed = true,
                Err(errno) => bail!(
                    "cannot delete {name}: {}",
                    std::io::Error::from_raw_os_error(-errno)
                ),
            }
        }
        Ok(removed)
    }
}

fn set_up(name: &str) -> anyhow::Result<()> {
    let mut message = LinkMessage::default();
    message.header.index = nix::net::if_::if_nametoindex(name)
        .with_context(|| format!("{name} vanished once made"))?;
    message.header.flags = LinkFlags::Up;
    message.header.change_mask = LinkFlags::Up;
    let answer = netlink::ask(RouteNetlinkMessage::SetLink(message), NLM_F_ACK)?;
    if let Err(errno) = answer {
        bail!(
            "cannot set {name} up: {}",
            std::io::Error::from_raw_os_error(-errno)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_fit_a_device_name_and_say_whose_they_are() {
        let s = Segmenter::of("flannel0");
        assert_eq!(
            (s.send.as_str(), s.receive.as_str()),
            ("flannel0-segs", "flannel0-segr")
        );
        let long = Segmenter::of("a-fifteen-chars");
        assert_eq!(long.send, "a-fifteen--segs");
        assert!(long.receive.len() <= 15);
    }
}
