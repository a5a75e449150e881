//! Phase 2 of a write call: data durable, then entries and reverse map durable (or, with
//! `OpenOptions::fenced_by_caller`, both left to the caller's next fence), then published;
//! or, on an error, the whole call rolled back.

use std::sync::atomic::Ordering;

use crate::engine::locks::STRIPES;
use crate::engine::{Engine, WriteCtx};
use crate::media::Medium;
use crate::meta::io::IoTally;
use crate::meta::record::{OFF_BLOCKNR, OFF_FP, OFF_REFCOUNT};
use crate::{Error, Result};

/// Cache-line size used to coalesce flushes.
const LINE: u64 = 64;

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

impl Engine {
    /// Phase 2: data durable, then entries and reverse map durable (with `fenced_by_caller`,
    /// both at the caller's next fence), published by [`Self::publish`].
    pub(super) fn persist(&self, ctx: &mut WriteCtx, t: &mut IoTally) -> Result<()> {
        if !ctx.new_blocks.is_empty() {
            if self.fenced_by_caller {
                // Set before `publish`, so before any other writer can deduplicate against these
                // blocks, and before the caller's record naming them.
                self.unfenced_data.store(true, Ordering::SeqCst);
            } else {
                // New blocks were written and flushed (`fill_with` / `write_stream`): one
                // fence orders them all before the entries that name them.
                self.medium.fence()?;
            }
        }
        if ctx.created.is_empty() && ctx.touched.is_empty() {
            return Ok(());
        }
        let mm = &**self.meta.medium();
        let mut eruns = Runs::new();
        for &off in &ctx.touched {
            eruns.add(mm, off, 8);
        }
        if self.gathers {
            self.write_entry_runs(ctx, t)?;
        } else {
            for c in &ctx.created {
                let e = c.entry(c.blocknr);
                // The block number last: a speculating writer reads a hinted slot without the
                // index (see `speculate`) and must never see a valid block number beside the
                // fingerprint of the slot's previous life. (Random crash states, beyond what
                // write-back produces, may still persist it alone. Without `fenced_by_caller`
                // nothing durable references this call's blocks yet, and failure recovery
                // drops that entry.)
                self.meta.write_entry_body(t, c.loc, &e)?;
                self.meta.publish_blocknr(t, c.loc, c.blocknr)?;
                eruns.add(mm, c.loc, 32);
            }
        }
        eruns.finish(mm);
        self.write_revmap(ctx, t)?;
        if self.fenced_by_caller {
            // The caller's next fence carries them (and the data: the caller fences before it
            // writes anything that names the blocks). Its records may still reach the medium
            // before the entries, written after that fence; failure recovery then recounts
            // every block from the records, recreates the entry of a block referenced twice or
            // more, and clears a slot left reserved (the block number is the last of an
            // entry's stores, all in one line, so a line that reached the medium as a prefix
            // of its stores holds none).
            return Ok(());
        }
        self.meta.fence()
    }

    /// The call's new entries on a medium that makes a system call per store
    /// ([`Medium::gathers`]): each run of consecutive slots takes two stores instead of two per
    /// entry. The first writes the entries with the reserved marker for block number, the second
    /// the whole entries again. The second changes nothing but the block numbers, so a reader
    /// that sees a new block number sees the fingerprint beside it (the order `speculate`
    /// relies on, as with one entry's two stores), and a crash keeps each line as a prefix of
    /// the two.
    fn write_entry_runs(&self, ctx: &WriteCtx, t: &mut IoTally) -> Result<()> {
        use crate::meta::record::{ENTRY_SIZE, RESERVED};
        let mut run: Vec<u8> = Vec::new();
        for created in ctx.created.chunk_by(|a, b| b.loc == a.loc + ENTRY_SIZE) {
            let at = created[0].loc;
            run.clear();
            run.extend(created.iter().flat_map(|c| c.entry(RESERVED).to_bytes()));
            self.meta.write(t, at, &run)?;
            run.clear();
            run.extend(created.iter().flat_map(|c| c.entry(c.blocknr).to_bytes()));
            self.meta.write(t, at, &run)?;
            self.meta.flush(at, run.len() as u64);
        }
        Ok(())
    }

