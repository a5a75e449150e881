//! PNG plot of the duplication-continuousness CDF (Light-Dedup Fig. 8).
//!
//! Drawn with plotters' bitmap backend only: plotters' text needs a font feature and system
//! fonts, so tick labels use a built-in 5x7 pixel font (digits and '.') instead; the plot then
//! renders on any machine. x = duplicate run length in blocks (log2 scale), y = CDF.

use crate::error::{Result, TraceError};
use crate::stats::TraceStats;
use plotters::backend::DrawingBackend;
use plotters::drawing::DrawingAreaErrorKind;
use plotters::prelude::*;
use plotters_backend::DrawingErrorKind;
use std::path::Path;

const W: u32 = 800;
const H: u32 = 500;
const LEFT: i32 = 70;
const RIGHT: i32 = W as i32 - 30;
const TOP: i32 = 20;
const BOTTOM: i32 = H as i32 - 50;

/// 5x7 glyphs, one byte per row, low 5 bits, MSB of the 5 on the left.
fn glyph(c: char) -> Option<[u8; 7]> {
    Some(match c {
        '0' => [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E],
        '1' => [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E],
        '2' => [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F],
        '3' => [0x1E, 0x01, 0x01, 0x0E, 0x01, 0x01, 0x1E],
        '4' => [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02],
        '5' => [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E],
        '6' => [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E],
        '7' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E],
        '9' => [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C],
        '.' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C],
        _ => return None,
    })
}

/// Width in pixels of `text` at pixel scale `s`.
fn text_width(text: &str, s: i32) -> i32 {
    text.chars().count() as i32 * 6 * s
}

fn draw_text<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    text: &str,
    x: i32,
    y: i32,
    s: i32,
) {
    for (i, c) in text.chars().enumerate() {
        let Some(g) = glyph(c) else { continue };
        for (row, bits) in g.iter().enumerate() {
            for col in 0..5 {
                if bits & (0x10 >> col) != 0 {
                    let px = x + (i as i32 * 6 + col) * s;
                    let py = y + row as i32 * s;
                    let _ = area.draw(&Rectangle::new(
                        [(px, py), (px + s - 1, py + s - 1)],
                        BLACK.filled(),
                    ));
                }
            }
        }
    }
}

/// File name extensions the bitmap encoder can write (plotters' `bitmap_encoder` enables only
/// these image formats; any other extension fails only once the whole plot has been drawn).
/// The error text of [`check_output`] lists them too.
pub const EXTENSIONS: [&str; 4] = ["png", "jpg", "jpeg", "bmp"];

/// Check that a plot can be written to `out` before any work is done for it: a supported
/// extension and an existing parent directory, so a typo costs one line instead of a run over
/// the whole trace.
pub fn check_output(out: &Path) -> Result<()> {
    let ext = out
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    if !ext.as_deref().is_some_and(|e| EXTENSIONS.contains(&e)) {
        return Err(TraceError::Plot(format!(
            "{}: the file name must end in .png, .jpg, .jpeg or .bmp (the image formats the plot can be written in)",
            out.display()
        )));
    }
    if out.is_dir() {
        return Err(TraceError::Plot(format!(
            "{}: is a directory",
            out.display()
        )));
    }
    // `Path::parent` of a bare file name is "": the current directory.
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(TraceError::Plot(format!(
            "{}: no such directory {}",
            out.display(),
            parent.display()
        )));
    }
    Ok(())
}

/// The backend's error type: its variants are matched to print the cause, not plotters'
/// `Debug` dump (its `Display` is that dump).
type BackendError = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

/// A drawing error as one line naming the file: the I/O or encoder cause without Rust
/// `Debug` text.
fn err(out: &Path, e: DrawingAreaErrorKind<BackendError>) -> TraceError {
    let cause = match &e {
        DrawingAreaErrorKind::BackendError(DrawingErrorKind::DrawingError(b)) => match b {
            BackendError::IOError(io) => io.to_string(),
            BackendError::ImageError(i) => i.to_string(),
            BackendError::InvalidBuffer => "invalid pixel buffer".to_string(),
        },
        other => other.to_string(),
    };
    TraceError::Plot(format!("{}: {cause}", out.display()))
}

/// Draw the continuousness CDF of `stats` into the image file `out` (PNG, JPEG or BMP by its
/// extension; see [`check_output`]).
pub fn plot_cdf(stats: &TraceStats, out: &Path) -> Result<()> {
    let err = |e| err(out, e);
    let root = BitMapBackend::new(out, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let max_len = stats.max_dup_run.max(2);
    let xmax = (max_len as f64).log2().ceil().max(1.0);
    let px =
        |len: f64| LEFT + ((len.max(1.0).log2() / xmax) * (RIGHT - LEFT) as f64).round() as i32;
    let py = |cdf: f64| BOTTOM - (cdf.clamp(0.0, 1.0) * (BOTTOM - TOP) as f64).round() as i32;
    let grid = RGBColor(220, 220, 220);
    for i in 0..=5 {
        let y = py(i as f64 / 5.0);
        root.draw(&PathElement::new(vec![(LEFT, y), (RIGHT, y)], grid))
            .map_err(err)?;
        let label = match i {
            0 => "0".to_string(),
            5 => "1".to_string(),
            _ => format!("0.{}", i * 2),
        };
        draw_text(&root, &label, LEFT - 10 - text_width(&label, 2), y - 7, 2);
    }
    for e in 0..=xmax as u32 {
        let len = 1u64 << e;
        let x = px(len as f64);
        root.draw(&PathElement::new(vec![(x, TOP), (x, BOTTOM)], grid))
            .map_err(err)?;
        // Label every power of two while they fit, else every other one.
        if xmax <= 12.0 || e % 2 == 0 {
            let label = len.to_string();
            draw_text(&root, &label, x - text_width(&label, 2) / 2, BOTTOM + 10, 2);
        }
    }
    root.draw(&PathElement::new(
        vec![(LEFT, TOP), (LEFT, BOTTOM), (RIGHT, BOTTOM)],
        BLACK.stroke_width(2),
    ))
    .map_err(err)?;
    // Step curve over every observed run length.
    let mut pts = vec![(px(1.0), py(0.0))];
    let mut acc = 0u64;
    let total = stats.duplicate_writes.max(1) as f64;
    for (&len, &runs) in &stats.run_hist {
        let x = px(len as f64);
        pts.push((x, py(acc as f64 / total)));
        acc += len * runs;
        pts.push((x, py(acc as f64 / total)));
    }
    pts.push((RIGHT, py(acc as f64 / total)));
    root.draw(&PathElement::new(pts, BLUE.stroke_width(3)))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_png_without_fonts() {
        let mut s = TraceStats {
            duplicate_writes: 30,
            max_dup_run: 20,
            ..Default::default()
        };
        s.run_hist.insert(1, 5);
        s.run_hist.insert(5, 1);
        s.run_hist.insert(20, 1);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cdf.png");
        plot_cdf(&s, &p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(bytes.len() > 1000);
    }
}
