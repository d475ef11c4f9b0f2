//! The classic TC filter a program sits in, read over rtnetlink: which program runs in it.
//! aya attaches and detaches filters but cannot tell what one runs; the repair of a dataplane
//! on classic TC must know whether its programs still run where they were put.

use anyhow::{bail, Context};
use aya::programs::TcAttachType;
use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::tc::{TcAttribute, TcFilterBpfOption, TcHandle, TcMessage, TcOption};
use netlink_packet_route::RouteNetlinkMessage;

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
    let request = RouteNetlinkMessage::GetTrafficFilter(request);
    match twill_dataplane::io::rtnetlink::ask(request, NLM_F_DUMP).context("listing tc filters")? {
        Ok(answers) => Ok(answers
            .into_iter()
            .filter_map(|a| match a {
                RouteNetlinkMessage::NewTrafficFilter(f) => Some(f),
                _ => None,
            })
            .collect()),
        // No clsact qdisc on the device: no filter either.
        Err(code) if code == -libc::EINVAL => Ok(Vec::new()),
        Err(code) => bail!(
            "listing tc filters: {}",
            std::io::Error::from_raw_os_error(-code)
        ),
    }
}
