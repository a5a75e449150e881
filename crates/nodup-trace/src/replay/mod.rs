//! `nodup replay`: drive a directory with a block trace, as Light-Dedup's trace-replayer (§5.3).
//!
//! Each trace device `major:minor` becomes the file `DIR/dev-MAJOR-MINOR.img` (created empty;
//! one that already holds data is refused unless [`ReplayOptions::overwrite`], and then emptied
//! only once the whole trace has been read without error);
//! a request at sector `lba` goes to byte offset `lba * 512`. The dispatcher (this module) streams
//! the trace once, keeps the compact expected-content model (`model::LbaModel`), and turns records
//! into I/O calls on whole 4 KiB blocks: sectors a request does not cover are filled from the model
//! (read-modify-write at sector granularity; never-written sectors are zeros, as a hole reads), so
//! 512 B-granular traces replay correctly and every call stays block aligned.
//!
//! - `block` mode: one call per 4 KiB block;
//! - `batch` mode: consecutive blocks of the same operation and file, from consecutive trace
//!   records, are merged into one call of up to 512 blocks (2 MiB), as the paper's batch replay.
//!
//! Threads: the trace is split into streams by (device, 64 MiB LBA region), each stream hashed to
//! one worker; a worker executes its calls in trace order. All calls for one block therefore run
//! in trace order on one thread, so reads verify deterministically and the final file contents do
//! not depend on the thread count. With more than one thread, batches also break at region
//! boundaries. A read is verified against what the replayer last wrote to the sectors the request
//! covers; sectors never written by the replay are not verified. Reported time covers dispatching,
//! all calls and a final fsync of every file.

pub mod latency;
pub mod worker;

use crate::content::SectorContent;
use crate::error::{Result, TraceError};
use crate::format::{for_each_record, BadLinePolicy, Format, TraceReader};
use crate::model::{touches, LbaModel};
use crate::record::{Op, SECTORS_PER_BLOCK};
use latency::Percentiles;
use serde::Serialize;
use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::time::Instant;
use worker::{DevFile, IoOp};

/// Largest batch in blocks (2 MiB), as in the paper.
pub const MAX_BATCH_BLOCKS: usize = 512;
/// Stream granularity for `--threads`: 64 MiB of LBA space.
pub const REGION_BLOCKS: u64 = 16384;
/// Calls queued per worker before the dispatcher waits (bounds memory).
const QUEUE_DEPTH: usize = 64;

/// One call per block, or merged runs of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One 4 KiB block per call.
    Block,
    /// Up to 512 consecutive blocks per call.
    Batch,
}

impl std::str::FromStr for Mode {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "block" => Ok(Mode::Block),
            "batch" => Ok(Mode::Batch),
            _ => Err(TraceError::Invalid(format!(
                "unknown replay mode {s:?} (block|batch)"
            ))),
        }
    }
}

/// Options of one replay.
pub struct ReplayOptions<'a> {
    /// Directory that receives the device files.
    pub dir: PathBuf,
    /// Block or batch calls.
    pub mode: Mode,
    /// Worker threads (>= 1).
    pub threads: usize,
    /// Skip read records (write-only replay).
    pub no_reads: bool,
    /// Replace device files that already hold data (refused otherwise).
    pub overwrite: bool,
    /// Trace format (detected when `None`).
    pub format: Option<Format>,
    /// Bad-line handling.
    pub policy: BadLinePolicy<'a>,
    /// Called now and then with the bytes of trace consumed.
    pub progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

/// Result of a replay (the `nodup replay --json` object).
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// "block" or "batch".
    pub mode: String,
    /// Worker threads.
    pub threads: usize,
    /// Records replayed (reads skipped by --no-reads excluded).
    pub records: u64,
    /// Read records skipped by --no-reads.
    pub skipped_reads: u64,
    /// Lines that did not parse (skipped).
    pub bad_lines: u64,
    /// I/O calls issued.
    pub ops: u64,
    /// Write calls.
    pub write_ops: u64,
    /// Read calls.
    pub read_ops: u64,
    /// Bytes moved by all calls.
    pub bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Wall time in seconds (dispatch + calls + final fsync).
    pub seconds: f64,
    /// bytes / seconds in MiB/s.
    pub mib_per_s: f64,
    /// Blocks whose read data differed from the last write (data loss).
    pub verify_errors: u64,
    /// Read blocks with at least one verified sector.
    pub verified_blocks: u64,
    /// Latency of every call, microseconds.
    pub latency_us: Percentiles,
    /// Latency of write calls.
    pub write_latency_us: Percentiles,
    /// Latency of read calls.
    pub read_latency_us: Percentiles,
    /// The replay files, in device order.
    pub files: Vec<String>,
    /// Descriptions of the first verify errors.
    pub verify_error_samples: Vec<String>,
}

/// A batch being built by the dispatcher.
struct Pending {
    op: IoOp,
    dev: u32,
    worker: usize,
}

