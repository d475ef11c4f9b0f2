//! A node's cgroup root: the kubelet's `cgroupRoot`, under which it puts every pod. Made in
//! every hierarchy beforehand (kubelet refuses a root that is missing in one), and at the end the
//! way to find and end every process a node's pods left, wherever their namespaces put them.

use crate::proc::signal;
use anyhow::{Context, Result};
use nix::sys::signal::Signal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CGROUP_FS: &str = "/sys/fs/cgroup";
/// Killed processes leave their cgroups within milliseconds; the bound only catches a stuck one.
const EMPTY_TIMEOUT: Duration = Duration::from_secs(10);

/// `/<name>` in every mounted hierarchy (v1 controllers, the named systemd one, the unified one).
/// Everything in it is killed and the directories removed on Drop.
#[derive(Debug)]
pub(crate) struct CgroupRoot {
    name: String,
}

impl CgroupRoot {
    /// Makes `/<name>` in every hierarchy; cpuset's `cpus` and `mems` are copied from the top,
    /// as a new cpuset cgroup starts with none and no task could join it.
    pub(crate) fn create(name: &str) -> Result<CgroupRoot> {
        let root = CgroupRoot { name: name.into() };
        for hierarchy in hierarchies()? {
            let dir = hierarchy.join(name);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot make cgroup {}", dir.display()))?;
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(value) = std::fs::read_to_string(hierarchy.join(file)) {
                    std::fs::write(dir.join(file), value.trim())
                        .with_context(|| format!("cannot set {}/{file}", dir.display()))?;
                }
            }
        }
        Ok(root)
    }

    /// The kubelet's `cgroupRoot`.
    pub(crate) fn path(&self) -> String {
        format!("/{}", self.name)
    }

    /// SIGKILLs every process under the root until none is left (or the bound passes).
    fn kill_all(&self) -> Result<()> {
        kill_tree(&self.name)
    }
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        if let Err(e) = self.kill_all().and_then(|()| remove_tree(&self.name)) {
            tracing::warn!("cannot remove cgroup {}: {e:#}", self.path());
        }
    }
}

/// Ends what is left under top-level cgroups named as [`CgroupRoot`]s of dead owners, and removes
/// them: `stale(name)` says whether a top-level cgroup is one.
pub(crate) fn sweep(stale: impl Fn(&str) -> bool) -> Result<()> {
    let mut names = Vec::new();
    for hierarchy in hierarchies()? {
        for entry in std::fs::read_dir(&hierarchy)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() && stale(&name) && !names.contains(&name) {
                names.push(name);
            }
        }
    }
    for name in names {
        kill_tree(&name)?;
        remove_tree(&name)?;
    }
    Ok(())
}

/// Every mounted hierarchy: /sys/fs/cgroup itself on a cgroup v2 host, else each directory
/// under it with a `cgroup.procs` (v1 controllers, the named systemd one, the unified one).
fn hierarchies() -> Result<Vec<PathBuf>> {
    if Path::new(CGROUP_FS).join("cgroup.procs").is_file() {
        return Ok(vec![CGROUP_FS.into()]);
    }
    let entries =
        std::fs::read_dir(CGROUP_FS).with_context(|| format!("cannot list {CGROUP_FS}"))?;
    Ok(entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").is_file())
        .collect())
}

fn kill_tree(name: &str) -> Result<()> {
    let deadline = Instant::now() + EMPTY_TIMEOUT;
    loop {
        let mut pids = Vec::new();
        for hierarchy in hierarchies()? {
            for dir in tree(&hierarchy.join(name)) {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                pids.extend(procs.lines().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
        if pids.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "processes {pids:?} still in cgroup /{name} after {EMPTY_TIMEOUT:?}"
        );
        for pid in pids {
            signal(pid, Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Removes `/<name>` and its children, deepest first, in every hierarchy. A cgroup whose last
/// process just died may stay busy for a moment, so each pass is retried within the bound.
fn remove_tree(name: &str) -> Result<()> {
    let deadline = Instant::now() + EMPTY_TIMEOUT;
    for hierarchy in hierarchies()? {
        let mut dirs = tree(&hierarchy.join(name));
        dirs.reverse();
        for dir in dirs {
            loop {
                match std::fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Err(e) => {
                        return Err(e).with_context(|| format!("cannot remove {}", dir.display()))
                    }
                }
            }
        }
    }
    Ok(())
}

/// `dir` and every directory below it, parents before children; empty if `dir` is missing.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    let mut next = vec![dir.to_path_buf()];
    while let Some(dir) = next.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        next.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        all.push(dir);
    }
    all
}
