//! Where the programs, links and maps are pinned: one directory per device, on a bpffs that is
//! mounted there when it is not one already. What is pinned outlives the daemon, so a restart
//! finds it and adopts it; [`remove`] is the only way it goes.

use crate::maps::{Maps, MAP_NAMES};
use crate::object::Side;
use anyhow::{bail, Context};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::statfs::{statfs, BPF_FS_MAGIC};
use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A running dataplane's claim on its pin directory: an exclusive flock on the directory,
/// held for as long as the dataplane is open, and dropped by the kernel when its process ends,
/// however it ends. Another node, or a cleanup, that finds it held leaves the pins alone.
#[derive(Debug)]
pub(crate) struct PinLock {
    _lock: Flock<File>,
}

/// Claims `dir`, which must exist; refused in one line while a running dataplane holds it.
pub(crate) fn lock(dir: &Path) -> anyhow::Result<PinLock> {
    let file = File::open(dir).with_context(|| format!("cannot open {}", dir.display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(PinLock { _lock: lock }),
        Err((_, Errno::EWOULDBLOCK)) => bail!(
            "{} holds the pins of a running twill's eBPF dataplane",
            dir.display()
        ),
        Err((_, e)) => Err(e).with_context(|| format!("cannot lock {}", dir.display())),
    }
}

/// The pins of one side's program and link.
pub(crate) fn program_pin(dir: &Path, side: Side) -> PathBuf {
    dir.join(format!("prog_{}", side_name(side)))
}

pub(crate) fn link_pin(dir: &Path, side: Side) -> PathBuf {
    dir.join(format!("link_{}", side_name(side)))
}

/// The pins of the XDP program and its link.
pub(crate) fn xdp_program_pin(dir: &Path) -> PathBuf {
    dir.join("prog_xdp_ingress")
}

pub(crate) fn xdp_link_pin(dir: &Path) -> PathBuf {
    dir.join("link_xdp_ingress")
}

fn side_name(side: Side) -> &'static str {
    match side {
        Side::Egress => "egress",
        Side::Ingress => "ingress",
        Side::Segmented => "segmented",
    }
}

/// The bpffs systemd mounts on every host.
const SYS_FS_BPF: &str = "/sys/fs/bpf";

/// Make `dir` on a bpffs. Pins under /sys/fs/bpf go on a bpffs mounted there, as systemd does
/// (a container or `ip netns exec` shows a /sys without it); elsewhere, a directory on another
/// filesystem gets a bpffs of its own.
pub(crate) fn ensure_bpffs(dir: &Path) -> anyhow::Result<()> {
    let root = Path::new(SYS_FS_BPF);
    if dir.starts_with(root) && root.is_dir() && !is_bpffs(root)? {
        mount_bpffs(root)?;
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    if is_bpffs(dir)? {
        return Ok(());
    }
    mount_bpffs(dir)
}

/// Whether [`ensure_bpffs`] can put `dir` on a bpffs: the directory (or where it would be
/// made) is on one already, or this process may mount one. A pod given CAP_BPF but neither the
/// host's /sys/fs/bpf nor CAP_SYS_ADMIN can load the programs and still not pin them.
pub fn can_pin(dir: &Path) -> Result<(), String> {
    let existing = dir.ancestors().find(|d| d.is_dir());
    if existing.is_some_and(|d| is_bpffs(d).unwrap_or(false)) || crate::probe::may_mount() {
        return Ok(());
    }
    Err(format!(
        "{} is not on a bpffs, and mounting one needs CAP_SYS_ADMIN: mount the host's \
         /sys/fs/bpf there",
        dir.display()
    ))
}

fn mount_bpffs(dir: &Path) -> anyhow::Result<()> {
    mount(
        Some("bpffs"),
        dir,
        Some("bpf"),
        MsFlags::empty(),
        None::<&str>,
    )
    .with_context(|| format!("cannot mount a bpffs on {}", dir.display()))
}

pub(crate) fn is_bpffs(dir: &Path) -> anyhow::Result<bool> {
    let fs = statfs(dir).with_context(|| format!("statfs {}", dir.display()))?;
    Ok(fs.filesystem_type() == BPF_FS_MAGIC)
}

/// Unpin everything [`crate::Dataplane::open`] pinned in `pin_dir`, unmount the bpffs it
/// mounted there, and remove the directory. A directory that is not there is fine; anything
/// else found in it is left, and named in the error.
pub(crate) fn unpin(pin_dir: &Path) -> anyhow::Result<()> {
    if !pin_dir.exists() {
        return Ok(());
    }
    if is_bpffs(pin_dir)? {
        for path in pinned_paths(pin_dir) {
            match fs::remove_file(&path) {
                Err(e) if e.kind() != ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("cannot unpin {}", path.display()))
                }
                _ => {}
            }
        }
        if is_mount_point(pin_dir)? {
            umount2(pin_dir, MntFlags::MNT_DETACH)
                .with_context(|| format!("cannot unmount the bpffs on {}", pin_dir.display()))?;
        }
    }
    if let Err(e) = fs::remove_dir(pin_dir) {
        let left: Vec<String> = fs::read_dir(pin_dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        bail!(
            "cannot remove {} ({e}); it still holds {left:?}",
            pin_dir.display()
        );
    }
    Ok(())
}

fn pinned_paths(dir: &Path) -> Vec<PathBuf> {
    let sides = Side::ALL.into_iter();
    let programs = sides
        .clone()
        .flat_map(|s| [link_pin(dir, s), program_pin(dir, s)])
        .chain([xdp_link_pin(dir), xdp_program_pin(dir)]);
    programs
        .chain(MAP_NAMES.iter().map(|m| dir.join(m)))
        .collect()
}

fn is_mount_point(dir: &Path) -> anyhow::Result<bool> {
    let Some(parent) = dir.parent() else {
        return Ok(false);
    };
    Ok(fs::metadata(dir)?.dev() != fs::metadata(parent)?.dev())
}

/// The config map pinned in `dir`, if there is one (it names the devices the programs run on).
pub(crate) fn pinned_config(dir: &Path) -> anyhow::Result<Option<crate::maps::Config>> {
    let path = dir.join("config");
    if !path.exists() {
        return Ok(None);
    }
    Maps::read_pinned_config(&path).map(Some)
}
