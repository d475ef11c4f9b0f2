//! The kernel's UDP counters, which the tests and twill-bench read around a run to tell where
//! datagrams were lost.

use anyhow::{Context, Result};

/// One counter of the `Udp:` lines of `/proc/net/snmp`: a line of names, then one of values.
pub fn snmp_udp(text: &str, name: &str) -> Result<u64> {
    let mut lines = text.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = lines
        .next()
        .zip(lines.next())
        .context("no Udp: lines in /proc/net/snmp")?;
    let at = names
        .split_whitespace()
        .position(|n| n == name)
        .with_context(|| format!("/proc/net/snmp has no Udp counter {name}"))?;
    let value = values
        .split_whitespace()
        .nth(at)
        .with_context(|| format!("/proc/net/snmp has no value for Udp {name}"))?;
    value
        .parse()
        .with_context(|| format!("/proc/net/snmp Udp {name} = {value:?}"))
}
