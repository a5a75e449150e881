//! Reports: text tables, and markdown tables and PNG plots made from a directory of results
//! (`run-TRACE.json` from `run --json`, `stats-TRACE.json` from `stats --json`, and
//! `sweep-TRACE-PARAM-VALUE.json` from `run --json` with one parameter changed; PARAM is
//! `efit`, `refresh`, `prefetch` or `gap`).

mod figures;
mod markdown;
pub mod plot;
mod text;

pub use text::{run_text, stats_text};

use crate::error::{Result, SimError};
use crate::run::RunReport;
use crate::schemes::SchemeKind;
use crate::sim::SchemeResult;
use crate::stats::TraceStats;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Everything found in a results directory.
pub struct Results {
    /// Runs of all schemes, by trace, captured traces first, generated (`gen-*`) last.
    pub runs: Vec<(String, RunReport)>,
    /// Table-1 statistics by trace.
    pub stats: BTreeMap<String, TraceStats>,
    /// Sweeps by (trace, parameter): (value, run) sorted by value.
    pub sweeps: BTreeMap<(String, String), Vec<(f64, RunReport)>>,
}

impl Results {
    /// A scheme's result in a run.
    pub fn get(r: &RunReport, k: SchemeKind) -> Option<&SchemeResult> {
        r.schemes.get(k.name())
    }
}

fn read_json<T: serde::de::DeserializeOwned>(p: &Path) -> Result<T> {
    let text = std::fs::read_to_string(p)
        .map_err(|e| SimError::io(format!("reading {}", p.display()), e))?;
    serde_json::from_str(&text)
        .map_err(|e| SimError::Format(format!("{}: not a result file ({e})", p.display())))
}

/// Load the results directory `dir`.
pub fn load(dir: &Path) -> Result<Results> {
    let mut runs = Vec::new();
    let mut stats = BTreeMap::new();
    let mut sweeps: BTreeMap<(String, String), Vec<(f64, RunReport)>> = BTreeMap::new();
    let rd = std::fs::read_dir(dir)
        .map_err(|e| SimError::io(format!("reading {}", dir.display()), e))?;
    for ent in rd.flatten() {
        let p = ent.path();
        let Some(name) = p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        if let Some(t) = name.strip_prefix("run-") {
            runs.push((t.to_string(), read_json::<RunReport>(&p)?));
        } else if let Some(t) = name.strip_prefix("stats-") {
            stats.insert(t.to_string(), read_json::<TraceStats>(&p)?);
        } else if let Some(rest) = name.strip_prefix("sweep-") {
            let mut parts = rest.rsplitn(3, '-');
            let (Some(v), Some(param), Some(trace)) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(SimError::Format(format!(
                    "{}: expected sweep-TRACE-PARAM-VALUE.json",
                    p.display()
                )));
            };
            let v: f64 = v.parse().map_err(|_| {
                SimError::Format(format!("{}: sweep value is not a number", p.display()))
            })?;
            sweeps
                .entry((trace.to_string(), param.to_string()))
                .or_default()
                .push((v, read_json::<RunReport>(&p)?));
        }
    }
    runs.sort_by(|a, b| (a.0.starts_with("gen-"), &a.0).cmp(&(b.0.starts_with("gen-"), &b.0)));
    for v in sweeps.values_mut() {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    if runs.is_empty() {
        return Err(SimError::Invalid(format!(
            "{}: no run-*.json results",
            dir.display()
        )));
    }
    Ok(Results {
        runs,
        stats,
        sweeps,
    })
}

/// Write `schemes.md` and the figures for the results in `dir` into `out`; returns the files.
pub fn write_report(dir: &Path, out: &Path) -> Result<Vec<PathBuf>> {
    let r = load(dir)?;
    std::fs::create_dir_all(out)
        .map_err(|e| SimError::io(format!("creating {}", out.display()), e))?;
    let mut files = figures::draw_all(&r, out)?;
    let md = out.join("schemes.md");
    std::fs::write(&md, markdown::render(&r))
        .map_err(|e| SimError::io(format!("writing {}", md.display()), e))?;
    files.push(md);
    Ok(files)
}

/// The deduplicating schemes, in the paper's order.
pub(crate) const DEDUP: [SchemeKind; 4] = [
    SchemeKind::Sha1,
    SchemeKind::DeWrite,
    SchemeKind::Esd,
    SchemeKind::FsDedup,
];

/// The paper's name of a scheme.
pub(crate) fn label(k: SchemeKind) -> &'static str {
    match k {
        SchemeKind::Baseline => "Baseline",
        SchemeKind::Sha1 => "Dedup_SHA1",
        SchemeKind::DeWrite => "DeWrite",
        SchemeKind::Esd => "ESD",
        SchemeKind::FsDedup => "FSDedup",
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Metric of scheme `k` relative to Baseline in run `r` (None without both).
pub(crate) fn vs_base(
    r: &RunReport,
    k: SchemeKind,
    f: impl Fn(&SchemeResult) -> f64,
    base_over: bool,
) -> Option<f64> {
    let b = Results::get(r, SchemeKind::Baseline)?;
    let s = Results::get(r, k)?;
    Some(if base_over {
        ratio(f(b), f(s))
    } else {
        ratio(f(s), f(b))
    })
}

/// Write speedup over Baseline (Baseline's mean write latency / the scheme's; Fig. 15).
pub(crate) fn write_speedup(r: &RunReport, k: SchemeKind) -> Option<f64> {
    vs_base(r, k, |s| s.mean_write_latency_ns, true)
}

/// Read speedup over Baseline (Fig. 16).
pub(crate) fn read_speedup(r: &RunReport, k: SchemeKind) -> Option<f64> {
    vs_base(r, k, |s| s.mean_read_latency_ns, true)
}

/// Energy normalized to Baseline (Fig. 17).
pub(crate) fn energy_norm(r: &RunReport, k: SchemeKind) -> Option<f64> {
    vs_base(r, k, |s| s.energy_nj, false)
}

/// Run-time speedup over Baseline (time to drain the trace; our stand-in for IPC, Fig. 19).
pub(crate) fn runtime_speedup(r: &RunReport, k: SchemeKind) -> Option<f64> {
    vs_base(r, k, |s| s.runtime_ns as f64, true)
}

/// EFIT (LRCU) hit ratio.
pub(crate) fn efit_hit_ratio(s: &SchemeResult) -> f64 {
    ratio(
        s.dedup.efit_hits as f64,
        (s.dedup.efit_hits + s.dedup.efit_misses) as f64,
    )
}

/// Share of verifications the prefetch cache answered.
pub(crate) fn prefetch_hit_ratio(s: &SchemeResult) -> f64 {
    ratio(
        s.dedup.prefetch_hits as f64,
        (s.dedup.prefetch_hits + s.dedup.prefetch_misses) as f64,
    )
}
