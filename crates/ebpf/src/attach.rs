//! Attaching the programs: a tcx link (kernels from 6.6), pinned so it outlives the daemon, or
//! a classic TC filter (a clsact qdisc and a direct-action bpf filter, which kernels have run
//! since 4.x) at a fixed priority and handle, which outlives the daemon by itself. A link or
//! filter already there is adopted: kept when it runs the same program, or switched to the new
//! one in one step (link update, filter replace), so forwarding never stops. An attachment of
//! the other kind an earlier run left (another `--bpf-attach`) goes once the new one is in.

use crate::filters;
use crate::object::Side;
use crate::pins::{link_pin, pinned_config, program_pin};
use anyhow::{bail, Context};
use aya::programs::links::{FdLink, LinkError, PinnedLink};
use aya::programs::tc::{
    qdisc_add_clsact, qdisc_detach_program, NlOptions, SchedClassifierLink, TcAttachOptions,
    TcError, TcHandle,
};
use aya::programs::{LinkOrder, ProgramInfo, SchedClassifier, TcAttachType};
use aya::util::KernelVersion;
use std::io::ErrorKind;
use std::path::Path;
use std::str::FromStr;

/// How the programs are attached (`--bpf-attach`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AttachMode {
    /// tcx links; refused on a kernel without them.
    Tcx,
    /// Classic TC: a clsact qdisc and a direct-action bpf filter.
    Tc,
    /// tcx where the kernel has it, else classic TC.
    #[default]
    Auto,
}

impl FromStr for AttachMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tcx" => Ok(AttachMode::Tcx),
            "tc" => Ok(AttachMode::Tc),
            "auto" => Ok(AttachMode::Auto),
            other => Err(format!(
                "{other:?} is not a way to attach; give tcx, tc or auto"
            )),
        }
    }
}

/// The hook the programs are attached through, once [`AttachMode`] is settled on a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Tcx,
    Tc,
}

impl Hook {
    /// As status names it.
    pub fn name(self) -> &'static str {
        match self {
            Hook::Tcx => "tcx",
            Hook::Tc => "tc",
        }
    }
}

impl AttachMode {
    /// The hook this kernel gives; `Tcx` on a kernel without tcx links is an error naming it.
    pub fn hook(self) -> anyhow::Result<Hook> {
        match self {
            AttachMode::Tcx if !has_tcx() => bail!(
                "tcx links need Linux 6.6 or later, and this kernel is {}: attach with tc, or auto",
                crate::probe::kernel_release()
            ),
            AttachMode::Tcx => Ok(Hook::Tcx),
            AttachMode::Tc => Ok(Hook::Tc),
            AttachMode::Auto if has_tcx() => Ok(Hook::Tcx),
            AttachMode::Auto => Ok(Hook::Tc),
        }
    }
}

/// What attaching found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attached {
    /// A link of an earlier run already ran this very program.
    Kept,
    /// A link or filter of an earlier run now runs the new program.
    Replaced,
    /// Nothing was attached here before.
    New,
}

fn has_tcx() -> bool {
    KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0))
}

pub(crate) fn attach(
    program: &mut SchedClassifier,
    side: Side,
    device: &str,
    pin_dir: &Path,
    hook: Hook,
) -> anyhow::Result<Attached> {
    let attached = match hook {
        Hook::Tcx => attach_tcx(program, side, device, pin_dir),
        Hook::Tc => attach_filter(program, side, device),
    };
    let attached =
        attached.with_context(|| format!("attaching {} to {device}", side.program_name()))?;
    // The other kind of attachment an earlier run left: after the new one, so no packet
    // finds neither.
    match hook {
        Hook::Tcx => detach_filter(side, device)?,
        Hook::Tc => remove_link_pin(pin_dir, side)?,
    }
    if attached != Attached::Kept {
        replace_pin(&program_pin(pin_dir, side), |path| program.pin(path))?;
    }
    Ok(attached)
}

fn attach_tcx(
    program: &mut SchedClassifier,
    side: Side,
    device: &str,
    pin_dir: &Path,
) -> anyhow::Result<Attached> {
    let pin = link_pin(pin_dir, side);
    match PinnedLink::from_pin(&pin) {
        Ok(pinned) => {
            let link = FdLink::from(pinned);
            let running = link.info()?.program_id();
            if tcx_runs(device, side, running)? {
                return adopt(program, side, pin_dir, link, running);
            }
            // The device this link was made for is gone (a link dies with its device).
            std::fs::remove_file(&pin)?;
        }
        Err(LinkError::SyscallError(e)) if e.io_error.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("opening {}", pin.display())),
    }
    let options = TcAttachOptions::TcxOrder(LinkOrder::default());
    let id = program.attach_with_options(device, side.attach_type(), options)?;
    let link: FdLink = program.take_link(id)?.try_into()?;
    link.pin(&pin)?;
    Ok(Attached::New)
}

/// Keep a live link that runs the same program; otherwise update it to the new one.
fn adopt(
    program: &mut SchedClassifier,
    side: Side,
    pin_dir: &Path,
    link: FdLink,
    running: u32,
) -> anyhow::Result<Attached> {
    if already_runs(&program.info()?, &program_pin(pin_dir, side), running) {
        return Ok(Attached::Kept);
    }
    let id = program.attach_to_link(SchedClassifierLink::try_from(link)?)?;
    // The link stays pinned; this process's handle on it can go.
    drop(FdLink::try_from(program.take_link(id)?)?);
    Ok(Attached::Replaced)
}

