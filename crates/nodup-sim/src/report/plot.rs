//! PNG charts with plotters: grouped bars, CDF curves, and x-y sweeps.
//!
//! Text needs a TrueType font: DejaVu Sans is loaded at run time from the system
//! (Debian package `fonts-dejavu-core`; `bench/sim.sh` installs it when missing).

use crate::error::{Result, SimError};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::Path;

const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Series colors, one per scheme in the paper's order.
pub const COLORS: [RGBColor; 6] = [
    RGBColor(120, 120, 120),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(31, 119, 180),
    RGBColor(148, 103, 189),
];

/// An axis label: integers without decimals, else at most 3 significant digits.
fn num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_string()
    }
}

fn err<E: std::fmt::Display>(e: E) -> SimError {
    SimError::Plot(e.to_string())
}

/// Make the system font available to plotters (once).
pub fn init_font() -> Result<()> {
    static DONE: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let bytes = FONTS
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .ok_or_else(|| {
                "no DejaVu Sans font found (install the Debian package fonts-dejavu-core)"
                    .to_string()
            })?;
        let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        register_font("sans-serif", FontStyle::Normal, leaked)
            .map_err(|_| "the DejaVu Sans font could not be parsed".to_string())
    })
    .clone()
    .map_err(SimError::Plot)
}

/// A grouped bar chart: `groups` on the x axis, one bar per series in each group.
pub struct Bars<'a> {
    /// Chart title.
    pub title: &'a str,
    /// Y axis label.
    pub y_label: &'a str,
    /// Group names.
    pub groups: &'a [String],
    /// Series names, colors and values (one per group).
    pub series: &'a [(String, RGBColor, Vec<f64>)],
    /// Draw a reference line at this y (e.g. 1.0 for "same as Baseline").
    pub reference: Option<f64>,
}

/// Draw `b` into `out` (PNG).
pub fn bars(b: &Bars, out: &Path) -> Result<()> {
    init_font()?;
    let root = BitMapBackend::new(out, (1100, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let ymax = b
        .series
        .iter()
        .flat_map(|(_, _, v)| v.iter().copied())
        .chain(b.reference)
        .fold(0.0f64, f64::max)
        .max(1e-9)
        // Headroom for the legend (upper right), so it never hides a bar.
        * 1.45;
    let n = b.groups.len().max(1);
    let groups = b.groups.to_vec();
    let mut chart = ChartBuilder::on(&root)
        .caption(b.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n + 1)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < groups.len() {
                groups[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc(b.y_label)
        .y_label_formatter(&|v| num(*v))
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(err)?;
    let k = b.series.len().max(1) as f64;
    let w = 0.8 / k;
    for (si, (name, color, vals)) in b.series.iter().enumerate() {
        let color = *color;
        chart
            .draw_series(vals.iter().enumerate().map(|(g, &v)| {
                let x0 = g as f64 - 0.4 + si as f64 * w;
                Rectangle::new([(x0, 0.0), (x0 + w * 0.92, v)], color.filled())
            }))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
    }
    if let Some(r) = b.reference {
        chart
            .draw_series(LineSeries::new(
                vec![(-0.5, r), (n as f64 - 0.5, r)],
                BLACK.stroke_width(1),
            ))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// One curve: name, color and points.
pub type Curve = (String, RGBColor, Vec<(f64, f64)>);

/// One panel of x-y curves.
pub struct Panel<'a> {
    /// Panel title.
    pub title: String,
    /// X axis label.
    pub x_label: &'a str,
    /// Y axis label.
    pub y_label: &'a str,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// Curves: name, color and points.
    pub curves: Vec<Curve>,
    /// Y range (None = from 0 to the data's maximum).
    pub y_range: Option<(f64, f64)>,
}

fn draw_panel<DB, X>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    p: &Panel,
    x: X,
    y: std::ops::Range<f64>,
) -> Result<()>
where
    DB: DrawingBackend,
    X: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
    X::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", 17))
        .margin(10)
        // Room for half of the last x tick label ("10000" on a log axis), which is centred
        // on the plot's right edge.
        .margin_right(28)
        .x_label_area_size(38)
        .y_label_area_size(58)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(p.x_label)
        .y_desc(p.y_label)
        .x_label_formatter(&|v| num(*v))
        .y_label_formatter(&|v| num(*v))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    for (name, color, v) in &p.curves {
        let c = *color;
        chart
            .draw_series(LineSeries::new(v.clone(), c.stroke_width(2)).point_size(2))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Draw `panels` in a grid of `cols` columns into `out` (PNG).
pub fn panels(panels: &[Panel], cols: usize, out: &Path) -> Result<()> {
    init_font()?;
    let cols = cols.max(1);
    let rows = panels.len().div_ceil(cols).max(1);
    let root = BitMapBackend::new(out, (480 * cols as u32, 380 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((rows, cols));
    for (p, area) in panels.iter().zip(areas.iter()) {
        let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
        for &(x, y) in p.curves.iter().flat_map(|(_, _, v)| v.iter()) {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
        if x0 > x1 {
            continue;
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        let (ylo, yhi) = p.y_range.unwrap_or((0.0, y1.max(1e-9) * 1.1));
        if p.log_x {
            // Ticks at the swept values only: plotters' own log ticks crowd (500 600 ... 1000).
            let mut ticks: Vec<f64> = p
                .curves
                .iter()
                .flat_map(|(_, _, v)| v.iter().map(|&(x, _)| x))
                .collect();
            ticks.sort_by(f64::total_cmp);
            ticks.dedup();
            let x = (x0.max(1e-12)..x1 * 1.15)
                .log_scale()
                .with_key_points(ticks);
            draw_panel(area, p, x, ylo..yhi)?;
        } else {
            draw_panel(area, p, x0..x1, ylo..yhi)?;
        }
    }
    root.present().map_err(err)
}
