//! The inline-dedup write path and release (Light-Dedup §4.2–4.3).
//!
//! One call runs in two phases. Phase 1 decides every block: speculation through a trusted hint,
//! else fingerprint + index lookup under the fingerprint's shard lock, byte comparison, refcount
//! increment (flushed) on a duplicate; a new block gets its data written and an entry slot
//! claimed and indexed as *pending*, so a concurrent writer of the same content cannot create a
//! second entry (it writes a non-dedup block instead). Phase 2 flushes all new data, fences,
//! writes the new entries and reverse-map slots, fences once more and publishes the entries.
//! Data is durable before its entry, and both before `write` returns. An entry is a single
//! 32-byte store inside one cache line, so cache-line write-back never exposes half of it; a
//! crash that tears it at 8 bytes leaves an entry whose block nobody references, which failure
//! recovery drops.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{add_nonzero, Engine, WriteCtx};
use crate::index::{ent_of, loc_of, Pending, SHARDS};
use crate::media::{AccessMeter, Medium, MeterConfig};
use crate::meta::io::IoTally;
use crate::meta::record::{DedupEntry, Hint, OFF_BLOCKNR, OFF_FP, OFF_HINT, OFF_REFCOUNT};
use crate::policy::prefetch::{self, trusted, update_hint, update_stream, HintOutcome, TRUST_MAX};
use crate::policy::{Decision, PrefetchMode};
use crate::{BlockNr, Error, Result, BLOCK_SIZE};

/// The entry the previous block of a stream mapped to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prev {
    loc: u64,
    hint: Hint,
    /// Index into `WriteCtx::created` when the entry was created by the current call.
    created: Option<usize>,
}

/// A block fingerprinted (and on mapped media already copied) ahead of its lookup.
#[derive(Debug, Clone, Copy)]
struct Staged {
    /// Position of the block in the call.
    i: usize,
    fp: u64,
    /// The block it was copied into (claimed by this call).
    block: Option<BlockNr>,
}

/// An entry created by the current call, persisted in phase 2.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Created {
    loc: u64,
    fp: u64,
    /// Position of its data in the call's input (the block itself may not be copied yet).
    src: usize,
    blocknr: u64,
    refs: u64,
    hint: Hint,
}

/// Counters of one call.
#[derive(Debug, Default)]
struct CallStats {
    blocks: u64,
    hits: u64,
    collisions: u64,
    hint_hits: u64,
    hint_misses: u64,
}

/// Coalesces ranges into runs of cache lines, so each line of a run is flushed once.
struct Runs {
    /// First line of the current run.
    start: u64,
    /// One past the last line (== start: no run).
    end: u64,
}

impl Runs {
    fn new() -> Runs {
        Runs { start: 0, end: 0 }
    }
    fn add(&mut self, m: &dyn Medium, off: u64, len: u64) {
        let l0 = off / LINE;
        let l1 = (off + len.max(1) - 1) / LINE + 1;
        if self.end > self.start && l0 >= self.start && l0 <= self.end {
            self.end = self.end.max(l1);
            return;
        }
        self.finish(m);
        self.start = l0;
        self.end = l1;
    }
    fn finish(&mut self, m: &dyn Medium) {
        if self.end > self.start {
            m.flush(self.start * LINE, (self.end - self.start) * LINE);
        }
        self.start = 0;
        self.end = 0;
    }
}

/// Blocks a writer allocates ahead under one pool lock.
const AHEAD_BATCH: usize = 8;

/// Most blocks staged (fingerprinted and copied) ahead of their lookups (8, 16, 32 and 64 were
/// measured; 32 was best on the 2 MiB calls of `bench engine`).
const STAGE_GROUP: usize = 32;

/// Cache-line size used to coalesce flushes.
const LINE: u64 = 64;

/// Counts the writers inside the write path for the transition threshold.
struct Active<'a>(&'a AtomicUsize);

