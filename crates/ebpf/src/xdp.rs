//! The XDP program on the underlay: attached in the driver's own (native) mode through an XDP
//! link (Linux 5.9+), pinned so it outlives the daemon and adopted on the next start as a tcx
//! link is. It decapsulates each wire frame before GRO, so the stack coalesces the inner TCP.
//!
//! Where the driver has no native XDP (or refuses it: a veth's MTU above a page, fewer receive
//! queues than its peer's transmit queues) it is not attached, and the TC ingress program does
//! the whole job as it does without XDP. Generic XDP is not tried: it runs after GRO, where it
//! gains nothing over TC and would meet a GSO train of datagrams as one frame.

use crate::attach::{already_runs, replace_pin, unpin, Attached};
use crate::pins::{xdp_link_pin, xdp_program_pin};
use anyhow::{bail, Context};
use aya::programs::links::{FdLink, LinkError, PinnedLink};
use aya::programs::xdp::XdpLink;
use aya::programs::{Xdp, XdpMode};
use netlink_packet_route::link::{LinkAttribute, LinkMessage, LinkXdp};
use netlink_packet_route::RouteNetlinkMessage;
use std::io::ErrorKind;
use std::path::Path;

/// Whether to decapsulate at XDP (`--bpf-xdp`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum XdpChoice {
    /// Where the driver takes native XDP, but not on a veth underlay: a veth whose peer runs XDP
    /// gets TSO and GSO taken away (`veth_fix_features`), so every super-packet sent to this node
    /// is segmented in software first, 3.5x slower between eBPF nodes (docs/performance.md).
    #[default]
    Auto,
    /// Wherever the driver takes native XDP, a veth too.
    On,
    /// Never: TC alone.
    Off,
}

impl std::str::FromStr for XdpChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(XdpChoice::Auto),
            "on" => Ok(XdpChoice::On),
            "off" => Ok(XdpChoice::Off),
            other => Err(format!(
                "{other:?} is not an XDP choice; give auto, on or off"
            )),
        }
    }
}

/// Where the underlay's datagrams are decapsulated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ingress {
    /// At XDP, before GRO; the TC ingress program moves what it decapsulated into the device.
    Xdp,
    /// At TC alone, for the reason given: XDP was not asked for, or could not attach.
    Tc { why: String },
}

impl Ingress {
    /// As status names it.
    pub fn name(&self) -> &'static str {
        match self {
            Ingress::Xdp => "xdp",
            Ingress::Tc { .. } => "tc",
        }
    }
}

/// Attach `program` to `device` (pinned under `pin_dir`), or adopt the link an earlier run
/// pinned there. `Ok(Err(why))` when the device takes no native XDP program: nothing of XDP is
/// left attached or pinned then.
pub(crate) fn attach(
    program: &mut Xdp,
    device: &str,
    pin_dir: &Path,
) -> anyhow::Result<Result<Attached, String>> {
    let pin = xdp_link_pin(pin_dir);
    let attached = match adopt(program, device, &pin, pin_dir)? {
        Some(attached) => attached,
        None => match attach_new(program, device, &pin)? {
            Ok(attached) => attached,
            Err(why) => return Ok(Err(why)),
        },
    };
    if attached != Attached::Kept {
        replace_pin(&xdp_program_pin(pin_dir), |path| program.pin(path))?;
    }
    if crate::device::ensure_gro(device)
        .with_context(|| format!("on {device}, which runs the XDP program"))?
    {
        tracing::info!(device, "GRO turned on, to coalesce what XDP decapsulates");
    }
    Ok(Ok(attached))
}

/// Take the XDP program off the underlay (its link goes with its pin), as when XDP is not
/// asked for.
pub(crate) fn detach(pin_dir: &Path) -> anyhow::Result<()> {
    unpin(&xdp_link_pin(pin_dir))?;
    unpin(&xdp_program_pin(pin_dir))
}

