//! The classic TC filter a program sits in, read over rtnetlink: which program runs in it.
//! aya attaches and detaches filters but cannot tell what one runs; the repair of a dataplane
//! on classic TC must know whether its programs still run where they were put.

use anyhow::{bail, Context};
use aya::programs::TcAttachType;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::tc::{TcAttribute, TcFilterBpfOption, TcHandle, TcMessage, TcOption};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// Where twill's filter sits on a hook: fixed, so a restart finds and replaces it.
pub(crate) const PRIORITY: u16 = 1;
pub(crate) const HANDLE: u32 = 1;

/// The id of the program in twill's filter on `ifindex`'s hook, if there is one.
pub(crate) fn program_at(ifindex: u32, hook: TcAttachType) -> anyhow::Result<Option<u32>> {
    let mut found = None;
    for filter in dump(ifindex, hook)? {
        let priority = (filter.header.info >> 16) as u16;
        let handle =
            u32::from(filter.header.handle.major) << 16 | u32::from(filter.header.handle.minor);
        if priority != PRIORITY || handle != HANDLE {
            continue;
        }
        found = filter.attributes.iter().find_map(|a| match a {
            TcAttribute::Options(options) => options.iter().find_map(|o| match o {
                TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => Some(*id),
                _ => None,
            }),
            _ => None,
        });
    }
    Ok(found)
}

/// Every filter on the hook (none where the device has no clsact qdisc).
fn dump(ifindex: u32, hook: TcAttachType) -> anyhow::Result<Vec<TcMessage>> {
    let mut request = TcMessage::with_index(ifindex as i32);
    request.header.parent = TcHandle {
        major: TcHandle::CLSACT.major,
        minor: match hook {
            TcAttachType::Egress => TcHandle::MIN_EGRESS,
            _ => TcHandle::MIN_INGRESS,
        },
    };
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut message = NetlinkMessage::new(
        header,
        NetlinkPayload::from(RouteNetlinkMessage::GetTrafficFilter(request)),
    );
    message.finalize();
    let mut bytes = vec![0u8; message.buffer_len()];
    message.serialize(&mut bytes);

    let mut socket = Socket::new(NETLINK_ROUTE).context("opening rtnetlink")?;
    socket.bind_auto().context("binding rtnetlink")?;
    socket.connect(&SocketAddr::new(0, 0))?;
    socket
        .send(&bytes, 0)
        .context("asking for the tc filters")?;
    let mut filters = Vec::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let read = socket.recv(&mut &mut buffer[..], 0)?;
        let mut at = 0;
        while at < read {
            let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buffer[at..read])
                .context("reading a tc filter")?;
            at += reply.header.length as usize;
            match reply.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewTrafficFilter(f)) => {
                    filters.push(f)
                }
                NetlinkPayload::Done(_) => return Ok(filters),
                // No clsact qdisc on the device: no filter either.
                NetlinkPayload::Error(e) if e.raw_code() == -libc::EINVAL => return Ok(filters),
                NetlinkPayload::Error(e) => bail!("listing tc filters: {e}"),
                _ => {}
            }
            if reply.header.length == 0 {
                break;
            }
        }
    }
}
