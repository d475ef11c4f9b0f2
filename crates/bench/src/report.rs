//! Results of every path: medians, ratios to kernel VXLAN and native and of IPv6 to IPv4, the
//! table, the JSON and the `--quick` completeness check.

use crate::measure::Field;
use crate::stats::{median, ratio};
use anyhow::{ensure, Result};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Everything measured on one path, all samples kept; reported values are medians.
#[derive(Debug, Clone, Default)]
pub struct PathResult {
    pub path: String,
    pub available: bool,
    /// Why the path is unavailable, or which measurements failed.
    pub note: String,
    /// Why the path carries no IPv6, where IPv6 was measured: its IPv6 numbers read n/a.
    pub no_ipv6: Option<String>,
    pub samples: BTreeMap<Field, Vec<f64>>,
}

impl PathResult {
    /// Median of the field's samples.
    pub fn value(&self, field: Field) -> Option<f64> {
        median(self.samples.get(&field)?)
    }
}

/// Single-stream TCP of the path named `name`: the base of the ratio columns.
fn baseline(results: &[PathResult], name: &str) -> Option<f64> {
    results
        .iter()
        .find(|r| r.path == name)?
        .value(Field::TcpGbps)
}

/// `(key, value)` of the ratio columns for `r`: single-stream TCP against vxlan's and native's,
/// and over IPv6 against over IPv4 on the same path.
fn ratios(results: &[PathResult], r: &PathResult) -> [(&'static str, Option<f64>); 3] {
    let tcp = r.value(Field::TcpGbps);
    [
        ("tcp_vs_vxlan", ratio(tcp, baseline(results, "vxlan"))),
        ("tcp_vs_native", ratio(tcp, baseline(results, "native"))),
        ("tcp6_vs_tcp", ratio(r.value(Field::Tcp6Gbps), tcp)),
    ]
}

const HEADER: [&str; 17] = [
    "path",
    "tcp Gbit/s",
    "×vxlan",
    "×native",
    "retr",
    "tcp6 Gbit/s",
    "×ipv4",
    "-P4",
    "-R",
    "flood kpps",
    "loss %",
    "dgram/pkt",
    "lat µs",
    "pinned µs",
    "cpu %",
    "sirq %",
    "cpu s/Gbit",
];

/// The comparison table, one row per path, then the notes of paths that had failures or carry
/// no IPv6.
pub fn table(results: &[PathResult]) -> String {
    let rows: Vec<Vec<String>> = results.iter().map(|r| row(results, r)).collect();
    let header: Vec<String> = HEADER.iter().map(|h| h.to_string()).collect();
    let mut out = render(&header, &rows);
    for r in results.iter().filter(|r| r.available) {
        if !r.note.is_empty() {
            out += &format!("note: {}: {}\n", r.path, r.note);
        }
        if let Some(why) = &r.no_ipv6 {
            out += &format!("note: {}: IPv6 n/a: {why}\n", r.path);
        }
    }
    out
}

/// A text table: the header, a rule, the rows. Columns are as wide as their widest full-width
/// row; a shorter row (an unavailable path's name and reason) runs past them.
pub(crate) fn render(header: &[String], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .filter(|row| row.len() == header.len())
                .map(|row| row[c].chars().count())
                .chain([header[c].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = line(header, &widths);
    out += &line(
        &widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>(),
        &widths,
    );
    for row in rows {
        out += &line(row, &widths);
    }
    out
}

/// A number to `decimals` places, or "-" when it was not measured.
pub(crate) fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.decimals$}"))
}

/// An unavailable path is one cell wide: its name and the reason.
fn row(results: &[PathResult], r: &PathResult) -> Vec<String> {
    if !r.available {
        return vec![r.path.clone(), r.note.clone()];
    }
    let [vs_vxlan, vs_native, vs_ipv4] = ratios(results, r).map(|(_, v)| cell(v, 2));
    let (tcp6, vs_ipv4) = match r.no_ipv6 {
        Some(_) => ("n/a".to_string(), "n/a".to_string()),
        None => (cell(r.value(Field::Tcp6Gbps), 2), vs_ipv4),
    };
    vec![
        r.path.clone(),
        cell(r.value(Field::TcpGbps), 2),
        vs_vxlan,
        vs_native,
        cell(r.value(Field::TcpRetransmits), 0),
        tcp6,
        vs_ipv4,
        cell(r.value(Field::TcpP4Gbps), 2),
        cell(r.value(Field::TcpRevGbps), 2),
        cell(r.value(Field::Flood64Kpps), 1),
        cell(r.value(Field::Flood64LossPct), 1),
        cell(r.value(Field::Flood64DatagramsPerPacket), 3),
        cell(r.value(Field::LatencyUs), 1),
        cell(r.value(Field::LatencyPinnedUs), 1),
        cell(r.value(Field::CpuPct), 0),
        cell(r.value(Field::CpuSoftirqPct), 0),
        cell(r.value(Field::CpuPerGbit), 3),
    ]
}

/// Numbers right-aligned under their header, the path name left-aligned (width counts chars,
/// so × and µ line up).
fn line(cells: &[String], widths: &[usize]) -> String {
    let padded: Vec<String> = cells
        .iter()
        .zip(widths)
        .enumerate()
        .map(|(c, (cell, w))| match c {
            0 => format!("{cell:<w$}"),
            _ => format!("{cell:>w$}"),
        })
        .collect();
    padded.join(" | ").trim_end().to_string() + "\n"
}

/// The `--json` document: an array with one object per path; missing values are null, and
/// `no_ipv6` says why a path has no IPv6 numbers (null where it carries IPv6).
pub fn json(results: &[PathResult]) -> Value {
    let objects = results.iter().map(|r| {
        let mut obj = Map::new();
        obj.insert("path".into(), r.path.clone().into());
        obj.insert("available".into(), r.available.into());
        obj.insert("note".into(), r.note.clone().into());
        obj.insert("no_ipv6".into(), r.no_ipv6.clone().into());
        for field in Field::ALL {
            obj.insert(field.key().into(), r.value(field).into());
        }
        for (key, value) in ratios(results, r) {
            obj.insert(key.into(), value.into());
        }
        let samples = r
            .samples
            .iter()
            .map(|(f, s)| (f.key().into(), s.clone().into()));
        obj.insert("samples".into(), Value::Object(samples.collect()));
        Value::Object(obj)
    });
    Value::Array(objects.collect())
}

/// `--quick`: every number of every available path is present and non-zero (loss and softirq
/// may be zero; the IPv6 ones are not wanted from a path that carries no IPv6), and at least one
/// path was available. No speed thresholds.
pub fn check_complete(results: &[PathResult]) -> Result<()> {
    ensure!(
        results.iter().any(|r| r.available),
        "no path could be set up"
    );
    let mut bad = Vec::new();
    for r in results.iter().filter(|r| r.available) {
        let wanted = Field::ALL
            .into_iter()
            .filter(|f| !f.is_ipv6() || r.no_ipv6.is_none());
        for field in wanted {
            match r.value(field) {
                Some(v) if v > 0.0 || (field.may_be_zero() && v == 0.0) => {}
                v => bad.push(format!("{} {} = {v:?}", r.path, field.key())),
            }
        }
    }
    ensure!(bad.is_empty(), "missing or zero: {}", bad.join(", "));
    Ok(())
}
