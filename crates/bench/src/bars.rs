//! Grouped bar panels drawn with plotters, the one chart shape of `--plot`: the path panels
//! (`plot`) and the control-plane scale panels (`scale::plot`) both draw with it.

use anyhow::{anyhow, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::sync::OnceLock;

/// Text needs a font file (no fontconfig in the bitmap backend); Debian's fonts-dejavu-core has it.
const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const FONT_PACKAGE: &str = "fonts-dejavu-core";
pub(crate) const FONT: &str = "sans-serif";
const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

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

pub(crate) fn value_label_style() -> TextStyle<'static> {
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
