//! The twill daemon under test and what the bench reads of it: its `/metrics`, its CPU time and
//! memory from `/proc`, and etcd's count of the RPCs it served. Everything runs on a thread
//! inside the lab host's namespace, where both twill and etcd listen on loopback.

use crate::paths::{still_running, TWILL_STATUS};
use anyhow::{ensure, Context, Result};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use twill_lab::Proc;

/// /proc/<pid>/stat counts CPU time in USER_HZ ticks, 100 per second on Linux.
const TICKS_PER_SECOND: f64 = 100.0;

/// `twill run` on the lab host, against the lab's etcd or API server.
pub struct Node {
    proc: Proc,
}

impl Node {
    /// The daemon `proc`, just spawned (see [`crate::paths::Twill`]).
    pub fn new(proc: Proc) -> Node {
        Node { proc }
    }

    /// The node's `/metrics`; Err while it does not answer yet.
    pub fn metrics(&self) -> Result<Metrics> {
        Ok(Metrics::parse(&http_get(TWILL_STATUS, "/metrics")?))
    }

    /// Polls `/metrics` every `every` until `done` holds; fails if twill exits or `limit` passes.
    pub fn wait(
        &mut self,
        what: &str,
        limit: Duration,
        every: Duration,
        mut done: impl FnMut(&Metrics) -> bool,
    ) -> Result<Metrics> {
        let deadline = Instant::now() + limit;
        loop {
            still_running(&mut self.proc)?;
            if let Ok(metrics) = self.metrics() {
                if done(&metrics) {
                    return Ok(metrics);
                }
            }
            ensure!(Instant::now() < deadline, "{what}: not within {limit:?}");
            std::thread::sleep(every);
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// CPU time and memory of the twill process so far.
    pub fn usage(&self) -> Result<Usage> {
        usage(self.proc.pid())
    }

    pub fn stop(mut self) -> Result<()> {
        self.proc.stop()?;
        Ok(())
    }
}

/// CPU time and memory of a process.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub cpu: Duration,
    /// Resident now.
    pub rss_mb: f64,
    /// The most it was ever resident (VmHWM).
    pub peak_mb: f64,
}

/// CPU time and memory of process `pid` so far, from `/proc`.
pub fn usage(pid: u32) -> Result<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("/proc/<pid>/stat")?
        .1
        .split_whitespace()
        .collect();
    let ticks = |i: usize| -> Result<f64> { Ok(fields.get(i - 3).context("stat")?.parse()?) };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |name: &str| -> Result<f64> {
        let line = status.lines().find(|l| l.starts_with(name));
        let value = line.and_then(|l| l.split_whitespace().nth(1));
        Ok(value
            .with_context(|| format!("{name} in /proc/{pid}/status"))?
            .parse()?)
    };
    Ok(Usage {
        cpu: Duration::from_secs_f64((ticks(14)? + ticks(15)?) / TICKS_PER_SECOND),
        rss_mb: kib("VmRSS:")? / 1024.0,
        peak_mb: kib("VmHWM:")? / 1024.0,
    })
}

/// Prometheus text, by series name (labels included) and value.
#[derive(Debug, Default)]
pub struct Metrics(HashMap<String, f64>);

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let series = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter_map(|(name, value)| Some((name.to_string(), value.parse().ok()?)));
        Metrics(series.collect())
    }

    /// The series' value; 0 when absent.
    pub fn get(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or_default()
    }

    /// The sum over every series of the metric `name`, whatever its labels.
    pub fn sum(&self, name: &str) -> f64 {
        let labelled = format!("{name}{{");
        let series = self.0.iter();
        let matching = series.filter(|(k, _)| *k == name || k.starts_with(&labelled));
        matching.map(|(_, v)| v).sum()
    }

    /// The sum over the series of the metric `name` whose labels include `label` (`key="value"`).
    pub fn sum_labelled(&self, name: &str, label: &str) -> f64 {
        let labelled = format!("{name}{{");
        let series = self.0.iter().filter(|(k, _)| {
            k.strip_prefix(&labelled)
                .and_then(|labels| labels.strip_suffix('}'))
                .is_some_and(|labels| labels.split(',').any(|l| l == label))
        });
        series.map(|(_, v)| v).sum()
    }
}

/// RPCs etcd has started serving so far (all methods, all clients).
pub fn etcd_rpcs(endpoint: &str) -> Result<f64> {
    let addr = endpoint.trim_start_matches("http://");
    let metrics = Metrics::parse(&http_get(addr, "/metrics")?);
    Ok(metrics.sum("grpc_server_started_total"))
}

/// An HTTP/1.0 GET (so no chunked body comes back); the body.
fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .with_context(|| format!("no HTTP response from {addr}{path}"))?;
    ensure!(head.contains(" 200 "), "GET {addr}{path}: {head}");
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_read_by_name_and_summed_over_labels() {
        let text = "# TYPE a counter\na 3\nb{x=\"1\"} 2\nb{x=\"2\"} 5\nbb 7\nc 0.25\n";
        let m = Metrics::parse(text);
        assert_eq!(m.get("a"), 3.0);
        assert_eq!(m.get("c"), 0.25);
        assert_eq!(m.get("missing"), 0.0);
        assert_eq!(m.sum("b"), 7.0);
        assert_eq!(m.sum_labelled("b", "x=\"2\""), 5.0);
        assert_eq!(m.sum_labelled("b", "x=\"3\""), 0.0);
    }
}
