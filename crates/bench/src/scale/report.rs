//! Results of `--measure scale`: one per (registry, backend, K), as a table and as JSON objects.

use super::{ScaleBackend, ScaleRegistry};
use crate::report::render;
use crate::stats::percentile;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Every number a scale run reports, each with its JSON key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ScaleField {
    /// From `twill run` until its first reconcile (all K peers programmed) finished.
    StartMs,
    /// twill's CPU time over the cold start, % of one core.
    CpuPct,
    PropagationP50Ms,
    PropagationP99Ms,
    /// The registry write alone (etcd put, Node create) until it returned, inside the
    /// propagation time: what the rest of it is the node's (and the watch's) share.
    WriteP50Ms,
    RemovalP50Ms,
    RemovalP99Ms,
    /// Wall time of a periodic reconcile with nothing to change.
    ReconcileIdleMs,
    /// Kernel writes that reconcile made (twill's own count).
    ReconcileIdleWrites,
    /// Route, neighbour and fdb changes the kernel reported during the idle window (vxlan).
    KernelEventsIdle,
    /// Resident memory at the end, after the idle reconcile.
    RssMb,
    /// The most twill was ever resident.
    RssPeakMb,
    /// twill's CPU over the idle window, % of one core.
    IdleCpuPct,
    /// RPCs etcd served per minute during the idle window (etcd).
    EtcdRpm,
    /// Requests on Nodes the API server served per minute during the idle window (kube).
    ApiRpm,
    /// kube-apiserver's resident memory at the end, holding K Nodes (kube).
    ApiserverRssMb,
    /// The most kube-apiserver was ever resident (kube).
    ApiserverPeakMb,
    /// Writing the K leases (etcd: transactions of 128 puts, 8 in flight; kube: Node creates,
    /// 32 in flight).
    FillMs,
}

impl ScaleField {
    pub const ALL: [ScaleField; 18] = [
        ScaleField::StartMs,
        ScaleField::CpuPct,
        ScaleField::PropagationP50Ms,
        ScaleField::PropagationP99Ms,
        ScaleField::WriteP50Ms,
        ScaleField::RemovalP50Ms,
        ScaleField::RemovalP99Ms,
        ScaleField::ReconcileIdleMs,
        ScaleField::ReconcileIdleWrites,
        ScaleField::KernelEventsIdle,
        ScaleField::RssMb,
        ScaleField::RssPeakMb,
        ScaleField::IdleCpuPct,
        ScaleField::EtcdRpm,
        ScaleField::ApiRpm,
        ScaleField::ApiserverRssMb,
        ScaleField::ApiserverPeakMb,
        ScaleField::FillMs,
    ];

