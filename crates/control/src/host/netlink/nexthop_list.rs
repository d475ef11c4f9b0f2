//! Reading nexthop objects back: all of them (`ip nexthop show`, a [`dump`]), or one (`ip
//! nexthop get id`) on the batch socket, which speaks nexthop messages.

use std::io;

use futures::StreamExt;
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use rtnetlink::sys::SocketAddr;

use super::dump::dump;
use super::message::parse_nexthop;
use super::nexthop::{NexthopMessage, RtnlMessage};
use super::{ListedNexthop, Netlink};

impl Netlink {
    /// Every nexthop object of this namespace. Fails with the kernel's errno where it has no
    /// nexthop objects (before Linux 5.3: EOPNOTSUPP).
    pub async fn nexthops(&self) -> io::Result<Vec<ListedNexthop>> {
        let request = RtnlMessage::GetNexthop(NexthopMessage::default());
        dump(request, |answer| match answer {
            RtnlMessage::NewNexthop(msg) => parse_nexthop(&msg),
            _ => None,
        })
        .await
    }

    /// The nexthop object `id`; `None` when there is none.
    pub async fn nexthop(&self, id: u32) -> io::Result<Option<ListedNexthop>> {
        match self.nexthop_request(NexthopMessage::id(id)).await {
            Ok(found) => Ok(found.into_iter().next()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn nexthop_request(&self, body: NexthopMessage) -> io::Result<Vec<ListedNexthop>> {
        let mut request = NetlinkMessage::from(RtnlMessage::GetNexthop(body));
        request.header.flags = NLM_F_REQUEST;
        let mut answers = self
            .batches
            .request(request, SocketAddr::new(0, 0))
            .map_err(io::Error::other)?;
        let mut listed = Vec::new();
        while let Some(answer) = answers.next().await {
            match answer.payload {
                NetlinkPayload::InnerMessage(RtnlMessage::NewNexthop(msg)) => {
                    listed.extend(parse_nexthop(&msg));
                }
                NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                _ => {}
            }
        }
        Ok(listed)
    }
}
