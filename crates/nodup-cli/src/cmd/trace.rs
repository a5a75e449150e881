//! `nodup replay` and `nodup trace stats|gen|convert`: thin edges over `nodup-trace`.

use super::size::parse_size_or_zero;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::ProgressBar;
use nodup_trace::format::{convert_pending, Format, TraceReader};
use nodup_trace::gen::{generate, GenOptions, RunLength};
use nodup_trace::output::OutputFile;
use nodup_trace::popularity::Popularity;
use nodup_trace::replay::{replay as run_replay, Mode, ReplayOptions};
use nodup_trace::stats::trace_stats;
use nodup_trace::{BadLinePolicy, TraceError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Arguments of `nodup replay`.
#[derive(Args)]
pub struct ReplayArgs {
    /// Trace file (FIU text or nodup binary; detected).
    pub trace: PathBuf,
    /// Directory receiving one file per trace device (dev-MAJOR-MINOR.img, created empty).
    #[arg(long)]
    pub dir: PathBuf,
    /// Replace device files in --dir that already hold data (refused otherwise); they are
    /// emptied only once the whole trace has been read without error.
    #[arg(long)]
    pub overwrite: bool,
    /// block: one 4 KiB block per call; batch: up to 512 consecutive blocks per call.
    #[arg(long, default_value = "block")]
    pub mode: String,
    /// Worker threads; the trace is split into streams by (device, 64 MiB LBA region).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Skip read records (write-only replay).
    #[arg(long)]
    pub no_reads: bool,
    /// Stop with an error at the first line that does not parse (otherwise such lines are
    /// skipped, the first 10 shown; a trace without one good line is an error).
    #[arg(long)]
    pub strict: bool,
    /// Trace format instead of detection: fiu|own.
    #[arg(long)]
    pub format: Option<String>,
    /// Print one JSON object instead of the text report.
    #[arg(long)]
    pub json: bool,
}

/// `nodup trace ...`.
#[derive(Subcommand)]
pub enum TraceCommand {
    /// Writes, reads, duplication ratio and duplicate-run CDF of a trace.
    Stats(StatsArgs),
    /// Generate a synthetic FIU-format trace.
    Gen(GenArgs),
    /// Convert between FIU text and nodup's binary format.
    Convert(ConvertArgs),
}

/// Arguments of `nodup trace stats`.
#[derive(Args)]
pub struct StatsArgs {
    /// Trace file.
    pub trace: PathBuf,
    /// Trace format instead of detection: fiu|own.
    #[arg(long)]
    pub format: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Also draw the continuousness CDF into this image (.png, .jpg or .bmp; its directory
    /// must exist). Checked before the trace is read; the statistics are printed even when
    /// writing the image fails.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Stop with an error at the first line that does not parse (otherwise such lines are
    /// skipped, the first 10 shown; a trace without one good line is an error).
    #[arg(long)]
    pub strict: bool,
}

/// Arguments of `nodup trace gen`.
#[derive(Args)]
pub struct GenArgs {
    /// Total request bytes (e.g. 2G, 512M); at least 4K, one 4 KiB request.
    #[arg(long)]
    pub size: String,
    /// Target fraction of duplicate written blocks (0..1), met to about a run length; a long
    /// unique run at the end can leave a small trace short of it (the last line says the ratio
    /// reached).
    #[arg(long)]
    pub dup_ratio: f64,
    /// Duplicate run lengths: fixed:N | geom:MEAN | uniform:A-B.
    #[arg(long, default_value = "geom:16")]
    pub run_length: String,
    /// Fraction of records that are reads.
    #[arg(long, default_value_t = 0.0)]
    pub read_ratio: f64,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Which earlier contents duplicate runs copy: uniform | zipf:S (start rank Zipf(S) over
    /// the contents in creation order, S > 0: a few contents get most references, a long tail).
    #[arg(long, default_value = "uniform", value_name = "uniform|zipf:S")]
    pub popularity: String,
    /// Split the trace into N equal phases; each phase copies only contents new in it, so the
    /// hot set changes at every boundary.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub phases: u64,
    /// Output trace file.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
}

/// Arguments of `nodup trace convert`.
#[derive(Args)]
pub struct ConvertArgs {
    /// Input trace (format detected).
    pub trace: PathBuf,
    /// Output file.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Output format (default: the other one): fiu|own.
    #[arg(long)]
    pub to: Option<String>,
    /// Stop with an error at the first line that does not parse (otherwise such lines are
    /// skipped, the first 10 shown; a trace without one good line is an error).
    #[arg(long)]
    pub strict: bool,
}

/// Append a line to an output buffer (writing into a `String` cannot fail).
macro_rules! outln {
    ($o:expr, $($t:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($o, $($t)*);
    }};
}

/// Write the report to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn emit(text: &str) -> Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing to stdout"),
    }
}

/// Bad lines reported one by one; the rest are only counted (a file that is not a trace gives
/// one per line, and a wall of them hides the point).
const SHOWN_BAD_LINES: u64 = 10;

/// Bad lines seen so far (one command per process).
static BAD_SEEN: AtomicU64 = AtomicU64::new(0);

fn print_bad_line(e: &TraceError) {
    if BAD_SEEN.fetch_add(1, Ordering::Relaxed) < SHOWN_BAD_LINES {
        eprintln!("nodup: skipping bad trace {e}");
    }
}

/// After the trace was read: a trace that gave no record but bad lines is refused (it is not
/// a trace, or not in the format given); otherwise one line counts the bad lines not shown.
fn check_bad_lines(trace: &Path, records: u64, bad: u64) -> Result<()> {
    let hidden = bad.saturating_sub(SHOWN_BAD_LINES);
    let not_shown = if hidden > 0 {
        format!(", {hidden} not shown")
    } else {
        String::new()
    };
    if records == 0 && bad > 0 {
        bail!(
            "{}: no record in the trace, {bad} bad lines{not_shown} (not a trace, or in another format than the one read?)",
            trace.display()
        );
    }
    if hidden > 0 {
        eprintln!("nodup: {bad} bad lines skipped in all{not_shown}");
    }
    Ok(())
}

/// Reporter of skipped lines; with --strict the first bad line is the command's error instead.
const PRINT_BAD: &(dyn Fn(&TraceError) + Sync) = &print_bad_line;

fn parse_format(f: &Option<String>) -> Result<Option<Format>> {
    f.as_deref().map(str::parse).transpose().map_err(Into::into)
}

/// A progress bar over the trace file's bytes, only when stderr is a terminal.
fn progress_bar(trace: &Path) -> Option<ProgressBar> {
    let len = std::fs::metadata(trace).map(|m| m.len()).unwrap_or(0);
    super::progress_bar(
        len,
        "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
}

/// `nodup replay`.
pub fn replay(a: ReplayArgs) -> Result<()> {
    let mode: Mode = a.mode.parse()?;
    if a.threads == 0 {
        bail!("--threads must be at least 1");
    }
    let pb = progress_bar(&a.trace);
    let report_progress = |b: u64| {
        if let Some(pb) = &pb {
            pb.set_position(b)
        }
    };
    let opts = ReplayOptions {
        dir: a.dir.clone(),
        mode,
        threads: a.threads,
        no_reads: a.no_reads,
        overwrite: a.overwrite,
        format: parse_format(&a.format)?,
        policy: BadLinePolicy {
            strict: a.strict,
            report: (!a.strict).then_some(PRINT_BAD),
        },
        progress: Some(&report_progress),
    };
    let r = run_replay(&a.trace, &opts)
        .map_err(trace_error)
        .with_context(|| format!("replaying {}", a.trace.display()))?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    check_bad_lines(&a.trace, r.records + r.skipped_reads, r.bad_lines)?;
    for s in &r.verify_error_samples {
        eprintln!("nodup: verify error: {s}");
    }
    let mut o = String::new();
    if a.json {
        outln!(o, "{}", serde_json::to_string_pretty(&r)?);
    } else {
        outln!(
            o,
            "replay {} ({} mode, {} thread(s)) into {}",
            a.trace.display(),
            r.mode,
            r.threads,
            a.dir.display()
        );
        outln!(
            o,
            "  records        {} ({} bad lines, {} reads skipped)",
            r.records,
            r.bad_lines,
            r.skipped_reads
        );
        outln!(
            o,
            "  calls          {} ({} writes, {} reads)",
            r.ops,
            r.write_ops,
            r.read_ops
        );
        outln!(
            o,
            "  bytes          {} ({} written, {} read)",
            r.bytes,
            r.write_bytes,
            r.read_bytes
        );
        outln!(
            o,
            "  time           {:.3} s   throughput {:.1} MiB/s",
            r.seconds,
            r.mib_per_s
        );
        let l = &r.latency_us;
        outln!(
            o,
            "  latency (us)   p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max
        );
        outln!(
            o,
            "  verified       {} blocks, {} verify errors",
            r.verified_blocks,
            r.verify_errors
        );
        outln!(o, "  files          {}", r.files.join(" "));
    }
    emit(&o)?;
    if r.verify_errors > 0 {
        bail!(
            "{} read-verify errors: data read back differs from what was written",
            r.verify_errors
        );
    }
    Ok(())
}

/// `nodup trace ...`.
pub fn trace(c: TraceCommand) -> Result<()> {
    match c {
        TraceCommand::Stats(a) => stats(a),
        TraceCommand::Gen(a) => gen(a),
        TraceCommand::Convert(a) => {
            let policy = BadLinePolicy {
                strict: a.strict,
                report: (!a.strict).then_some(PRINT_BAD),
            };
            let (out, n, bad) = convert_pending(&a.trace, &a.output, parse_format(&a.to)?, &policy)
                .map_err(trace_error)
                .with_context(|| format!("converting {}", a.trace.display()))?;
            // Nothing was converted: what was at the output stays (dropping `out` removes
            // what was written), and no empty trace is left where one was asked for.
            check_bad_lines(&a.trace, n, bad)?;
            out.commit()
                .map_err(trace_error)
                .with_context(|| format!("converting {}", a.trace.display()))?;
            eprintln!(
                "nodup: converted {n} records ({bad} bad lines skipped) to {}",
                a.output.display()
            );
            Ok(())
        }
    }
}

fn stats(a: StatsArgs) -> Result<()> {
    if let Some(p) = &a.plot {
        // Before the trace is read: a plot path that cannot be written is a typo to fix now,
        // not after minutes over a large trace.
        nodup_trace::plot::check_output(p).map_err(plot_error)?;
    }
    let mut reader = TraceReader::open(&a.trace, parse_format(&a.format)?).map_err(trace_error)?;
    let policy = BadLinePolicy {
        strict: a.strict,
        report: (!a.strict).then_some(PRINT_BAD),
    };
    let pb = progress_bar(&a.trace);
    let s = trace_stats(&mut reader, &policy, |b| {
        if let Some(pb) = &pb {
            pb.set_position(b)
        }
    })
    .map_err(trace_error)
    .with_context(|| format!("reading {}", a.trace.display()))?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    check_bad_lines(&a.trace, s.records, s.bad_lines)?;
    let mut o = String::new();
    if a.json {
        outln!(o, "{}", serde_json::to_string_pretty(&s)?);
    } else {
        stats_text(&mut o, &a.trace, &s);
    }
    // The figures first: a plot that fails to be written (disk full, permissions) should not
    // cost the statistics the whole trace was read for.
    emit(&o)?;
    if let Some(p) = &a.plot {
        nodup_trace::plot::plot_cdf(&s, p).map_err(plot_error)?;
    }
    Ok(())
}

/// A trace error for the command line: an I/O error without Rust's " (os error N)" suffix,
/// as the other commands print theirs.
fn trace_error(e: TraceError) -> anyhow::Error {
    match e {
        TraceError::Io { what, source } => anyhow::anyhow!("{what}: {}", super::plain(&source)),
        e => e.into(),
    }
}

/// A plot error as one line: the message already names the file, so no "plot:" prefix, and
/// no errno suffix.
fn plot_error(e: TraceError) -> anyhow::Error {
    match e {
        TraceError::Plot(m) => anyhow::anyhow!("--plot {}", super::without_errno(&m)),
        e => e.into(),
    }
}

/// The text report of `nodup trace stats`.
fn stats_text(o: &mut String, trace: &Path, s: &nodup_trace::stats::TraceStats) {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    outln!(o, "trace {}", trace.display());
    outln!(
        o,
        "  records            {} ({} bad lines)",
        s.records,
        s.bad_lines
    );
    outln!(
        o,
        "  write requests     {}  ({:.1} MiB, {} blocks)",
        s.write_requests,
        mib(s.write_bytes),
        s.writes
    );
    outln!(
        o,
        "  read requests      {}  ({:.1} MiB, {} blocks)",
        s.read_requests,
        mib(s.read_bytes),
        s.reads
    );
    let total = s.write_bytes + s.read_bytes;
    if total > 0 {
        outln!(
            o,
            "  write proportion   {:.1} %",
            100.0 * s.write_bytes as f64 / total as f64
        );
    }
    outln!(
        o,
        "  devices            {}   unaligned requests {}",
        s.devices,
        s.unaligned_requests
    );
    outln!(
        o,
        "  duplicate writes   {} of {}  dedup ratio {:.2} %  unique blocks {}",
        s.duplicate_writes,
        s.writes,
        100.0 * s.dedup_ratio,
        s.unique_blocks
    );
    outln!(
        o,
        "  at end             {} live blocks, {} distinct  ({:.2} % dedup)",
        s.live_blocks,
        s.distinct_live_contents,
        100.0 * s.final_dedup_ratio
    );
    outln!(
        o,
        "  duplicate runs     {}  mean {:.2}  max {}",
        s.dup_runs,
        s.mean_dup_run,
        s.max_dup_run
    );
    if s.duplicate_writes > 0 {
        let tops: Vec<String> = s
            .popularity
            .iter()
            .map(|p| {
                format!(
                    "top {} % ({}) get {:.1} %",
                    p.top_percent,
                    p.contents,
                    100.0 * p.share
                )
            })
            .collect();
        outln!(
            o,
            "  duplicate refs     by content: {}; max {} refs to one content",
            tops.join(", "),
            s.max_content_refs
        );
    }
    outln!(
        o,
        "  continuousness CDF (fraction of duplicate blocks in runs <= L):"
    );
    outln!(o, "      L      CDF");
    for p in &s.continuity_cdf {
        outln!(o, "  {:>6}   {:.4}", p.len, p.cdf);
    }
}

fn gen(a: GenArgs) -> Result<()> {
    let size = parse_size_or_zero(&a.size).map_err(|e| anyhow::anyhow!("--size: {e}"))?;
    // Each record is one 4 KiB request; `validate` refuses less too, but without the flag.
    if size < 4096 {
        bail!(
            "--size {}: too small, a trace needs at least one 4 KiB request",
            a.size
        );
    }
    let o = GenOptions {
        size,
        dup_ratio: a.dup_ratio,
        run_length: a.run_length.parse::<RunLength>()?,
        read_ratio: a.read_ratio,
        seed: a.seed,
        popularity: a.popularity.parse::<Popularity>()?,
        phases: a.phases,
    };
    // Before the output file is created.
    o.validate()?;
    // Written beside the output and renamed over it once complete: a run that fails midway (a
    // full disk) leaves neither a partial trace that looks like a good one nor, in place of
    // the file that was there, nothing.
    let out = OutputFile::create(&a.output).map_err(trace_error)?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, out.file());
    let s = generate(&o, &mut w).map_err(|e| match e {
        // Its own "writing generated trace" says less than the file's name.
        TraceError::Io { source, .. } => {
            anyhow::anyhow!("writing {}: {}", a.output.display(), super::plain(&source))
        }
        e => anyhow::Error::new(e).context(format!("writing {}", a.output.display())),
    })?;
    // The writer's borrow of the file ends before the commit (generate flushed it).
    drop(w);
    out.commit().map_err(trace_error)?;
    eprintln!(
        "nodup: generated {} records ({} written blocks, {} duplicates = {:.2} %, {} read blocks) into {}",
        s.records,
        s.write_blocks,
        s.dup_blocks,
        if s.write_blocks > 0 { 100.0 * s.dup_blocks as f64 / s.write_blocks as f64 } else { 0.0 },
        s.read_blocks,
        a.output.display()
    );
    Ok(())
}
