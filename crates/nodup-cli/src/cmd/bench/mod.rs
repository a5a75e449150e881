//! `nodup bench engine|aging|churn|probe`: benchmarks of the engine (no FUSE) and small load
//! generators for a mounted file system.
//!
//! - `engine` ([`engine`]): write throughput of every policy at several duplication ratios,
//!   first write and rewrite, plus the seven speculative-prefetch variants of `light`
//!   (Light-Dedup §5.2 and §5.4, scaled down).
//! - `aging` ([`aging`]): dedup metadata bytes read/written per block at 256 B granularity,
//!   on a fresh and on an aged image, per metadata layout (Light-Dedup §5.5, Table 4).
//!
//! Both run the engine over a `Pmem` image in `/dev/shm` (emulated pmem), single thread, with
//! all input data generated before the timed region ([`data`]).

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

pub mod aging;
pub mod churn;
pub mod data;
pub mod engine;
pub mod fill;
pub mod probe;
pub mod race;

/// `nodup bench ...`.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Policies x duplication x prefetch variants (first write and rewrite), median of N runs.
    Engine(engine::EngineArgs),
    /// Metadata I/O per block, fresh and aged, per layout (Light-Dedup Table 4).
    Aging(aging::AgingArgs),
    /// Create, write and delete small files in a directory, in a loop.
    Churn(churn::ChurnArgs),
    /// Time 4 KiB write+fsync in a loop, optionally forcing checkpoints of a mount meanwhile.
    Probe(probe::ProbeArgs),
    /// Threads writing the same new data at once: physical space over data size.
    Race(race::RaceArgs),
    /// Write a file on a mount from numbered block contents (unique, shuffled, duplicate phases).
    Fill(fill::FillArgs),
}

pub fn bench(c: BenchCommand) -> Result<()> {
    match c {
        BenchCommand::Engine(a) => engine::run(a),
        BenchCommand::Aging(a) => aging::run(a),
        BenchCommand::Churn(a) => churn::run(a),
        BenchCommand::Probe(a) => probe::run(a),
        BenchCommand::Race(a) => race::run(a),
        BenchCommand::Fill(a) => fill::run(a),
    }
}

/// Options shared by the benches.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Directory of the emulated-pmem image (tmpfs).
    #[arg(long, default_value = "/dev/shm")]
    pub dir: PathBuf,
    /// Also write the JSON result to this file (the table still goes to stdout).
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}

/// A size option (`--size 1GiB`), parsed as every size of nodup is (so refused saying why);
/// the error names the option.
pub fn size_arg(flag: &str, s: &str) -> Result<u64> {
    super::size::parse_size(s).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
}

/// A progress bar on stderr when it is a terminal, else a hidden one.
pub fn progress(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_prefix(what.to_string());
    pb
}

/// Median of samples (mean of the two middle ones for an even count).
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// CLOCK_MONOTONIC in seconds (the clock `perf record -k CLOCK_MONOTONIC` stamps samples with).
pub fn monotonic_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// CPU time consumed by the calling thread, in seconds (excludes time spent descheduled, so it
/// filters out most of the noise of a shared machine for single-threaded CPU-bound work).
pub fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Wall-clock and thread-CPU stopwatch.
pub struct Stopwatch {
    wall: std::time::Instant,
    cpu: f64,
}

impl Stopwatch {
    pub fn start() -> Stopwatch {
        Stopwatch {
            wall: std::time::Instant::now(),
            cpu: thread_cpu_secs(),
        }
    }
    /// (wall seconds, thread CPU seconds) since start.
    pub fn elapsed(&self) -> (f64, f64) {
        (
            self.wall.elapsed().as_secs_f64(),
            thread_cpu_secs() - self.cpu,
        )
    }
}

/// With `NODUP_BENCH_WINDOWS=1`, print the timed window `[start, now]` of `what` on stderr, in
/// the form `perf report --time START,END` takes (record with `perf record -k CLOCK_MONOTONIC`),
/// so a profile can be cut to one pass of one point.
pub fn trace_window(what: &str, start: f64) {
    if std::env::var_os("NODUP_BENCH_WINDOWS").is_some() {
        eprintln!("window {what}: --time {start:.6},{:.6}", monotonic_secs());
    }
}

/// Removes the benchmark image file when dropped (also on error paths).
pub struct TempImage(pub PathBuf);

impl TempImage {
    pub fn new(dir: &std::path::Path, tag: &str) -> TempImage {
        TempImage(dir.join(format!("nodup-bench-{tag}-{}.img", std::process::id())))
    }
}

impl Drop for TempImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Print the JSON result on stdout (`--json`) and/or into `--json-out`.
pub fn emit_json(value: &serde_json::Value, to_stdout: bool, out: Option<&PathBuf>) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    if let Some(p) = out {
        std::fs::write(p, format!("{text}\n"))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if to_stdout {
        println!("{text}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
