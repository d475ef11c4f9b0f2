//! `twill run --cleanup`: what the dataplane leaves running on purpose, taken away. Above both
//! the attachments and the pins, which it needs together.

use crate::{attach, pins};
use std::path::Path;

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
    if pin_dir.exists() && pins::is_bpffs(pin_dir)? {
        attach::detach_filters(pin_dir)?;
    }
    pins::unpin(pin_dir)
}
