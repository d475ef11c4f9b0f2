//! The pinned latency run: every thread of a path's processes on CPU 0, as `taskset -c 0` would
//! start them, and back where each was afterwards.

use anyhow::{Context, Result};
use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Threads moved to CPU 0, each with the CPUs it had before; put back on drop.
pub struct Pinned {
    moved: Vec<(Pid, CpuSet)>,
}

impl Pinned {
    /// Move every thread of `processes` to CPU 0.
    pub fn to_cpu0(processes: &[u32]) -> Result<Pinned> {
        let mut cpu0 = CpuSet::new();
        cpu0.set(0)?;
        let mut pinned = Pinned { moved: Vec::new() };
        for &pid in processes {
            for thread in threads(pid)? {
                let before = sched_getaffinity(thread)?;
                sched_setaffinity(thread, &cpu0)
                    .with_context(|| format!("pin thread {thread} of process {pid} to CPU 0"))?;
                pinned.moved.push((thread, before));
            }
        }
        Ok(pinned)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        for (thread, before) in &self.moved {
            let _ = sched_setaffinity(*thread, before);
        }
    }
}

fn threads(pid: u32) -> Result<Vec<Pid>> {
    let dir = format!("/proc/{pid}/task");
    let mut threads = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("list {dir}"))? {
        let name = entry?.file_name();
        let tid: i32 = name
            .to_str()
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("{dir}/{name:?} is not a thread id"))?;
        threads.push(Pid::from_raw(tid));
    }
    Ok(threads)
}