impl<'a> Active<'a> {
    fn enter(a: &'a AtomicUsize) -> Active<'a> {
        a.fetch_add(1, Ordering::Relaxed);
        Active(a)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a lookup under the shard lock ended.
enum Found {
    /// An entry of this call: deduplicate against it in DRAM.
    Mine(usize),
    /// An entry of another in-flight call: not durable yet, write a non-dedup block.
    Other,
    /// A committed entry.
    Live(u64, DedupEntry),
}

/// The metadata medium and, when it is one, the meter itself.
pub(super) type MetaMedium = (Arc<dyn Medium>, Option<Arc<AccessMeter>>);

/// The medium to use for metadata: an access meter over `m` when a granularity is asked.
pub(super) fn meta_medium(m: &Arc<dyn Medium>, granularity: Option<usize>) -> Result<MetaMedium> {
    match granularity {
        None => Ok((m.clone(), None)),
        Some(g) => {
            let meter = Arc::new(AccessMeter::new(
                m.clone(),
                MeterConfig::with_granularity(g),
            )?);
            Ok((meter.clone(), Some(meter)))
        }
    }
}

impl Engine {
    pub(super) fn write_blocks(
        &self,
        ctx: &mut WriteCtx,
        blocks: &[&[u8]],
    ) -> Result<Vec<BlockNr>> {
        self.check_ready()?;
        if let Some(b) = blocks.iter().find(|b| b.len() != BLOCK_SIZE) {
            return Err(Error::Invalid(format!("write of a {}-byte block", b.len())));
        }
        self.bind(ctx);
        let _active = Active::enter(&self.active);
        let mut out = Vec::with_capacity(blocks.len());
        let mut t = IoTally::default();
        let mut st = CallStats::default();
        ctx.new_blocks.clear();
        ctx.created.clear();
        ctx.touched.clear();
        ctx.copies.clear();
        // No prefetch state crosses calls.
        ctx.prefetched = None;
        let r1 = self.phase1(ctx, blocks, &mut out, &mut t, &mut st);
        // Unused read-ahead blocks go back, newest first, so the allocator cursor rewinds.
        let mut r0 = Ok(());
        while let Some(b) = ctx.ahead.pop_back() {
            r0 = r0.and(self.alloc.unalloc(b));
        }
        r0 = r0.and(self.return_slots(ctx, &mut t));
        let res = r1
            .and(r0)
            .and_then(|_| self.copy_new(ctx, blocks, &mut t))
            .and_then(|_| self.persist(ctx, &mut t));
        if let Err(e) = res {
            // Nothing of this call is published yet: undo all of it, so the live engine is
            // exactly as before the call (no leaked block, entry or reference).
            if self.rollback(ctx, &mut t).is_err() {
                // The live state can no longer be trusted; the caller's references on the
                // medium still are, so failure recovery (next open) rebuilds everything.
                self.set_state(super::STATE_NEEDS_RECOVERY);
            }
            self.merge_tally(&t);
            ctx.prev = None;
            return Err(e);
        }
        self.publish(ctx);
        self.merge_tally(&t);
        let c = &self.c;
        c.blocks_written.fetch_add(st.blocks, Ordering::Relaxed);
        add_nonzero(&c.dedup_hits, st.hits);
        add_nonzero(&c.fp_collisions, st.collisions);
        add_nonzero(&c.hint_hits, st.hint_hits);
        add_nonzero(&c.hint_misses, st.hint_misses);
        c.physical_blocks
            .fetch_add(ctx.new_blocks.len() as u64, Ordering::Relaxed);
        Ok(out)
    }

    fn phase1(
        &self,
        ctx: &mut WriteCtx,
        blocks: &[&[u8]],
        out: &mut Vec<BlockNr>,
        t: &mut IoTally,
        st: &mut CallStats,
    ) -> Result<()> {
        let n = blocks.len();
        let never = self.policy.never_dedups();
        // Blocks staged ahead of their lookup (see `stage`), in input order.
        let mut early: VecDeque<Staged> = VecDeque::new();
        // How many blocks to stage at once: doubles while the stream keeps writing new data.
        let mut group = 1;
        for (i, data) in blocks.iter().enumerate() {
            st.blocks += 1;
            ctx.blocks_left = n - i;
            if never {
                out.push(self.new_block(ctx, i, t)?);
                continue;
            }
            if early.is_empty() && ctx.last_new {
                // The stream is writing new data, so these blocks will all be looked up (a
                // block after a new one cannot follow a hint): stage them together, then
                // decide them together. Their index slots load meanwhile, and the lookups'
                // locked instructions wait for the staged copies to drain once per group
                // rather than once per block.
                let end = (i + group).min(n);
                if self.fused && ctx.ahead.len() < end - i {
                    // Every block of the group is claimed under one allocator lock before the
                    // first copy: a lock taken between two copies waits for the first one's
                    // stores to drain.
                    let want = end - i - ctx.ahead.len();
                    self.alloc.alloc_batch(&mut ctx.apool, want, &mut ctx.ahead);
                }
                for (j, b) in blocks.iter().enumerate().take(end).skip(i) {
                    early.push_back(self.stage(ctx, j, b, t)?);
                }
            }
            let staged = match early.front() {
                Some(s) if s.i == i => early.pop_front(),
                _ => None,
            };
            let mut cur: Option<(BlockNr, Option<Prev>)> = None;
            if let (Some(p), None) = (ctx.prev, staged) {
                if trusted(p.hint)
                    && p.created.is_none()
                    && self.layout.is_entry_loc(p.hint.target())
                {
                    match self.prefetch {
                        PrefetchMode::Sp | PrefetchMode::Pn | PrefetchMode::Cbp => {
                            cur = self.speculate(ctx, p.hint.target(), data, i + 1 < n, t, st)?;
                        }
                        PrefetchMode::Pc => self.prefetch_target(p.hint.target(), t)?,
                        _ => {}
                    }
                }
            }
            let (b, next, new) = match cur {
                Some((b, next)) => (b, next, false),
                None => {
                    let (fp, pre) = match staged {
                        Some(s) => (s.fp, s.block),
                        None => (self.fpr.fingerprint(data), None),
                    };
                    match self.policy.decide(fp) {
                        Decision::Skip => (self.place(ctx, i, pre, t)?, None, true),
                        Decision::Dedup => self.dedup_one(ctx, blocks, i, fp, pre, t, st)?,
                    }
                }
            };
            out.push(b);
            ctx.last_new = new;
            group = if new { (group * 2).min(STAGE_GROUP) } else { 1 };
            self.track_hint(ctx, next, t, st)?;
        }
        Ok(())
    }

    /// Fingerprint block `i` ahead of its lookup and start loading its index slot. On a
    /// mapped medium it is also copied, in the same pass, into a block claimed for it (new
    /// data is the likely outcome while the stream writes new data; a duplicate gives the
    /// block back).
    fn stage(&self, ctx: &mut WriteCtx, i: usize, data: &[u8], t: &mut IoTally) -> Result<Staged> {
        if !self.fused {
            let fp = self.fpr.fingerprint(data);
            self.index.prefetch(fp);
            return Ok(Staged { i, fp, block: None });
        }
        let b = self.claim_block(ctx)?;
        let mut fp = 0;
        let fpr = &*self.fpr;
        let direct = self
            .medium
            .fill_with(b * BLOCK_SIZE as u64, BLOCK_SIZE, &mut |dst| {
                // SAFETY: `dst.ptr` is this claimed block's place in the mapping (BLOCK_SIZE
                // bytes, bounds-checked and line-aligned by the medium), which no one else
                // writes or reads yet; the store kind is the one the medium asks for.
                fp = unsafe { fpr.fingerprint_into(data, dst) };
            })?;
        if !direct {
            self.store(b, data, t)?;
            fp = fpr.fingerprint(data);
        } else {
            t.data_written += BLOCK_SIZE as u64;
        }
        self.index.prefetch(fp);
        Ok(Staged {
            i,
            fp,
            block: Some(b),
        })
    }

    /// An entry slot for a new block: from the writer's batch of claimed slots, refilled with
    /// one layout call (one lock) for the blocks still to come, else claimed alone.
    fn claim_entry(&self, ctx: &mut WriteCtx, fp: u64, t: &mut IoTally) -> Result<u64> {
        if ctx.slots.is_empty() && ctx.blocks_left > 1 {
            let n = ctx.blocks_left.min(STAGE_GROUP);
            // An error here (e.g. no room for a new region) leaves the single claim below to
            // report it; a media error the single claim then gets past is counted as absorbed.
            let r = self.layout.alloc_entries(
                &self.meta,
                t,
                ctx.pool,
                &self.alloc,
                &mut ctx.apool,
                n,
                &mut ctx.slots,
            );
            if matches!(r, Err(Error::Io(_))) && ctx.slots.is_empty() {
                let one = self.layout.alloc_entry(
                    &self.meta,
                    t,
                    fp,
                    ctx.pool,
                    &self.alloc,
                    &mut ctx.apool,
                );
                if one.is_ok() {
                    t.errors_absorbed += 1;
                }
                return one;
            }
        }
        match ctx.slots.pop_front() {
            Some(loc) => Ok(loc),
            None => {
                self.layout
                    .alloc_entry(&self.meta, t, fp, ctx.pool, &self.alloc, &mut ctx.apool)
            }
        }
    }

    /// Give back the claimed slots the call did not use (they hold the reserved marker, which
    /// nothing trusts; clearing it makes them free again). A failed clear is tried once more;
    /// a slot that stays reserved would be counted in use with no entry in it, so the engine
    /// then asks for failure recovery, which clears it.
    fn return_slots(&self, ctx: &mut WriteCtx, t: &mut IoTally) -> Result<()> {
        let mut res = Ok(());
        while let Some(loc) = ctx.slots.pop_front() {
            let first = self.meta.write_u64(t, loc + OFF_BLOCKNR, 0);
            let cleared = first.is_ok() || self.meta.write_u64(t, loc + OFF_BLOCKNR, 0).is_ok();
            if cleared {
                self.layout.free_entry(loc);
            } else {
                self.set_state(super::STATE_NEEDS_RECOVERY);
            }
            if let Err(e) = first {
                res = Err(e);
            }
        }
        res
    }

    /// A staged block that turned out a duplicate: back to the front of the read-ahead blocks.
    fn unclaim(&self, ctx: &mut WriteCtx, b: BlockNr) {
        if let Some(k) = ctx.new_blocks.iter().rposition(|&x| x == b) {
            ctx.new_blocks.remove(k);
            ctx.ahead.push_front(b);
        }
    }

    /// The block for data stored without an entry: the staged one, else a new one.
    fn place(
        &self,
        ctx: &mut WriteCtx,
        i: usize,
        pre: Option<BlockNr>,
        t: &mut IoTally,
    ) -> Result<BlockNr> {
        match pre {
            Some(b) => Ok(b),
            None => self.new_block(ctx, i, t),
        }
    }

    /// Allocate a block for input block `i` (copied after phase 1, flushed in phase 2).
    fn new_block(&self, ctx: &mut WriteCtx, i: usize, t: &mut IoTally) -> Result<BlockNr> {
        let _ = t;
        let b = self.claim_block(ctx)?;
        ctx.copies.push((b, i));
        Ok(b)
    }

    /// Take the next block for new data (read-ahead first) and record it as this call's, so a
    /// failed call gives it back.
    fn claim_block(&self, ctx: &mut WriteCtx) -> Result<BlockNr> {
        if ctx.ahead.is_empty() {
            // One allocator lock for several blocks.
            let want = AHEAD_BATCH.min(ctx.blocks_left.max(1));
            self.alloc.alloc_batch(&mut ctx.apool, want, &mut ctx.ahead);
        }
        let b = match ctx.ahead.pop_front() {
            Some(b) => b,
            None => self.alloc.alloc(&mut ctx.apool)?,
        };
        ctx.new_blocks.push(b);
        Ok(b)
    }

    /// Copy `data` into block `b` (flushed in phase 2).
    fn store(&self, b: BlockNr, data: &[u8], t: &mut IoTally) -> Result<()> {
        self.medium.write_stream(b * BLOCK_SIZE as u64, data)?;
        t.data_written += BLOCK_SIZE as u64;
        Ok(())
    }

    /// Compare `data` with stored block `b`, prefetching as `mode` says.
    fn same_content(
        &self,
        scratch: &mut Vec<u8>,
        b: BlockNr,
        data: &[u8],
        mode: PrefetchMode,
        t: &mut IoTally,
    ) -> Result<bool> {
        let off = b * BLOCK_SIZE as u64;
        prefetch::before_compare(&*self.medium, mode, off);
        t.data_read += BLOCK_SIZE as u64;
        if let Some(s) = self.medium.direct(off, BLOCK_SIZE) {
            return Ok(s == data);
        }
        scratch.resize(BLOCK_SIZE, 0);
        self.medium.read(off, scratch)?;
        Ok(scratch[..] == *data)
    }

    /// Basic dedup of one block with fingerprint `fp`; `pre` is the block it was already
    /// copied into, if it was staged. Returns the block, the entry it maps to, and whether the
    /// block is new (stored by this call) rather than a duplicate.
    #[allow(clippy::too_many_arguments)]
    fn dedup_one(
        &self,
        ctx: &mut WriteCtx,
        blocks: &[&[u8]],
        i: usize,
        fp: u64,
        pre: Option<BlockNr>,
        t: &mut IoTally,
        st: &mut CallStats,
    ) -> Result<(BlockNr, Option<Prev>, bool)> {
        let data = blocks[i];
        let (mut sh, h) = self.index.lock(fp);
        let mut err = None;
        let found = {
            let shard = &*sh;
            let created = &ctx.created;
            let id = ctx.id;
            shard.table.find(h, |ent| {
                let loc = loc_of(ent);
                if let Some(p) = shard.pending_at(loc) {
                    if p.owner == id {
                        return (created[p.slot].fp == fp).then_some(Found::Mine(p.slot));
                    }
                    return (p.fp == fp).then_some(Found::Other);
                }
                match self.meta.read_entry(t, loc) {
                    Ok(e) if e.fp == fp && e.is_valid() => Some(Found::Live(loc, e)),
                    Ok(_) => None,
                    Err(e) => {
                        err = Some(e);
                        Some(Found::Other)
                    }
                }
            })
        };
        if let Some(e) = err {
            return Err(e);
        }
        match found {
            Some(Found::Mine(k)) => {
                let b = ctx.created[k].blocknr;
                // A block of this call: compared with its input (it may not be copied yet).
                if self.policy.verify() && blocks[ctx.created[k].src] != data {
                    st.collisions += 1;
                    drop(sh);
                    return Ok((self.place(ctx, i, pre, t)?, None, true));
                }
                let c = &mut ctx.created[k];
                c.refs += 1;
                let prev = Prev {
                    loc: c.loc,
                    hint: c.hint,
                    created: Some(k),
                };
                st.hits += 1;
                self.policy.on_hit(fp);
                if let Some(p) = pre {
                    self.unclaim(ctx, p);
                }
                Ok((b, Some(prev), false))
            }
            Some(Found::Other) => {
                drop(sh);
                Ok((self.place(ctx, i, pre, t)?, None, true))
            }
            Some(Found::Live(loc, e)) => {
                if !self.in_data(e.blocknr) {
                    return Err(Error::Corrupt(format!(
                        "entry at {loc} names block {}",
                        e.blocknr
                    )));
                }
                if self.policy.verify()
                    && !self.same_content(&mut ctx.scratch, e.blocknr, data, self.prefetch, t)?
                {
                    // Same fingerprint, different bytes: a collision. Store the block without an entry.
                    st.collisions += 1;
                    drop(sh);
                    return Ok((self.place(ctx, i, pre, t)?, None, true));
                }
                self.incref(ctx, loc, e.refcount, t)?;
                drop(sh);
                st.hits += 1;
                self.policy.on_hit(fp);
                if let Some(p) = pre {
                    self.unclaim(ctx, p);
                }
                Ok((
                    e.blocknr,
                    Some(Prev {
                        loc,
                        hint: Hint(e.hint),
                        created: None,
                    }),
                    false,
                ))
            }
            None => {
                // A new block. Its number, entry slot and index record are claimed before the
                // data is copied (unless staging copied it already) and the shard lock is
                // dropped first: the locked instructions of the claim then do not wait for
                // the copy's stores to drain, and the copy's write-back overlaps the next
                // block's work.
                let b = match pre {
                    Some(b) => b,
                    None => self.claim_block(ctx)?,
                };
                let loc = match self.claim_entry(ctx, fp, t) {
                    Ok(l) => l,
                    // No room for metadata: the block is still stored, just not deduplicated.
                    Err(Error::NoSpace) => {
                        drop(sh);
                        if pre.is_none() {
                            ctx.copies.push((b, i));
                        }
                        return Ok((b, None, true));
                    }
                    Err(e) => return Err(e),
                };
                let k = ctx.created.len();
                ctx.created.push(Created {
                    loc,
                    fp,
                    src: i,
                    blocknr: b,
                    refs: 1,
                    hint: Hint::NONE,
                });
                sh.table.insert(h, ent_of(loc));
                sh.pending.push(Pending {
                    loc,
                    owner: ctx.id,
                    slot: k,
                    fp,
                });
                drop(sh);
                self.policy.on_insert(fp);
                if pre.is_none() {
                    ctx.copies.push((b, i));
                }
                Ok((
                    b,
                    Some(Prev {
                        loc,
                        hint: Hint::NONE,
                        created: Some(k),
                    }),
                    true,
                ))
            }
        }
    }

    /// Refcount + 1 of a committed entry (flushed and fenced at the end of the call, one flush
    /// per line of consecutive entries).
    /// The caller holds the entry's shard lock.
    fn incref(&self, ctx: &mut WriteCtx, loc: u64, old: u64, t: &mut IoTally) -> Result<()> {
        let off = loc + OFF_REFCOUNT;
        if let Err(e) = self.meta.write_u64(t, off, old.saturating_add(1)) {
            // A failed (possibly partial) store: put the old count back, or give up on the
            // live state if even that fails.
            if self.meta.write_u64(t, off, old).is_err() {
                self.set_state(super::STATE_NEEDS_RECOVERY);
            }
            return Err(e);
        }
        ctx.touched.push(off);
        Ok(())
    }

    /// Speculation (SP): compare directly with the block of the hinted entry, skipping the
    /// fingerprint and the index. Also issues prefetch-next (PN/CBP). `None` = fall back.
    fn speculate(
        &self,
        ctx: &mut WriteCtx,
        target: u64,
        data: &[u8],
        more: bool,
        t: &mut IoTally,
        st: &mut CallStats,
    ) -> Result<Option<(BlockNr, Option<Prev>)>> {
        let fp = self.meta.read_u64(t, target + OFF_FP)?;
        let (sh, _) = self.index.lock(fp);
        // The hint is only a guess, checked on the entry itself as the paper's SP does, without
        // probing the index (a cache miss per block that cost more than SP saves on DRAM).
        // Under the lock of `fp`'s shard, a slot that holds `fp` and a valid block number is the
        // committed entry of `fp`, unless it is pending here (a call still in flight): freeing
        // clears the block number and unindexes under this lock, rollback clears before it
        // unlocks, and a new entry's block number is stored last, after its fingerprint is
        // durable (`persist`), and read first here. The byte comparison then proves the
        // duplicate.
        if sh.pending_at(target).is_some() {
            return Ok(None);
        }
        let e = self.meta.read_entry_ordered(t, target)?;
        if !e.is_valid() || e.fp != fp || !self.in_data(e.blocknr) {
            return Ok(None);
        }
        let mode = self.prefetch;
        let off = e.blocknr * BLOCK_SIZE as u64;
        // Prefetch-next of the previous block already started loading this one.
        if ctx.prefetched != Some(e.blocknr) {
            prefetch::before_compare(&*self.medium, mode, off);
        }
        ctx.prefetched = None;
        let next_ok = match mode {
            PrefetchMode::Pn => true,
            PrefetchMode::Cbp => self.active.load(Ordering::Relaxed) < self.transition,
            _ => false,
        };
        if more && next_ok && ctx.stream_trust == TRUST_MAX {
            let h2 = Hint(e.hint);
            if trusted(h2) && self.layout.is_entry_loc(h2.target()) {
                let b2 = self.meta.read_u64(t, h2.target() + OFF_BLOCKNR)?;
                if self.in_data(b2) {
                    prefetch::next_block(&*self.medium, b2 * BLOCK_SIZE as u64);
                    ctx.prefetched = Some(b2);
                }
            }
        }
        if !self.same_content(&mut ctx.scratch, e.blocknr, data, PrefetchMode::None, t)? {
            return Ok(None);
        }
        self.incref(ctx, target, e.refcount, t)?;
        drop(sh);
        st.hits += 1;
        self.policy.on_hit(fp);
        Ok(Some((
            e.blocknr,
            Some(Prev {
                loc: target,
                hint: Hint(e.hint),
                created: None,
            }),
        )))
    }

    /// Prefetch-Current: start loading the hinted entry's block before fingerprinting.
    fn prefetch_target(&self, target: u64, t: &mut IoTally) -> Result<()> {
        let b = self.meta.read_u64(t, target + OFF_BLOCKNR)?;
        if self.in_data(b) {
            prefetch::before_compare(&*self.medium, PrefetchMode::Ibp, b * BLOCK_SIZE as u64);
        }
        Ok(())
    }

    /// Judge the previous entry's hint against the entry this block used, update trust degrees.
    fn track_hint(
        &self,
        ctx: &mut WriteCtx,
        cur: Option<Prev>,
        t: &mut IoTally,
        st: &mut CallStats,
    ) -> Result<()> {
        let mut cur = cur;
        if let (Some(p), Some(c)) = (ctx.prev, cur.as_mut()) {
            let (nh, outcome) = update_hint(p.hint, c.loc);
            if trusted(p.hint) {
                match outcome {
                    HintOutcome::Right => st.hint_hits += 1,
                    HintOutcome::Wrong => st.hint_misses += 1,
                    HintOutcome::Created => {}
                }
            }
            ctx.stream_trust = update_stream(ctx.stream_trust, outcome);
            if nh != p.hint {
                match p.created {
                    Some(k) => ctx.created[k].hint = nh,
                    // Hints are performance state: written in place, not flushed.
                    None => self.meta.write_u64(t, p.loc + OFF_HINT, nh.0)?,
                }
                if c.loc == p.loc {
                    c.hint = nh;
                }
            }
        }
        ctx.prev = cur;
        Ok(())
    }

    /// Copy the new blocks decided in phase 1. Deferred to here so that no locked instruction
    /// of the lookups waits for a copy's stores to drain: the lookups and claims run while the
    /// store buffer is nearly empty, and the copies run back to back like a plain write's.
    fn copy_new(&self, ctx: &mut WriteCtx, blocks: &[&[u8]], t: &mut IoTally) -> Result<()> {
        for &(b, i) in &ctx.copies {
            self.store(b, blocks[i], t)?;
        }
        Ok(())
    }

    /// Phase 2: data durable, then entries and reverse map durable (published by [`Self::publish`]).
    fn persist(&self, ctx: &mut WriteCtx, t: &mut IoTally) -> Result<()> {
        if !ctx.new_blocks.is_empty() {
            // New blocks were written and flushed (`fill_with` / `write_stream`): one fence
            // orders them all before the entries that name them.
            self.medium.fence()?;
        }
        if ctx.created.is_empty() && ctx.touched.is_empty() {
            return Ok(());
        }
        let mm = &**self.meta.medium();
        let mut eruns = Runs::new();
        for &off in &ctx.touched {
            eruns.add(mm, off, 8);
        }
        let mut rruns = Runs::new();
        for c in &ctx.created {
            let e = DedupEntry {
                fp: c.fp,
                blocknr: c.blocknr,
                refcount: c.refs,
                hint: c.hint.0,
            };
            // The block number last: a speculating writer reads a hinted slot without the
            // index (see `speculate`) and must never see a valid block number beside the
            // fingerprint of the slot's previous life. (Random crash states, beyond what
            // write-back produces, may still persist it alone; that entry belongs to this
            // call, whose blocks nobody references yet, and failure recovery drops it.)
            self.meta.write_entry_body(t, c.loc, &e)?;
            self.meta.publish_blocknr(t, c.loc, c.blocknr)?;
            self.meta
                .write_u64(t, self.revmap.slot_off(c.blocknr), c.loc)?;
            eruns.add(mm, c.loc, 32);
            rruns.add(mm, self.revmap.slot_off(c.blocknr), 8);
        }
        eruns.finish(mm);
        rruns.finish(mm);
        self.meta.fence()
    }

    /// Make the call's new entries visible to other writers (one lock per shard).
    fn publish(&self, ctx: &mut WriteCtx) {
        ctx.touched.clear();
        // Group by shard with a counting sort (a call creates up to hundreds of entries).
        let mut start = [0usize; SHARDS + 1];
        for c in &ctx.created {
            start[self.index.shard_of(c.fp) + 1] += 1;
        }
        for s in 0..SHARDS {
            start[s + 1] += start[s];
        }
        ctx.publish.clear();
        ctx.publish.resize(ctx.created.len(), (0, 0));
        for c in &ctx.created {
            let s = self.index.shard_of(c.fp);
            ctx.publish[start[s]] = (s, c.loc);
            start[s] += 1;
        }
        for group in ctx.publish.chunk_by(|a, b| a.0 == b.0) {
            let mut sh = self.index.lock_shard(group[0].0);
            for &(_, loc) in group {
                sh.unpend(loc);
            }
        }
        if let Some(p) = ctx.prev.as_mut() {
            p.created = None;
        }
    }

    /// Undo a failed call before anything of it was published: unindex and clear its new
    /// entries (and their reverse-map slots), take back its reference-count increments, and
    /// free its new blocks once all that is durable. Every step is attempted even after an
    /// error; the first error is returned.
    fn rollback(&self, ctx: &mut WriteCtx, t: &mut IoTally) -> Result<()> {
        let mut res = Ok(());
        let mm = &**self.meta.medium();
        for c in &ctx.created {
            let (mut sh, h) = self.index.lock(c.fp);
            // blocknr and refcount to zero: the slot is free again (it may hold a complete
            // entry if the call failed after writing it). Cleared before the lock is dropped,
            // so a speculating writer never finds it valid once it is neither pending nor
            // indexed.
            res = res.and(self.meta.write(t, c.loc + OFF_BLOCKNR, &[0u8; 16]));
            sh.unpend(c.loc);
            sh.table.remove(h, ent_of(c.loc));
            drop(sh);
            mm.flush(c.loc + OFF_BLOCKNR, 16);
            let slot = self.revmap.slot_off(c.blocknr);
            res = res.and(self.meta.write_u64(t, slot, 0));
            mm.flush(slot, 8);
        }
        for &off in &ctx.touched {
            res = res.and(self.decref_touched(off - OFF_REFCOUNT, t));
        }
        res = res.and(self.meta.fence());
        if res.is_ok() {
            // Only once nothing durable names them may the slots and blocks be reused.
            for c in &ctx.created {
                self.layout.free_entry(c.loc);
            }
            for &b in &ctx.new_blocks {
                res = res.and(self.alloc.free(b));
            }
        }
        ctx.created.clear();
        ctx.new_blocks.clear();
        ctx.touched.clear();
        res
    }

    /// Take back one reference-count increment of the committed entry at `loc` (under its
    /// shard lock, as other writers may have changed the count since).
    fn decref_touched(&self, loc: u64, t: &mut IoTally) -> Result<()> {
        let fp = self.meta.read_u64(t, loc + OFF_FP)?;
        let _sh = self.index.lock(fp);
        let rc = self.meta.read_u64(t, loc + OFF_REFCOUNT)?;
        if rc < 2 {
            return Err(Error::Corrupt(format!(
                "entry at {loc}: reference count {rc} below the increment being undone"
            )));
        }
        self.meta.write_u64(t, loc + OFF_REFCOUNT, rc - 1)?;
        self.meta.flush(loc + OFF_REFCOUNT, 8);
        Ok(())
    }

    /// Drop one reference to each block of `blocks` (see [`Engine::release_batch`]).
    ///
    /// The caller has already dropped these references durably, so a release that fails
    /// half-way would leave the live counts above the caller's: a failed step is undone and
    /// tried once more, and when that fails too the engine asks for failure recovery (which
    /// rebuilds the counts from the caller's references) instead of running on wrong counts.
    /// A step that failed once is reported as an error even when its second try worked; the
    /// remaining blocks are still released.
    pub(super) fn release_blocks(&self, blocks: &[BlockNr]) -> Result<()> {
        let mut t = IoTally::default();
        let mut to_free: Vec<BlockNr> = Vec::new();
        let mut freed: std::collections::HashSet<BlockNr> = std::collections::HashSet::new();
        let mut slots: Vec<u64> = Vec::new();
        let mut soft: Option<Error> = None;
        let mut res = Ok(());
        for &b in blocks {
            if !self.in_data(b) || !self.alloc.is_allocated(b) || freed.contains(&b) {
                res = Err(Error::Invalid(format!(
                    "block {b} is not an allocated data block (or was released past zero)"
                )));
                break;
            }
            let r = match self.release_one(b, &mut t, &mut slots) {
                Err(e @ Error::Io(_)) => {
                    // Reported even when the second try works: the caller saw an I/O error.
                    soft.get_or_insert(e);
                    self.release_one(b, &mut t, &mut slots)
                }
                r => r,
            };
            match r {
                Ok(true) => {
                    freed.insert(b);
                    to_free.push(b);
                }
                Ok(false) => {}
                Err(e) => {
                    if matches!(e, Error::Io(_)) {
                        self.set_state(super::STATE_NEEDS_RECOVERY);
                    }
                    res = Err(e);
                    break;
                }
            }
        }
        // One fence makes every decrement and every cleared entry and reverse-map slot
        // durable; only then may the slots and blocks be reused.
        let f = self.meta.fence().or_else(|e| {
            soft.get_or_insert(e);
            self.meta.fence()
        });
        if f.is_ok() {
            for loc in slots {
                self.layout.free_entry(loc);
            }
            for b in &to_free {
                res = res.and(self.alloc.free(*b));
            }
            self.c
                .physical_blocks
                .fetch_sub(to_free.len() as u64, Ordering::Relaxed);
        } else {
            // The blocks stay allocated (leaked until recovery) rather than reused while an
            // entry naming them may still be on the medium.
            self.set_state(super::STATE_NEEDS_RECOVERY);
        }
        self.merge_tally(&t);
        res.and(f).and(soft.map_or(Ok(()), Err))
    }

    /// Drop one reference to `b` without fencing; returns whether the block is now free (the
    /// caller frees it after the fence; freed entry slots are collected in `slots`). On an
    /// error nothing is changed (a failed store is undone), unless undoing failed too.
    fn release_one(&self, b: BlockNr, t: &mut IoTally, slots: &mut Vec<u64>) -> Result<bool> {
        let loc = self.revmap.get(&self.meta, t, b)?;
        if loc == 0 {
            // A block without an entry (non-dedup, collision, policy none): free it directly.
            return Ok(true);
        }
        if !self.layout.is_entry_loc(loc) {
            return Err(Error::Corrupt(format!(
                "reverse map of block {b} names {loc}, not an entry"
            )));
        }
        let fp = self.meta.read_u64(t, loc + OFF_FP)?;
        let (mut sh, h) = self.index.lock(fp);
        let e = self.meta.read_entry(t, loc)?;
        if e.blocknr != b || e.fp != fp {
            return Err(Error::Corrupt(format!(
                "reverse map of block {b} names the entry of block {}",
                e.blocknr
            )));
        }
        let undo = |t: &mut IoTally, err: Error| -> Error {
            let mut r = self.meta.write_entry(t, loc, &e);
            r = r.and_then(|_| self.revmap.set(&self.meta, t, b, loc));
            if r.is_err() {
                self.set_state(super::STATE_NEEDS_RECOVERY);
            }
            err
        };
        if e.refcount > 1 {
            if let Err(err) = self.meta.write_u64(t, loc + OFF_REFCOUNT, e.refcount - 1) {
                return Err(undo(t, err));
            }
            self.meta.flush(loc + OFF_REFCOUNT, 8);
            return Ok(false);
        }
        // Last reference: clear the entry (blocknr 0 frees the slot) and the reverse map, then
        // unindex (under the shard lock, so no writer can find it any more).
        let cleared = self
            .meta
            .write(t, loc + OFF_BLOCKNR, &[0u8; 16])
            .and_then(|_| self.revmap.set(&self.meta, t, b, 0));
        if let Err(err) = cleared {
            return Err(undo(t, err));
        }
        self.meta.flush(loc + OFF_BLOCKNR, 16);
        sh.table.remove(h, ent_of(loc));
        slots.push(loc);
        Ok(true)
    }
}
