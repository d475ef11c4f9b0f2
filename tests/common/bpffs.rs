//! A bpffs of the test's own, so that an eBPF node's pins outlive its process (as under
//! systemd) and two tests never share them.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// `--backend udp --dataplane ebpf`.
pub const EBPF: &[&str] = &["--backend", "udp", "--dataplane", "ebpf"];

/// A bpffs mounted by the test in the root mount namespace: `ip netns exec` gives each twill a
/// copy of the mounts, so pins made there outlive the process, as under systemd.
pub struct BpfFs {
    pub path: PathBuf,
}

impl BpfFs {
    pub fn mount(path: PathBuf) -> Result<BpfFs> {
        std::fs::create_dir_all(&path)?;
        nix::mount::mount(
            Some("bpffs"),
            &path,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .with_context(|| format!("mounting bpffs on {}", path.display()))?;
        Ok(BpfFs { path })
    }

    pub fn arg(&self) -> &str {
        self.path.to_str().expect("a UTF-8 scratch path")
    }

    /// `--backend udp --dataplane ebpf`, pinning here.
    pub fn ebpf_args(&self) -> Vec<&str> {
        EBPF.iter()
            .copied()
            .chain(["--bpf-dir", self.arg()])
            .collect()
    }

    /// Entries left under the mount, as `find` lists them.
    pub fn entries(&self) -> Result<Vec<String>> {
        let mut found = Vec::new();
        collect_entries(&self.path, &mut found)?;
        Ok(found)
    }
}

fn collect_entries(dir: &Path, found: &mut Vec<String>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        found.push(path.display().to_string());
        if path.is_dir() {
            collect_entries(&path, found)?;
        }
    }
    Ok(())
}

impl Drop for BpfFs {
    fn drop(&mut self) {
        // Lazily: a pin still open elsewhere must not keep the test from cleaning up.
        let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
    }
}
