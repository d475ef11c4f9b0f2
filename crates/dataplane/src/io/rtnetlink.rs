//! One rtnetlink request and its answer, from a thread with no async runtime: the TUN's and
//! the eBPF dataplane's device settings ([`super::devconf`]), what aya cannot tell about the
//! eBPF attachments (which program a classic TC filter runs, which XDP program a device runs),
//! and the segmenter's veth pair.

use anyhow::Context;
use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// The messages the kernel answers `request` with (with `flags` NLM_F_DUMP, all of them until
/// the dump ends; with NLM_F_ACK, none once it acknowledges); `Err(-errno)` when it answers
/// with an error.
pub fn ask(
    request: RouteNetlinkMessage,
    flags: u16,
) -> anyhow::Result<Result<Vec<RouteNetlinkMessage>, i32>> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    let mut message = NetlinkMessage::new(header, NetlinkPayload::from(request));
    message.finalize();
    let mut bytes = vec![0u8; message.buffer_len()];
    message.serialize(&mut bytes);

    let mut socket = Socket::new(NETLINK_ROUTE).context("opening rtnetlink")?;
    socket.bind_auto().context("binding rtnetlink")?;
    socket.connect(&SocketAddr::new(0, 0))?;
    socket.send(&bytes, 0).context("asking rtnetlink")?;
    let mut answers = Vec::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let read = socket.recv(&mut &mut buffer[..], 0)?;
        let mut at = 0;
        while at < read {
            let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buffer[at..read])
                .context("reading rtnetlink's answer")?;
            at += reply.header.length as usize;
            match reply.payload {
                NetlinkPayload::InnerMessage(answer) => {
                    answers.push(answer);
                    // A request that is no dump has one answer.
                    if flags & netlink_packet_core::NLM_F_DUMP == 0 {
                        return Ok(Ok(answers));
                    }
                }
                NetlinkPayload::Done(_) => return Ok(Ok(answers)),
                NetlinkPayload::Error(e) if e.code.is_some() => return Ok(Err(e.raw_code())),
                // An acknowledgement: the request is done.
                NetlinkPayload::Error(_) => return Ok(Ok(answers)),
                _ => {}
            }
            if reply.header.length == 0 {
                break;
            }
        }
    }
}
