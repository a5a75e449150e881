//! The out-of-line worker of `smart` (SmartDedup §3.3): it takes blocks from the skipped
//! buffer, finds each one's fingerprint (from inline dedup, the block's entry, or by reading
//! it), asks the engine for another copy anywhere in the fingerprint stores, and on a match
//! remaps the file's block onto it through the file system's log ([`FileSystem::remap_block`]:
//! atomic, crash-safe, skipped when a write raced with it). A block with no copy and no entry
//! (not fingerprinted inline) gets an entry, so later copies find it. With a run filter of T
//! blocks, only runs of at least T consecutive file blocks whose copies are consecutive stored
//! blocks are remapped, counting what the file already maps contiguously around them.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nodup_core::{BlockNr, BLOCK_SIZE};

use super::skipped::Item;
use crate::error::Result;
use crate::fs::FileSystem;
use crate::remap::{AdoptOutcome, RemapOutcome};

/// How often the worker wakes.
const TICK: Duration = Duration::from_millis(100);
/// How often it samples the machine.
const SAMPLE: Duration = Duration::from_secs(1);
/// How often it checkpoints the skipped buffer (when it changed).
const CHECKPOINT: Duration = Duration::from_secs(30);
/// Blocks of a whole-file scan taken per step.
const SCAN_CHUNK: u64 = 256;
/// Most blocks one step works on (the budget's worker share sets the step below this).
pub const STEP_MAX: usize = 256;
/// Fewest blocks a step works on, whatever the budget.
const STEP_MIN: usize = 16;

/// A block under consideration.
#[derive(Debug, Clone, Copy)]
struct Cand {
    ino: u64,
    lbn: u64,
    own: BlockNr,
    fp: u64,
    /// `fp` comes from the skipped buffer, not from the block's entry or bytes: the file block
    /// may have been rewritten since it was queued (a truncate's or a punch's partial block,
    /// a copy), so it is only a hint until checked against the bytes.
    fp_queued: bool,
    has_entry: bool,
    /// Another stored copy, with its references.
    to: Option<(BlockNr, u64)>,
    /// Second visit: moves even toward a less referenced copy (see `apply_candidates`).
    again: bool,
}

/// A queued block: inode, file block, fingerprint when queued with one, second visit.
type Queued = (u64, u64, Option<u64>, bool);

/// The worker's per-step scratch, reserved once from the budget's worker share and reused, so
/// that a step allocates nothing and the worker's memory is part of the budget.
#[derive(Debug)]
pub struct StepScratch {
    /// Blocks a step takes at most.
    step: usize,
    items: Vec<Queued>,
    taken: Vec<Item>,
    cands: Vec<Cand>,
    /// References to each stored block among a step's candidates.
    here: HashMap<BlockNr, u64>,
}

/// Scratch bytes per block of a step, besides the reference map.
const VEC_BYTES_PER_BLOCK: usize =
    std::mem::size_of::<Queued>() + std::mem::size_of::<Item>() + std::mem::size_of::<Cand>();
/// Bytes of one reference-map bucket (the pair and its control byte).
const MAP_BUCKET_BYTES: usize = std::mem::size_of::<(BlockNr, u64)>() + 1;

/// Bytes of the reference map's table with `buckets` buckets (the standard hash map's layout:
/// a control byte per bucket plus one group of 16).
fn map_table_bytes(buckets: usize) -> usize {
    buckets * MAP_BUCKET_BYTES + 16
}

/// Buckets the standard hash map allocates for `entries` (8/7 of them, to a power of two).
fn map_buckets(entries: usize) -> usize {
    match entries {
        0..4 => 4,
        4..8 => 8,
        _ => (entries * 8 / 7).next_power_of_two(),
    }
}

/// Scratch bytes of a step of `step` blocks.
fn scratch_bytes(step: usize) -> usize {
    step * VEC_BYTES_PER_BLOCK + map_table_bytes(map_buckets(step))
}

