//! `schemes.md`: the trace table (Table 1), per-trace results of all schemes, averages, the
//! check of the issue's four qualitative claims, and the sensitivity sweeps.

use super::*;
use std::fmt::Write as _;

fn pct(v: f64) -> String {
    format!("{:.2} %", 100.0 * v)
}

fn x(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}x"))
}

fn traces_table(o: &mut String, r: &Results) {
    let _ = writeln!(o, "## Traces\n");
    let _ = writeln!(
        o,
        "Duplicate rate = written lines whose content was written before anywhere in the trace (an upper \
         bound: content overwritten since is no longer in memory to share). Reference-count columns: share \
         of the written volume by the reference count of its content (Table 1, \"before deduplication\"); \
         in brackets the share of unique contents (\"after\").\n"
    );
    let _ = writeln!(
        o,
        "| trace | events | writes | reads | unique contents | dup rate | zero lines | non-zero dups | RC=1 | 1<RC<=10 | 10<RC<=100 | 100<RC<=1000 | RC>1000 |"
    );
    let _ = writeln!(
        o,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (name, run) in &r.runs {
        let Some(s) = r.stats.get(name) else {
            let _ = writeln!(
                o,
                "| {name} | {} | {} | {} | | | | | | | | | |",
                run.events, run.writes, run.reads
            );
            continue;
        };
        let _ = write!(
            o,
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            s.events,
            s.writes,
            s.reads,
            s.unique_contents,
            pct(s.duplicate_rate),
            pct(s.zero_share),
            pct(s.nonzero_duplicate_share)
        );
        for row in &s.rc_table {
            let _ = write!(
                o,
                " {:.1} ({:.2}) |",
                100.0 * row.volume_share,
                100.0 * row.unique_share
            );
        }
        let _ = writeln!(o);
    }
    let _ = writeln!(
        o,
        "| paper, Table 1 (20 SPEC/PARSEC apps) | | | | | 62.9 % (Fig. 1 mean) | | \"largely non-zero\" | 31.5 (81.3) | 15.6 (16.0) | 7.2 (2.4) | 3.1 (0.2) | 42.6 (0.1) |\n"
    );
}

fn run_tables(o: &mut String, r: &Results) {
    let _ = writeln!(o, "## Results per trace\n");
    let _ = writeln!(
        o,
        "Speedups are Baseline's mean latency over the scheme's (the paper's Figs. 15, 16); energy is the \
         scheme's over Baseline's (Fig. 17); run time = time to drain the trace (our stand-in for IPC). \
         Metadata = on-chip caches provisioned + metadata kept in PCM at the end (PCM part also as a share \
         of the live data lines).\n"
    );
    for (name, run) in &r.runs {
        let _ = writeln!(
            o,
            "### {name}\n\n{} events ({} writes, {} reads); simulated in {:.1} s ({:.2} M events/s per scheme)\n",
            run.events,
            run.writes,
            run.reads,
            run.elapsed_s,
            run.events_per_s / 1e6
        );
        let _ = writeln!(
            o,
            "| scheme | writes eliminated | write mean ns | write p99 ns | read mean ns | read p99 ns | write speedup | read speedup | run-time speedup | energy vs Baseline | metadata on chip | metadata in PCM |"
        );
        let _ = writeln!(
            o,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for k in SchemeKind::ALL {
            let Some(s) = Results::get(run, k) else {
                continue;
            };
            let _ = writeln!(
                o,
                "| {} | {} | {:.1} | {} | {:.1} | {} | {} | {} | {} | {} | {} KiB | {:.2} MiB ({}) |",
                label(k),
                pct(s.writes_eliminated_fraction),
                s.mean_write_latency_ns,
                s.p99_write_latency_ns,
                s.mean_read_latency_ns,
                s.p99_read_latency_ns,
                x(write_speedup(run, k)),
                x(read_speedup(run, k)),
                x(runtime_speedup(run, k)),
                energy_norm(run, k).map_or("-".into(), |v| format!("{v:.3}")),
                s.metadata.on_chip_bytes / 1024,
                s.metadata.nvmm_bytes as f64 / (1 << 20) as f64,
                pct(s.metadata_nvmm_fraction)
            );
        }
        let _ = writeln!(o);
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn averages(o: &mut String, r: &Results) {
    let typical: Vec<&RunReport> = r
        .runs
        .iter()
        .filter(|(n, _)| !n.contains("worst"))
        .map(|(_, run)| run)
        .collect();
    let _ = writeln!(
        o,
        "## Averages over the {} non-worst-case traces (arithmetic means, as the paper's)\n",
        typical.len()
    );
    let _ = writeln!(
        o,
        "| scheme | writes eliminated | write speedup | read speedup | energy vs Baseline |"
    );
    let _ = writeln!(o, "|---|---:|---:|---:|---:|");
    for k in DEDUP {
        let col = |f: &dyn Fn(&RunReport) -> Option<f64>| {
            mean(&typical.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
        };
        let _ = writeln!(
            o,
            "| {} | {} | {:.2}x | {:.2}x | {:.3} |",
            label(k),
            pct(col(
                &|r| Results::get(r, k).map(|s| s.writes_eliminated_fraction)
            )),
            col(&|r| write_speedup(r, k)),
            col(&|r| read_speedup(r, k)),
            col(&|r| energy_norm(r, k)),
        );
    }
    let _ = writeln!(o);
}

fn claims(o: &mut String, r: &Results) {
    let _ = writeln!(o, "## The issue's four claims, trace by trace (computed)\n");
    let get = |run: &RunReport, k| Results::get(run, k).cloned();
    let mut c1 = (0, 0);
    let mut c2 = (0, 0);
    let mut c3 = 0;
    let _ = writeln!(o, "| trace | 1: ESD < FSDedup < min(SHA1, DeWrite) eliminated | 2: lowest mean / p99 write latency of the four dedup schemes (Fig. 18's set) | FSDedup vs Baseline mean / p99 write ns | 3: Dedup_SHA1 / Baseline mean write latency |");
    let _ = writeln!(o, "|---|---|---|---|---|");
    for (name, run) in &r.runs {
        let (Some(b), Some(sha), Some(dw), Some(esd), Some(fs)) = (
            get(run, SchemeKind::Baseline),
            get(run, SchemeKind::Sha1),
            get(run, SchemeKind::DeWrite),
            get(run, SchemeKind::Esd),
            get(run, SchemeKind::FsDedup),
        ) else {
            continue;
        };
        let e = |s: &SchemeResult| s.writes_eliminated_fraction;
        let ok1 = e(&esd) < e(&fs) && e(&fs) < e(&sha).min(e(&dw));
        c1 = (c1.0 + ok1 as u32, c1.1 + 1);
        let dedup = [
            (SchemeKind::Sha1, &sha),
            (SchemeKind::DeWrite, &dw),
            (SchemeKind::Esd, &esd),
            (SchemeKind::FsDedup, &fs),
        ];
        let best_mean = dedup
            .iter()
            .min_by(|a, b| {
                a.1.mean_write_latency_ns
                    .total_cmp(&b.1.mean_write_latency_ns)
            })
            .map(|a| a.0);
        let best_p99 = dedup
            .iter()
            .min_by_key(|a| a.1.p99_write_latency_ns)
            .map(|a| a.0);
        let fs_p99_best = dedup
            .iter()
            .all(|a| fs.p99_write_latency_ns <= a.1.p99_write_latency_ns);
        let ok2 = best_mean == Some(SchemeKind::FsDedup) && fs_p99_best;
        c2 = (c2.0 + ok2 as u32, c2.1 + 1);
        let slow = sha.mean_write_latency_ns / b.mean_write_latency_ns;
        c3 += (slow > 1.0) as u32;
        let _ = writeln!(
            o,
            "| {name} | {} ({} < {} < {}) | {} (mean: {}, p99: {}{}) | {:.1} / {:.1}, {} / {} | {slow:.2} |",
            if ok1 { "yes" } else { "no" },
            pct(e(&esd)),
            pct(e(&fs)),
            pct(e(&sha).min(e(&dw))),
            if ok2 { "yes" } else { "no" },
            best_mean.map_or("-", label),
            best_p99.map_or("-", label),
            if fs_p99_best && best_p99 != Some(SchemeKind::FsDedup) {
                ", FSDedup tied"
            } else {
                ""
            },
            fs.mean_write_latency_ns,
            b.mean_write_latency_ns,
            fs.p99_write_latency_ns,
            b.p99_write_latency_ns,
        );
    }
    let _ = writeln!(
        o,
        "\nClaim 1 holds on {}/{} traces; claim 2 (among the dedup schemes) on {}/{}; Dedup_SHA1 is slower than Baseline on {} of {} traces (claim 3 needs one).\n",
        c1.0, c1.1, c2.0, c2.1, c3, c2.1
    );
    for (name, run) in r.runs.iter().filter(|(n, _)| n.contains("worst")) {
        let _ = writeln!(o, "Claim 4, worst-case trace `{name}`: FSDedup vs Baseline");
        let _ = writeln!(
            o,
            "write speedup {}, read speedup {}, run-time speedup {}, energy {}; p99 write {} vs {} ns.\n",
            x(write_speedup(run, SchemeKind::FsDedup)),
            x(read_speedup(run, SchemeKind::FsDedup)),
            x(runtime_speedup(run, SchemeKind::FsDedup)),
            energy_norm(run, SchemeKind::FsDedup).map_or("-".into(), |v| format!("{v:.3}")),
            get(run, SchemeKind::FsDedup).map_or(0, |s| s.p99_write_latency_ns),
            get(run, SchemeKind::Baseline).map_or(0, |s| s.p99_write_latency_ns),
        );
    }
}

fn sweeps(o: &mut String, r: &Results) {
    if r.sweeps.is_empty() {
        return;
    }
    let _ = writeln!(o, "## Sensitivity (Fig. 23) and load\n");
    for ((trace, param), runs) in &r.sweeps {
        let unit = match param.as_str() {
            "efit" => "EFIT KiB",
            "refresh" => "refresh interval (simulated ms)",
            "prefetch" => "prefetch cache KiB",
            "gap" => "issue gap ns",
            _ => "value",
        };
        let _ = writeln!(o, "### {param} on {trace}\n");
        let _ = writeln!(o, "| {unit} | scheme | writes eliminated | EFIT hit ratio | EFIT refreshes | prefetch hit ratio | write mean ns | write speedup | read speedup |");
        let _ = writeln!(o, "|---:|---|---:|---:|---:|---:|---:|---:|---:|");
        for (v, run) in runs {
            for k in SchemeKind::ALL {
                let Some(s) = Results::get(run, k) else {
                    continue;
                };
                let _ = writeln!(
                    o,
                    "| {v} | {} | {} | {:.4} | {} | {:.4} | {:.1} | {} | {} |",
                    label(k),
                    pct(s.writes_eliminated_fraction),
                    efit_hit_ratio(s),
                    s.dedup.efit_refreshes,
                    prefetch_hit_ratio(s),
                    s.mean_write_latency_ns,
                    x(write_speedup(run, k)),
                    x(read_speedup(run, k)),
                );
            }
        }
        let _ = writeln!(o);
    }
}

/// The whole markdown page.
pub fn render(r: &Results) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# nodup sim: scheme results (generated by `nodup sim report`)\n"
    );
    if let Some((_, run)) = r.runs.first() {
        let c = &run.config;
        let _ = writeln!(
            o,
            "Model: {} banks, one request issued every {} ns, at most {} in flight; PCM read/write {}/{} ns, \
             {}/{} nJ; AES-{} counter mode {} ns / {} nJ per line; SHA-1 {} ns / {} nJ; CRC-32 {} ns / {} nJ; \
             on-chip metadata access {} ns / {} nJ; EFIT {} KiB, AMT cache {} KiB, prefetch cache {} KiB, \
             fingerprint cache (SHA-1, DeWrite) {} KiB; FSDedup refresh every {} simulated ms{}; referH cap {}.\n",
            c.banks, c.issue_gap_ns, c.window, c.costs.pcm_read_ns, c.costs.pcm_write_ns,
            c.costs.pcm_read_nj, c.costs.pcm_write_nj, c.aes_bits, c.costs.aes_ns, c.costs.aes_nj,
            c.costs.sha1_ns, c.costs.sha1_nj, c.costs.crc_ns, c.costs.crc_nj, c.costs.meta_ns,
            c.costs.meta_nj, c.efit_bytes / 1024, c.amt_bytes / 1024, c.prefetch_bytes / 1024,
            c.fp_cache_bytes / 1024, c.refresh_interval_ns as f64 / 1e6,
            if c.refresh_ops > 0 { format!(" or every {} LRCU operations", c.refresh_ops) } else { String::new() },
            c.max_refs
        );
    }
    traces_table(&mut o, r);
    run_tables(&mut o, r);
    averages(&mut o, r);
    claims(&mut o, r);
    sweeps(&mut o, r);
    o
}
