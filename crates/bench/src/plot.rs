//! `--plot`: a PNG with one bar panel per metric, paths side by side, and the control-plane
//! scale panels when they were measured.

use crate::bars::{grouped_bars, register_font, value_label_style, Series, FONT};
use crate::measure::{Field, Measurement};
use crate::report::PathResult;
use crate::scale::report::ScaleResult;
use anyhow::{Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const PATHS_SIZE: (u32, u32) = (1600, 1400);
/// The row of scale panels below (or instead of) the path panels.
const SCALE_HEIGHT: u32 = 520;

/// One panel: a title and the fields drawn as grouped bars per path.
struct Panel {
    title: &'static str,
    series: &'static [(&'static str, Field)],
}

const PANELS: [Panel; 6] = [
    Panel {
        title: "TCP throughput, Gbit/s (higher is better)",
        series: &[
            ("single stream", Field::TcpGbps),
            ("single stream, IPv6", Field::Tcp6Gbps),
            ("-P 4", Field::TcpP4Gbps),
            ("reverse", Field::TcpRevGbps),
        ],
    },
    Panel {
        title: "TCP one-way latency (qperf tcp_lat, half a round trip), µs (lower is better)",
        series: &[
            ("both vCPUs", Field::LatencyUs),
            ("all on CPU 0", Field::LatencyPinnedUs),
        ],
    },
    Panel {
        title: "64-byte flood delivered, kpps (higher is better)",
        series: &[("delivered", Field::Flood64Kpps)],
    },
    Panel {
        title: "64-byte flood: underlay datagrams per packet (lower is better)",
        series: &[("datagrams / packet", Field::Flood64DatagramsPerPacket)],
    },
    Panel {
        title: "CPU of the whole machine during single-stream TCP, %",
        series: &[
            ("busy", Field::CpuPct),
            ("of it softirq", Field::CpuSoftirqPct),
        ],
    },
    Panel {
        title: "CPU seconds per Gbit, single-stream TCP, both hosts (lower is better)",
        series: &[("CPU s / Gbit", Field::CpuPerGbit)],
    },
];

/// Write the PNG: the path panels when paths were measured, a row of control-plane scale
/// panels when `--measure scale` ran. `title` names the run (e.g. repeat and duration), and
/// `measured` says which measurements ran, so a panel of the others reads "not measured"
/// rather than "failed".
pub fn draw(
    results: &[PathResult],
    scale: &[ScaleResult],
    measured: &[Measurement],
    title: &str,
    out: &Path,
) -> Result<()> {
    register_font()?;
    let (width, paths_height) = PATHS_SIZE;
    let paths_height = if results.is_empty() { 0 } else { paths_height };
    let scale_height = if scale.is_empty() { 0 } else { SCALE_HEIGHT };
    let root = BitMapBackend::new(out, (width, paths_height + scale_height)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, (FONT, 28))?;
    let (paths, scale_row) = root.split_vertically(paths_height);
    if !results.is_empty() {
        for (area, panel) in paths.split_evenly((3, 2)).iter().zip(&PANELS) {
            let ran = panel
                .series
                .iter()
                .any(|(_, f)| measured.iter().any(|m| m.fields().contains(f)));
            draw_panel(area, results, panel, ran)?;
        }
    }
    if !scale.is_empty() {
        crate::scale::plot::draw_panels(&scale_row, scale)?;
    }
    root.present()
        .with_context(|| format!("cannot write {}", out.display()))
}

/// `ran`: whether any measurement behind this panel was asked for.
fn draw_panel(
    area: &DrawingArea<BitMapBackend, Shift>,
    results: &[PathResult],
    panel: &Panel,
    ran: bool,
) -> Result<()> {
    let paths: Vec<String> = results.iter().map(|r| r.path.clone()).collect();
    let series: Vec<Series> = panel
        .series
        .iter()
        .map(|(name, field)| Series {
            name: name.to_string(),
            values: results.iter().map(|r| r.value(*field)).collect(),
        })
        .collect();
    let mut chart = grouped_bars(area, panel.title, &paths, &series)?;
    // A path with no bar in this panel says why: not set up at all, not asked for, or its runs
    // failed.
    let empty = results
        .iter()
        .enumerate()
        .filter(|(_, r)| panel.series.iter().all(|(_, f)| r.value(*f).is_none()));
    chart.draw_series(empty.map(|(i, r)| {
        let why = match (r.available, ran) {
            (false, _) => "n/a",
            (true, false) => "not measured",
            (true, true) => "failed",
        };
        Text::new(why, (i as f64, 0.0), value_label_style())
    }))?;
    Ok(())
}
