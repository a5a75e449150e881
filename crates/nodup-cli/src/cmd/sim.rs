//! `nodup sim gen|capture|run|stats|report`: thin edge over `nodup-sim`.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use nodup_sim::gen::{generate, GenOptions};
use nodup_sim::model::ModelConfig;
use nodup_sim::schemes::SchemeKind;
use std::ffi::OsString;
use std::path::PathBuf;

/// `nodup sim ...`.
#[derive(Subcommand)]
pub enum SimCommand {
    /// Generate a synthetic cache-line trace (target duplicate rate, reference-count skew).
    Gen(GenArgs),
    /// Run a program and record an approximation of its cache-line write-backs.
    Capture(CaptureArgs),
    /// Simulate deduplication schemes for encrypted NVM main memory over a trace.
    Run(RunArgs),
    /// Content statistics of a trace (the paper's Table 1).
    Stats(StatsArgs),
    /// Markdown tables and PNG plots from a directory of `run --json` results.
    Report(ReportArgs),
}

/// Arguments of `nodup sim gen`.
#[derive(Args)]
pub struct GenArgs {
    /// Events (reads + writes).
    #[arg(long)]
    pub lines: u64,
    /// Fraction of writes that duplicate earlier content (0..1).
    #[arg(long)]
    pub dup_rate: f64,
    /// Zipf exponent of the hot contents' popularity (0 = uniform).
    #[arg(long, default_value_t = 1.2)]
    pub skew: f64,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Fraction of events that are reads.
    #[arg(long, default_value_t = 0.5)]
    pub read_ratio: f64,
    /// Lines of address space touched.
    #[arg(long, default_value_t = 1 << 20)]
    pub footprint_lines: u64,
    /// Distinct hot contents.
    #[arg(long, default_value_t = 1 << 20)]
    pub hot_lines: u64,
    /// Share of duplicates that are the zero line.
    #[arg(long, default_value_t = 0.05)]
    pub zero_share: f64,
    /// Share of duplicates that repeat a recently written fresh line.
    #[arg(long, default_value_t = 0.1)]
    pub recent_share: f64,
    /// Times the hot set changes over the trace.
    #[arg(long, default_value_t = 4)]
    pub phases: u32,
    /// Output trace.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
}

/// Arguments of `nodup sim capture`.
#[derive(Args)]
pub struct CaptureArgs {
    /// Output trace.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Sampling interval of the program's run time (ms).
    #[arg(long, default_value_t = 10)]
    pub interval_ms: u64,
    /// Fraction of events that are (synthesized) reads.
    #[arg(long, default_value_t = 0.5)]
    pub read_ratio: f64,
    /// Seed of the synthesized reads.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// Arguments of `nodup sim run`.
#[derive(Args)]
pub struct RunArgs {
    /// Trace file.
    pub trace: PathBuf,
    /// baseline|sha1|dewrite|esd|fsdedup|all (comma-separated list allowed).
    #[arg(long, default_value = "all")]
    pub scheme: String,
    /// Print one JSON object: {"schemes": {NAME: {...}}, ...}.
    #[arg(long)]
    pub json: bool,
    /// PCM banks.
    #[arg(long)]
    pub banks: Option<u32>,
    /// Time between two issued requests (ns).
    #[arg(long)]
    pub gap_ns: Option<u64>,
    /// Requests in flight at most.
    #[arg(long)]
    pub window: Option<u32>,
    /// AES key size, 128 or 256.
    #[arg(long)]
    pub aes_bits: Option<u32>,
    /// EFIT (LRCU) size of ESD/FSDedup, KiB (default 512).
    #[arg(long)]
    pub efit_kib: Option<f64>,
    /// AMT cache size, KiB (default 512).
    #[arg(long)]
    pub amt_kib: Option<f64>,
    /// FSDedup prefetch cache size, KiB (default 512; 0 = none).
    #[arg(long)]
    pub prefetch_kib: Option<f64>,
    /// Fingerprint cache of Dedup_SHA1 and DeWrite, KiB (default 512).
    #[arg(long)]
    pub fp_cache_kib: Option<f64>,
    /// FSDedup refresh interval in simulated ms (default 10000 = 10 s; 0 = off).
    #[arg(long)]
    pub refresh_interval_ms: Option<f64>,
    /// FSDedup refresh every N LRCU operations (default 0 = off).
    #[arg(long)]
    pub refresh_ops: Option<u64>,
    /// Any model parameter: NAME=VALUE (pcm_read_ns, pcm_write_nj, aes_ns, sha1_ns, crc_nj, ...).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub set: Vec<String>,
}

/// Arguments of `nodup sim stats`.
#[derive(Args)]
pub struct StatsArgs {
    /// Trace file.
    pub trace: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `nodup sim report`.
#[derive(Args)]
pub struct ReportArgs {
    /// Directory of results: run-TRACE.json, stats-TRACE.json, sweep-TRACE-PARAM-VALUE.json.
    pub results: PathBuf,
    /// Output directory for the markdown tables and PNG plots.
    #[arg(long)]
    pub out: PathBuf,
}

fn emit(text: &str) -> Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing to stdout"),
    }
}

/// Parse `--scheme`.
fn schemes(s: &str) -> Result<Vec<SchemeKind>> {
    if s == "all" {
        return Ok(SchemeKind::ALL.to_vec());
    }
    s.split(',')
        .map(|n| {
            SchemeKind::from_name(n.trim()).with_context(|| {
                format!("unknown scheme {n:?} (baseline, sha1, dewrite, esd, fsdedup or all)")
            })
        })
        .collect()
}

