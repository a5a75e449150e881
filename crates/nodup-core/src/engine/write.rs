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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{add_nonzero, Engine, WriteCtx};
use crate::index::{ent_of, loc_of, Pending};
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

/// An entry created by the current call, persisted in phase 2.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Created {
    loc: u64,
    fp: u64,
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
        // No prefetch state crosses calls.
        ctx.prefetched = None;
        let r1 = self.phase1(ctx, blocks, &mut out, &mut t, &mut st);
        // Unused read-ahead blocks go back, newest first, so the allocator cursor rewinds.
        let mut r0 = Ok(());
        while let Some(b) = ctx.ahead.pop_back() {
            r0 = r0.and(self.alloc.unalloc(b));
        }
        ctx.ahead_prefetched = 0;
        let r2 = self.commit(ctx, &mut t);
        self.merge_tally(&t);
        let c = &self.c;
        c.blocks_written.fetch_add(st.blocks, Ordering::Relaxed);
        add_nonzero(&c.dedup_hits, st.hits);
        add_nonzero(&c.fp_collisions, st.collisions);
        add_nonzero(&c.hint_hits, st.hint_hits);
        add_nonzero(&c.hint_misses, st.hint_misses);
        c.physical_blocks
            .fetch_add(ctx.new_blocks.len() as u64, Ordering::Relaxed);
        match r1.and(r0).and(r2) {
            Ok(()) => Ok(out),
            Err(e) => {
                // Everything decided so far is durable; hand the references back.
                let _ = self.release_blocks(&out);
                ctx.prev = None;
                Err(e)
            }
        }
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
        for (i, data) in blocks.iter().enumerate() {
            st.blocks += 1;
            if let Some(next) = blocks.get(i + 1) {
                prefetch::input(next);
            }
            if never {
                out.push(self.new_block(ctx, data, t)?);
                continue;
            }
            let before = ctx.new_blocks.len();
            if ctx.last_new {
                // The stream is writing new data: take the blocks this one and the next will
                // probably need and start loading their lines a block ahead, so the copy does
                // not stall on them (the loads run while inputs are fingerprinted and copied).
                if ctx.ahead.len() < 2 {
                    self.alloc.alloc_batch(
                        &mut ctx.apool,
                        AHEAD_BATCH.min(n - i + 1),
                        &mut ctx.ahead,
                    );
                }
                while ctx.ahead_prefetched < 2 && ctx.ahead_prefetched < ctx.ahead.len() {
                    let b = ctx.ahead[ctx.ahead_prefetched];
                    self.medium
                        .prefetch(b * BLOCK_SIZE as u64, BLOCK_SIZE, prefetch::LINE);
                    ctx.ahead_prefetched += 1;
                }
            }
            let mut cur: Option<(BlockNr, Option<Prev>)> = None;
            if let Some(p) = ctx.prev {
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
            let (b, next) = match cur {
                Some(x) => x,
                None => {
                    let fp = self.fpr.fingerprint(data);
                    match self.policy.decide(fp) {
                        Decision::Skip => (self.new_block(ctx, data, t)?, None),
                        Decision::Dedup => self.dedup_one(ctx, fp, data, t, st)?,
                    }
                }
            };
            out.push(b);
            ctx.last_new = ctx.new_blocks.len() > before;
            self.track_hint(ctx, next, t, st)?;
        }
        Ok(())
    }

    /// Allocate a block and store `data` in it (flushed in phase 2).
    fn new_block(&self, ctx: &mut WriteCtx, data: &[u8], t: &mut IoTally) -> Result<BlockNr> {
        let b = match ctx.ahead.pop_front() {
            Some(b) => {
                ctx.ahead_prefetched = ctx.ahead_prefetched.saturating_sub(1);
                b
            }
            None => self.alloc.alloc(&mut ctx.apool)?,
        };
        if let Err(e) = self.medium.write(b * BLOCK_SIZE as u64, data) {
            let _ = self.alloc.free(b);
            return Err(e);
        }
        t.data_written += BLOCK_SIZE as u64;
        ctx.new_blocks.push(b);
        Ok(b)
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

    /// Basic dedup of one block with fingerprint `fp`.
    fn dedup_one(
        &self,
        ctx: &mut WriteCtx,
        fp: u64,
        data: &[u8],
        t: &mut IoTally,
        st: &mut CallStats,
    ) -> Result<(BlockNr, Option<Prev>)> {
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
                // The block was stored earlier in this call: it is compared like any other.
                if self.policy.verify()
                    && !self.same_content(&mut ctx.scratch, b, data, self.prefetch, t)?
                {
                    st.collisions += 1;
                    drop(sh);
                    return Ok((self.new_block(ctx, data, t)?, None));
                }
                let c = &mut ctx.created[k];
                c.refs += 1;
                st.hits += 1;
                self.policy.on_hit(fp);
                Ok((
                    c.blocknr,
                    Some(Prev {
                        loc: c.loc,
                        hint: c.hint,
                        created: Some(k),
                    }),
                ))
            }
            Some(Found::Other) => Ok((self.new_block(ctx, data, t)?, None)),
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
                    return Ok((self.new_block(ctx, data, t)?, None));
                }
                self.incref(ctx, loc, e.refcount, t)?;
                st.hits += 1;
                self.policy.on_hit(fp);
                Ok((
                    e.blocknr,
                    Some(Prev {
                        loc,
                        hint: Hint(e.hint),
                        created: None,
                    }),
                ))
            }
            None => {
                let b = self.new_block(ctx, data, t)?;
                let loc = match self.layout.alloc_entry(
                    &self.meta,
                    t,
                    fp,
                    ctx.pool,
                    &self.alloc,
                    &mut ctx.apool,
                ) {
                    Ok(l) => l,
                    // No room for metadata: the block is still stored, just not deduplicated.
                    Err(Error::NoSpace) => return Ok((b, None)),
                    Err(e) => {
                        ctx.new_blocks.pop();
                        let _ = self.alloc.free(b);
                        return Err(e);
                    }
                };
                let k = ctx.created.len();
                ctx.created.push(Created {
                    loc,
                    fp,
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
                self.policy.on_insert(fp);
                Ok((
                    b,
                    Some(Prev {
                        loc,
                        hint: Hint::NONE,
                        created: Some(k),
                    }),
                ))
            }
        }
    }

    /// Refcount + 1 of a committed entry (flushed and fenced at the end of the call, one flush
    /// per line of consecutive entries).
    fn incref(&self, ctx: &mut WriteCtx, loc: u64, old: u64, t: &mut IoTally) -> Result<()> {
        self.meta
            .write_u64(t, loc + OFF_REFCOUNT, old.saturating_add(1))?;
        ctx.touched.push(loc + OFF_REFCOUNT);
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
        let (sh, h) = self.index.lock(fp);
        // The hint is only a guess: the target must still be the committed entry of `fp`
        // (an entry freed or reused since the hint was written is not in the index under it).
        let live = sh.pending_at(target).is_none()
            && sh
                .table
                .find(h, |ent| (loc_of(ent) == target).then_some(()))
                .is_some();
        if !live {
            return Ok(None);
        }
        let e = self.meta.read_entry(t, target)?;
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

    /// Phase 2: data durable, then entries and reverse map durable, then publish.
    fn commit(&self, ctx: &mut WriteCtx, t: &mut IoTally) -> Result<()> {
        let m = &*self.medium;
        if !ctx.new_blocks.is_empty() {
            // Flush every new block of the call together, then one fence orders them all before
            // the entries that name them. (Flushing each block right after its copy was measured
            // slower for every policy: the next locked instruction waits for the write-back.)
            let mut runs = Runs::new();
            for &b in &ctx.new_blocks {
                runs.add(m, b * BLOCK_SIZE as u64, BLOCK_SIZE as u64);
            }
            runs.finish(m);
            m.fence()?;
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
        let mut res = Ok(());
        for c in &ctx.created {
            let e = DedupEntry {
                fp: c.fp,
                blocknr: c.blocknr,
                refcount: c.refs,
                hint: c.hint.0,
            };
            res = res
                .and_then(|_| self.meta.write_entry(t, c.loc, &e))
                .and_then(|_| {
                    self.meta
                        .write_u64(t, self.revmap.slot_off(c.blocknr), c.loc)
                });
            eruns.add(mm, c.loc, 32);
            rruns.add(mm, self.revmap.slot_off(c.blocknr), 8);
        }
        eruns.finish(mm);
        rruns.finish(mm);
        res = res.and_then(|_| self.meta.fence());
        ctx.touched.clear();
        // Publish: one lock per shard rather than one per entry.
        ctx.publish.clear();
        ctx.publish.extend(
            ctx.created
                .iter()
                .map(|c| (self.index.shard_of(c.fp), c.loc)),
        );
        ctx.publish.sort_unstable();
        for group in ctx.publish.chunk_by(|a, b| a.0 == b.0) {
            let mut sh = self.index.lock_shard(group[0].0);
            for &(_, loc) in group {
                sh.unpend(loc);
            }
        }
        if let Some(p) = ctx.prev.as_mut() {
            p.created = None;
        }
        res
    }

    /// Drop one reference to each block of `blocks` (see [`Engine::release_batch`]).
    pub(super) fn release_blocks(&self, blocks: &[BlockNr]) -> Result<()> {
        let mut t = IoTally::default();
        let mut to_free: Vec<BlockNr> = Vec::new();
        let mut freed: std::collections::HashSet<BlockNr> = std::collections::HashSet::new();
        let mut slots: Vec<u64> = Vec::new();
        let mut res = Ok(());
        for &b in blocks {
            if !self.in_data(b) || !self.alloc.is_allocated(b) || freed.contains(&b) {
                res = Err(Error::Invalid(format!(
                    "block {b} is not an allocated data block (or was released past zero)"
                )));
                break;
            }
            match self.release_one(b, &mut t, &mut slots) {
                Ok(true) => {
                    freed.insert(b);
                    to_free.push(b);
                }
                Ok(false) => {}
                Err(e) => {
                    res = Err(e);
                    break;
                }
            }
        }
        // One fence makes every decrement and every cleared entry and reverse-map slot
        // durable; only then may the slots and blocks be reused.
        let f = self.meta.fence();
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
        }
        self.merge_tally(&t);
        res.and(f)
    }

    /// Drop one reference to `b` without fencing; returns whether the block is now free (the
    /// caller frees it after the fence; freed entry slots are collected in `slots`).
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
        if e.refcount > 1 {
            self.meta.write_u64(t, loc + OFF_REFCOUNT, e.refcount - 1)?;
            self.meta.flush(loc + OFF_REFCOUNT, 8);
            return Ok(false);
        }
        // Last reference: unindex (under the shard lock, so no writer can find it any more),
        // clear the entry (blocknr 0 frees the slot) and the reverse map.
        sh.table.remove(h, ent_of(loc));
        self.meta.write(t, loc + OFF_BLOCKNR, &[0u8; 16])?;
        self.meta.flush(loc + OFF_BLOCKNR, 16);
        self.revmap.set(&self.meta, t, b, 0)?;
        slots.push(loc);
        Ok(true)
    }
}
