//! The guest runner (twill_lab::guest) on each of Debian's kernels that `scripts/kernels`
//! caches: the guest boots the cached release, loads the modules this host's kernel lacks (ipip,
//! wireguard) from the kernel's own tree, makes a WireGuard device, has the kernel's BTF, and
//! runs host binaries at their host paths. Prints the boot (QEMU start to the script) and total
//! times per kernel.

use anyhow::Result;
use std::time::Duration;
use twill_lab::guest::{run_in_guest, Kernel};

/// A boot takes seconds under TCG; this allows for a loaded machine running several at once.
const TIMEOUT: Duration = Duration::from_secs(240);

/// Each check prints `ok <name>` once it has passed; `set -e` ends the script at the first
/// that fails, with its error in the output.
const SCRIPT: &str = r#"set -eu
echo "release $(uname -r)"
modprobe ipip
modprobe wireguard
grep -q '^ipip ' /proc/modules && grep -q '^wireguard ' /proc/modules && echo "ok modules"
ip link add wg0 type wireguard
ip -d link show wg0 | grep -q wireguard && echo "ok wireguard device"
test -s /sys/kernel/btf/vmlinux && echo "ok btf"
/usr/bin/etcd --version | grep -q '^etcd Version: ' && echo "ok etcd"
"$TWILL" --version | grep -q '^twill ' && echo "ok twill"
"#;

fn boots_and_runs(series: &str) -> Result<()> {
    let kernel = Kernel::find(series)?;
    let script = format!("TWILL={}\n{SCRIPT}", env!("CARGO_BIN_EXE_twill"));
    let run = run_in_guest(&kernel, &script, TIMEOUT)?;
    println!(
        "guest {series} ({}): boot {:.1} s, total {:.1} s",
        kernel.release(),
        run.boot_secs,
        run.total_secs
    );
    run.success()?;
    let lines: Vec<&str> = run.output.lines().collect();
    let release = format!("release {}", kernel.release());
    assert!(lines.contains(&release.as_str()), "{}", run.output);
    for check in ["modules", "wireguard device", "btf", "etcd", "twill"] {
        let ok = format!("ok {check}");
        assert!(lines.contains(&ok.as_str()), "no `{ok}`:\n{}", run.output);
    }
    Ok(())
}

#[test]
fn debian_5_10() -> Result<()> {
    boots_and_runs("5.10")
}

#[test]
fn debian_6_1() -> Result<()> {
    boots_and_runs("6.1")
}

#[test]
fn debian_6_12() -> Result<()> {
    boots_and_runs("6.12")
}
