//! Parsers for what the measuring tools print: `iperf3 -J`, `qperf` text, `tc -s -j`,
//! `ip -s -j link`, `/proc/net/snmp` and `/proc/stat`.

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The `error` iperf3 -J reports on failure (it prints JSON to stdout and not to stderr then).
pub fn iperf_error(json: &str) -> Option<String> {
    let doc: Value = serde_json::from_str(json).ok()?;
    Some(doc.get("error")?.as_str()?.to_string())
}

/// Receiver-side TCP throughput in Gbit/s: with `-R` or `-P` the receiver sum is still the data
/// that arrived, not what the sender managed to queue.
pub fn iperf_tcp_gbps(json: &str) -> Result<f64> {
    let sum = iperf_sum(json, "sum_received")?;
    Ok(number(&sum, "bits_per_second")? / 1e9)
}

/// TCP payload the receiver got, in bytes (`end.sum_received.bytes`).
pub fn iperf_tcp_bytes(json: &str) -> Result<u64> {
    let bytes = number(&iperf_sum(json, "sum_received")?, "bytes")?;
    Ok(bytes as u64)
}

/// Segments the sender sent again (iperf3's `end.sum_sent.retransmits`): every packet the path
/// lost costs TCP at least one.
pub fn iperf_tcp_retransmits(json: &str) -> Result<f64> {
    number(&iperf_sum(json, "sum_sent")?, "retransmits")
}

/// iperf3's `end.<which>` summary, or iperf3's own error.
fn iperf_sum(json: &str, which: &str) -> Result<Value> {
    if let Some(error) = iperf_error(json) {
        bail!("iperf3: {error}");
    }
    let doc: Value = serde_json::from_str(json).context("iperf3 output is not JSON")?;
    doc.pointer(&format!("/end/{which}"))
        .cloned()
        .with_context(|| format!("iperf3 JSON has no end.{which}"))
}

fn number(obj: &Value, key: &str) -> Result<f64> {
    obj.get(key)
        .and_then(Value::as_f64)
        .with_context(|| format!("iperf3 JSON: `{key}` missing or not a number"))
}

pub use twill_lab::snmp_udp;

/// Packets the clsact qdisc of `tc -s -j qdisc show dev X` has seen: with a filter attached it
/// counts every packet its filters see, a GSO packet as its segments.
pub fn tc_clsact_packets(json: &str) -> Result<u64> {
    let qdiscs: Value = serde_json::from_str(json).context("tc output is not JSON")?;
    let clsact = qdiscs
        .as_array()
        .and_then(|all| all.iter().find(|q| q["kind"] == "clsact"))
        .with_context(|| format!("no clsact qdisc in {json}"))?;
    clsact["packets"]
        .as_u64()
        .with_context(|| format!("clsact qdisc without a packet count: {clsact}"))
}

/// Bytes a device has received, from `ip -s -j link show dev X` (its 64-bit counters).
pub fn link_rx_bytes(json: &str) -> Result<u64> {
    let links: Value = serde_json::from_str(json).context("ip output is not JSON")?;
    links
        .pointer("/0/stats64/rx/bytes")
        .and_then(Value::as_u64)
        .with_context(|| format!("no stats64.rx.bytes in {json}"))
}

/// The `latency = 7.8 us` line of `qperf ... tcp_lat`, in µs (qperf picks ns/us/ms/sec itself).
pub fn qperf_latency_us(text: &str) -> Result<f64> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("latency"))
        .with_context(|| format!("no latency in qperf output: {text:?}"))?;
    let (_, value) = line
        .split_once('=')
        .with_context(|| format!("qperf line without '=': {line:?}"))?;
    let mut words = value.split_whitespace();
    let (Some(number), Some(unit)) = (words.next(), words.next()) else {
        bail!("qperf latency line is not `<number> <unit>`: {line:?}");
    };
    let number: f64 = number
        .parse()
        .with_context(|| format!("qperf latency {number:?}"))?;
    let scale = match unit {
        "ns" => 1e-3,
        "us" => 1.0,
        "ms" => 1e3,
        "sec" | "s" => 1e6,
        _ => bail!("unknown qperf latency unit {unit:?}"),
    };
    Ok(number * scale)
}

/// Whole-machine CPU time from the `cpu` line of /proc/stat, in clock ticks, and the number of
/// CPUs (`cpuN` lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    pub total: u64,
    pub idle: u64,
    pub softirq: u64,
    pub cpus: u32,
}

/// Share of all CPUs used between two [`CpuTimes`] samples, in % of the whole machine, and how
/// many CPUs' worth were busy on average (CPU seconds per second).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuUse {
    pub busy_pct: f64,
    pub softirq_pct: f64,
    pub busy_cpus: f64,
}

pub fn cpu_times(proc_stat: &str) -> Result<CpuTimes> {
    let line = proc_stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .context("/proc/stat has no `cpu` line")?;
    let ticks = line
        .split_whitespace()
        .skip(1)
        .map(str::parse::<u64>)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("bad /proc/stat line {line:?}"))?;
    if ticks.len() < 8 {
        bail!("/proc/stat cpu line has {} fields, want 8+", ticks.len());
    }
    let cpus = proc_stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    // user nice system idle iowait irq softirq steal; guest time is already inside user/nice.
    Ok(CpuTimes {
        total: ticks[..8].iter().sum(),
        idle: ticks[3] + ticks[4],
        softirq: ticks[6],
        cpus: u32::try_from(cpus.max(1)).unwrap_or(u32::MAX),
    })
}

impl CpuTimes {
    /// Usage from `before` to `self`; None when no tick passed (nothing to divide by).
    pub fn since(&self, before: &CpuTimes) -> Option<CpuUse> {
        let total = self.total.checked_sub(before.total).filter(|&t| t > 0)? as f64;
        let idle = self.idle.saturating_sub(before.idle) as f64;
        let softirq = self.softirq.saturating_sub(before.softirq) as f64;
        let busy = (total - idle) / total;
        Some(CpuUse {
            busy_pct: 100.0 * busy,
            softirq_pct: 100.0 * softirq / total,
            busy_cpus: busy * f64::from(self.cpus),
        })
    }
}

/// `FLANNEL_MTU` of a flannel subnet file: the MTU container runtimes give their containers.
pub fn subnet_env_mtu(text: &str) -> Result<u32> {
    let value = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("FLANNEL_MTU="))
        .with_context(|| format!("no FLANNEL_MTU in subnet file: {text:?}"))?;
    value
        .trim()
        .parse()
        .with_context(|| format!("bad FLANNEL_MTU {value:?}"))
}
