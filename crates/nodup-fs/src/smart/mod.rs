//! The file system's half of policy `smart` (SmartDedup §3.3–3.4): the skipped buffer the
//! write path fills with the blocks inline dedup did not match (`skipped.rs`), the out-of-line
//! worker that finds their duplicates in both fingerprint stores and remaps them through the
//! file system's log (`worker.rs`), the resource readings that scale inline selectivity and the
//! worker's rate (`resources.rs`), the buffer's checkpoint (`persist.rs`), and the control
//! commands behind `nodup ctl`.

pub mod persist;
pub mod resources;
pub mod skipped;
pub mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use crate::error::{errno, Result};
use resources::{Overrides, Sampler};
use skipped::SkippedBuffer;
use worker::StepScratch;

/// Blocks per second the worker processes by default (before resource scaling).
pub const DEFAULT_RATE: u64 = 50_000;

/// Counters of the out-of-line worker.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct WorkerStats {
    /// Blocks looked at.
    pub processed: u64,
    /// Blocks remapped onto an existing copy (out-of-line dedup hits).
    pub remapped: u64,
    /// Blocks without an entry given one (stored without inline fingerprint, no copy found).
    pub adopted: u64,
    /// Blocks whose queued fingerprint was not their content's (the file block was replaced
    /// since it was queued): not adopted, queued again with their own.
    pub stale: u64,
    /// Blocks rewritten, truncated or unlinked since they were queued (skipped).
    pub moved: u64,
    /// Candidates whose bytes differed (fingerprint collision).
    pub differs: u64,
    /// Blocks with no other copy anywhere.
    pub unique: u64,
    /// Duplicates left alone by the run filter (runs shorter than the threshold).
    pub filtered: u64,
    /// Duplicates left in place because the other copy has fewer references (its references
    /// move here when the worker reaches them).
    pub kept: u64,
    /// Of those, queued once more, to move on their second visit.
    pub second_visits: u64,
    /// Bytes read to fingerprint blocks that had no fingerprint.
    pub read_bytes: u64,
    /// Whole files scanned after the buffer overflowed.
    pub files_scanned: u64,
    /// Operations that failed (logged; the block is left as it is).
    pub errors: u64,
}

/// `smart`'s state in an open file system.
pub struct SmartFs {
    pub(crate) buf: Mutex<SkippedBuffer>,
    /// The worker's step scratch (its budget share). Its size and step, fixed at creation,
    /// are kept beside it for `report`, which must not wait for the lock a step holds
    /// throughout.
    pub(crate) scratch: Mutex<StepScratch>,
    pub(crate) scratch_bytes: u64,
    pub(crate) step_blocks: usize,
    /// Blocks per second (0: paused).
    pub(crate) rate: Mutex<u64>,
    pub(crate) overrides: Mutex<Overrides>,
    pub(crate) sampler: Mutex<Sampler>,
    pub(crate) stats: Mutex<WorkerStats>,
    /// Shortest run of duplicates remapped (the fragmentation filter).
    pub(crate) min_run: usize,
    /// Client-area block of the buffer's checkpoint, when the image has room for one.
    pub(crate) ckpt_at: Option<u64>,
    /// The file being scanned whole: (inode, next block).
    pub(crate) scan: Mutex<Option<(u64, u64)>>,
    pub(crate) dirty: AtomicBool,
    pub(crate) last_ckpt: Mutex<Instant>,
    pub(crate) stop: AtomicBool,
    pub(crate) thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// `smart`'s state for a writable open of `engine` (none for other policies or read-only):
/// the buffer sized from the policy's budget, refilled from its checkpoint in the client area
/// (after the superblock pair at `area`, when the area is large enough).
pub(crate) fn for_engine(
    engine: &nodup_core::Engine,
    area: u64,
    opts: &crate::fs::FsOptions,
) -> Option<SmartFs> {
    if opts.read_only || engine.policy_kind() != nodup_core::policy::PolicyKind::Smart {
        return None;
    }
    let split = engine.policy().budget_split()?;
    let (carea, alen) = engine.client_area();
    let ckpt_at = (carea == area && alen >= persist::AREA_OFFSET + persist::AREA_BLOCKS)
        .then_some(area + persist::AREA_OFFSET);
    let s = SmartFs::new(
        split.skipped,
        split.worker,
        engine.policy().min_dup_run(),
        ckpt_at,
        opts.image_path.as_deref(),
    );
    if let Some(at) = ckpt_at {
        let items = persist::load(&**engine.medium(), at);
        let mut b = s.buf.lock();
        for it in items {
            match it {
                skipped::Item::Block { ino, lbn, .. } => b.push(ino, lbn, None),
                skipped::Item::File { ino } => b.push_file(ino),
            }
        }
    }
    Some(s)
}

impl SmartFs {
    /// State for a buffer of `skipped_bytes` and worker scratch of `worker_bytes`, remapping
    /// runs of at least `min_run` blocks.
    pub fn new(
        skipped_bytes: u64,
        worker_bytes: u64,
        min_run: usize,
        ckpt_at: Option<u64>,
        image: Option<&std::path::Path>,
    ) -> SmartFs {
        let scratch = StepScratch::new(worker_bytes);
        SmartFs {
            buf: Mutex::new(SkippedBuffer::new(skipped_bytes)),
            scratch_bytes: scratch.memory_bytes(),
            step_blocks: scratch.step(),
            scratch: Mutex::new(scratch),
            rate: Mutex::new(DEFAULT_RATE),
            overrides: Mutex::new(Overrides::default()),
            sampler: Mutex::new(Sampler::new(image)),
            stats: Mutex::new(WorkerStats::default()),
            min_run: min_run.max(1),
            ckpt_at,
            scan: Mutex::new(None),
            dirty: AtomicBool::new(false),
            last_ckpt: Mutex::new(Instant::now()),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        }
    }

