//! The scale panels of `--plot`: per K, a bar per backend (and registry, when both ran).

use super::report::{ScaleField, ScaleResult};
use super::{ScaleBackend, ScaleRegistry};
use crate::bars::{grouped_bars, Series};
use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;

/// A panel: its title, and the fields drawn (with the factor that turns them into its unit).
struct Panel {
    title: &'static str,
    fields: &'static [(&'static str, ScaleField)],
    factor: f64,
}

const PANELS: [Panel; 4] = [
    Panel {
        title: "cold start to all K peers programmed, s",
        fields: &[("", ScaleField::StartMs)],
        factor: 1e-3,
    },
    Panel {
        title: "new lease in the registry -> table or kernel, ms",
        fields: &[
            ("p50", ScaleField::PropagationP50Ms),
            ("p99", ScaleField::PropagationP99Ms),
        ],
        factor: 1.0,
    },
    Panel {
        title: "resident memory after an idle reconcile, MB",
        fields: &[("", ScaleField::RssMb)],
        factor: 1.0,
    },
    Panel {
        title: "idle periodic reconcile, ms",
        fields: &[("", ScaleField::ReconcileIdleMs)],
        factor: 1.0,
    },
];

/// The four panels side by side in `area`: K on the x axis, one series per backend (and per
/// registry when there are several, and per percentile).
pub fn draw_panels(
    area: &DrawingArea<BitMapBackend, Shift>,
    results: &[ScaleResult],
) -> Result<()> {
    let mut ks: Vec<u32> = results.iter().map(|r| r.leases).collect();
    ks.sort();
    ks.dedup();
    let mut backends: Vec<(ScaleRegistry, ScaleBackend)> =
        results.iter().map(|r| (r.registry, r.backend)).collect();
    backends.sort();
    backends.dedup();
    let first = backends.first().map(|&(registry, _)| registry);
    let several = backends
        .iter()
        .any(|&(registry, _)| Some(registry) != first);
    let label = |(registry, backend): (ScaleRegistry, ScaleBackend)| match several {
        true => format!("{} {}", registry.name(), backend.name()),
        false => backend.name().to_string(),
    };
    let categories: Vec<String> = ks.iter().map(|k| format!("K = {k}")).collect();
    for (area, panel) in area.split_evenly((1, PANELS.len())).iter().zip(&PANELS) {
        let series: Vec<Series> = backends
            .iter()
            .flat_map(|&b| {
                panel
                    .fields
                    .iter()
                    .map(move |&(what, field)| (b, what, field))
            })
            .map(|((registry, backend), what, field)| Series {
                name: format!("{} {what}", label((registry, backend)))
                    .trim_end()
                    .to_string(),
                values: ks
                    .iter()
                    .map(|&k| {
                        let r = results.iter().find(|r| {
                            r.leases == k && r.registry == registry && r.backend == backend
                        });
                        Some(r?.value(field)? * panel.factor)
                    })
                    .collect(),
            })
            .collect();
        grouped_bars(area, panel.title, &categories, &series)?;
    }
    Ok(())
}
