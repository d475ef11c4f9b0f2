//! Per-peer kernel changes (routes, neighbours, fdb entries), sent many to a datagram.
//!
//! The kernel handles every message of a datagram in turn and acks each, so one `sendmsg`
//! carries a whole batch and a reconcile of thousands of peers costs a few hundred round
//! trips instead of one per entry. The acks come back in order, one per message, which is how
//! each change gets its own result.

use super::message::{family_of, nexthop_message};
use super::nexthop::{NexthopMessage, RtnlMessage};
use super::{route_message, FdbEntry, Neighbour, Netlink, Nexthop, Route};
use futures::StreamExt;
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{RouteScope, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::packet_core::{
    NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE,
    NLM_F_REQUEST,
};
use rtnetlink::proto::ConnectionHandle;
use rtnetlink::sys::{protocols::NETLINK_ROUTE, AsyncSocket, SocketAddr};
use std::fmt;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;

/// Messages per datagram: about 80 bytes each, and the acks of one batch (about 1 KB of
/// receive buffer each, counting the kernel's bookkeeping) fit the buffer set below.
const BATCH: usize = 256;
const RECEIVE_BUFFER: usize = 4 << 20;

/// One change to the kernel's state for a peer. Adds replace what is there (idempotent);
/// deletes of something already gone succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    ReplaceRoute(Route),
    DeleteRoute(Route),
    /// A permanent neighbour on the device of this index.
    ReplaceNeighbour(u32, Neighbour),
    DeleteNeighbour(u32, IpAddr),
    /// `bridge fdb replace <mac> dev <index> dst <dst> self permanent`.
    ReplaceFdb(u32, FdbEntry),
    DeleteFdb(u32, FdbEntry),
    /// A nexthop object of twill's, made only where its id is free: another's is never
    /// replaced, even one made since twill last looked.
    CreateNexthop(Nexthop),
    /// A nexthop object twill made before, changed in place.
    ReplaceNexthop(Nexthop),
    DeleteNexthop(u32),
}

/// The protocol twill's nexthop objects carry (an unassigned RTPROT_* value, 't'): with
/// their id range, how twill tells its own from another daemon's or an administrator's.
pub const NEXTHOP_PROTOCOL: u8 = 0x74;

impl fmt::Display for Write {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Write::ReplaceRoute(r) => write!(f, "adding route {}", r.dst),
            Write::DeleteRoute(r) => write!(f, "deleting route {}", r.dst),
            Write::ReplaceNeighbour(_, n) => write!(f, "adding neighbour {} {}", n.ip, n.mac),
            Write::DeleteNeighbour(_, ip) => write!(f, "deleting neighbour {ip}"),
            Write::ReplaceFdb(_, e) => write!(f, "adding fdb entry {} dst {}", e.mac, e.dst),
            Write::DeleteFdb(_, e) => write!(f, "deleting fdb entry {} dst {}", e.mac, e.dst),
            Write::CreateNexthop(n) | Write::ReplaceNexthop(n) => {
                write!(f, "adding nexthop {} via {}", n.id, n.gateway)
            }
            Write::DeleteNexthop(id) => write!(f, "deleting nexthop {id}"),
        }
    }
}

impl Write {
    fn message(&self) -> NetlinkMessage<RtnlMessage> {
        const REPLACE: u16 = NLM_F_CREATE | NLM_F_REPLACE;
        let (payload, flags): (RtnlMessage, u16) = match *self {
            Write::ReplaceRoute(route) => {
                let msg = RouteNetlinkMessage::NewRoute(route_message(&route));
                (msg.into(), REPLACE)
            }
            Write::DeleteRoute(route) => {
                let mut msg = route_message(&route);
                // NoWhere matches any scope, as `ip route del` does.
                msg.header.scope = RouteScope::NoWhere;
                (RouteNetlinkMessage::DelRoute(msg).into(), 0)
            }
            Write::ReplaceNeighbour(dev, n) => {
                let msg = neighbour(family_of(n.ip), dev, n.ip, Some(n.mac.0));
                (RouteNetlinkMessage::NewNeighbour(msg).into(), REPLACE)
            }
            Write::DeleteNeighbour(dev, ip) => {
                let msg = neighbour(family_of(ip), dev, ip, None);
                (RouteNetlinkMessage::DelNeighbour(msg).into(), 0)
            }
            Write::ReplaceFdb(dev, e) => {
                let msg = neighbour(AddressFamily::Bridge, dev, e.dst, Some(e.mac.0));
                (RouteNetlinkMessage::NewNeighbour(msg).into(), REPLACE)
            }
            Write::DeleteFdb(dev, e) => {
                let msg = neighbour(AddressFamily::Bridge, dev, e.dst, Some(e.mac.0));
                (RouteNetlinkMessage::DelNeighbour(msg).into(), 0)
            }
            Write::CreateNexthop(nh) => {
                let msg = nexthop_message(&nh, NEXTHOP_PROTOCOL);
                (RtnlMessage::NewNexthop(msg), NLM_F_CREATE | NLM_F_EXCL)
            }
            Write::ReplaceNexthop(nh) => {
                let msg = nexthop_message(&nh, NEXTHOP_PROTOCOL);
                (RtnlMessage::NewNexthop(msg), REPLACE)
            }
            Write::DeleteNexthop(id) => (RtnlMessage::DelNexthop(NexthopMessage::id(id)), 0),
        };
        let mut message = NetlinkMessage::from(payload);
        message.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        message
    }