impl StepScratch {
    /// Scratch within `bytes`: steps of as many blocks as fit (between 16 and [`STEP_MAX`];
    /// 16 even when they do not fit).
    pub fn new(bytes: u64) -> StepScratch {
        let mut step = STEP_MAX;
        while step > STEP_MIN && scratch_bytes(step) as u64 > bytes {
            step -= 1;
        }
        StepScratch {
            step,
            items: Vec::with_capacity(step),
            taken: Vec::with_capacity(step),
            cands: Vec::with_capacity(step),
            here: HashMap::with_capacity(step),
        }
    }

    /// Blocks a step takes at most.
    pub fn step(&self) -> usize {
        self.step
    }

    /// Heap bytes reserved (fixed: a step never holds more than `step` blocks).
    pub fn memory_bytes(&self) -> u64 {
        let vecs = self.items.capacity() * std::mem::size_of::<Queued>()
            + self.taken.capacity() * std::mem::size_of::<Item>()
            + self.cands.capacity() * std::mem::size_of::<Cand>();
        // A table of 8 or more buckets holds 7/8 of them.
        let buckets = match self.here.capacity() {
            0 => 0,
            c if c < 7 => map_buckets(c),
            c => c * 8 / 7,
        };
        (vecs
            + if buckets > 0 {
                map_table_bytes(buckets)
            } else {
                0
            }) as u64
    }
}

