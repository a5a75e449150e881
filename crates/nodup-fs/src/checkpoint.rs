//! Writing incremental checkpoints (see [`crate::persist`] for the format), the reserve of
//! blocks that keeps one always possible, and when to take one.
//!
//! A checkpoint runs in three steps:
//! 1. **Cut** (under the gate, so no operation is half applied): the inodes changed since the
//!    last checkpoint, and the live units of the segments chosen for cleaning, are encoded into
//!    new segment payloads; the log position is noted. The time spent here is proportional to
//!    what changed, not to the size of the file system, and is the only pause operations see.
//! 2. **Write** (operations run again): the segments and a new manifest go to fresh blocks,
//!    then, after a fence, the superblock names the new manifest and the cut.
//! 3. **Free**: cleaned and emptied segments, the old manifest and the log blocks before the
//!    cut go back to the engine.
//!
//! A failure in step 2 leaves the old checkpoint in force (the log still holds everything since
//! its cut): the unit locations are put back and everything encoded is marked changed again.

use crate::chain::{ChainKind, ChainWriter, PAYLOAD};
use crate::error::{errno, FsError, Result};
use crate::fs::FileSystem;
use crate::inode::{Body, Inode};
use crate::log::writer::LogPos;
use crate::persist::manifest::{Manifest, SegRef};
use crate::persist::unit::{self, UnitKind};
use crate::persist::{load, Loc, SegInfo};
use crate::superblock::{FLAG_CLEAN, FS_VERSION};
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
    /// Checkpoints that failed (and left the previous one in force).
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
    /// What the last checkpoint did, for the log.
    #[serde(skip)]
    pub last_detail: String,
    /// When a checkpoint was last logged, and how many since.
    #[serde(skip)]
    pub logged: Option<(Instant, u64)>,
}

/// A checkpoint is logged at most this often (slow or failed ones always).
const LOG_EVERY_SECS: u64 = 60;

/// A unit whose location a checkpoint changed, and what it was before (for undo).
pub(crate) enum Change {
    Head(u64, Option<Loc>),
    Unit(u64, u64, Option<Loc>),
}

/// Segment buffers kept between checkpoints (their capacity, at most this many): a fresh buffer
/// would be fresh memory, and first-touch page faults then made the cut several times longer
/// on a busy VM.
const BUF_POOL: usize = 32;

/// Working vectors of a cut, kept between checkpoints with their capacity (see [`BUF_POOL`]:
/// memory freshly taken from the system under the gate costs page faults, which a VM short
/// of memory serves slowly).
#[derive(Default)]
pub(crate) struct CutScratch {
    placed: Vec<(u64, Option<u64>, usize, u32)>,
    gone: Vec<(u64, u64)>,
    changes: Vec<Change>,
    dead: Vec<Loc>,
}

impl CutScratch {
    /// Make room for about `units` units without allocating under the gate.
    fn reserve(&mut self, units: usize) {
        self.placed.reserve(units);
        self.changes.reserve(units);
        self.dead.reserve(units);
        self.gone.reserve(units / 8 + 16);
    }
}

/// New segments being assembled by a cut.
struct Builder {
    seg_bytes: usize,
    /// Empty buffers to use before allocating.
    pool: Vec<Vec<u8>>,
    segs: Vec<Vec<u8>>,
    /// (inode, unit or None for the head, segment index, frame length) per unit written.
    placed: Vec<(u64, Option<u64>, usize, u32)>,
    /// (inode, unit) of units that became empty.
    gone: Vec<(u64, u64)>,
}

impl Builder {
    fn cur(&mut self) -> (usize, &mut Vec<u8>) {
        if self.segs.last().is_none_or(|s| s.len() >= self.seg_bytes) {
            let cap = self.seg_bytes + (64 << 10);
            let buf = self.pool.pop().unwrap_or_else(|| Vec::with_capacity(cap));
            self.segs.push(buf);
        }
        let i = self.segs.len() - 1;
        (i, &mut self.segs[i])
    }

    /// Copy a unit frame as it is.
    fn raw(&mut self, ino: u64, unit: Option<u64>, frame: &[u8]) {
        let (si, buf) = self.cur();
        buf.extend_from_slice(frame);
        self.placed.push((ino, unit, si, frame.len() as u32));
    }