    /// Errnos that mean the kernel already is as this change wants it.
    fn already_done(&self) -> &'static [i32] {
        match self {
            Write::DeleteRoute(_) => &[libc::ESRCH, libc::ENOENT],
            Write::DeleteNeighbour(..) | Write::DeleteFdb(..) => &[libc::ENOENT, libc::ESRCH],
            Write::DeleteNexthop(_) => &[libc::ENOENT],
            _ => &[],
        }
    }
}

/// A permanent neighbour (`Inet`, `Inet6`) or fdb entry (`Bridge`, flagged `self`) on `dev`;
/// `mac` only when adding or when it identifies the entry (fdb).
fn neighbour(
    family: AddressFamily,
    dev: u32,
    ip: IpAddr,
    mac: Option<[u8; 6]>,
) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = family;
    msg.header.ifindex = dev;
    msg.header.state = NeighbourState::Permanent;
    msg.header.kind = RouteType::Unspec;
    if family == AddressFamily::Bridge {
        msg.header.flags = NeighbourFlags::Own;
    }
    if let Some(mac) = mac {
        msg.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
    }
    let dst = match ip {
        IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
        IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
    };
    msg.attributes.push(NeighbourAttribute::Destination(dst));
    msg
}

/// The connection for batches: acks are handed back (not only errors), so that every message
/// of a batch gets its answer, and the receive buffer holds a whole batch of them.
pub(super) fn connect(
    runtime: &tokio::runtime::Handle,
) -> io::Result<ConnectionHandle<RtnlMessage>> {
    let (mut connection, handle, _) = rtnetlink::proto::new_connection(NETLINK_ROUTE)?;
    connection.set_forward_ack(true);
    connection
        .socket_mut()
        .socket_mut()
        .set_rx_buf_sz(RECEIVE_BUFFER)?;
    runtime.spawn(connection);
    Ok(handle)
}

impl Netlink {
    /// Makes the changes, in order, `BATCH` to a datagram; one result per change.
    pub async fn write(&self, writes: &[Write]) -> Vec<io::Result<()>> {
        let mut results = Vec::with_capacity(writes.len());
        for batch in writes.chunks(BATCH) {
            self.writes.fetch_add(batch.len() as u64, Relaxed);
            results.extend(self.write_batch(batch).await);
        }
        results
    }

    /// One change; for the few made outside a batch.
    pub async fn write_one(&self, write: Write) -> io::Result<()> {
        let result = self.write(&[write]).await.pop();
        result.unwrap_or_else(|| Err(io::Error::other("netlink gave no answer")))
    }

    async fn write_batch(&self, batch: &[Write]) -> Vec<io::Result<()>> {
        let messages = batch.iter().map(Write::message);
        let sent = self.batches.request_batch(messages, SocketAddr::new(0, 0));
        let answers: Vec<_> = match sent {
            Ok(stream) => stream.collect().await,
            Err(e) => return failed(batch.len(), &e.to_string()),
        };
        if answers.len() != batch.len() {
            let why = format!("{} answers to {} requests", answers.len(), batch.len());
            return failed(batch.len(), &why);
        }
        let results = batch
            .iter()
            .zip(answers)
            .map(|(write, answer)| match answer.payload {
                NetlinkPayload::Error(e) if e.code.is_none() => Ok(()),
                NetlinkPayload::Error(e) => {
                    let e = e.to_io();
                    match e.raw_os_error() {
                        Some(code) if write.already_done().contains(&code) => Ok(()),
                        _ => Err(e),
                    }
                }
                other => Err(io::Error::other(format!("unexpected answer {other:?}"))),
            });
        results.collect()
    }
}

fn failed(n: usize, why: &str) -> Vec<io::Result<()>> {
    (0..n)
        .map(|_| Err(io::Error::other(format!("netlink batch failed: {why}"))))
        .collect()
}
