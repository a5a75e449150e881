//! Writing incremental checkpoints (see [`crate::persist`] for the format), the reserve of
//! blocks that keeps one always possible, and when to take one.
//!
//! A checkpoint runs in three steps:
//! 1. **Cut** (under the gate, so no operation is half applied): the inodes changed since the
//!    last checkpoint, and the live units of the segments chosen for cleaning, are encoded into
//!    new segments, written to fresh blocks as they fill (not flushed yet), so the cut's memory
//!    does not grow with what changed; the log position is noted. The time spent here is
//!    proportional to what changed, not to the size of the file system, and is the only pause
//!    operations see.
//! 2. **Write** (operations run again): the segments are flushed and a new manifest goes to
//!    fresh blocks, then, after a fence, the superblock names the new manifest and the cut.
//! 3. **Free**: cleaned and emptied segments, the old manifest and the log blocks before the
//!    cut go back to the engine.
//!
//! A failed write in step 1 or 2 leaves the old checkpoint in force (the log still holds
//! everything since its cut): the unit locations are put back and everything encoded is marked
//! changed again.
//!
//! By concern: `build` (the new segments a cut writes), `clean` (segment cleaning), `write`
//! (step 2 and the undo of a failed one), `space` (the reserve and the space check before
//! operations), `schedule` (when to take one).

mod build;
mod clean;
mod schedule;
mod space;
mod write;

pub(crate) use self::build::CutScratch;
use self::build::{blocks_for, Builder, Change};
use self::clean::{copy_bytes, still_current};
use crate::chain::PAYLOAD;
use crate::error::{FsError, Result};
use crate::fs::FileSystem;
use crate::persist::manifest::{Manifest, SegRef};
use crate::persist::unit::UnitKind;
use crate::persist::{Loc, SegInfo};
use nodup_core::BlockNr;
use std::time::Instant;

/// A checkpoint splits its units into segments of about this many payload bytes (1/1024 of the
/// image, between 4 KiB and this), so cleaning can pick segments at a fine grain.
pub const SEG_BYTES_MAX: usize = 1 << 20;
/// Live bytes one (non-final) checkpoint rewrites at most to clean segments.
pub const CLEAN_BUDGET: u64 = 4 << 20;
/// Segments may hold this much more than their live bytes before cleaning starts (1/1024 of
/// the image, between 4 KiB and this) ...
pub const GARBAGE_SLACK_MAX: u64 = 256 << 10;
/// ... or more than this share of garbage.
pub const GARBAGE_RATIO: f64 = 0.5;
/// Smallest and largest automatic log limit (see [`FileSystem::log_limit`]).
pub const LOG_LIMIT_MIN: u64 = 256 << 10;
/// See [`LOG_LIMIT_MIN`].
pub const LOG_LIMIT_MAX: u64 = 64 << 20;
/// Estimated checkpoint bytes at which the tick takes a checkpoint (twice this, and an
/// operation takes it itself). The cut encodes what changed while operations wait, so this
/// bounds that pause (a few milliseconds).
pub const DIRTY_LIMIT: u64 = 4 << 20;
/// A file system idle this long with changes not yet checkpointed takes a checkpoint.
pub const IDLE_MS: u64 = 1000;

/// Counters of the checkpoints taken since the file system was opened.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CkptStats {
    /// Checkpoints written.
    pub count: u64,
    /// Checkpoints that failed or were refused (and left the previous one in force).
    pub failed: u64,
    /// Seconds the last checkpoint took in all.
    pub last_seconds: f64,
    /// Seconds operations were paused by the last checkpoint (its cut).
    pub last_pause_seconds: f64,
    /// Longest pause of any checkpoint so far.
    pub max_pause_seconds: f64,
    /// Payload bytes the last checkpoint wrote (units + manifest).
    pub last_bytes: u64,
    /// Inodes whose units the last checkpoint wrote.
    pub last_inodes: u64,
    /// Segments cleaned (rewritten and freed) so far.
    pub segments_cleaned: u64,
    /// Most bytes of the cut's per-unit working vectors one checkpoint filled: the memory
    /// checkpoints need per changed unit (most of them file-map units). The vectors are kept
    /// between checkpoints, so at least this much stays resident (more where a vector grew
    /// by copying); the fixed staging buffer is not counted.
    pub scratch_peak_bytes: u64,
    /// What the last checkpoint did, for the log.
    #[serde(skip)]
    pub last_detail: String,
    /// When a checkpoint was last logged, and how many since.
    #[serde(skip)]
    pub logged: Option<(Instant, u64)>,
}