struct Dispatcher {
    mode: Mode,
    threads: usize,
    txs: Vec<SyncSender<IoOp>>,
    pending: Option<Pending>,
}

impl Dispatcher {
    fn worker_of(&self, dev: u32, block: u64) -> usize {
        if self.threads == 1 {
            return 0;
        }
        let h = ((dev as u64) << 40 ^ (block / REGION_BLOCKS)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((h >> 32) % self.threads as u64) as usize
    }

    fn send(&self, worker: usize, op: IoOp) -> Result<()> {
        // A closed channel means the worker stopped on an error; the caller collects it on join.
        self.txs[worker]
            .send(op)
            .map_err(|_| TraceError::Invalid("replay worker stopped".into()))
    }

    fn flush(&mut self) -> Result<()> {
        if let Some(p) = self.pending.take() {
            self.send(p.worker, p.op)?;
        }
        Ok(())
    }

    fn push(
        &mut self,
        file: &Arc<DevFile>,
        dev: u32,
        block: u64,
        write: bool,
        line: u64,
        content: [SectorContent; SECTORS_PER_BLOCK as usize],
    ) -> Result<()> {
        let worker = self.worker_of(dev, block);
        if self.mode == Mode::Batch {
            if let Some(p) = &mut self.pending {
                let fits = p.dev == dev
                    && p.op.write == write
                    && p.worker == worker
                    && p.op.first_block + p.op.blocks.len() as u64 == block
                    && p.op.blocks.len() < MAX_BATCH_BLOCKS
                    && (self.threads == 1 || block % REGION_BLOCKS != 0);
                if fits {
                    p.op.blocks.push(content);
                    return Ok(());
                }
            }
            self.flush()?;
            let mut blocks = Vec::with_capacity(16);
            blocks.push(content);
            self.pending = Some(Pending {
                op: IoOp {
                    file: file.clone(),
                    first_block: block,
                    line,
                    write,
                    blocks,
                },
                dev,
                worker,
            });
            Ok(())
        } else {
            self.send(
                worker,
                IoOp {
                    file: file.clone(),
                    first_block: block,
                    line,
                    write,
                    blocks: vec![content],
                },
            )
        }
    }
}

/// The name of the file that replays device `major:minor`.
fn file_name(major: u32, minor: u32) -> String {
    format!("dev-{major}-{minor}.img")
}

/// The refusal of a device file that holds data.
fn holds_data(path: &Path) -> TraceError {
    TraceError::Refused(format!(
        "{}: exists and holds data the replay would overwrite (--overwrite to replace it)",
        path.display()
    ))
}

/// Names of the device files in `dir` (`dev-*.img`, symlinks followed) that hold data.
fn files_with_data(dir: &Path) -> Result<BTreeSet<String>> {
    let what = |e| TraceError::io(format!("reading {}", dir.display()), e);
    let mut held = BTreeSet::new();
    for entry in std::fs::read_dir(dir).map_err(what)? {
        let entry = entry.map_err(what)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("dev-")
            && name.ends_with(".img")
            && std::fs::metadata(entry.path()).is_ok_and(|m| m.len() > 0)
        {
            held.insert(name);
        }
    }
    Ok(held)
}

/// Names of the files a replay of `trace` writes, from one pass over the whole trace (with the
/// replay's format, bad-line and read handling; bad lines are reported by the replay itself).
fn trace_files(trace: &Path, o: &ReplayOptions<'_>) -> Result<BTreeSet<String>> {
    let mut reader = TraceReader::open(trace, o.format)?;
    let quiet = BadLinePolicy {
        strict: o.policy.strict,
        report: None,
    };
    let mut names = BTreeSet::new();
    for_each_record(
        &mut reader,
        &quiet,
        |_| {},
        |_, r| {
            if r.op == Op::Write || !o.no_reads {
                names.insert(file_name(r.major, r.minor));
            }
            Ok(())
        },
    )?;
    Ok(names)
}

/// Open (or create) a device file for the replay, empty: one holding data is emptied only with
/// `overwrite` (the check is made on the opened file, so nothing slips in between).
fn open_device_file(path: &Path, overwrite: bool) -> Result<std::fs::File> {
    let what = |e| TraceError::io(format!("opening {}", path.display()), e);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(what)?;
    if file.metadata().map_err(what)?.len() > 0 {
        if !overwrite {
            return Err(holds_data(path));
        }
        file.set_len(0).map_err(what)?;
    }
    Ok(file)
}

/// Replay `trace` into `o.dir`.
pub fn replay(trace: &Path, o: &ReplayOptions<'_>) -> Result<ReplayReport> {
    let threads = o.threads.max(1);
    let mut reader = TraceReader::open(trace, o.format)?;
    std::fs::create_dir_all(&o.dir)
        .map_err(|e| TraceError::io(format!("creating {}", o.dir.display()), e))?;
    // The replay starts each device file empty (the model's never-written sectors read as
    // zeros). Files with data that this trace would write are refused unless `overwrite`;
    // with it, the whole trace is read once first, so one that fails part way (a bad line
    // under --strict, a cut own-format file) leaves them as they were.
    let held = files_with_data(&o.dir)?;
    if !held.is_empty() {
        // A pipe (`<(zcat t.gz)`) would be drained by that first pass, and the replay would
        // then read nothing and report success.
        if !std::fs::metadata(trace).is_ok_and(|m| m.is_file()) {
            return Err(TraceError::Refused(format!(
                "{}: not a regular file, so it cannot be read once to see which device files it writes, then replayed; {} holds device files with data: replay into an empty directory",
                trace.display(),
                o.dir.display()
            )));
        }
        if let Some(name) = trace_files(trace, o)?
            .into_iter()
            .find(|n| held.contains(n))
        {
            if !o.overwrite {
                return Err(holds_data(&o.dir.join(name)));
            }
        }
    }
    let mut txs = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..threads {
        let (tx, rx) = sync_channel::<IoOp>(QUEUE_DEPTH);
        txs.push(tx);
        handles.push(std::thread::spawn(move || worker::run(rx)));
    }
    let mut d = Dispatcher {
        mode: o.mode,
        threads,
        txs,
        pending: None,
    };
    let mut model = LbaModel::default();
    let mut files: Vec<Arc<DevFile>> = Vec::new();
    let (mut records, mut skipped_reads) = (0u64, 0u64);
    let start = Instant::now();
    let progress = |b: u64| {
        if let Some(p) = o.progress {
            p(b)
        }
    };
    let dispatched = for_each_record(&mut reader, &o.policy, progress, |line, r| {
        if r.op == Op::Read && o.no_reads {
            skipped_reads += 1;
            return Ok(());
        }
        records += 1;
        let dev = model.device_index(r.device())?;
        if dev as usize == files.len() {
            let name = file_name(r.major, r.minor);
            let path = o.dir.join(&name);
            let file = open_device_file(&path, o.overwrite)?;
            files.push(Arc::new(DevFile { file, name }));
        }
        let file = files[dev as usize].clone();
        for t in touches(&r) {
            let content = match r.op {
                Op::Write => {
                    let (_, new) = model.write(dev, &r, t)?;
                    new.map(|k| model.interner.content(k))
                }
                Op::Read => {
                    let cur = model.get(dev, t.block);
                    let mut exp = [SectorContent::ZERO; SECTORS_PER_BLOCK as usize];
                    for s in t.from..t.to {
                        exp[s as usize] = model.interner.content(cur[s as usize]);
                    }
                    exp
                }
            };
            d.push(&file, dev, t.block, r.op == Op::Write, line, content)?;
        }
        Ok(())
    })
    .and_then(|bad| d.flush().map(|_| bad));
    drop(d);
    let mut total = worker::WorkerStats::default();
    let mut worker_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(s)) => {
                total.write_ops += s.write_ops;
                total.read_ops += s.read_ops;
                total.write_bytes += s.write_bytes;
                total.read_bytes += s.read_bytes;
                total.verify_errors += s.verify_errors;
                total.verified_blocks += s.verified_blocks;
                total.write_lat.merge(&s.write_lat);
                total.read_lat.merge(&s.read_lat);
                total.samples.extend(s.samples);
            }
            Ok(Err(e)) => worker_err = worker_err.or(Some(e)),
            Err(_) => {
                worker_err =
                    worker_err.or(Some(TraceError::Invalid("a replay worker panicked".into())))
            }
        }
    }
    if let Some(e) = worker_err {
        return Err(e);
    }
    let bad_lines = dispatched?;
    for f in &files {
        f.file
            .sync_all()
            .map_err(|e| TraceError::io(format!("fsync {}", f.name), e))?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let mut all = total.write_lat.clone();
    all.merge(&total.read_lat);
    let bytes = total.write_bytes + total.read_bytes;
    total.samples.truncate(10);
    Ok(ReplayReport {
        mode: match o.mode {
            Mode::Block => "block".into(),
            Mode::Batch => "batch".into(),
        },
        threads,
        records,
        skipped_reads,
        bad_lines,
        ops: total.write_ops + total.read_ops,
        write_ops: total.write_ops,
        read_ops: total.read_ops,
        bytes,
        write_bytes: total.write_bytes,
        read_bytes: total.read_bytes,
        seconds,
        mib_per_s: if seconds > 0.0 {
            bytes as f64 / (1 << 20) as f64 / seconds
        } else {
            0.0
        },
        verify_errors: total.verify_errors,
        verified_blocks: total.verified_blocks,
        latency_us: all.percentiles(),
        write_latency_us: total.write_lat.percentiles(),
        read_latency_us: total.read_lat.percentiles(),
        files: files.iter().map(|f| f.name.clone()).collect(),
        verify_error_samples: total.samples,
    })
}