    pub fn key(self) -> &'static str {
        match self {
            ScaleField::StartMs => "start_ms",
            ScaleField::CpuPct => "cpu_pct",
            ScaleField::PropagationP50Ms => "propagation_p50_ms",
            ScaleField::PropagationP99Ms => "propagation_p99_ms",
            ScaleField::WriteP50Ms => "write_p50_ms",
            ScaleField::RemovalP50Ms => "removal_p50_ms",
            ScaleField::RemovalP99Ms => "removal_p99_ms",
            ScaleField::ReconcileIdleMs => "reconcile_idle_ms",
            ScaleField::ReconcileIdleWrites => "reconcile_idle_writes",
            ScaleField::KernelEventsIdle => "kernel_events_idle",
            ScaleField::RssMb => "rss_mb",
            ScaleField::RssPeakMb => "rss_peak_mb",
            ScaleField::IdleCpuPct => "idle_cpu_pct",
            ScaleField::EtcdRpm => "etcd_rpm",
            ScaleField::ApiRpm => "api_rpm",
            ScaleField::ApiserverRssMb => "apiserver_rss_mb",
            ScaleField::ApiserverPeakMb => "apiserver_peak_mb",
            ScaleField::FillMs => "fill_ms",
        }
    }

    /// The registry the field means something in; None for all.
    pub fn registry(self) -> Option<ScaleRegistry> {
        match self {
            ScaleField::EtcdRpm => Some(ScaleRegistry::Etcd),
            ScaleField::ApiRpm | ScaleField::ApiserverRssMb | ScaleField::ApiserverPeakMb => {
                Some(ScaleRegistry::Kube)
            }
            _ => None,
        }
    }

    /// The column header and the decimals shown in the table.
    fn column(self) -> (&'static str, usize) {
        match self {
            ScaleField::StartMs => ("start ms", 0),
            ScaleField::CpuPct => ("start cpu %", 0),
            ScaleField::PropagationP50Ms => ("prop p50 ms", 1),
            ScaleField::PropagationP99Ms => ("prop p99 ms", 1),
            ScaleField::WriteP50Ms => ("write p50 ms", 1),
            ScaleField::RemovalP50Ms => ("rm p50 ms", 1),
            ScaleField::RemovalP99Ms => ("rm p99 ms", 1),
            ScaleField::ReconcileIdleMs => ("idle rec. ms", 0),
            ScaleField::ReconcileIdleWrites => ("writes", 0),
            ScaleField::KernelEventsIdle => ("k. events", 0),
            ScaleField::RssMb => ("RSS MB", 1),
            ScaleField::RssPeakMb => ("peak MB", 1),
            ScaleField::IdleCpuPct => ("idle cpu %", 2),
            ScaleField::EtcdRpm => ("etcd rpm", 1),
            ScaleField::ApiRpm => ("api rpm", 1),
            ScaleField::ApiserverRssMb => ("apisrv MB", 0),
            ScaleField::ApiserverPeakMb => ("apisrv peak", 0),
            ScaleField::FillMs => ("fill ms", 0),
        }
    }
}

/// One backend at one K of one registry.
#[derive(Debug, Clone)]
pub struct ScaleResult {
    pub registry: ScaleRegistry,
    pub backend: ScaleBackend,
    pub leases: u32,
    /// Why the run failed, if it did.
    pub note: String,
    pub values: BTreeMap<ScaleField, f64>,
}

impl ScaleResult {
    /// A result of etcd (see [`ScaleResult::in_registry`]).
    pub fn new(backend: ScaleBackend, leases: u32) -> ScaleResult {
        ScaleResult {
            registry: ScaleRegistry::Etcd,
            backend,
            leases,
            note: String::new(),
            values: BTreeMap::new(),
        }
    }

    pub fn failed(backend: ScaleBackend, leases: u32, why: String) -> ScaleResult {
        ScaleResult {
            note: why,
            ..ScaleResult::new(backend, leases)
        }
    }

    /// The same result, of `registry`.
    pub fn in_registry(self, registry: ScaleRegistry) -> ScaleResult {
        ScaleResult { registry, ..self }
    }

    pub fn set(&mut self, field: ScaleField, value: f64) {
        self.values.insert(field, value);
    }

    pub fn set_percentiles(&mut self, p50: ScaleField, p99: ScaleField, samples: &[f64]) {
        for (field, p) in [(p50, 50.0), (p99, 99.0)] {
            if let Some(v) = percentile(samples, p) {
                self.set(field, v);
            }
        }
    }

    pub fn value(&self, field: ScaleField) -> Option<f64> {
        self.values.get(&field).copied()
    }
}

/// The fields shown: all but those of a registry no result is of.
fn shown(results: &[ScaleResult]) -> Vec<ScaleField> {
    let measured = |registry| results.iter().any(|r| r.registry == registry);
    let fields = ScaleField::ALL.into_iter();
    fields
        .filter(|f| f.registry().is_none_or(measured))
        .collect()
}

/// The table: one row per (registry, backend, K), then the notes of failed runs.
pub fn table(results: &[ScaleResult]) -> String {
    let fields = shown(results);
    let mut header = vec![
        "backend".to_string(),
        "registry".to_string(),
        "leases".to_string(),
    ];
    header.extend(fields.iter().map(|f| f.column().0.to_string()));
    let rows: Vec<Vec<String>> = results.iter().map(|r| row(r, &fields)).collect();
    let mut out = render(&header, &rows);
    for r in results.iter().filter(|r| !r.note.is_empty()) {
        out += &format!(
            "note: {} {} at {}: {}\n",
            r.registry.name(),
            r.backend.name(),
            r.leases,
            r.note
        );
    }
    out
}

