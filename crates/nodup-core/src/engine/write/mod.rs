//! The inline-dedup write path and release (Light-Dedup §4.2–4.3).
//!
//! One call runs in two phases. Phase 1 decides every block: speculation through a trusted hint,
//! else fingerprint + lookup in the policy's store under the fingerprint's entry lock, byte comparison, refcount
//! increment (flushed) on a duplicate; a new block gets its data written and an entry slot
//! claimed and indexed as *pending*, so a concurrent writer of the same content cannot create a
//! second entry (it writes a non-dedup block instead). Phase 2 flushes all new data, fences,
//! writes the new entries and reverse-map slots, fences once more and publishes the entries.
//! Data is durable before its entry, and both before `write` returns (with
//! `OpenOptions::fenced_by_caller`, both only at the caller's next fence). An
//! entry's stores (body, then block number) are inside one cache line, so cache-line
//! write-back never exposes the block number without the body; a crash that keeps it alone
//! (8-byte tearing, beyond hardware) leaves an entry whose block no durable reference names
//! (without the option), which failure recovery drops.

mod join;
mod lookup;
mod persist;
mod split;
mod stage;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{add_nonzero, Engine, PolicyFlags, WriteCtx};
use crate::meta::io::IoTally;
use crate::meta::record::Hint;
use crate::policy::light::prefetch::trusted;
use crate::policy::light::Prev;
use crate::policy::{Decision, PrefetchMode};
use crate::{BlockNr, Error, Result, BLOCK_SIZE};

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
    pub(crate) loc: u64,
    fp: u64,
    /// Position of its data in the call's input (the block itself may not be copied yet).
    src: usize,
    blocknr: u64,
    refs: u64,
    pub(crate) hint: Hint,
}

impl Created {
    /// The entry as persisted, with `blocknr` in its commit field (`RESERVED` until the store
    /// that makes it valid).
    fn entry(&self, blocknr: u64) -> crate::meta::record::DedupEntry {
        crate::meta::record::DedupEntry {
            fp: self.fp,
            blocknr,
            refcount: self.refs,
            hint: self.hint.0,
        }
    }
}

/// Counters of one call.
#[derive(Debug, Default)]
pub(crate) struct CallStats {
    pub(crate) blocks: u64,
    /// Blocks looked up in the store (fingerprinted inline and not skipped by the policy).
    pub(crate) looked_up: u64,
    pub(crate) hits: u64,
    pub(crate) collisions: u64,
    pub(crate) hint_hits: u64,
    pub(crate) hint_misses: u64,
    /// Duplicates given up by the run filter.
    pub(crate) filtered: u64,
}

/// Placeholder block number of a block waiting for another call's entry (block 0 is the engine
/// superblock, never a data block).
const WAITING: BlockNr = 0;

pub(crate) use join::JoinWait;
pub use split::SplitOptions;

/// Blocks a writer allocates ahead under one pool lock.
const AHEAD_BATCH: usize = 8;

/// Most blocks staged (fingerprinted and copied) ahead of their lookups (8, 16, 32 and 64 were
/// measured; 32 was best on the 2 MiB calls of `bench engine`).
const STAGE_GROUP: usize = 32;

