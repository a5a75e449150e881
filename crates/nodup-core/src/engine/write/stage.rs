//! Staging and placement of new blocks: fingerprint-and-copy ahead of the lookup, block and
//! entry-slot claims in batches, and the deferred copies of phase 1.

use super::{Staged, AHEAD_BATCH, STAGE_GROUP, STAGE_WASTE_OFF};
use crate::engine::{Engine, WriteCtx};
use crate::meta::io::IoTally;
use crate::meta::record::OFF_BLOCKNR;
use crate::{BlockNr, Error, Result, BLOCK_SIZE};

impl Engine {
    /// Fingerprint block `i` ahead of its lookup and start loading what its lookup reads. On a
    /// mapped medium it is also copied, in the same pass, into a block claimed for it (new
    /// data is the likely outcome while the stream writes new data; a duplicate gives the
    /// block back), unless the stream's staged blocks have lately turned out duplicates.
    pub(super) fn stage(
        &self,
        ctx: &mut WriteCtx,
        i: usize,
        data: &[u8],
        t: &mut IoTally,
    ) -> Result<Staged> {
        if !self.fused || ctx.stage_waste >= STAGE_WASTE_OFF {
            let fp = self.fpr.fingerprint(data);
            self.store.prefetch(fp);
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
        self.store.prefetch(fp);
        Ok(Staged {
            i,
            fp,
            block: Some(b),
        })
    }

    /// An entry slot for a new block: from the writer's batch of claimed slots, refilled with
    /// one layout call (one lock) for the blocks still to come, else claimed alone.
    pub(super) fn claim_entry(&self, ctx: &mut WriteCtx, fp: u64, t: &mut IoTally) -> Result<u64> {
        if ctx.slots.is_empty() && ctx.blocks_left > 1 {
            // An error here (e.g. no room for a new region) leaves the single claim below to
            // report it; a media error the single claim then gets past is counted as absorbed.
            let r = self.refill_slots(ctx, t);
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

    /// Claim entry slots for the blocks still to come, with one layout call (one lock).
    fn refill_slots(&self, ctx: &mut WriteCtx, t: &mut IoTally) -> Result<usize> {
        let n = ctx.blocks_left.min(STAGE_GROUP);
        self.layout.alloc_entries(
            &self.meta,
            t,
            ctx.pool,
            &self.alloc,
            &mut ctx.apool,
            n,
            &mut ctx.slots,
        )
    }

    /// The entry slot the next new block would get, left in the writer's batch (refilled when
    /// empty; `None` when it cannot be): a lookup that misses can then insert it in the same
    /// store operation. A refill error is left for [`Self::claim_entry`] to report.
    pub(super) fn spare_slot(&self, ctx: &mut WriteCtx, t: &mut IoTally) -> Option<u64> {
        if ctx.slots.is_empty() && ctx.blocks_left > 1 {
            let _ = self.refill_slots(ctx, t);
        }
        ctx.slots.front().copied()
    }

    /// Give back the claimed slots the call did not use (they hold the reserved marker, which
    /// nothing trusts; clearing it makes them free again). A failed clear is tried once more;
    /// a slot that stays reserved would be counted in use with no entry in it, so the engine
    /// then asks for failure recovery, which clears it.
    pub(super) fn return_slots(&self, ctx: &mut WriteCtx, t: &mut IoTally) -> Result<()> {
        use crate::meta::record::ENTRY_SIZE;
        let mut res = Ok(());
        // A block file clears a run of consecutive slots with one store (whole slots: a free
        // slot's other fields mean nothing) instead of one per slot.
        let run_of = |a: &u64, b: &u64| self.gathers && *b == *a + ENTRY_SIZE;
        for run in ctx.slots.make_contiguous().chunk_by(run_of) {
            let clear = |t: &mut IoTally| match run {
                [loc] => self.meta.write_u64(t, loc + OFF_BLOCKNR, 0),
                _ => self
                    .meta
                    .write(t, run[0], &vec![0u8; run.len() * ENTRY_SIZE as usize]),
            };
            let first = clear(t);
            let cleared = first.is_ok() || clear(t).is_ok();
            for &loc in run {
                if cleared {
                    self.layout.free_entry(loc);
                } else {
                    self.set_state(crate::engine::STATE_NEEDS_RECOVERY);
                }
            }
            if let Err(e) = first {
                res = Err(e);
            }
        }
        ctx.slots.clear();
        res
    }

    /// A staged block that turned out a duplicate: back to the front of the read-ahead blocks.
    pub(super) fn unclaim(&self, ctx: &mut WriteCtx, b: BlockNr) {
        if let Some(k) = ctx.new_blocks.iter().rposition(|&x| x == b) {
            ctx.new_blocks.remove(k);
            ctx.ahead.push_front(b);
        }
    }

    /// The block for data stored without an entry: the staged one, else a new one.
    pub(super) fn place(
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
    pub(super) fn new_block(
        &self,
        ctx: &mut WriteCtx,
        i: usize,
        t: &mut IoTally,
    ) -> Result<BlockNr> {
        let _ = t;
        let b = self.claim_block(ctx)?;
        ctx.copies.push((b, i));
        Ok(b)
    }

    /// Take the next block for new data (read-ahead first) and record it as this call's, so a
    /// failed call gives it back.
    pub(super) fn claim_block(&self, ctx: &mut WriteCtx) -> Result<BlockNr> {
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
    pub(super) fn store(&self, b: BlockNr, data: &[u8], t: &mut IoTally) -> Result<()> {
        self.medium.write_stream(b * BLOCK_SIZE as u64, data)?;
        t.data_written += BLOCK_SIZE as u64;
        Ok(())
    }

    /// Copy the new blocks decided in phase 1. Deferred to here so that no locked instruction
    /// of the lookups waits for a copy's stores to drain: the lookups and claims run while the
    /// store buffer is nearly empty, and the copies run back to back like a plain write's.
    pub(super) fn copy_new(
        &self,
        ctx: &mut WriteCtx,
        blocks: &[&[u8]],
        t: &mut IoTally,
    ) -> Result<()> {
        if !self.gathers {
            for &(b, i) in &ctx.copies {
                self.store(b, blocks[i], t)?;
            }
            return Ok(());
        }
        // A block file takes a run of consecutive blocks in one gathered write instead of one
        // system call per block.
        let mut run: Vec<&[u8]> = Vec::new();
        for copies in ctx.copies.chunk_by(|a, b| b.0 == a.0 + 1) {
            run.clear();
            run.extend(copies.iter().map(|&(_, i)| blocks[i]));
            let off = copies[0].0 * BLOCK_SIZE as u64;
            self.medium.write_gather(off, &run)?;
            self.medium.flush(off, (run.len() * BLOCK_SIZE) as u64);
            t.data_written += (run.len() * BLOCK_SIZE) as u64;
        }
        Ok(())
    }
}
