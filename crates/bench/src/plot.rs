//! `--plot`: a PNG with one bar panel per metric, paths side by side, and the control-plane
//! scale panels when they were measured.

use crate::measure::{Field, Measurement};
use crate::report::PathResult;
use crate::scale::report::ScaleResult;
use anyhow::{anyhow, Context, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;
use std::sync::OnceLock;

/// Text needs a font file (no fontconfig in the bitmap backend); Debian's fonts-dejavu-core has it.
const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const FONT_PACKAGE: &str = "fonts-dejavu-core";
pub(crate) const FONT: &str = "sans-serif";
const PATHS_SIZE: (u32, u32) = (1600, 1400);
/// The row of scale panels below (or instead of) the path panels.
const SCALE_HEIGHT: u32 = 520;
const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

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

/// One bar per category in each series.
pub(crate) struct Series {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

pub(crate) type Chart<'a> =
    ChartContext<'a, BitMapBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Grouped bars: a group per category (x axis), a bar per series, each labelled with its value;
/// a legend when there is more than one series.
pub(crate) fn grouped_bars<'a>(
    area: &DrawingArea<BitMapBackend<'a>, Shift>,
    title: &str,
    categories: &[String],
    series: &[Series],
) -> Result<Chart<'a>> {
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0, |a: f64, &b| a.max(b));
    let n = categories.len();
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        // Headroom above the tallest bar for its value label (and the legend).
        .build_cartesian_2d(
            -0.5..n as f64 - 0.5,
            0.0..if max > 0.0 { max * 1.3 } else { 1.0 },
        )?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| category_at(categories, *x))
        .label_style((FONT, 15))
        .draw()?;
    let width = 0.8 / series.len() as f64;
    for (k, s) in series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let bars: Vec<(f64, f64)> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((i as f64 - 0.4 + k as f64 * width, (*v)?)))
            .collect();
        chart
            .draw_series(bars.iter().map(|&(x, v)| {
                Rectangle::new([(x + 0.01, 0.0), (x + width - 0.01, v)], color.filled())
            }))?
            .label(s.name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 12, y + 6)], color.filled()));
        chart.draw_series(
            bars.iter()
                .map(|&(x, v)| Text::new(short(v), (x + width / 2.0, v), value_label_style())),
        )?;
    }
    if series.len() > 1 {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font((FONT, 14))
            .draw()?;
    }
    Ok(chart)
}

fn value_label_style() -> TextStyle<'static> {
    TextStyle::from((FONT, 13)).pos(Pos::new(HPos::Center, VPos::Bottom))
}

/// The category under each integer x; the axis may also ask for ticks in between.
fn category_at(categories: &[String], x: f64) -> String {
    let i = x.round();
    match categories.get(i as usize) {
        Some(name) if (x - i).abs() < 1e-6 && i >= 0.0 => name.clone(),
        _ => String::new(),
    }
}

/// Three significant digits, enough to read a bar.
fn short(v: f64) -> String {
    match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

/// Registered once per process; plotters keeps a `'static` reference to the bytes.
pub(crate) fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let bytes = std::fs::read(FONT_PATH)
                .map_err(|e| format!("{FONT_PATH}: {e} (install Debian's {FONT_PACKAGE})"))?;
            plotters::style::register_font(FONT, FontStyle::Normal, Box::leak(bytes.into()))
                .map_err(|_| format!("{FONT_PATH} is not a usable font"))
        })
        .clone()
        .map_err(|e| anyhow!("plot font: {e}"))
}