    /// The reverse-map slots of the call's new entries (flushed). New blocks of a call are
    /// mostly consecutive, and so are their slots: on a plain block file ([`Medium::gathers`])
    /// each run goes in one store (one system call) instead of one per block.
    fn write_revmap(&self, ctx: &WriteCtx, t: &mut IoTally) -> Result<()> {
        let mm = &**self.meta.medium();
        if !self.gathers {
            let mut rruns = Runs::new();
            for c in &ctx.created {
                let at = self.revmap.slot_off(c.blocknr);
                self.meta.write_u64(t, at, c.loc)?;
                rruns.add(mm, at, 8);
            }
            rruns.finish(mm);
            return Ok(());
        }
        let mut run: Vec<u8> = Vec::new();
        for created in ctx.created.chunk_by(|a, b| b.blocknr == a.blocknr + 1) {
            run.clear();
            run.extend(created.iter().flat_map(|c| c.loc.to_le_bytes()));
            let at = self.revmap.slot_off(created[0].blocknr);
            self.meta.write(t, at, &run)?;
            mm.flush(at, run.len() as u64);
        }
        Ok(())
    }

    /// Make the call's new entries visible to other writers (one entry lock per stripe).
    pub(super) fn publish(&self, ctx: &mut WriteCtx) {
        ctx.touched.clear();
        // Group by stripe with a counting sort (a call creates up to hundreds of entries).
        let mut start = [0usize; STRIPES + 1];
        for c in &ctx.created {
            start[self.locks.stripe_of(c.fp) + 1] += 1;
        }
        for s in 0..STRIPES {
            start[s + 1] += start[s];
        }
        ctx.publish.clear();
        ctx.publish.resize(ctx.created.len(), (0, 0));
        for c in &ctx.created {
            let s = self.locks.stripe_of(c.fp);
            ctx.publish[start[s]] = (s, c.loc);
            start[s] += 1;
        }
        for group in ctx.publish.chunk_by(|a, b| a.0 == b.0) {
            let mut sh = self.locks.lock_stripe(group[0].0);
            for &(_, loc) in group {
                sh.unpend(loc);
            }
        }
        if !ctx.created.is_empty() {
            self.join.wake();
        }
        if let Some(p) = ctx.light.prev.as_mut() {
            p.created = None;
        }
    }

    /// Undo a failed call before anything of it was published: unindex and clear its new
    /// entries (and their reverse-map slots), take back its reference-count increments, and
    /// free its new blocks once all that is durable. Every step is attempted even after an
    /// error; the first error is returned.
    pub(super) fn rollback(&self, ctx: &mut WriteCtx, t: &mut IoTally) -> Result<()> {
        let mut res = Ok(());
        let mm = &**self.meta.medium();
        for c in &ctx.created {
            let mut sh = self.locks.lock(c.fp);
            // blocknr and refcount to zero: the slot is free again (it may hold a complete
            // entry if the call failed after writing it). Cleared before the lock is dropped,
            // so a speculating writer never finds it valid once it is neither pending nor
            // indexed.
            res = res.and(self.meta.write(t, c.loc + OFF_BLOCKNR, &[0u8; 16]));
            sh.unpend(c.loc);
            self.store.remove(c.fp, c.loc);
            drop(sh);
            mm.flush(c.loc + OFF_BLOCKNR, 16);
            let slot = self.revmap.slot_off(c.blocknr);
            res = res.and(self.meta.write_u64(t, slot, 0));
            mm.flush(slot, 8);
        }
        for &off in &ctx.touched {
            res = res.and(self.decref_touched(off - OFF_REFCOUNT, t));
        }
        if !ctx.created.is_empty() {
            self.join.wake();
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
    /// entry lock, as other writers may have changed the count since).
    pub(super) fn decref_touched(&self, loc: u64, t: &mut IoTally) -> Result<()> {
        let fp = self.meta.read_u64(t, loc + OFF_FP)?;
        let _sh = self.locks.lock(fp);
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
}
