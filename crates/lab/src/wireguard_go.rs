//! wireguard-go, the Go implementation of WireGuard, on a lab host: the WireGuard that twill's
//! is tested against and measured next to. Configured with `wg` from wireguard-tools.

use crate::{Netns, Proc};
use anyhow::{bail, ensure, Context, Result};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// wireguard-go in the foreground on its own TUN in a host's namespace. Its control socket is
/// in /var/run/wireguard, shared by every namespace, so interface names must be unique on the
/// machine. Stopped, and its socket removed, on drop.
#[derive(Debug)]
pub struct WireguardGo {
    proc: Proc,
    name: String,
}

impl WireguardGo {
    /// Start it on interface `name` and wait for its control socket.
    pub fn start(ns: &Netns, name: &str) -> Result<WireguardGo> {
        installed()?;
        let env = [("WG_PROCESS_FOREGROUND", "1")];
        let mut proc = ns.spawn_with("wireguard-go", &["-f", name], &env)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !socket(name).exists() {
            ensure!(proc.is_running(), "wireguard-go exited: {}", proc.stderr());
            ensure!(
                Instant::now() < deadline,
                "wireguard-go made no control socket"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let name = name.to_string();
        Ok(WireguardGo { proc, name })
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for WireguardGo {
    fn drop(&mut self) {
        let _ = self.proc.stop();
        // wireguard-go removes it on a clean stop; a killed one leaves it behind.
        let _ = std::fs::remove_file(socket(&self.name));
    }
}

/// Fails, naming the packages, unless wireguard-go and wg are installed.
pub fn installed() -> Result<()> {
    for tool in ["wireguard-go", "wg"] {
        if std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_err()
        {
            bail!("{tool} is not installed (Debian: wireguard-go, wireguard-tools)");
        }
    }
    Ok(())
}

/// A new private key (`wg genkey`) in `file`, mode 0600; returns its public key.
pub fn generate_key(ns: &Netns, file: &Path) -> Result<String> {
    std::fs::write(file, ns.exec("wg", &["genkey"])?.trim())?;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))?;
    let path = file.to_str().context("key path")?;
    Ok(ns.sh(&format!("wg pubkey < {path}"))?.trim().to_string())
}

fn socket(name: &str) -> PathBuf {
    Path::new("/var/run/wireguard").join(format!("{name}.sock"))
}
