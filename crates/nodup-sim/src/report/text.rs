//! Plain-text reports of `nodup sim run` and `nodup sim stats`.

use crate::run::RunReport;
use crate::schemes::SchemeKind;
use crate::stats::TraceStats;
use std::fmt::Write as _;

/// Results of a run as a text table, schemes in the paper's order; speedups against Baseline when
/// it ran.
pub fn run_text(r: &RunReport, kinds: &[SchemeKind]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{}: {} events ({} writes, {} reads), {:.1} s, {:.2} M events/s per scheme",
        r.trace,
        r.events,
        r.writes,
        r.reads,
        r.elapsed_s,
        r.events_per_s / 1e6
    );
    let base = r.schemes.get("baseline");
    let _ = writeln!(
        o,
        "{:<9} {:>9} {:>10} {:>9} {:>10} {:>9} {:>9} {:>9} {:>12} {:>12}",
        "scheme",
        "wr elim",
        "wr mean ns",
        "wr p99",
        "rd mean ns",
        "wr spdup",
        "rd spdup",
        "energy",
        "energy nJ",
        "metadata B"
    );
    for k in kinds {
        let Some(s) = r.schemes.get(k.name()) else {
            continue;
        };
        let ratio = |b: f64, x: f64| if x > 0.0 { b / x } else { 0.0 };
        let (ws, rs, en) = match base {
            Some(b) => (
                format!(
                    "{:.2}x",
                    ratio(b.mean_write_latency_ns, s.mean_write_latency_ns)
                ),
                format!(
                    "{:.2}x",
                    ratio(b.mean_read_latency_ns, s.mean_read_latency_ns)
                ),
                format!("{:.3}", ratio(s.energy_nj, b.energy_nj)),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let _ = writeln!(
            o,
            "{:<9} {:>8.2}% {:>10.1} {:>9} {:>10.1} {:>9} {:>9} {:>9} {:>12.0} {:>12}",
            k.name(),
            100.0 * s.writes_eliminated_fraction,
            s.mean_write_latency_ns,
            s.p99_write_latency_ns,
            s.mean_read_latency_ns,
            ws,
            rs,
            en,
            s.energy_nj,
            s.metadata_bytes
        );
    }
    o
}

/// Trace statistics as Table 1.
pub fn stats_text(s: &TraceStats) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} events ({} writes, {} reads), {} lines written, {} unique contents",
        s.events, s.writes, s.reads, s.written_lines, s.unique_contents
    );
    let _ = writeln!(
        o,
        "duplicate rate {:.2} %, zero-line writes {:.2} %, non-zero share of duplicates {:.2} %",
        100.0 * s.duplicate_rate,
        100.0 * s.zero_share,
        100.0 * s.nonzero_duplicate_share
    );
    let _ = writeln!(
        o,
        "{:<20} {:>16} {:>16}",
        "reference count", "before dedup", "after dedup"
    );
    for row in &s.rc_table {
        let _ = writeln!(
            o,
            "{:<20} {:>15.2}% {:>15.2}%",
            row.range,
            100.0 * row.volume_share,
            100.0 * row.unique_share
        );
    }
    o
}
