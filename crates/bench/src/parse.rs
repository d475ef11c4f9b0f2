//! Parsers for what the measuring tools print: `iperf3 -J`, `qperf` text and `/proc/stat`.

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Received UDP traffic of one iperf3 run, as the receiver counted it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UdpRate {
    pub pps: f64,
    pub loss_pct: f64,
}

/// The `error` iperf3 -J reports on failure (it prints JSON to stdout and not to stderr then).
pub fn iperf_error(json: &str) -> Option<String> {
    let doc: Value = serde_json::from_str(json).ok()?;
    Some(doc.get("error")?.as_str()?.to_string())
}

/// Receiver-side TCP throughput in Gbit/s: with `-R` or `-P` the receiver sum is still the data
/// that arrived, not what the sender managed to queue.
pub fn iperf_tcp_gbps(json: &str) -> Result<f64> {
    let sum = iperf_sum_received(json)?;
    Ok(number(&sum, "bits_per_second")? / 1e9)
}

/// Segments the sender sent again (iperf3's `end.sum_sent.retransmits`): every packet the path
/// lost costs TCP at least one.
pub fn iperf_tcp_retransmits(json: &str) -> Result<f64> {
    let doc: Value = serde_json::from_str(json).context("iperf3 output is not JSON")?;
    let sent = doc
        .pointer("/end/sum_sent")
        .context("iperf3 JSON has no end.sum_sent")?;
    number(sent, "retransmits")
}

/// Received packets per second and loss of a UDP run (iperf3 3.x `end.sum_received`).
pub fn iperf_udp(json: &str) -> Result<UdpRate> {
    let sum = iperf_sum_received(json)?;
    let received = number(&sum, "packets")? - number(&sum, "lost_packets")?;
    let seconds = number(&sum, "seconds")?;
    if seconds <= 0.0 {
        bail!("iperf3 UDP run lasted {seconds} s");
    }
    Ok(UdpRate {
        pps: received / seconds,
        loss_pct: number(&sum, "lost_percent")?,
    })
}

fn iperf_sum_received(json: &str) -> Result<Value> {
    if let Some(error) = iperf_error(json) {
        bail!("iperf3: {error}");
    }
    let doc: Value = serde_json::from_str(json).context("iperf3 output is not JSON")?;
    doc.pointer("/end/sum_received")
        .cloned()
        .context("iperf3 JSON has no end.sum_received")
}

fn number(obj: &Value, key: &str) -> Result<f64> {
    obj.get(key)
        .and_then(Value::as_f64)
        .with_context(|| format!("iperf3 JSON: `{key}` missing or not a number"))
}

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

/// Whole-machine CPU time from the `cpu` line of /proc/stat, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    pub total: u64,
    pub idle: u64,
    pub softirq: u64,
}

/// Share of all CPUs used between two [`CpuTimes`] samples, in % of the whole machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuUse {
    pub busy_pct: f64,
    pub softirq_pct: f64,
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
    // user nice system idle iowait irq softirq steal; guest time is already inside user/nice.
    Ok(CpuTimes {
        total: ticks[..8].iter().sum(),
        idle: ticks[3] + ticks[4],
        softirq: ticks[6],
    })
}

impl CpuTimes {
    /// Usage from `before` to `self`; None when no tick passed (nothing to divide by).
    pub fn since(&self, before: &CpuTimes) -> Option<CpuUse> {
        let total = self.total.checked_sub(before.total).filter(|&t| t > 0)? as f64;
        let idle = self.idle.saturating_sub(before.idle) as f64;
        let softirq = self.softirq.saturating_sub(before.softirq) as f64;
        Some(CpuUse {
            busy_pct: 100.0 * (total - idle) / total,
            softirq_pct: 100.0 * softirq / total,
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
