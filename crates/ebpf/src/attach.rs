//! Attaching the programs: a tcx link where the kernel has them (6.6+), pinned so it outlives
//! the daemon, or a clsact filter otherwise. A link or filter already there is adopted: kept
//! when it runs the same program, or switched to the new one in one step (link update,
//! filter replace), so forwarding never stops.

use crate::object::Side;
use crate::pins::{link_pin, pinned_config, program_pin};
use anyhow::Context;
use aya::programs::links::{FdLink, LinkError, PinnedLink};
use aya::programs::tc::{
    qdisc_add_clsact, qdisc_detach_program, NlOptions, SchedClassifierLink, TcAttachOptions,
    TcError, TcHandle,
};
use aya::programs::{LinkOrder, ProgramInfo, SchedClassifier};
use aya::util::KernelVersion;
use std::io::ErrorKind;
use std::path::Path;

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

/// The clsact filter twill's programs sit at: fixed, so a restart finds and replaces it.
const FILTER_PRIORITY: u16 = 1;
const FILTER_HANDLE: TcHandle = TcHandle::new(0, 1);

pub(crate) fn has_tcx() -> bool {
    KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0))
}

pub(crate) fn attach(
    program: &mut SchedClassifier,
    side: Side,
    device: &str,
    pin_dir: &Path,
) -> anyhow::Result<Attached> {
    let attached = if has_tcx() {
        attach_tcx(program, side, device, pin_dir)
    } else {
        attach_clsact(program, side, device)
    };
    let attached =
        attached.with_context(|| format!("attaching {} to {device}", side.program_name()))?;
    if attached != Attached::Kept {
        pin_program(program, &program_pin(pin_dir, side))?;
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
            if attached_here(device, side, running)? {
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
    let new_tag = program.info()?.tag();
    let pinned = ProgramInfo::from_pin(program_pin(pin_dir, side)).ok();
    if pinned.is_some_and(|p| p.id() == running && p.tag() == new_tag) {
        return Ok(Attached::Kept);
    }
    let id = program.attach_to_link(SchedClassifierLink::try_from(link)?)?;
    // The link stays pinned; this process's handle on it can go.
    drop(FdLink::try_from(program.take_link(id)?)?);
    Ok(Attached::Replaced)
}

/// Whether `program` runs at `device`'s hook for `side` (tcx kernels): no longer once its
/// device was deleted or its link unpinned. A device that is gone is not an error here.
pub(crate) fn runs(program: &SchedClassifier, side: Side, device: &str) -> anyhow::Result<bool> {
    if nix::net::if_::if_nametoindex(device).is_err() {
        return Ok(false);
    }
    attached_here(device, side, program.info()?.id())
}

fn attached_here(device: &str, side: Side, program_id: u32) -> anyhow::Result<bool> {
    let (_, programs) = SchedClassifier::query_tcx(device, side.attach_type())?;
    Ok(programs.iter().any(|p| p.id() == program_id))
}

fn attach_clsact(
    program: &mut SchedClassifier,
    side: Side,
    device: &str,
) -> anyhow::Result<Attached> {
    match qdisc_add_clsact(device) {
        Ok(()) | Err(TcError::AlreadyAttached) => {}
        Err(e) => return Err(e).context("adding the clsact qdisc"),
    }
    let existing = SchedClassifierLink::attached(
        device,
        side.attach_type(),
        FILTER_PRIORITY,
        FILTER_HANDLE,
        None,
    )?;
    let (id, attached) = match program.attach_to_link(existing) {
        Ok(id) => (id, Attached::Replaced),
        Err(_) => {
            let options = TcAttachOptions::Netlink(NlOptions {
                priority: FILTER_PRIORITY,
                handle: FILTER_HANDLE,
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

fn pin_program(program: &mut SchedClassifier, path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    program
        .pin(path)
        .with_context(|| format!("pinning {}", path.display()))
}

/// Delete the clsact filters of the devices named in `pin_dir`'s config map (tcx links go when
/// their pins do). A device that is gone took its filters with it.
pub(crate) fn detach_filters(pin_dir: &Path) -> anyhow::Result<()> {
    if has_tcx() {
        return Ok(());
    }
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
        let name = name.to_string_lossy();
        match qdisc_detach_program(&name, side.attach_type(), side.program_name()) {
            Ok(()) => {}
            Err(TcError::IoError(e)) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("detaching from {name}")),
        }
    }
    Ok(())
}
