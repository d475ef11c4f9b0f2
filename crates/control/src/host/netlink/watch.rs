//! The kernel's notifications about links, addresses and routes (rtnetlink multicast groups),
//! so that a device someone set down, or whose route someone deleted, is noticed when it
//! happens instead of at the next periodic reconcile.
//!
//! The kernel does not announce the routes it flushes when a link goes down, only the link's
//! change: a watcher of one device must listen to the link group, not only the route group.

use futures::channel::mpsc::UnboundedReceiver;
use futures::StreamExt;
use netlink_packet_route::route::RouteAttribute;
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::sys::SocketAddr;
use rtnetlink::MulticastGroup;
use std::io;

/// What changed, by the index of the link it concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// A link was added, changed (up, down, MTU, name) or deleted.
    Link(u32),
    /// An address of the link was added or deleted.
    Address(u32),
    /// A route through the link was added or deleted.
    Route(u32),
}

impl Notice {
    pub fn index(&self) -> u32 {
        match *self {
            Notice::Link(i) | Notice::Address(i) | Notice::Route(i) => i,
        }
    }
}

/// What a watcher hears besides link changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Groups {
    /// Address and route changes (a node with thousands of routes of its own would otherwise
    /// hear each of its writes, so only a device that carries the network's route asks).
    pub routes: bool,
    /// IPv6 addresses (and IPv6 routes, with `routes`) too: a dual-stack device's.
    pub ipv6: bool,
}

/// A subscription; its connection ends when this is dropped.
pub struct Watch {
    messages: UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>,
    connection: tokio::task::JoinHandle<()>,
}

impl Watch {
    /// Subscribes to link changes, and to the address and route changes `wanted` says.
    pub fn subscribe(wanted: Groups) -> io::Result<Watch> {
        let mut groups = vec![MulticastGroup::Link];
        if wanted.routes {
            groups.extend([MulticastGroup::Ipv4Ifaddr, MulticastGroup::Ipv4Route]);
        }
        if wanted.ipv6 {
            groups.push(MulticastGroup::Ipv6Ifaddr);
        }
        if wanted.routes && wanted.ipv6 {
            groups.push(MulticastGroup::Ipv6Route);
        }
        let (connection, _handle, messages) = rtnetlink::new_multicast_connection(&groups)?;
        Ok(Watch {
            messages,
            connection: tokio::spawn(connection),
        })
    }

    /// The next notice; `None` once the subscription has ended (the socket failed, e.g. its
    /// buffer overran): then only the periodic reconcile repairs.
    pub async fn next(&mut self) -> Option<Notice> {
        loop {
            let (message, _) = self.messages.next().await?;
            if let Some(notice) = notice(message.payload) {
                return Some(notice);
            }
        }
    }

    /// Drops the notices already queued: a burst (`ip link set down; ip link set up`, or a
    /// repair's own writes) needs one check, not one each.
    pub fn drain(&mut self) {
        while self.messages.try_recv().is_ok() {}
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

fn notice(payload: NetlinkPayload<RouteNetlinkMessage>) -> Option<Notice> {
    let NetlinkPayload::InnerMessage(message) = payload else {
        return None;
    };
    match message {
        RouteNetlinkMessage::NewLink(m) | RouteNetlinkMessage::DelLink(m) => {
            Some(Notice::Link(m.header.index))
        }
        RouteNetlinkMessage::NewAddress(m) | RouteNetlinkMessage::DelAddress(m) => {
            Some(Notice::Address(m.header.index))
        }
        RouteNetlinkMessage::NewRoute(m) | RouteNetlinkMessage::DelRoute(m) => {
            m.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(index) => Some(Notice::Route(*index)),
                _ => None,
            })
        }
        _ => None,
    }
}
