//! The IPv6 knobs of the dataplane's devices (twill's device, the segmenter's ends) that
//! rtnetlink cannot set, set through /proc/sys in the calling thread's network namespace.

use anyhow::Context;

/// Sets the IPv6 `knobs` of device `name`. Where /proc/sys is read-only (a pod without
/// privileges, as kube-flannel.yml runs flannel) they stay as they are: the device is already
/// quiet, the kernel making no link-local address on it
/// ([`twill_dataplane::io::devconf::no_link_local`]).
pub fn ipv6_sysctls(name: &str, knobs: &[(&str, &str)]) -> anyhow::Result<()> {
    for (knob, value) in knobs {
        let path = format!("/proc/sys/net/ipv6/conf/{name}/{knob}");
        match std::fs::write(&path, value) {
            Ok(()) => {}
            // A kernel without IPv6 has no such file, and nothing to set.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
                tracing::debug!("cannot set IPv6 on {name}: {path} is read-only here");
                return Ok(());
            }
            Err(e) => return Err(e).with_context(|| format!("cannot write {path}")),
        }
    }
    Ok(())
}