    /// Encode what changed in `n`.
    fn take(&mut self, n: &mut Inode) {
        n.ck.queued = false;
        n.ck.est = 0;
        let units = n.unit_dirt_mut().map(|d| d.take()).unwrap_or_default();
        // Unit 0 lives in the head, and a unit that appears or disappears changes the head's list.
        let head = std::mem::take(&mut n.ck.head_dirty) || !units.is_empty();
        if head {
            let (si, buf) = self.cur();
            let len = unit::encode_head(buf, n);
            self.placed.push((n.ino, None, si, len));
        }
        for u in units.into_iter().filter(|&u| u != 0) {
            let (si, buf) = self.cur();
            let len = match &n.body {
                Body::File(m) if m.unit_mapped(u) => Some(unit::encode_map_unit(buf, n.ino, u, m)),
                Body::Dir(d) if d.unit_entries(u).next().is_some() => {
                    Some(unit::encode_dir_unit(buf, n.ino, u, d))
                }
                _ => None,
            };
            match len {
                Some(len) => self.placed.push((n.ino, Some(u), si, len)),
                None => self.gone.push((n.ino, u)),
            }
        }
    }
}

fn blocks_for(bytes: usize) -> usize {
    bytes.div_ceil(PAYLOAD).max(1)
}

/// A unit frame of a segment chosen for cleaning.
struct VictimUnit {
    kind: UnitKind,
    ino: u64,
    unit: u64,
    /// Where its frame is in the segment payload.
    off: usize,
    len: usize,
}

/// True when the copy of `v` in segment `gen` is the current one and unchanged since: it can be
/// copied as it is. (A changed unit is encoded from memory by the cut instead.)
fn still_current(n: &Inode, v: &VictimUnit, gen: u64) -> bool {
    let units_dirty = n.unit_dirt().is_some_and(|d| !d.is_empty());
    match v.kind {
        // The head is rewritten whenever anything of the inode changed.
        UnitKind::Head => {
            n.ck.head.is_some_and(|l| l.gen == gen) && !n.ck.head_dirty && !units_dirty
        }
        _ => {
            let dirty = n.unit_dirt().is_none_or(|d| d.contains(v.unit));
            n.ck.units.get(&v.unit).is_some_and(|l| l.gen == gen) && !dirty
        }
    }
}

impl FileSystem {
    /// Target payload bytes of one segment.
    fn seg_bytes(&self) -> usize {
        ((self.medium.len() / 1024) as usize).clamp(4 << 10, SEG_BYTES_MAX)
    }

    /// Garbage the segments may hold beyond [`GARBAGE_RATIO`] before cleaning starts.
    fn garbage_slack(&self) -> u64 {
        (self.medium.len() / 1024).clamp(4 << 10, GARBAGE_SLACK_MAX)
    }

    /// Log bytes (and estimated checkpoint bytes) at which the maintenance tick writes a
    /// checkpoint: a fixed value when the options give one, else 1/256 of the image, between
    /// [`LOG_LIMIT_MIN`] and [`LOG_LIMIT_MAX`], and never more than 1/8 of the free space.
    pub fn log_limit(&self) -> u64 {
        if self.fixed_log_limit != 0 {
            return self.fixed_log_limit;
        }
        let image = self.medium.len();
        let free = self.engine.allocator().free_blocks() * nodup_core::BLOCK_SIZE as u64;
        (image / 256)
            .clamp(LOG_LIMIT_MIN, LOG_LIMIT_MAX)
            .min(free / 8)
            .max(64 << 10)
    }

    /// Blocks the next checkpoint may need: its units (estimated from what changed), the
    /// manifest, and a margin.
    pub(crate) fn reserve_want(&self) -> usize {
        let units = self.persist.estimate() + self.persist.estimate() / 4 + (64 << 10);
        let segs = self.persist.segs.lock().len() + 2 + units as usize / self.seg_bytes();
        blocks_for(units as usize) + segs + blocks_for(24 * segs + 64) + 4
    }