/// The pinned link of an earlier run, if it still runs on `device`: kept when it runs this
/// very program, else switched to it in one step. A pin whose link lost its device goes.
fn adopt(
    program: &mut Xdp,
    device: &str,
    pin: &Path,
    pin_dir: &Path,
) -> anyhow::Result<Option<Attached>> {
    let link = match PinnedLink::from_pin(pin) {
        Ok(pinned) => FdLink::from(pinned),
        Err(LinkError::SyscallError(e)) if e.io_error.kind() == ErrorKind::NotFound => {
            return Ok(None)
        }
        Err(e) => return Err(e).with_context(|| format!("opening {}", pin.display())),
    };
    let running = link.info()?.program_id();
    if program_on(device)? != Some(running) {
        unpin(pin)?;
        return Ok(None);
    }
    if already_runs(&program.info()?, &xdp_program_pin(pin_dir), running) {
        return Ok(Some(Attached::Kept));
    }
    let id = program.attach_to_link(XdpLink::try_from(link)?)?;
    // The link stays pinned; this process's handle on it can go.
    drop(FdLink::try_from(program.take_link(id)?)?);
    Ok(Some(Attached::Replaced))
}

fn attach_new(
    program: &mut Xdp,
    device: &str,
    pin: &Path,
) -> anyhow::Result<Result<Attached, String>> {
    let id = match program.attach(device, XdpMode::Driver) {
        Ok(id) => id,
        Err(e) => return Ok(Err(format!("{device} takes no native XDP program: {e}"))),
    };
    // A kernel without XDP links (before 5.9) attaches over netlink: nothing to pin, and the
    // attachment would go with this process. Dropped, it is detached again.
    let link = match FdLink::try_from(program.take_link(id)?) {
        Ok(link) => link,
        Err(_) => return Ok(Err("this kernel has no XDP links (Linux 5.9+)".to_string())),
    };
    link.pin(pin)
        .with_context(|| format!("pinning {}", pin.display()))?;
    Ok(Ok(Attached::New))
}

/// Whether the program `id` runs at `device`'s XDP hook (not once the device was deleted or
/// the link unpinned).
pub(crate) fn runs(id: u32, device: &str) -> anyhow::Result<bool> {
    Ok(program_on(device)? == Some(id))
}

/// The id of the XDP program `device` runs, if any; none on a device that is gone.
fn program_on(device: &str) -> anyhow::Result<Option<u32>> {
    let Ok(ifindex) = nix::net::if_::if_nametoindex(device) else {
        return Ok(None);
    };
    let mut request = LinkMessage::default();
    request.header.index = ifindex;
    let answers =
        match twill_dataplane::io::rtnetlink::ask(RouteNetlinkMessage::GetLink(request), 0)
            .with_context(|| format!("reading {device}'s XDP program"))?
        {
            Ok(answers) => answers,
            Err(code) if code == -libc::ENODEV => return Ok(None),
            Err(code) => bail!(
                "reading {device}'s XDP program: {}",
                std::io::Error::from_raw_os_error(-code)
            ),
        };
    let id = answers.iter().find_map(|answer| match answer {
        RouteNetlinkMessage::NewLink(link) => link.attributes.iter().find_map(|a| match a {
            LinkAttribute::Xdp(xdp) => xdp.iter().find_map(|x| match x {
                LinkXdp::ProgId(id) if *id != 0 => Some(*id),
                _ => None,
            }),
            _ => None,
        }),
        _ => None,
    });
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_reads_three_words_and_names_them_when_wrong() {
        assert_eq!("auto".parse(), Ok(XdpChoice::Auto));
        assert_eq!("on".parse(), Ok(XdpChoice::On));
        assert_eq!("off".parse(), Ok(XdpChoice::Off));
        assert_eq!(
            "yes".parse::<XdpChoice>().unwrap_err(),
            r#""yes" is not an XDP choice; give auto, on or off"#
        );
    }
}