fn kib(v: f64, what: &str) -> Result<usize> {
    if !(v >= 0.0 && v.is_finite()) {
        bail!("{what} must be a size in KiB >= 0");
    }
    Ok((v * 1024.0) as usize)
}

fn config(a: &RunArgs) -> Result<ModelConfig> {
    let mut c = ModelConfig::default();
    if let Some(v) = a.banks {
        c.banks = v;
    }
    if let Some(v) = a.gap_ns {
        c.issue_gap_ns = v;
    }
    if let Some(v) = a.window {
        c.window = v;
    }
    if let Some(v) = a.aes_bits {
        c.aes_bits = v;
    }
    if let Some(v) = a.efit_kib {
        c.efit_bytes = kib(v, "--efit-kib")?;
    }
    if let Some(v) = a.amt_kib {
        c.amt_bytes = kib(v, "--amt-kib")?;
    }
    if let Some(v) = a.prefetch_kib {
        c.prefetch_bytes = kib(v, "--prefetch-kib")?;
    }
    if let Some(v) = a.fp_cache_kib {
        c.fp_cache_bytes = kib(v, "--fp-cache-kib")?;
    }
    if let Some(v) = a.refresh_interval_ms {
        if !(v >= 0.0 && v.is_finite()) {
            bail!("--refresh-interval-ms must be >= 0");
        }
        c.refresh_interval_ns = (v * 1e6) as u64;
    }
    if let Some(v) = a.refresh_ops {
        c.refresh_ops = v;
    }
    for s in &a.set {
        let Some((k, v)) = s.split_once('=') else {
            bail!("--set {s}: expected NAME=VALUE");
        };
        c.set(k.trim(), v.trim())?;
    }
    c.validate()?;
    Ok(c)
}

/// `nodup sim ...`.
pub fn sim(c: SimCommand) -> Result<()> {
    match c {
        SimCommand::Gen(a) => gen(a),
        SimCommand::Capture(a) => capture(a),
        SimCommand::Run(a) => run(a),
        SimCommand::Stats(a) => stats(a),
        SimCommand::Report(a) => {
            let written = nodup_sim::report::write_report(&a.results, &a.out)?;
            for f in written {
                eprintln!("wrote {}", f.display());
            }
            Ok(())
        }
    }
}

fn gen(a: GenArgs) -> Result<()> {
    let o = GenOptions {
        lines: a.lines,
        dup_rate: a.dup_rate,
        skew: a.skew,
        seed: a.seed,
        read_ratio: a.read_ratio,
        footprint_lines: a.footprint_lines,
        hot_lines: a.hot_lines,
        zero_share: a.zero_share,
        recent_share: a.recent_share,
        phases: a.phases,
    };
    let pb = super::progress_bar(a.lines, "{bar:40} {pos}/{len} lines {per_sec} eta {eta}");
    let s = generate(&o, &a.output, &|n| {
        if let Some(pb) = &pb {
            pb.set_position(n)
        }
    })
    .with_context(|| format!("generating {}", a.output.display()))?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    emit(&format!(
        "wrote {}: {} events ({} writes, {} reads), duplicate writes {:.4}, zero-line writes {}, {} bytes\n",
        a.output.display(),
        s.events,
        s.writes,
        s.reads,
        s.duplicate_rate,
        s.zero_writes,
        s.bytes
    ))
}

fn capture(a: CaptureArgs) -> Result<()> {
    let o = nodup_sim::capture::CaptureOptions {
        interval_ms: a.interval_ms,
        read_ratio: a.read_ratio,
        seed: a.seed,
    };
    let s = nodup_sim::capture::capture(&a.command, &a.output, &o)
        .with_context(|| format!("capturing into {}", a.output.display()))?;
    eprintln!(
        "nodup sim capture: {} samples ({} mode), {} processes, {} writes + {} synthesized reads into {}; program exit status {}",
        s.samples,
        s.mode,
        s.processes,
        s.writes,
        s.reads,
        a.output.display(),
        s.exit_code
    );
    if s.exit_code != 0 {
        bail!("the captured program exited with status {}", s.exit_code);
    }
    Ok(())
}

fn run(a: RunArgs) -> Result<()> {
    let kinds = schemes(&a.scheme)?;
    let cfg = config(&a)?;
    let len = std::fs::metadata(&a.trace).map(|m| m.len()).unwrap_or(0);
    let pb = super::progress_bar(
        len,
        "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    );
    let r = nodup_sim::run::run(&a.trace, &kinds, &cfg, &|b| {
        if let Some(pb) = &pb {
            pb.set_position(b)
        }
    })
    .with_context(|| format!("simulating {}", a.trace.display()))?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if a.json {
        return emit(&format!("{}\n", serde_json::to_string_pretty(&r)?));
    }
    emit(&nodup_sim::report::run_text(&r, &kinds))
}

fn stats(a: StatsArgs) -> Result<()> {
    let len = std::fs::metadata(&a.trace).map(|m| m.len()).unwrap_or(0);
    let pb = super::progress_bar(
        len,
        "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    );
    let s = nodup_sim::stats::trace_stats(&a.trace, &|b| {
        if let Some(pb) = &pb {
            pb.set_position(b)
        }
    })
    .with_context(|| format!("reading {}", a.trace.display()))?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if a.json {
        return emit(&format!("{}\n", serde_json::to_string_pretty(&s)?));
    }
    emit(&nodup_sim::report::stats_text(&s))
}