/// Staged-waste score at which staging stops copying ahead (it still fingerprints ahead and
/// loads index slots; new blocks are then copied after their lookup, as on unmapped media).
/// A staged block that turns out new takes 1 off the score, one that turns out a duplicate
/// (its copy wasted) adds [`STAGE_WASTE_HIT`], up to [`STAGE_WASTE_MAX`]: a stream writing
/// new data keeps the fused copy, one that alternates new and duplicate runs stops paying a
/// wasted copy for every block a group overshoots a run by.
const STAGE_WASTE_OFF: u32 = 16;
const STAGE_WASTE_HIT: u32 = 4;
const STAGE_WASTE_MAX: u32 = 64;

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
        ctx.misses.clear();
        let mut out = Vec::with_capacity(blocks.len());
        self.write_call(ctx, blocks, &mut out, true)?;
        if !ctx.waiting.is_empty() {
            if let Err(e) = self.join_waiting(ctx, blocks, &mut out) {
                // The first part of the call is published: give its references back, so a
                // failed call leaves no reference the caller does not know about.
                let done: Vec<BlockNr> = out.iter().copied().filter(|&b| b != WAITING).collect();
                if self.release_blocks(&done).is_err() {
                    self.set_state(crate::engine::STATE_NEEDS_RECOVERY);
                }
                return Err(e);
            }
        }
        Ok(out)
    }

    /// Store the blocks that met another call's pending entry (`ctx.waiting`): wait for each
    /// entry, then write them again as a call of their own, which now finds the entries
    /// published and deduplicates against them. Repeats while blocks keep meeting pending
    /// entries, up to [`join::JOIN_ROUNDS`] rounds or [`join::JOIN_WAIT`].
    fn join_waiting(
        &self,
        ctx: &mut WriteCtx,
        blocks: &[&[u8]],
        out: &mut [BlockNr],
    ) -> Result<()> {
        let deadline = std::time::Instant::now() + join::JOIN_WAIT;
        let mut round = 0;
        while !ctx.waiting.is_empty() {
            round += 1;
            let waiting = std::mem::take(&mut ctx.waiting);
            let mut in_time = true;
            for &(_, fp) in &waiting {
                in_time &= self.wait_unpended(fp, ctx.id, deadline);
            }
            let sub: Vec<&[u8]> = waiting.iter().map(|&(i, _)| blocks[i]).collect();
            let mut got = Vec::with_capacity(sub.len());
            // The blocks are not consecutive in the input: no hint links them.
            ctx.light.prev = None;
            let m0 = ctx.misses.len();
            self.write_call(ctx, &sub, &mut got, in_time && round < join::JOIN_ROUNDS)?;
            for (k, &(i, _)) in waiting.iter().enumerate() {
                out[i] = got[k];
            }
            for m in ctx.misses[m0..].iter_mut() {
                m.index = waiting[m.index].0;
            }
            for w in ctx.waiting.iter_mut() {
                w.0 = waiting[w.0].0;
            }
        }
        Ok(())
    }

    /// One pass of the write path over `blocks`, appending one block number per input to
    /// `out`; with `join`, a block that meets another call's pending entry gets [`WAITING`]
    /// and is listed in `ctx.waiting` instead of being stored.
    fn write_call(
        &self,
        ctx: &mut WriteCtx,
        blocks: &[&[u8]],
        out: &mut Vec<BlockNr>,
        join: bool,
    ) -> Result<()> {
        ctx.join = join;
        ctx.waiting.clear();
        let mut t = IoTally::default();
        let mut st = CallStats::default();
        ctx.new_blocks.clear();
        ctx.created.clear();
        ctx.touched.clear();
        ctx.copies.clear();
        // No prefetch state crosses calls.
        ctx.light.prefetched = None;
        let m0 = ctx.misses.len();
        let r1 = self.phase1(ctx, blocks, out, &mut t, &mut st);
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
                self.set_state(crate::engine::STATE_NEEDS_RECOVERY);
            }
            self.merge_tally(&t);
            ctx.light.prev = None;
            ctx.waiting.clear();
            ctx.misses.truncate(m0);
            return Err(e);
        }
        self.publish(ctx);
        if self.flags.samples {
            self.policy.after_call(st.looked_up, st.hits);
        }
        self.merge_tally(&t);
        let c = &self.c;
        // Waiting blocks are counted by the call that stores them.
        c.blocks_written
            .fetch_add(st.blocks - ctx.waiting.len() as u64, Ordering::Relaxed);
        add_nonzero(&c.dedup_hits, st.hits);
        add_nonzero(&c.fp_collisions, st.collisions);
        add_nonzero(&c.hint_hits, st.hint_hits);
        add_nonzero(&c.hint_misses, st.hint_misses);
        c.physical_blocks
            .fetch_add(ctx.new_blocks.len() as u64, Ordering::Relaxed);
        Ok(())
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
        let PolicyFlags {
            stages,
            samples,
            reports_misses: report,
            min_run,
        } = self.flags;
        // Per block, the entry a duplicate was counted on (for the run filter).
        let mut dups: Vec<Option<Prev>> = Vec::new();
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
            if stages && early.is_empty() && ctx.last_new {
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
            if let (Some(p), None) = (ctx.light.prev, staged) {
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
            let mut fp_seen = None;
            let (b, next, new) = match cur {
                Some((b, next)) => (b, next, false),
                None if samples && staged.is_none() && !self.policy.fingerprint_inline() => {
                    // Not sampled for inline dedup: stored as is, left to the worker.
                    (self.new_block(ctx, i, t)?, None, true)
                }
                None => {
                    let (fp, pre) = match staged {
                        Some(s) => (s.fp, s.block),
                        None => (self.fpr.fingerprint(data), None),
                    };
                    fp_seen = Some(fp);
                    match self.policy.decide(fp) {
                        Decision::Skip => (self.place(ctx, i, pre, t)?, None, true),
                        Decision::Lookup => {
                            st.looked_up += 1;
                            self.dedup_one(ctx, blocks, i, fp, pre, true, t, st)?
                        }
                        Decision::LookupOrInsert => {
                            st.looked_up += 1;
                            self.dedup_one(ctx, blocks, i, fp, pre, false, t, st)?
                        }
                    }
                }
            };
            if report && new && b != WAITING {
                ctx.misses.push(crate::engine::Miss {
                    index: i,
                    fp: fp_seen,
                });
            }
            if min_run > 1 {
                dups.push(if new { None } else { next });
            }
            if staged.is_some() {
                ctx.stage_waste = if new {
                    ctx.stage_waste.saturating_sub(1)
                } else {
                    (ctx.stage_waste + STAGE_WASTE_HIT).min(STAGE_WASTE_MAX)
                };
            }
            out.push(b);
            ctx.last_new = new;
            group = if new { (group * 2).min(STAGE_GROUP) } else { 1 };
            self.track_hint(ctx, next, t, st)?;
        }
        if min_run > 1 {
            self.filter_short_runs(ctx, blocks, out, &dups, min_run, report, t, st)?;
        }
        Ok(())
    }

    /// The fragmentation filter (SmartDedup §4.5, after iDedup): duplicates count only in runs
    /// of at least `min_run` consecutive input blocks that map to consecutive stored blocks; the
    /// others give their reference back and are stored as new blocks (reported as misses, so the
    /// out-of-line worker, which sees runs across calls, can still join them to a long run).
    #[allow(clippy::too_many_arguments)]
    fn filter_short_runs(
        &self,
        ctx: &mut WriteCtx,
        blocks: &[&[u8]],
        out: &mut [BlockNr],
        dups: &[Option<Prev>],
        min_run: usize,
        report: bool,
        t: &mut IoTally,
        st: &mut CallStats,
    ) -> Result<()> {
        let mut i = 0;
        while i < out.len() {
            if dups[i].is_none() {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < out.len() && dups[j].is_some() && out[j] == out[j - 1] + 1 {
                j += 1;
            }
            if j - i < min_run {
                for k in i..j {
                    let Some(p) = dups[k] else { continue };
                    match p.created {
                        Some(c) => ctx.created[c].refs -= 1,
                        None => {
                            self.decref_touched(p.loc, t)?;
                            // Rollback must not take this increment back a second time.
                            let off = p.loc + crate::meta::record::OFF_REFCOUNT;
                            if let Some(x) = ctx.touched.iter().rposition(|&o| o == off) {
                                ctx.touched.swap_remove(x);
                            }
                        }
                    }
                    st.hits -= 1;
                    st.filtered += 1;
                    out[k] = self.new_block(ctx, k, t)?;
                    if report {
                        let fp = self.fpr.fingerprint(blocks[k]);
                        ctx.misses.push(crate::engine::Miss {
                            index: k,
                            fp: Some(fp),
                        });
                    }
                }
            }
            i = j;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
