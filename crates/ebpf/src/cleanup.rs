//! `twill run --cleanup`: what the dataplane leaves running on purpose, taken away. Above both
//! the attachments and the pins, which it needs together.

use crate::attach::{self, Hook};
use crate::object::Side;
use crate::{pins, xdp};
use anyhow::{bail, Context};
use aya::programs::ProgramInfo;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a removal waits for the kernel to detach what the unpinned links attached.
const DETACH_WITHIN: Duration = Duration::from_secs(5);

/// Detach the programs (their classic TC filters; a tcx link goes with its
/// pin) and unpin everything [`crate::Dataplane::open`] left in `pin_dir`, unmounting the
/// bpffs it mounted there. A directory that is not there is fine. Refused while a running
/// dataplane holds `pin_dir`: it would go on with programs detached under it.
pub fn remove(pin_dir: &Path) -> anyhow::Result<()> {
    let _claim = claim(pin_dir)?;
    remove_pins(pin_dir)
}

/// [`remove`], even while a running dataplane holds `pin_dir` (`--cleanup --force`).
pub fn remove_anyway(pin_dir: &Path) -> anyhow::Result<()> {
    let _claim = claim(pin_dir).ok();
    remove_pins(pin_dir)
}

/// The claim on `pin_dir` while it is removed, so that no start adopts half of it; none for a
/// directory that holds no pins.
fn claim(pin_dir: &Path) -> anyhow::Result<Option<pins::PinLock>> {
    match pin_dir.exists() && pins::is_bpffs(pin_dir)? {
        true => pins::lock(pin_dir).map(Some),
        false => Ok(None),
    }
}

/// What [`remove`] does once `pin_dir` is its caller's.
pub(crate) fn remove_pins(pin_dir: &Path) -> anyhow::Result<()> {
    let mut links = Vec::new();
    if pin_dir.exists() && pins::is_bpffs(pin_dir)? {
        links = pinned_links(pin_dir)?;
        attach::detach_filters(pin_dir)?;
    }
    pins::unpin(pin_dir)?;
    wait_detached(&links)
}

/// A program a pinned link attaches, read before the pins go.
struct PinnedLink {
    at: LinkAt,
    device: String,
    program: u32,
}

enum LinkAt {
    Tcx(Side),
    Xdp,
}

impl PinnedLink {
    fn runs(&self) -> anyhow::Result<bool> {
        match self.at {
            LinkAt::Tcx(side) => attach::runs(self.program, side, &self.device, Hook::Tcx),
            LinkAt::Xdp => xdp::runs(self.program, &self.device),
        }
    }
}

/// The links pinned in `pin_dir` (tcx and XDP; a classic filter is no link) and what they run.
fn pinned_links(pin_dir: &Path) -> anyhow::Result<Vec<PinnedLink>> {
    let Some(config) = pins::pinned_config(pin_dir)? else {
        return Ok(Vec::new());
    };
    let pinned = [
        (LinkAt::Tcx(Side::Egress), config.device_ifindex),
        (LinkAt::Tcx(Side::Ingress), config.underlay_ifindex),
        (LinkAt::Xdp, config.underlay_ifindex),
    ];
    let mut links = Vec::new();
    for (at, ifindex) in pinned {
        let (link, program) = match at {
            LinkAt::Tcx(side) => (
                pins::link_pin(pin_dir, side),
                pins::program_pin(pin_dir, side),
            ),
            LinkAt::Xdp => (pins::xdp_link_pin(pin_dir), pins::xdp_program_pin(pin_dir)),
        };
        let Ok(device) = nix::net::if_::if_indextoname(ifindex) else {
            continue;
        };
        if !link.exists() || !program.exists() {
            continue;
        }
        let program = ProgramInfo::from_pin(&program)
            .with_context(|| format!("reading {}", program.display()))?
            .id();
        let device = device.to_string_lossy().into_owned();
        links.push(PinnedLink {
            at,
            device,
            program,
        });
    }
    Ok(links)
}

/// Unpinning a link detaches its program only when the kernel frees the link, from a work
/// item after an RCU grace period: without this wait, what runs right after `--cleanup`
/// (another start, another tool's XDP program) could find the hook still taken.
fn wait_detached(links: &[PinnedLink]) -> anyhow::Result<()> {
    let deadline = Instant::now() + DETACH_WITHIN;
    for link in links {
        while link.runs()? {
            if Instant::now() >= deadline {
                bail!(
                    "program {} still runs on {} {DETACH_WITHIN:?} after its link was unpinned",
                    link.program,
                    link.device
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}