    /// Segments to clean by this checkpoint, oldest-emptiest first: every segment without live
    /// units, and, while the segments hold more than [`GARBAGE_RATIO`] (plus
    /// [`FileSystem::garbage_slack`]) garbage, the emptiest ones, within `budget` live bytes.
    fn pick_victims(&self, budget: u64) -> Vec<(u64, SegRef)> {
        let slack = self.garbage_slack() as f64;
        let segs = self.persist.segs.lock();
        let size = |s: &SegInfo| s.blocks.len() as u64 * nodup_core::BLOCK_SIZE as u64;
        let mut total: u64 = segs.values().map(size).sum();
        let live: u64 = segs.values().map(|s| s.live).sum();
        let mut by_ratio: Vec<(f64, u64)> = segs
            .iter()
            .map(|(&g, s)| (s.live as f64 / size(s).max(1) as f64, g))
            .collect();
        by_ratio.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut spent = 0u64;
        let mut out = Vec::new();
        for (_, g) in by_ratio {
            let s = &segs[&g];
            let over = total as f64 > live as f64 / (1.0 - GARBAGE_RATIO) + slack;
            let eager = self.eager_cleaning && s.live < s.bytes as u64;
            if s.live > 0 && !eager && (!over || spent + s.live > budget) {
                continue;
            }
            spent += s.live;
            total = total - size(s) + s.live;
            out.push((
                g,
                SegRef {
                    head: s.blocks.first().copied().unwrap_or(0),
                    gen: g,
                    blocks: s.blocks.len() as u32,
                    bytes: s.bytes,
                },
            ));
        }
        out
    }

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
        match &r {
            Ok(()) => {
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
            }
            Err(e) => {
                st.failed += 1;
                crate::logging::error(&format!("checkpoint failed (the previous one stays): {e}"));
            }
        }
        r
    }

    fn checkpoint_locked(&self, clean: bool, t0: Instant) -> Result<()> {
        let m = &*self.medium;
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
        let mut victim_data: Vec<(u64, Vec<u8>, Vec<VictimUnit>)> = Vec::new();
        for (g, s) in &victims {
            if self.persist.segs.lock().get(g).is_some_and(|x| x.live == 0) {
                continue;
            }
            let (_, payload) = load::read_segment(m, s)?;
            let mut units = Vec::new();
            let mut at = 0usize;
            unit::for_each_unit(&payload, &mut |r| {
                units.push(VictimUnit {
                    kind: r.kind,
                    ino: r.ino,
                    unit: r.unit,
                    off: at,
                    len: r.len as usize,
                });
                at += r.len as usize;
                Ok(())
            })?;
            victim_data.push((*g, payload, units));
        }

        // Buffers for the segments, faulted in now: fresh memory touched under the gate made
        // the cut wait for page faults (slow on a VM whose memory is under pressure).
        let seg_bytes = self.seg_bytes();
        let mut pool = std::mem::take(&mut *self.seg_bufs.lock());
        let want = (self.persist.estimate() as usize + copy_bytes(&victim_data)) / seg_bytes + 2;
        let mut scratch = std::mem::take(&mut *self.cut_scratch.lock());
        scratch.reserve(want * (seg_bytes / 1024 + 1));
        while pool.len() < want.min(BUF_POOL) {
            // Non-zero fill: a zeroed allocation would map untouched zero pages.
            let mut v = vec![1u8; seg_bytes + (64 << 10)];
            v.clear();
            pool.push(v);
        }

        // ---- 1. the cut
        let gate = self.gate.write();
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
        let mut b = Builder {
            seg_bytes,
            pool,
            segs: Vec::new(),
            placed: std::mem::take(&mut scratch.placed),
            gone: std::mem::take(&mut scratch.gone),
        };
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
        let t_enc = tc.elapsed().as_secs_f64();
        let (pos, cut_counts) = {
            let mut log = self.log.lock();
            let pos = log.position();
            (pos, log.mark_cut())
        };
        let next_ino = t.next_ino;
        let t_log = tc.elapsed().as_secs_f64();
        // Generations: one per new segment and one for the manifest.
        let (gen0, man_gen) = {
            let mut meta = self.meta.lock();
            let g = meta.next_gen;
            meta.next_gen += b.segs.len() as u64 + 1;
            (g, g + b.segs.len() as u64)
        };
        // Point every written unit at its new copy; remember the old one.
        let mut changes = std::mem::take(&mut scratch.changes);
        let mut dead = std::mem::take(&mut scratch.dead);
        let mut new_live = vec![0u64; b.segs.len()];
        for &(ino, u, si, len) in &b.placed {
            let Some(node) = t.get(ino) else { continue };
            let mut n = node.write();
            let loc = Loc {
                gen: gen0 + si as u64,
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
            for (i, buf) in b.segs.iter().enumerate() {
                segs.insert(
                    gen0 + i as u64,
                    SegInfo {
                        blocks: Vec::new(),
                        bytes: buf.len() as u32,
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
            b.segs.iter().map(|s| s.len()).sum::<usize>(),
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
        let written = self.write_checkpoint(&b.segs, gen0, manifest, man_gen, &pos, clean);
        let (man_blocks, pending) = match written {
            Ok(x) => x,
            Err(e) => {
                self.undo_cut(&changes, &b, gen0, cut_counts);
                drop(gate);
                self.keep_buffers(b, changes, dead);
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
            st.last_bytes = b.segs.iter().map(|s| s.len() as u64).sum();
            st.last_inodes = inodes;
            st.segments_cleaned += victims.len() as u64;
        }
        if !free.is_empty() {
            self.engine.free_meta(&free)?;
        }
        self.keep_buffers(b, changes, dead);
        // Releases waiting for durability are covered by the fence before the switch.
        self.engine.release_batch(&pending)?;
        if !released.is_empty() {
            self.engine.release_batch(&released)?;
        }
        let _ = t0;
        Ok(())
    }

    /// Keep the segment buffers of a finished cut for the next one.
    fn keep_buffers(&self, b: Builder, mut changes: Vec<Change>, mut dead: Vec<Loc>) {
        let mut pool = self.seg_bufs.lock();
        for mut v in b.segs.into_iter().chain(b.pool) {
            if pool.len() < BUF_POOL {
                v.clear();
                pool.push(v);
            }
        }
        let (mut placed, mut gone) = (b.placed, b.gone);
        placed.clear();
        gone.clear();
        changes.clear();
        dead.clear();
        *self.cut_scratch.lock() = CutScratch {
            placed,
            gone,
            changes,
            dead,
        };
    }

    /// Step 2: segments, manifest, fence, superblock. Returns the manifest's blocks and the
    /// deferred releases the fence made safe.
    fn write_checkpoint(
        &self,
        segs: &[Vec<u8>],
        gen0: u64,
        mut manifest: Manifest,
        man_gen: u64,
        pos: &LogPos,
        clean: bool,
    ) -> Result<(Vec<BlockNr>, Vec<BlockNr>)> {
        let m = &*self.medium;
        let man_bytes = manifest_len(manifest.segs.len());
        let need: usize =
            segs.iter().map(|s| blocks_for(s.len())).sum::<usize>() + blocks_for(man_bytes);
        let mut blocks = self.take_meta_blocks(need)?;
        let give_back = |fs: &FileSystem, v: Vec<BlockNr>| fs.meta.lock().reserve.extend(v);
        let r = (|| -> Result<Vec<BlockNr>> {
            let mut at = 0;
            for (i, s) in segs.iter().enumerate() {
                let n = blocks_for(s.len());
                let bl = &blocks[at..at + n];
                at += n;
                let gen = gen0 + i as u64;
                let mut w = ChainWriter::start(m, ChainKind::Segment, gen, bl[0])?;
                w.append(m, s, &bl[1..])?;
                if let Some(e) = manifest.segs.iter_mut().find(|x| x.gen == gen) {
                    e.head = bl[0];
                }
                if let Some(si) = self.persist.segs.lock().get_mut(&gen) {
                    si.blocks = bl.to_vec();
                }
            }
            let bytes = manifest.encode();
            let bl = &blocks[at..];
            let mut w = ChainWriter::start(m, ChainKind::Manifest, man_gen, bl[0])?;
            w.append(m, &bytes, &bl[1..])?;
            Ok(bl.to_vec())
        })();
        let man_blocks = match r {
            Ok(b) => b,
            Err(e) => {
                give_back(self, std::mem::take(&mut blocks));
                return Err(e);
            }
        };
        let mut meta = self.meta.lock();
        let pending = std::mem::take(&mut *self.pending.lock());
        // Everything before the switch (data, segments, manifest) must be durable first.
        let switched = m.fence().map_err(FsError::from).and_then(|()| {
            let mut sb = meta.sb.clone();
            sb.version = FS_VERSION;
            sb.seq += 1;
            sb.ckpt_head = man_blocks[0];
            sb.ckpt_gen = man_gen;
            sb.log_head = pos.block;
            sb.log_gen = self.log.lock().gen();
            sb.log_index = pos.index;
            sb.log_off = pos.off as u32;
            sb.log_seq = pos.seq;
            sb.next_gen = meta.next_gen;
            sb.flags = if clean { FLAG_CLEAN } else { 0 };
            let slot = 1 - meta.slot;
            self.switch_sb(&meta.sb, slot, &sb)?;
            meta.sb = sb;
            meta.slot = slot;
            Ok(())
        });
        if let Err(e) = switched {
            self.pending.lock().extend(pending);
            meta.reserve.extend(blocks);
            return Err(e);
        }
        Ok((man_blocks, pending))
    }

    /// Blocks for a checkpoint: the reserve first, then the engine.
    fn take_meta_blocks(&self, need: usize) -> Result<Vec<BlockNr>> {
        let mut meta = self.meta.lock();
        let from_reserve = need.min(meta.reserve.len());
        let mut blocks: Vec<BlockNr> = meta.reserve.drain(..from_reserve).collect();
        if blocks.len() < need {
            match self.engine.alloc_meta(need - blocks.len()) {
                Ok(more) => blocks.extend(more),
                Err(e) => {
                    meta.reserve.append(&mut blocks);
                    return Err(e.into());
                }
            }
        }
        Ok(blocks)
    }

    /// A checkpoint failed after its cut: every unit it moved points at its old copy again and
    /// is marked changed, so the next checkpoint writes it.
    fn undo_cut(&self, changes: &[Change], b: &Builder, gen0: u64, cut: (u64, u64)) {
        let _g = self.gate.read();
        let t = self.tables.read();
        let mut revived: Vec<Loc> = Vec::new();
        for c in changes.iter().rev() {
            let (ino, u, old) = match c {
                Change::Head(i, o) => (*i, None, *o),
                Change::Unit(i, u, o) => (*i, Some(*u), *o),
            };
            let Some(node) = t.get(ino) else { continue };
            let mut n = node.write();
            match u {
                None => n.ck.head = old,
                Some(u) => {
                    match old {
                        Some(l) => n.ck.units.insert(u, l),
                        None => n.ck.units.remove(&u),
                    };
                    if let Some(d) = n.unit_dirt_mut() {
                        d.insert(u);
                    }
                }
            }
            revived.extend(old);
            t.persist.touch(&mut n, usize::from(u.is_some()));
        }
        let mut segs = self.persist.segs.lock();
        for i in 0..b.segs.len() {
            segs.remove(&(gen0 + i as u64));
        }
        for l in revived {
            if let Some(s) = segs.get_mut(&l.gen) {
                s.live += l.bytes as u64;
            }
        }
        drop(segs);
        self.log.lock().unmark_cut(cut);
    }

    /// Keep enough metadata blocks aside for the next checkpoint. Returns whether the reserve
    /// is as large as wanted. The caller must not hold the gate.
    pub(crate) fn top_up_reserve(&self) -> bool {
        if self.is_shut_down() {
            return true;
        }
        let want = self.reserve_want();
        let mut meta = self.meta.lock();
        if meta.reserve.len() < want {
            if let Ok(more) = self.engine.alloc_meta(want - meta.reserve.len()) {
                meta.reserve.extend(more);
            }
        } else if meta.reserve.len() > 2 * want + 64 {
            // A burst of changes wanted a large reserve; give back what the next checkpoint
            // will not need, so it shows as free space again.
            let excess: Vec<BlockNr> = meta.reserve.drain(want..).collect();
            drop(meta);
            let _ = self.engine.free_meta(&excess);
            return true;
        }
        meta.reserve.len() >= want
    }

    /// Would a checkpoint give blocks back? (log blocks before the end, deferred releases,
    /// segments with garbage).
    fn checkpoint_frees(&self) -> bool {
        if self.log.lock().blocks().len() > 1 || !self.pending.lock().is_empty() {
            return true;
        }
        let (_, bytes, live) = self.persist.seg_totals();
        bytes > live + PAYLOAD as u64
    }

    /// Before an operation that takes `data_blocks` new data blocks and appends up to
    /// `log_bytes` to the log: the checkpoint reserve must cover what changed, data must leave
    /// some blocks free for log appends, and the log must have room. When that fails, a
    /// checkpoint (which gives back the log before its cut and cleaned segments) and deferred
    /// releases are tried first: ENOSPC only when the space is really used. The caller must
    /// not hold the gate.
    ///
    /// `grows` is set for operations that add metadata (data writes, new inodes): they need the
    /// full reserve. Others (unlink, rename, attribute changes) may borrow from it.
    pub(crate) fn ensure_space(
        &self,
        data_blocks: u64,
        grows: bool,
        log_bytes: usize,
    ) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        // Past a limit, the maintenance thread is woken to checkpoint now. Far past it (no
        // maintenance thread, or one that cannot keep up) the operation does it itself.
        let logged = self.log.lock().bytes();
        let est = self.persist.estimate();
        let limit = self.log_limit();
        if logged > limit || est > DIRTY_LIMIT {
            self.wake_maintenance();
        }
        if logged > 8 * limit || est > 8 * DIRTY_LIMIT {
            match self.checkpoint(false) {
                Ok(()) => {}
                Err(e) if e.errno() == libc::ENOSPC => {}
                Err(e) => return Err(e),
            }
        }
        for attempt in 0..2 {
            let reserve_ok = !grows || self.top_up_reserve();
            let free = self.engine.allocator().free_blocks();
            let data_ok =
                data_blocks == 0 || free >= data_blocks.saturating_add(crate::fs::LOG_HEADROOM);
            if reserve_ok && data_ok && self.log_room(log_bytes) {
                return Ok(());
            }
            if attempt == 1 {
                break;
            }
            if !self.durable && !self.pending.lock().is_empty() {
                self.sync()?;
                continue;
            }
            if !self.checkpoint_frees() {
                break;
            }
            match self.checkpoint(false) {
                Ok(()) => {}
                Err(e) if e.errno() == libc::ENOSPC => break,
                Err(e) => return Err(e),
            }
        }
        if !grows && self.lend_reserve(log_bytes) {
            return Ok(());
        }
        errno(libc::ENOSPC)
    }

    /// Make sure the log can take `bytes` more without asking the allocator for blocks it
    /// does not have (pre-fills the spare pool).
    fn log_room(&self, bytes: usize) -> bool {
        let short = self.log.lock().blocks_short(bytes);
        if short == 0 {
            return true;
        }
        let want = short.max(crate::log::writer::LOG_REFILL);
        let got = self
            .engine
            .alloc_meta(want)
            .or_else(|_| self.engine.alloc_meta(short));
        match got {
            Ok(b) => {
                self.log.lock().spare.extend(b);
                true
            }
            Err(_) => false,
        }
    }

    /// On a full device, lend the log blocks from the checkpoint reserve so that removing
    /// files (which frees space) still works; the reserve is topped up again later.
    fn lend_reserve(&self, bytes: usize) -> bool {
        let short = self.log.lock().blocks_short(bytes);
        let mut meta = self.meta.lock();
        if meta.reserve.len() < short {
            return false;
        }
        let lent: Vec<BlockNr> = meta.reserve.drain(..short).collect();
        drop(meta);
        self.log.lock().spare.extend(lent);
        true
    }

    /// Periodic work: make BlockFile state durable and hand back deferred releases, checkpoint
    /// when the log or the changed metadata passed the limit or the file system is idle with
    /// changes, keep the checkpoint reserve filled.
    pub fn tick(&self) -> Result<()> {
        if self.read_only || self.is_shut_down() {
            return Ok(());
        }
        if !self.durable && !self.pending.lock().is_empty() {
            self.sync()?;
        }
        let log_bytes = self.log.lock().bytes();
        let changed = log_bytes > 0 || self.persist.queued() > 0;
        let limit = self.log_limit();
        let idle = self.idle_ms() >= IDLE_MS;
        let dirty = self.persist.estimate() > limit.min(DIRTY_LIMIT);
        if log_bytes > limit || dirty || (idle && changed) {
            self.checkpoint(false)?;
        }
        self.top_up_reserve();
        Ok(())
    }
}

/// CPU time of the calling thread, seconds (tells a slow cut from a preempted one in the log).
fn thread_cpu_secs() -> f64 {
    // SAFETY: clock_gettime fills the timespec it is given.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Bytes of the victims' units (an upper bound of what cleaning copies).
fn copy_bytes(victims: &[(u64, Vec<u8>, Vec<VictimUnit>)]) -> usize {
    victims.iter().map(|(_, p, _)| p.len()).sum()
}

/// Encoded bytes of a manifest listing `n` segments.
fn manifest_len(n: usize) -> usize {
    crate::persist::manifest::HEADER + crate::persist::manifest::ENTRY * n + 4
}