    /// Queue the blocks of a write that inline dedup did not match.
    pub fn note(&self, ino: u64, first: u64, misses: &[nodup_core::engine::Miss]) {
        if misses.is_empty() {
            return;
        }
        let mut b = self.buf.lock();
        for m in misses {
            b.push(ino, first + m.index as u64, m.fp);
        }
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// True when nothing waits for the worker. The two locks are taken one after the other,
    /// never nested: a writer takes `buf` under an inode lock, and the worker takes an inode
    /// lock under `scan`.
    pub fn idle(&self) -> bool {
        let empty = self.buf.lock().is_empty();
        empty && self.scan.lock().is_none()
    }

    /// Run a control command (`key=value`); errors are EINVAL with nothing changed.
    pub fn control(&self, cmd: &str) -> Result<()> {
        let Some((k, v)) = cmd.split_once('=') else {
            return errno(libc::EINVAL);
        };
        let frac = |v: &str| -> Result<Option<f64>> {
            if v == "auto" {
                return Ok(None);
            }
            match v.parse::<f64>() {
                Ok(x) if (0.0..=1.0).contains(&x) => Ok(Some(x)),
                _ => errno(libc::EINVAL),
            }
        };
        match k {
            "worker-rate" => match v.parse::<u64>() {
                Ok(r) => *self.rate.lock() = r,
                Err(_) => return errno(libc::EINVAL),
            },
            "low-power" => {
                let x = match v {
                    "on" => Some(true),
                    "off" => Some(false),
                    "auto" => None,
                    _ => return errno(libc::EINVAL),
                };
                self.overrides.lock().low_power = x;
            }
            "battery" => {
                let x = if v == "auto" {
                    None
                } else {
                    match v.parse::<f64>() {
                        Ok(x) if (0.0..=100.0).contains(&x) => Some(x),
                        _ => return errno(libc::EINVAL),
                    }
                };
                self.overrides.lock().battery = x;
            }
            "cpu-busy" => self.overrides.lock().cpu_busy = frac(v)?,
            "device-busy" => self.overrides.lock().device_busy = frac(v)?,
            _ => return errno(libc::EINVAL),
        }
        Ok(())
    }

    /// The worker's and the buffer's figures for `nodup stats`.
    pub fn report(&self) -> serde_json::Value {
        // `buf` and `scan` one after the other, never nested (see `idle`).
        let scanning = self.scan.lock().is_some();
        let b = self.buf.lock();
        let (blocks, files) = b.pending();
        serde_json::json!({
            "idle": blocks == 0 && files == 0 && !scanning,
            "worker": *self.stats.lock(),
            "worker_rate": *self.rate.lock(),
            "step_blocks": self.step_blocks,
            "scratch_bytes": self.scratch_bytes,
            "min_run": self.min_run,
            "overrides": *self.overrides.lock(),
            "skipped_buffer": {
                "pending_blocks": blocks,
                "pending_files": files,
                "capacity_blocks": b.capacity(),
                "fill": blocks as f64 / b.capacity().max(1) as f64,
                "overflows": b.overflows,
                "lost_files": b.lost,
                "memory_bytes": b.memory_bytes(),
                "checkpointed": self.ckpt_at.is_some(),
            },
        })
    }
}

impl crate::fs::FileSystem {
    /// Run a `smart` control command (`key=value`, see [`SmartFs::control`]); EINVAL for other
    /// policies.
    pub fn smart_control(&self, cmd: &str) -> Result<()> {
        let Some(s) = &self.smart else {
            return errno(libc::EINVAL);
        };
        s.control(cmd)?;
        // Readings set by hand take effect now, not at the worker's next sample.
        let ov = *s.overrides.lock();
        let r = s.sampler.lock().sample(&ov);
        self.engine.policy().set_resources(r);
        Ok(())
    }

    /// Whether `smart`'s worker has nothing queued; `None` for policies without a worker.
    pub fn worker_idle(&self) -> Option<bool> {
        self.smart.as_ref().map(|s| s.idle())
    }

    /// True when `smart`'s worker has nothing queued (always true for other policies).
    pub fn smart_idle(&self) -> bool {
        self.worker_idle().unwrap_or(true)
    }
}
