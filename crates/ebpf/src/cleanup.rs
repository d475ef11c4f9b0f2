//! `twill run --cleanup`: what the dataplane leaves running on purpose, taken away. Above both
//! the attachments and the pins, which it needs together.

use crate::{attach, pins};
use std::path::Path;

/// Detach the programs (the clsact filters a kernel before tcx got; a tcx link goes with its
/// pin) and unpin everything [`crate::Dataplane::open`] left in `pin_dir`, unmounting the
/// bpffs it mounted there. A directory that is not there is fine.
pub fn remove(pin_dir: &Path) -> anyhow::Result<()> {
    if pin_dir.exists() && pins::is_bpffs(pin_dir)? {
        attach::detach_filters(pin_dir)?;
    }
    pins::unpin(pin_dir)
}
