//! Dumps (`ip route show`, `ip neigh show`, `ip nexthop show`) read one datagram at a time.
//!
//! rtnetlink's connection reads its socket until the kernel has nothing more, queueing every
//! message it parsed before it hands any on; a dump goes on for as long as it is read, so a
//! dump of 60,000 routes sat in that queue whole, as full messages (about 17 MB at 60,000
//! vxlan peers, the largest part of a reconcile's peak), and the queue kept its size after.
//! Here the next datagram is read only once the last one is parsed down to what the caller
//! keeps, on a socket of the dump's own.

use std::io;

use rtnetlink::packet_core::{
    NetlinkBuffer, NetlinkMessage, NetlinkPayload, NLMSG_ALIGNTO, NLM_F_DUMP, NLM_F_REQUEST,
};
use rtnetlink::sys::SocketAddr;
use rtnetlink::sys::{protocols::NETLINK_ROUTE, AsyncSocket, AsyncSocketExt, TokioSocket};

use super::nexthop::RtnlMessage;

/// The receive buffer. The kernel sizes a dump's datagrams to what the reader offers, up to
/// 32 KiB: this has room for the largest, and one that fills it was cut short.
const DATAGRAM: usize = 64 << 10;

/// Sends `request` as a dump and keeps what `parse` makes of each message of the answer; the
/// kernel's error (its errno intact) if it refuses.
pub(super) async fn dump<T>(
    request: impl Into<RtnlMessage>,
    mut parse: impl FnMut(RtnlMessage) -> Option<T>,
) -> io::Result<Vec<T>> {
    let socket = TokioSocket::new(NETLINK_ROUTE)?;
    let mut message = NetlinkMessage::from(request.into());
    message.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    message.finalize();
    let mut wire = vec![0; message.buffer_len()];
    message.serialize(&mut wire);
    socket.send_to(&wire, &SocketAddr::new(0, 0)).await?;
    let (mut kept, mut datagram) = (Vec::new(), Vec::with_capacity(DATAGRAM));
    loop {
        datagram.clear();
        socket.recv(&mut datagram).await?;
        if datagram.len() == DATAGRAM {
            return Err(malformed("a datagram filled the whole receive buffer"));
        }
        let mut rest = datagram.as_slice();
        while !rest.is_empty() {
            let length = NetlinkBuffer::new_checked(rest)
                .map_err(malformed)?
                .length() as usize;
            let message = NetlinkMessage::<RtnlMessage>::deserialize(&rest[..length]);
            match message.map_err(malformed)?.payload {
                NetlinkPayload::Done(_) => return Ok(kept),
                NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                NetlinkPayload::InnerMessage(inner) => kept.extend(parse(inner)),
                _ => {}
            }
            let align = usize::from(NLMSG_ALIGNTO);
            let next = length.next_multiple_of(align).min(rest.len());
            rest = &rest[next..];
        }
    }
}

fn malformed(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed netlink dump: {e}"),
    )
}