/// Whether the program `id` runs at `device`'s hook for `side` through `hook`: no longer once its
/// device was deleted, its link unpinned or its filter deleted. A device that is gone is not
/// an error here.
pub(crate) fn runs(id: u32, side: Side, device: &str, hook: Hook) -> anyhow::Result<bool> {
    let Ok(ifindex) = nix::net::if_::if_nametoindex(device) else {
        return Ok(false);
    };
    match hook {
        Hook::Tcx => tcx_runs(device, side, id),
        Hook::Tc => Ok(filters::program_at(ifindex, side.attach_type())? == Some(id)),
    }
}

fn tcx_runs(device: &str, side: Side, program_id: u32) -> anyhow::Result<bool> {
    let (_, programs) = SchedClassifier::query_tcx(device, side.attach_type())?;
    Ok(programs.iter().any(|p| p.id() == program_id))
}

fn attach_filter(
    program: &mut SchedClassifier,
    side: Side,
    device: &str,
) -> anyhow::Result<Attached> {
    match qdisc_add_clsact(device) {
        Ok(()) | Err(TcError::AlreadyAttached) => {}
        // aya 0.14 reports a clsact qdisc already there as the kernel's EEXIST.
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(e).context("adding the clsact qdisc"),
    }
    let ifindex = nix::net::if_::if_nametoindex(device)?;
    let handle = TcHandle::new(0, filters::HANDLE as u16);
    let there = filters::at_twills_priority(ifindex, side.attach_type())?;
    if let Some(foreign) = there.iter().find(|f| !f.is_twills(side.program_name())) {
        bail!(
            "{device}'s {hook} hook already has {foreign}, which twill did not put there: twill \
             replaces only its own; remove it (tc filter del dev {device} {hook} pref {pref}) or \
             attach by tcx (--bpf-attach tcx, from Linux 6.6)",
            hook = match side.attach_type() {
                TcAttachType::Egress => "egress",
                _ => "ingress",
            },
            pref = filters::PRIORITY,
        );
    }
    let (id, attached) = match !there.is_empty() {
        true => {
            let existing = SchedClassifierLink::attached(
                device,
                side.attach_type(),
                filters::PRIORITY,
                handle,
                None,
            )?;
            (program.attach_to_link(existing)?, Attached::Replaced)
        }
        false => {
            let options = TcAttachOptions::Netlink(NlOptions {
                priority: filters::PRIORITY,
                handle,
                ..NlOptions::default()
            });
            let id = program.attach_with_options(device, side.attach_type(), options)?;
            (id, Attached::New)
        }
    };
    // A filter is no link: dropping its handle would delete it, and it must outlive us.
    std::mem::forget(program.take_link(id)?);
    Ok(attached)
}

/// Deletes twill's filter on `device`'s hook for `side`, if there is one.
fn detach_filter(side: Side, device: &str) -> anyhow::Result<()> {
    match qdisc_detach_program(device, side.attach_type(), side.program_name()) {
        Ok(()) => Ok(()),
        Err(TcError::IoError(e)) if e.kind() == ErrorKind::NotFound => Ok(()),
        // No clsact qdisc on the device: no filter either.
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        Err(e) => Err(e).with_context(|| format!("detaching the filter from {device}")),
    }
}

/// Whether the program pinned at `pin` is the one running (`running`, a link's) and is
/// `new`: then the running one is kept as it is.
pub(crate) fn already_runs(new: &ProgramInfo, pin: &Path, running: u32) -> bool {
    let pinned = ProgramInfo::from_pin(pin).ok();
    pinned.is_some_and(|p| p.id() == running && p.tag() == new.tag())
}

fn remove_link_pin(pin_dir: &Path, side: Side) -> anyhow::Result<()> {
    unpin(&link_pin(pin_dir, side))
}

/// Removes the pin at `path`; one that is not there is fine.
pub(crate) fn unpin(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot unpin {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// Pins with `pin` at `path`, in place of what was pinned there.
pub(crate) fn replace_pin<E: std::error::Error + Send + Sync + 'static>(
    path: &Path,
    pin: impl FnOnce(&Path) -> Result<(), E>,
) -> anyhow::Result<()> {
    unpin(path)?;
    pin(path).with_context(|| format!("pinning {}", path.display()))
}

/// Delete the classic TC filters of the devices named in `pin_dir`'s config map (tcx links go
/// when their pins do). A device that is gone took its filters with it.
pub(crate) fn detach_filters(pin_dir: &Path) -> anyhow::Result<()> {
    let Some(config) = pinned_config(pin_dir)? else {
        return Ok(());
    };
    let devices = [
        (config.device_ifindex, Side::Egress),
        (config.underlay_ifindex, Side::Ingress),
    ];
    for (ifindex, side) in devices {
        let Ok(name) = nix::net::if_::if_indextoname(ifindex) else {
            continue;
        };
        detach_filter(side, &name.to_string_lossy())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_reads_three_words_and_names_them_when_wrong() {
        assert_eq!("tcx".parse(), Ok(AttachMode::Tcx));
        assert_eq!("tc".parse(), Ok(AttachMode::Tc));
        assert_eq!("auto".parse(), Ok(AttachMode::Auto));
        assert_eq!(
            "clsact".parse::<AttachMode>().unwrap_err(),
            r#""clsact" is not a way to attach; give tcx, tc or auto"#
        );
    }

    #[test]
    fn auto_takes_tcx_where_the_kernel_has_it() {
        let hook = AttachMode::Auto.hook().unwrap();
        assert_eq!(hook == Hook::Tcx, has_tcx(), "{hook:?}");
        assert_eq!(AttachMode::Tc.hook().unwrap(), Hook::Tc);
    }
}