/// A checkpoint is logged at most this often (slow or failed ones always).
const LOG_EVERY_SECS: u64 = 60;

impl FileSystem {
    /// Write a checkpoint (see the module comment). `clean` is the final one of a clean
    /// shutdown: it holds the gate throughout, drops unlinked inodes nobody has open any more,
    /// cleans without a budget and sets the clean flag.
    pub fn checkpoint(&self, clean: bool) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        let _one = self.ckpt_lock.lock();
        if self.is_shut_down() && !clean {
            return Ok(());
        }
        let t0 = Instant::now();
        let r = self.checkpoint_locked(clean, t0);
        let mut st = self.ckpt_stats.lock();
        let secs = t0.elapsed().as_secs_f64();
        let gave_back = match r {
            Ok(g) => g,
            Err(e) => {
                st.failed += 1;
                crate::logging::error(&format!("checkpoint failed (the previous one stays): {e}"));
                return Err(e);
            }
        };
        st.count += 1;
        st.last_seconds = secs;
        let since = st.logged.map_or(st.count, |(_, n)| st.count - n);
        let due = st
            .logged
            .is_none_or(|(t, _)| t.elapsed().as_secs() >= LOG_EVERY_SECS);
        if due || secs > 1.0 || clean || std::env::var_os("NODUP_CKPT_DEBUG").is_some() {
            crate::logging::info(&format!(
                "checkpoint {} ({} since the last line){}: {:.1} ms, {}",
                st.count,
                since,
                if clean { ", final" } else { "" },
                secs * 1e3,
                st.last_detail
            ));
            st.logged = Some((Instant::now(), st.count));
        }
        let Some(e) = gave_back else { return Ok(()) };
        // An I/O error with the engine still ready is a release whose second try worked: the
        // checkpoint is fine. One that gave up leaves the engine needing recovery: every later
        // change fails, and so does this checkpoint's caller. Any other error (a block not
        // allocated, a count past zero) means counts the file system no longer agrees with:
        // the caller fails too, so a clean unmount does not save them as clean.
        let ready = self.engine.check_ready();
        let retried = ready.is_ok() && matches!(e, FsError::Engine(nodup_core::Error::Io(_)));
        crate::logging::error(&format!(
            "checkpoint {} is written, but giving back the blocks it freed failed{}: {e}",
            st.count,
            if retried {
                " once (the engine carries on)"
            } else {
                " (what it held stays allocated until failure recovery at the next mount)"
            }
        ));
        match ready {
            Err(r) => Err(r.into()),
            Ok(()) if retried => Ok(()),
            Ok(()) => Err(e),
        }
    }

    /// Steps 1 to 3 (see the module comment); the caller holds `ckpt_lock`. An error leaves
    /// the previous checkpoint in force; `Ok(Some(e))` is a checkpoint written whose step 3
    /// failed to give some blocks back.
    fn checkpoint_locked(&self, clean: bool, t0: Instant) -> Result<Option<FsError>> {
        // Not once no change can be made durable (`changes_possible`): after a failed
        // write-back no fence succeeds, after an undone switch the cut would write over reserve
        // blocks the medium may name, and once the engine gave up nothing can be given back.
        self.changes_possible()?;
        // Room for cleaning: what the reserve and free space hold beyond this checkpoint's own
        // units; no cleaning when space is short (it frees blocks only after the switch).
        let spare_blocks = (self.meta.lock().reserve.len() as u64
            + self.engine.allocator().free_blocks())
        .saturating_sub(self.reserve_want() as u64 + 16);
        let room = spare_blocks * PAYLOAD as u64;
        // Cleaning keeps pace with the garbage a checkpoint makes (about what it writes).
        let pace = CLEAN_BUDGET.max(2 * self.persist.estimate());
        let budget = if clean { room } else { room.min(pace) };
        let victims = self.pick_victims(budget);
        // What each victim holds (read before the cut: media reads, no locks). Its units that
        // are still current and unchanged at the cut are copied to the new segment as they
        // are (a memory copy: their frames are self-contained); changed ones are encoded anew
        // with everything else that changed.
        let victim_data = self.read_victims(&victims)?;

        // Working vectors sized now: fresh memory touched under the gate made the cut wait for
        // page faults (slow on a VM whose memory is under pressure).
        // Units: about one per 2 KiB of the estimate (heads count 256 B and more, file-map
        // units up to 4.2 KiB).
        let seg_bytes = self.seg_bytes();
        let units = (self.persist.estimate() as usize + copy_bytes(&victim_data)) / 2048 + 256;
        let mut scratch = std::mem::take(&mut *self.cut_scratch.lock());
        scratch.reserve(units);

        // ---- 1. the cut
        let gate = self.gate.write();
        // A failed append may have left a frame at the end of the log, where this cut starts
        // replay: a clean reopen would apply it. Erase it first and give back what it held.
        // Records held back go first: the cut names the end of the log, whose blocks (and
        // their headers) must be on the medium before the superblock does.
        let scrubbed = {
            let mut log = self.log.lock();
            self.write_out_held(&mut log)
                .and_then(|()| log.scrub(&*self.medium))
                .map(|()| log.settled())
        };
        match scrubbed {
            Ok(settled) => self.give_back_settled(settled),
            Err(e) => {
                *self.cut_scratch.lock() = scratch;
                return Err(e);
            }
        }
        let tc = Instant::now();
        let cpu0 = thread_cpu_secs();
        let mut released = Vec::new();
        if clean {
            // Nobody can hold a handle after the final unmount: unlinked inodes go now, so a
            // clean image never carries one.
            let mut t = self.tables.write();
            for ino in t.unlinked() {
                if let Some(n) = t.remove_inode(ino) {
                    let mut n = n.write();
                    let mapped = n.map().map_or(0, |m| m.mapped());
                    released.extend(n.map_mut().map(|m| m.clear()).unwrap_or_default());
                    self.sub_mapped(mapped);
                }
            }
        }
        let t = self.tables.read();
        let t_lock = tc.elapsed().as_secs_f64();
        // Every new segment's generation is at least this (the manifest's comes after them).
        let gen0 = self.meta.lock().next_gen;
        let mut b = Builder::new(self, seg_bytes, &mut scratch);
        let mut copied = 0usize;
        for (g, payload, units) in &victim_data {
            for v in units {
                let Some(node) = t.get(v.ino) else { continue };
                let n = node.read();
                if still_current(&n, v, *g) {
                    b.raw(
                        v.ino,
                        (v.kind != UnitKind::Head).then_some(v.unit),
                        &payload[v.off..v.off + v.len],
                    );
                    copied += 1;
                }
            }
        }
        let t_mark = tc.elapsed().as_secs_f64();
        let queue = self.persist.take_queue();
        let mut inodes = 0u64;
        let mut lock_wait = 0f64;
        for &ino in &queue {
            if let Some(node) = t.get(ino) {
                let tw = Instant::now();
                let mut n = node.write();
                lock_wait += tw.elapsed().as_secs_f64();
                b.take(&mut n);
                inodes += 1;
            }
        }
        let written = b.finish();
        let t_enc = tc.elapsed().as_secs_f64();
        let (pos, cut_counts) = {
            let mut log = self.log.lock();
            let pos = log.position();
            (pos, log.mark_cut())
        };
        let next_ino = t.next_ino;
        let t_log = tc.elapsed().as_secs_f64();
        // The manifest's generation follows the segments'.
        let man_gen = self.take_gen();
        // Point every written unit at its new copy; remember the old one.
        let mut changes = std::mem::take(&mut scratch.changes);
        let mut dead = std::mem::take(&mut scratch.dead);
        let mut new_live = vec![0u64; b.segs.len()];
        for &(ino, u, si, len) in &b.placed {
            let Some(node) = t.get(ino) else { continue };
            let mut n = node.write();
            let loc = Loc {
                gen: b.segs[si].gen,
                bytes: len,
            };
            new_live[si] += len as u64;
            let old = match u {
                None => n.ck.head.replace(loc),
                Some(u) => n.ck.units.insert(u, loc),
            };
            dead.extend(old);
            changes.push(match u {
                None => Change::Head(ino, old),
                Some(u) => Change::Unit(ino, u, old),
            });
        }
        for &(ino, u) in &b.gone {
            let Some(node) = t.get(ino) else { continue };
            let old = node.write().ck.units.remove(&u);
            dead.extend(old);
            changes.push(Change::Unit(ino, u, old));
        }
        drop(t);
        let t_locs = tc.elapsed().as_secs_f64();
        self.persist.forget(dead.iter().copied());
        let (manifest, dropped) = {
            let mut segs = self.persist.segs.lock();
            for (i, s) in b.segs.iter().enumerate() {
                segs.insert(
                    s.gen,
                    SegInfo {
                        blocks: s.blocks().to_vec(),
                        bytes: s.bytes as u32,
                        live: new_live[i],
                    },
                );
            }
            let dropped: Vec<u64> = segs
                .iter()
                .filter(|(g, s)| s.live == 0 && **g < gen0)
                .map(|(&g, _)| g)
                .collect();
            let man = Manifest {
                next_ino,
                segs: segs
                    .iter()
                    .filter(|(g, _)| !dropped.contains(g))
                    .map(|(&g, s)| SegRef {
                        head: s.blocks.first().copied().unwrap_or(0),
                        gen: g,
                        blocks: blocks_for(s.bytes as usize) as u32,
                        bytes: s.bytes,
                    })
                    .collect(),
            };
            (man, dropped)
        };
        let pause = tc.elapsed().as_secs_f64();
        let pause_cpu = thread_cpu_secs() - cpu0;
        let detail = format!(
            "{} inodes, {} units copied from {} cleaned segments, {} bytes; pause {:.1} ms, \
             {:.1} ms of it on the CPU \
             (at {:.1} locked, {:.1} copied, {:.1} encoded ({:.1} waiting for inodes), {:.1} cut, \
             {:.1} moved)",
            inodes,
            copied,
            victims.len(),
            b.bytes(),
            pause * 1e3,
            pause_cpu * 1e3,
            t_lock * 1e3,
            t_mark * 1e3,
            t_enc * 1e3,
            lock_wait * 1e3,
            t_log * 1e3,
            t_locs * 1e3,
        );
        let gate = if clean {
            Some(gate)
        } else {
            drop(gate);
            None
        };

        // ---- 2. write
        let seg_blocks = b.blocks();
        let written = written
            .and_then(|()| self.write_checkpoint(&seg_blocks, manifest, man_gen, &pos, clean));
        let (man_blocks, pending) = match written {
            Ok(x) => x,
            Err(e) => {
                // The final checkpoint still holds the gate; any other takes it to undo.
                let _g = gate.is_none().then(|| self.gate.read());
                self.undo_cut(&changes, &b, cut_counts);
                drop(_g);
                drop(gate);
                self.give_back(seg_blocks);
                self.keep_scratch(b, changes, dead);
                return Err(e);
            }
        };

        // ---- 3. free
        let mut free: Vec<BlockNr> = Vec::new();
        {
            let mut meta = self.meta.lock();
            free.append(&mut std::mem::replace(&mut meta.manifest, man_blocks));
            free.append(&mut meta.legacy);
        }
        {
            let mut segs = self.persist.segs.lock();
            for g in &dropped {
                if let Some(s) = segs.remove(g) {
                    free.extend(s.blocks);
                }
            }
        }
        free.extend(self.log.lock().drop_before(&pos));
        drop(gate);
        {
            let mut st = self.ckpt_stats.lock();
            st.last_detail = detail;
            st.last_pause_seconds = pause;
            st.max_pause_seconds = st.max_pause_seconds.max(pause);
            st.last_bytes = b.bytes() as u64;
            st.last_inodes = inodes;
            st.segments_cleaned += victims.len() as u64;
        }
        self.keep_scratch(b, changes, dead);
        // The new checkpoint is in force: whatever fails from here on is not undone, and
        // every step is tried so no block is kept by one failing before it.
        let mut gave_back = Ok(());
        if !free.is_empty() {
            gave_back = self.engine.free_meta(&free);
        }
        // Releases waiting for durability are covered by the fence before the switch (with the
        // records that made them, written out just before it: `write.rs`).
        gave_back = gave_back.and(self.engine.release_batch(&pending));
        if !released.is_empty() {
            gave_back = gave_back.and(self.engine.release_batch(&released));
        }
        let _ = t0;
        Ok(gave_back.err().map(Into::into))
    }
}

/// Give the pages malloc holds free back to the system, at most once a second (the tick calls
/// it after a checkpoint: the cut's and the operations' transient buffers are gone by then; an
/// operation that takes a checkpoint itself does not pay for it). Without it the daemon's
/// resident memory keeps the high-water mark of every thread's arena, which a fixed-memory
/// policy's user reads as growth (about 0.7 MiB in `bench/smart.sh budget`).
pub(super) fn return_free_memory() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_SEC: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LAST_SEC.swap(now, Ordering::Relaxed) == now {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// CPU time of the calling thread, seconds (tells a slow cut from a preempted one in the log).
fn thread_cpu_secs() -> f64 {
    // SAFETY: clock_gettime fills the timespec it is given.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
