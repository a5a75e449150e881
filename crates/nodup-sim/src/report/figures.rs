//! The PNG figures, numbered like the paper's: 14 write reduction, 15/16 write/read speedup,
//! 17 energy, 18 write-latency CDF, 20 worst case, 23 sensitivity, and the load sweep.

use super::plot::{bars, panels, Bars, Panel, COLORS};
use super::*;

fn color(k: SchemeKind) -> plotters::style::RGBColor {
    COLORS[(k as usize - 1) % COLORS.len()]
}

/// One bar series per dedup scheme over all traces.
fn per_trace(
    r: &Results,
    f: impl Fn(&RunReport, SchemeKind) -> Option<f64>,
) -> Vec<(String, plotters::style::RGBColor, Vec<f64>)> {
    DEDUP
        .iter()
        .map(|&k| {
            let v = r
                .runs
                .iter()
                .map(|(_, run)| f(run, k).unwrap_or(0.0))
                .collect();
            (label(k).to_string(), color(k), v)
        })
        .collect()
}

fn cdf_panels(r: &Results) -> Vec<Panel<'static>> {
    r.runs
        .iter()
        .map(|(name, run)| {
            // Clip the x axis a little past the largest p99 so the knees are visible.
            let xmax = SchemeKind::ALL
                .iter()
                .filter_map(|&k| Results::get(run, k))
                .map(|s| s.p99_write_latency_ns)
                .max()
                .unwrap_or(1) as f64
                * 1.3;
            let curves = SchemeKind::ALL
                .iter()
                .filter_map(|&k| {
                    let s = Results::get(run, k)?;
                    let pts: Vec<(f64, f64)> = s
                        .write_latency_cdf
                        .iter()
                        .map(|p| (p.ns as f64, p.frac))
                        .filter(|p| p.0 <= xmax)
                        .collect();
                    Some((label(k).to_string(), color(k), pts))
                })
                .collect();
            Panel {
                title: name.clone(),
                x_label: "write latency (ns)",
                y_label: "CDF",
                log_x: false,
                curves,
                y_range: Some((0.0, 1.0)),
            }
        })
        .collect()
}

fn sweep_panel(
    r: &Results,
    param: &str,
    title: &str,
    x_label: &'static str,
    y_label: &'static str,
    kinds: &[SchemeKind],
    y: impl Fn(&RunReport, SchemeKind) -> Option<f64>,
) -> Vec<Panel<'static>> {
    r.sweeps
        .iter()
        .filter(|((_, p), _)| p == param)
        .map(|((trace, _), runs)| {
            let curves = kinds
                .iter()
                .map(|&k| {
                    let name = match (param, k) {
                        ("efit", SchemeKind::Esd) => "ESD (LRCU)".to_string(),
                        ("efit", SchemeKind::FsDedup) => "FSDedup (LRCU-Refresh)".to_string(),
                        _ => label(k).to_string(),
                    };
                    let pts = runs
                        .iter()
                        .filter(|(v, _)| *v > 0.0)
                        .filter_map(|(v, run)| Some((*v, y(run, k)?)))
                        .collect();
                    (name, color(k), pts)
                })
                .collect();
            Panel {
                title: format!("{title}: {trace}"),
                x_label,
                y_label,
                log_x: true,
                curves,
                y_range: None,
            }
        })
        .collect()
}

/// Draw every figure the results allow; returns the files written.
pub fn draw_all(r: &Results, out: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let groups: Vec<String> = r.runs.iter().map(|(n, _)| n.clone()).collect();
    type Series = Vec<(String, plotters::style::RGBColor, Vec<f64>)>;
    let figs: [(&str, &str, &str, Option<f64>, Series); 4] = [
        (
            "fig14-write-reduction.png",
            "Writes eliminated (Fig. 14)",
            "fraction of writes",
            None,
            per_trace(r, |run, k| {
                Results::get(run, k).map(|s| s.writes_eliminated_fraction)
            }),
        ),
        (
            "fig15-write-speedup.png",
            "Write speedup over Baseline (Fig. 15)",
            "Baseline / scheme mean write latency",
            Some(1.0),
            per_trace(r, write_speedup),
        ),
        (
            "fig16-read-speedup.png",
            "Read speedup over Baseline (Fig. 16)",
            "Baseline / scheme mean read latency",
            Some(1.0),
            per_trace(r, read_speedup),
        ),
        (
            "fig17-energy.png",
            "Energy normalized to Baseline (Fig. 17)",
            "scheme / Baseline energy",
            Some(1.0),
            per_trace(r, energy_norm),
        ),
    ];
    for (file, title, y, reference, series) in figs {
        let p = out.join(file);
        bars(
            &Bars {
                title,
                y_label: y,
                groups: &groups,
                series: &series,
                reference,
            },
            &p,
        )?;
        files.push(p);
    }
    let cdf = cdf_panels(r);
    let p = out.join("fig18-write-latency-cdf.png");
    panels(&cdf, 4, &p)?;
    files.push(p);
    for (name, run) in r.runs.iter().filter(|(n, _)| n.contains("worst")) {
        let metrics = [
            "write speedup",
            "read speedup",
            "run-time speedup",
            "energy (lower is better)",
        ];
        let series: Series = DEDUP
            .iter()
            .map(|&k| {
                let v = vec![
                    write_speedup(run, k).unwrap_or(0.0),
                    read_speedup(run, k).unwrap_or(0.0),
                    runtime_speedup(run, k).unwrap_or(0.0),
                    energy_norm(run, k).unwrap_or(0.0),
                ];
                (label(k).to_string(), color(k), v)
            })
            .collect();
        let p = out.join("fig20-worst-case.png");
        let groups: Vec<String> = metrics.iter().map(|s| s.to_string()).collect();
        bars(
            &Bars {
                title: &format!("Worst case ({name}) normalized to Baseline (Fig. 20)"),
                y_label: "relative to Baseline",
                groups: &groups,
                series: &series,
                reference: Some(1.0),
            },
            &p,
        )?;
        files.push(p);
    }
    let mut sens = sweep_panel(
        r,
        "efit",
        "(a) EFIT hit ratio vs size",
        "EFIT size (KiB)",
        "hit ratio",
        &[SchemeKind::Esd, SchemeKind::FsDedup],
        |run, k| Results::get(run, k).map(efit_hit_ratio),
    );
    sens.extend(sweep_panel(
        r,
        "refresh",
        "(b) FSDedup vs refresh interval",
        "refresh interval (simulated ms)",
        "EFIT hit ratio",
        &[SchemeKind::FsDedup],
        |run, k| Results::get(run, k).map(efit_hit_ratio),
    ));
    sens.extend(sweep_panel(
        r,
        "prefetch",
        "(c) prefetch hit ratio vs size",
        "prefetch cache (KiB)",
        "verifications answered",
        &[SchemeKind::FsDedup],
        |run, k| Results::get(run, k).map(prefetch_hit_ratio),
    ));
    if !sens.is_empty() {
        let p = out.join("fig23-sensitivity.png");
        panels(&sens, 3, &p)?;
        files.push(p);
    }
    let mut load = sweep_panel(
        r,
        "gap",
        "write speedup vs load",
        "issue gap (ns, smaller = more load)",
        "write speedup",
        &DEDUP,
        write_speedup,
    );
    load.extend(sweep_panel(
        r,
        "gap",
        "read speedup vs load",
        "issue gap (ns, smaller = more load)",
        "read speedup",
        &DEDUP,
        read_speedup,
    ));
    if !load.is_empty() {
        let p = out.join("fig-load.png");
        panels(&load, 2, &p)?;
        files.push(p);
    }
    Ok(files)
}