fn row(r: &ScaleResult, fields: &[ScaleField]) -> Vec<String> {
    let mut cells = vec![
        r.backend.name().to_string(),
        r.registry.name().to_string(),
        r.leases.to_string(),
    ];
    cells.extend(
        fields
            .iter()
            .map(|&f| crate::report::cell(r.value(f), f.column().1)),
    );
    cells
}

/// One JSON object per (registry, backend, K); missing values are null.
pub fn json(results: &[ScaleResult]) -> Vec<Value> {
    results
        .iter()
        .map(|r| {
            let mut obj = Map::new();
            obj.insert("measure".into(), "scale".into());
            obj.insert("registry".into(), r.registry.name().into());
            obj.insert("backend".into(), r.backend.name().into());
            obj.insert("scale_leases".into(), r.leases.into());
            obj.insert("note".into(), r.note.clone().into());
            for field in ScaleField::ALL {
                obj.insert(field.key().into(), r.value(field).into());
            }
            Value::Object(obj)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_the_issues_keys_and_the_table_a_row_per_run() {
        let mut r = ScaleResult::new(ScaleBackend::Vxlan, 5000);
        r.set(ScaleField::StartMs, 1234.6);
        r.set_percentiles(
            ScaleField::PropagationP50Ms,
            ScaleField::PropagationP99Ms,
            &(1..=100).map(f64::from).collect::<Vec<_>>(),
        );
        let failed = ScaleResult::failed(ScaleBackend::Udp, 5000, "no etcd".into());
        let doc = json(&[r.clone(), failed.clone()]);
        for key in [
            "scale_leases",
            "start_ms",
            "propagation_p50_ms",
            "propagation_p99_ms",
            "reconcile_idle_ms",
            "reconcile_idle_writes",
            "rss_mb",
            "cpu_pct",
            "etcd_rpm",
        ] {
            assert!(doc[0].get(key).is_some(), "{key} missing in {}", doc[0]);
        }
        assert_eq!(doc[0]["scale_leases"], 5000);
        assert_eq!(doc[0]["propagation_p50_ms"], 50.0);
        assert_eq!(doc[0]["propagation_p99_ms"], 99.0);
        assert!(doc[1]["start_ms"].is_null());
        let text = table(&[r, failed]);
        assert!(
            text.contains("vxlan   |     etcd |   5000 |     1235"),
            "{text}"
        );
        assert!(text.contains("note: etcd udp at 5000: no etcd"), "{text}");
        assert!(
            text.contains("etcd rpm") && !text.contains("api rpm"),
            "{text}"
        );
        assert_eq!(doc[0]["registry"], "etcd");
    }

    #[test]
    fn kube_rows_name_their_registry_and_bring_the_api_server_columns() {
        let mut kube = ScaleResult::new(ScaleBackend::Udp, 5000).in_registry(ScaleRegistry::Kube);
        kube.set(ScaleField::ApiserverRssMb, 612.4);
        kube.set(ScaleField::FillMs, 61234.0);
        let etcd = ScaleResult::new(ScaleBackend::Udp, 5000);
        let text = table(&[etcd, kube.clone()]);
        assert!(
            text.contains("etcd rpm") && text.contains("api rpm"),
            "{text}"
        );
        assert!(text.contains("udp     |     kube |   5000 |"), "{text}");
        assert!(text.contains("612") && text.contains("61234"), "{text}");
        let only_kube = table(std::slice::from_ref(&kube));
        assert!(!only_kube.contains("etcd rpm"), "{only_kube}");
        let doc = json(&[kube]);
        assert_eq!(doc[0]["registry"], "kube");
        assert_eq!(doc[0]["apiserver_rss_mb"], 612.4);
        assert_eq!(doc[0]["fill_ms"], 61234.0);
        assert!(doc[0]["etcd_rpm"].is_null());
    }
}
