use crate::proc::{run, signal, OWNER_ENV};
use anyhow::{Context, Result};
use nix::sys::signal::Signal;
use std::path::Path;

const NETNS_DIR: &str = "/var/run/netns";

/// Remove what earlier runs of this lab left behind when they died without running Drop:
/// processes they started, namespaces `tw<pid>-<counter>-...`, cluster nodes' cgroups and temp
/// dirs `twill-lab-<pid>-...` whose `<pid>` is no longer alive. Runs automatically before a process's first [`crate::Netns`].
pub fn cleanup_stale() -> Result<()> {
    kill_orphans()?;
    for name in names_in(Path::new(NETNS_DIR))? {
        if ns_owner(&name).is_some_and(is_dead) {
            // A parallel test process may be sweeping the same namespace.
            let _ = delete(&name);
        }
    }
    // Pods of a dead owner's cluster nodes: in its nodes' cgroup roots, named like temp dirs.
    crate::cluster::cgroups::sweep(|name| temp_owner(name).is_some_and(is_dead))?;
    for name in names_in(&std::env::temp_dir())? {
        if temp_owner(&name).is_some_and(is_dead) {
            let _ = std::fs::remove_dir_all(std::env::temp_dir().join(name));
        }
    }
    Ok(())
}

fn kill_orphans() -> Result<()> {
    let marker = format!("{OWNER_ENV}=");
    for entry in names_in(Path::new("/proc"))? {
        let Ok(pid) = entry.parse::<u32>() else {
            continue;
        };
        // Unreadable means the process is gone (or a kernel thread); nothing to do either way.
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let owner = environ
            .split(|&b| b == 0)
            .filter_map(|var| std::str::from_utf8(var).ok()?.strip_prefix(&marker))
            .find_map(|owner| owner.parse::<u32>().ok());
        if owner.is_some_and(is_dead) {
            signal(pid, Signal::SIGKILL);
        }
    }
    Ok(())
}

fn names_in(dir: &Path) -> Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("cannot list {}", dir.display())),
    }
}

/// `tw<pid>-<counter>-...` as made by `Netns::new`.
fn ns_owner(name: &str) -> Option<u32> {
    let (pid, rest) = name.strip_prefix("tw")?.split_once('-')?;
    let (counter, _) = rest.split_once('-')?;
    counter.parse::<u32>().ok()?;
    pid.parse().ok()
}

fn temp_owner(name: &str) -> Option<u32> {
    name.strip_prefix("twill-lab-")?
        .split_once('-')?
        .0
        .parse()
        .ok()
}

fn is_dead(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

/// Kills what still runs inside (a namespace with live processes outlives `ip netns del`, and so
/// would its interfaces), then removes the name.
pub(crate) fn delete(name: &str) -> Result<()> {
    let me = std::process::id();
    let pids = run(std::process::Command::new("ip").args(["netns", "pids", name]))?;
    for pid in pids
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
    {
        if pid != me {
            signal(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
    run(std::process::Command::new("ip").args(["netns", "del", name]))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_parsed_only_from_lab_names() {
        assert_eq!(ns_owner("tw123-4-two-h1"), Some(123));
        assert_eq!(ns_owner("tw123-x-two"), None);
        assert_eq!(ns_owner("twill"), None);
        assert_eq!(temp_owner("twill-lab-77-abc"), Some(77));
        assert_eq!(temp_owner("twill-77-abc"), None);
    }
}