thread_local! {
    /// Set while this thread runs a step (it holds `SmartFs::scratch`).
    static IN_STEP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True on a thread inside a `smart` worker step: it holds the step's lock, which failure
/// recovery while mounted takes first, so it must not run one.
pub(crate) fn in_step() -> bool {
    IN_STEP.with(|f| f.get())
}

/// Marks the thread as inside a step until dropped.
struct InStep;

impl InStep {
    fn enter() -> InStep {
        IN_STEP.with(|f| f.set(true));
        InStep
    }
}

impl Drop for InStep {
    fn drop(&mut self) {
        IN_STEP.with(|f| f.set(false));
    }
}

impl FileSystem {
    /// Work through at most `max` (and at most a step's worth, see [`StepScratch`]) queued
    /// blocks now; returns how many were looked at (0 when nothing is queued). Not a policy
    /// with a worker: always 0.
    pub fn smart_step(&self, max: usize) -> Result<usize> {
        let Some(s) = &self.smart else {
            return Ok(0);
        };
        // Held for the whole step (two callers at once take turns). It is taken before any
        // other lock and never while one is held, so the step's other locks under it cannot
        // deadlock.
        let mut scratch = s.scratch.lock();
        let _in_step = InStep::enter();
        let StepScratch {
            step,
            items,
            taken,
            cands,
            here,
        } = &mut *scratch;
        let max = max.min(*step);
        items.clear();
        while items.len() < max {
            // A file being scanned whole goes first.
            // The file's size is read without `scan` held: a writer takes `buf` under its
            // inode lock and `stats` reads `scan` and `buf`, so no inode lock may be taken under
            // `scan` (only this worker moves `scan`; the re-check is for safety).
            let cur = *s.scan.lock();
            let scanning = match cur {
                Some((ino, next)) => {
                    let blocks = self
                        .node(ino)
                        .map(|n| n.read().attr.size.div_ceil(BLOCK_SIZE as u64))
                        .unwrap_or(0);
                    let end = blocks.min(next + SCAN_CHUNK.min((max - items.len()) as u64));
                    let mut scan = s.scan.lock();
                    if *scan == cur {
                        items.extend((next..end).map(|l| (ino, l, None, false)));
                        *scan = (end < blocks).then_some((ino, end));
                    }
                    true
                }
                None => false,
            };
            if scanning {
                continue;
            }
            // Second visits only in a step of their own (see `take_into`).
            let allow_again = items.is_empty();
            s.buf
                .lock()
                .take_into(max - items.len(), allow_again, taken);
            if taken.is_empty() {
                break;
            }
            for it in taken.drain(..) {
                match it {
                    Item::Block {
                        ino,
                        lbn,
                        fp,
                        again,
                    } => items.push((ino, lbn, fp, again)),
                    Item::File { ino } => {
                        // Taken only while no file is being scanned (see above).
                        *s.scan.lock() = Some((ino, 0));
                        s.stats.lock().files_scanned += 1;
                    }
                }
            }
        }
        if items.is_empty() {
            return Ok(0);
        }
        items.sort_unstable_by_key(|&(i, l, _, _)| (i, l));
        items.dedup_by_key(|x| (x.0, x.1));
        let n = items.len();
        cands.clear();
        for &(ino, lbn, fp, again) in items.iter() {
            match self.candidate(ino, lbn, fp, again) {
                Ok(Some(c)) => cands.push(c),
                Ok(None) => {}
                Err(e) => {
                    s.stats.lock().errors += 1;
                    crate::logging::warn(&format!("smart worker: inode {ino} block {lbn}: {e}"));
                }
            }
        }
        self.apply_candidates(cands, here, s.min_run)?;
        s.stats.lock().processed += n as u64;
        Ok(n)
    }

    /// Fingerprint and copy elsewhere of file block `lbn` of `ino` (`None`: nothing to do).
    fn candidate(&self, ino: u64, lbn: u64, fp: Option<u64>, again: bool) -> Result<Option<Cand>> {
        let own = match self.mapped_block(ino, lbn) {
            Ok(0) => return Ok(None),
            Ok(b) => b,
            // Unlinked since: nothing to do.
            Err(e) if e.errno() == libc::ENOENT => return Ok(None),
            Err(e) => return Err(e),
        };
        let entry = self.engine.block_entry(own)?;
        let (fp, fp_queued) = match (fp, entry) {
            (_, Some((efp, _))) => (efp, false),
            (Some(f), None) => (f, true),
            (None, None) => {
                let own_fp = self.block_fingerprint(own)?;
                if let Some(s) = &self.smart {
                    s.stats.lock().read_bytes += BLOCK_SIZE as u64;
                }
                (own_fp, false)
            }
        };
        let to = self.engine.find_duplicate(fp, own)?;
        Ok(Some(Cand {
            ino,
            lbn,
            own,
            fp,
            fp_queued,
            has_entry: entry.is_some(),
            to,
            again,
        }))
    }

    /// Remap the candidates that pass the run filter, adopt the blocks with no copy.
    fn apply_candidates(
        &self,
        cands: &[Cand],
        here: &mut HashMap<BlockNr, u64>,
        min_run: usize,
    ) -> Result<()> {
        let Some(s) = &self.smart else { return Ok(()) };
        // References to each block among these candidates: when all of a block's references
        // are here, they all move, whichever copy has more.
        here.clear();
        for c in cands {
            *here.entry(c.own).or_default() += 1;
        }
        let mut i = 0;
        while i < cands.len() {
            let c = cands[i];
            if c.to.is_none() {
                if !c.has_entry {
                    let out = self.adopt_block(c.ino, c.lbn, c.own, c.fp, c.fp_queued);
                    if c.fp_queued
                        && matches!(out, Ok(AdoptOutcome::Adopted | AdoptOutcome::Stale(_)))
                    {
                        s.stats.lock().read_bytes += BLOCK_SIZE as u64;
                    }
                    match out {
                        Ok(AdoptOutcome::Adopted) => s.stats.lock().adopted += 1,
                        Ok(AdoptOutcome::Skipped) => {}
                        Ok(AdoptOutcome::Stale(_)) => {
                            // Looked for under another content's fingerprint: `adopt_block`
                            // queued it again with its own, so a later step searches its real
                            // copies.
                            s.stats.lock().stale += 1;
                        }
                        Err(e) => {
                            s.stats.lock().errors += 1;
                            crate::logging::warn(&format!("smart worker: adopt: {e}"));
                        }
                    }
                } else {
                    s.stats.lock().unique += 1;
                    if let Err(e) = self.engine.confirm_unique(c.own, c.fp) {
                        s.stats.lock().errors += 1;
                        crate::logging::warn(&format!("smart worker: confirm: {e}"));
                    }
                }
                i += 1;
                continue;
            }
            // The run of consecutive file blocks with consecutive copies starting here.
            let mut j = i + 1;
            while j < cands.len()
                && cands[j].ino == c.ino
                && cands[j].lbn == cands[j - 1].lbn + 1
                && cands[j].to.is_some()
                && cands[j].to.map(|t| t.0) == cands[j - 1].to.map(|t| t.0 + 1)
            {
                j += 1;
            }
            let mut run = j - i;
            if run < min_run {
                run += self.contiguous_around(&cands[i], &cands[j - 1], min_run - run);
            }
            if run < min_run {
                s.stats.lock().filtered += (j - i) as u64;
                i = j;
                continue;
            }
            for c in &cands[i..j] {
                let Some((to, _)) = c.to else { continue };
                let left = here.get(&c.own).copied().unwrap_or(0);
                if let Some(n) = here.get_mut(&c.own) {
                    *n = n.saturating_sub(1);
                }
                // References move toward the more referenced copy (a tie moves this one), so
                // one pass over a file's blocks leaves one copy: moving both ways could trade
                // references between two copies forever. Unless every remaining reference of
                // this copy is among the candidates: then all of them move. Counts are read
                // now, as earlier moves of this step changed them. A block left in place that
                // way is queued once more: when its copy's other references were queued too
                // but fell into other steps (a step holds a few hundred blocks), or were never
                // queued, nothing would ever move them or the other copy's; on its second visit
                // it moves regardless, which leaves one copy whenever its references get
                // visited.
                let own_refs = self.engine.block_entry(c.own)?.map_or(1, |e| e.1);
                let Some((_, to_refs)) = self.engine.block_entry(to)? else {
                    s.stats.lock().unique += 1;
                    continue;
                };
                if own_refs > to_refs && left < own_refs && !c.again {
                    let fp = (!c.fp_queued).then_some(c.fp);
                    let again = s.buf.lock().push_again(c.ino, c.lbn, fp);
                    let mut st = s.stats.lock();
                    st.kept += 1;
                    st.second_visits += u64::from(again);
                    continue;
                }
                let out = self.remap_block(c.ino, c.lbn, c.own, to);
                let mut st = s.stats.lock();
                match out {
                    Ok(RemapOutcome::Done) => st.remapped += 1,
                    Ok(RemapOutcome::Moved) => st.moved += 1,
                    Ok(RemapOutcome::Differs) => st.differs += 1,
                    Ok(RemapOutcome::NoEntry) => st.unique += 1,
                    Err(e) => {
                        st.errors += 1;
                        drop(st);
                        crate::logging::warn(&format!("smart worker: remap: {e}"));
                    }
                }
            }
            i = j;
        }
        Ok(())
    }

    /// File blocks already mapped contiguously with the run `first..=last` would make (before
    /// `first` and after `last`), counting up to `want`.
    fn contiguous_around(&self, first: &Cand, last: &Cand, want: usize) -> usize {
        let mut n = 0;
        let (Some((f, _)), Some((l, _))) = (first.to, last.to) else {
            return 0;
        };
        let mut k = 1;
        while n < want && first.lbn >= k && f > k {
            match self.mapped_block(first.ino, first.lbn - k) {
                Ok(b) if b == f - k => n += 1,
                _ => break,
            }
            k += 1;
        }
        let mut k = 1;
        while n < want {
            match self.mapped_block(last.ino, last.lbn + k) {
                Ok(b) if b != 0 && b == l + k => n += 1,
                _ => break,
            }
            k += 1;
        }
        n
    }

    /// Run the worker until nothing is queued (tests, benches, `fsck`-like settling).
    pub fn smart_settle(&self) -> Result<()> {
        while self.smart_step(usize::MAX)? > 0 {}
        Ok(())
    }

    /// Write the skipped buffer's checkpoint now (when the image has room for one).
    pub fn smart_checkpoint(&self) -> Result<()> {
        let Some(s) = &self.smart else { return Ok(()) };
        let Some(at) = s.ckpt_at else { return Ok(()) };
        use super::persist::{ROOM_INOS, ROOM_PAIRS};
        // `scan` and `buf` one after the other, never nested (see `SmartFs::idle`).
        let scanning = s.scan.lock().map(|(ino, _)| ino);
        let mut words = Vec::new();
        let pairs = s
            .buf
            .lock()
            .checkpoint_words(scanning, ROOM_PAIRS, ROOM_INOS, &mut words);
        super::persist::store(&*self.medium, at, pairs, &words)?;
        s.dirty.store(false, Ordering::Relaxed);
        *s.last_ckpt.lock() = Instant::now();
        Ok(())
    }

    /// Start the background worker (a mount does; an embedded user may instead call
    /// [`FileSystem::smart_step`]). Nothing happens for other policies or read-only opens.
    pub fn start_smart_worker(self: &Arc<Self>) -> Result<()> {
        let Some(s) = &self.smart else { return Ok(()) };
        let fs = Arc::clone(self);
        let h = std::thread::Builder::new()
            .name("nodup-smart".into())
            .spawn(move || fs.worker_loop())?;
        *s.thread.lock() = Some(h);
        Ok(())
    }

    /// Stop the background worker and wait for it (before the file system shuts down).
    pub fn stop_smart_worker(&self) {
        if let Some(s) = &self.smart {
            s.stop.store(true, Ordering::Relaxed);
            let h = s.thread.lock().take();
            if let Some(h) = h {
                if h.thread().id() != std::thread::current().id() {
                    let _ = h.join();
                }
            }
        }
    }

    fn worker_loop(&self) {
        let Some(s) = &self.smart else { return };
        let mut last_sample = Instant::now() - SAMPLE;
        let mut carry = 0.0f64;
        while !s.stop.load(Ordering::Relaxed) && !self.is_shut_down() {
            std::thread::sleep(TICK);
            if last_sample.elapsed() >= SAMPLE {
                last_sample = Instant::now();
                let ov = *s.overrides.lock();
                let r = s.sampler.lock().sample(&ov);
                self.engine.policy().set_resources(r);
            }
            if s.dirty.load(Ordering::Relaxed) && s.last_ckpt.lock().elapsed() >= CHECKPOINT {
                if let Err(e) = self.smart_checkpoint() {
                    crate::logging::warn(&format!("smart: skipped-buffer checkpoint: {e}"));
                }
            }
            let factor = self.engine.policy().resources().map_or(1.0, |r| r.factor());
            carry += *s.rate.lock() as f64 * factor * TICK.as_secs_f64();
            let n = carry.floor() as usize;
            if n == 0 {
                continue;
            }
            carry -= n as f64;
            let mut left = n;
            while left > 0 && !s.stop.load(Ordering::Relaxed) {
                match self.smart_step(left) {
                    Ok(0) => {
                        carry = 0.0;
                        break;
                    }
                    Ok(k) => left = left.saturating_sub(k),
                    Err(e) => {
                        crate::logging::warn(&format!("smart worker: {e}"));
                        carry = 0.0;
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_scratch_stays_in_its_share() {
        // Every share from 2 KiB to 64 KiB: the reserved scratch fits it (unless the step is at
        // its floor of 16 blocks), and the map never grows past what was reserved.
        for kib in 2..=64u64 {
            let bytes = kib << 10;
            let mut s = StepScratch::new(bytes);
            assert!(
                (STEP_MIN..=STEP_MAX).contains(&s.step()),
                "{bytes}: {}",
                s.step()
            );
            let reserved = s.memory_bytes();
            if s.step() > STEP_MIN {
                assert!(reserved <= bytes, "{bytes}: {reserved}");
            }
            for k in 0..s.step() as u64 {
                s.here.insert(k, k);
            }
            assert_eq!(s.memory_bytes(), reserved, "{bytes}: the map grew");
        }
        // The shares of a 512 KiB and a 3 MiB budget take useful steps.
        assert!(StepScratch::new(32 << 10).step() >= 128);
        assert_eq!(
            StepScratch::new(nodup_core::policy::smart::WORKER_MAX).step(),
            STEP_MAX
        );
    }
}
