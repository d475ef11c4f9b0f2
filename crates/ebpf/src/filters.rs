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

/// A filter at twill's priority on a hook, as the kernel lists it.
#[derive(Debug)]
pub(crate) struct Filter {
    handle: u32,
    /// The classifier: `bpf` for twill's.
    kind: String,
    /// A bpf filter's program: its id and the name it was attached under.
    program: Option<(u32, String)>,
}

impl Filter {
    /// Whether twill put this filter there for `program` (an earlier run's, or this one's):
    /// a bpf filter at twill's handle attached under the program's name.
    pub(crate) fn is_twills(&self, program: &str) -> bool {
        self.handle == HANDLE
            && self.kind == "bpf"
            && self
                .program
                .as_ref()
                .is_some_and(|(_, name)| name == program)
    }

    /// The id of the program it runs, if it is a bpf filter at twill's handle.
    fn program_id(&self) -> Option<u32> {
        let (id, _) = self.program.as_ref().filter(|_| self.handle == HANDLE)?;
        Some(*id)
    }
}

impl std::fmt::Display for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor) = (self.handle >> 16, self.handle & 0xffff);
        write!(
            f,
            "a {} filter at pref {PRIORITY} handle {major:x}:{minor:x}",
            self.kind
        )?;
        match &self.program {
            Some((id, name)) => write!(f, " running program {name:?} (id {id})"),
            None => Ok(()),
        }
    }
}

/// The filters at twill's priority on `ifindex`'s hook.
pub(crate) fn at_twills_priority(ifindex: u32, hook: TcAttachType) -> anyhow::Result<Vec<Filter>> {
    Ok(dump(ifindex, hook)?
        .into_iter()
        .filter(|f| (f.header.info >> 16) as u16 == PRIORITY)
        .filter_map(|f| {
            let handle = u32::from(f.header.handle.major) << 16 | u32::from(f.header.handle.minor);
            // The kernel lists a priority's classifier itself first, as handle 0.
            (handle != 0).then(|| read_filter(handle, &f.attributes))
        })
        .collect())
}

fn read_filter(handle: u32, attributes: &[TcAttribute]) -> Filter {
    let mut filter = Filter {
        handle,
        kind: String::new(),
        program: None,
    };
    let (mut id, mut name) = (None, String::new());
    for attribute in attributes {
        match attribute {
            TcAttribute::Kind(kind) => filter.kind = kind.clone(),
            TcAttribute::Options(options) => {
                for option in options {
                    match option {
                        TcOption::Bpf(TcFilterBpfOption::ProgId(i)) => id = Some(*i),
                        TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => name = n.clone(),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    filter.program = id.map(|id| (id, name));
    filter
}

/// The id of the program in the filter at twill's place on `ifindex`'s hook, if there is one.
pub(crate) fn program_at(ifindex: u32, hook: TcAttachType) -> anyhow::Result<Option<u32>> {
    Ok(at_twills_priority(ifindex, hook)?
        .iter()
        .find_map(Filter::program_id))
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
