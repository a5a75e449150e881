//! Light-Dedup speculation (§4.3): following a trusted hint past the fingerprint and index,
//! prefetch of the hinted and next blocks, and hint / stream trust bookkeeping.

use std::sync::atomic::Ordering;

use super::Prev;
use crate::engine::write::CallStats;
use crate::engine::{Engine, WriteCtx};
use crate::meta::io::IoTally;
use crate::meta::record::{Hint, OFF_BLOCKNR, OFF_FP, OFF_HINT};
use crate::policy::light::prefetch::{
    self, trusted, update_hint, update_stream, HintOutcome, TRUST_MAX,
};
use crate::policy::PrefetchMode;
use crate::{BlockNr, Result, BLOCK_SIZE};

impl Engine {
    /// Speculation (SP): compare directly with the block of the hinted entry, skipping the
    /// fingerprint and the index. Also issues prefetch-next (PN/CBP). `None` = fall back.
    pub(crate) fn speculate(
        &self,
        ctx: &mut WriteCtx,
        target: u64,
        data: &[u8],
        more: bool,
        t: &mut IoTally,
        st: &mut CallStats,
    ) -> Result<Option<(BlockNr, Option<Prev>)>> {
        let fp = self.meta.read_u64(t, target + OFF_FP)?;
        let sh = self.locks.lock(fp);
        // The hint is only a guess, checked on the entry itself as the paper's SP does, without
        // probing the index (a cache miss per block that cost more than SP saves on DRAM).
        // Under `fp`'s entry lock, a slot that holds `fp` and a valid block number is the
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
        if ctx.light.prefetched != Some(e.blocknr) {
            prefetch::before_compare(&*self.medium, mode, off);
        }
        ctx.light.prefetched = None;
        let next_ok = match mode {
            PrefetchMode::Pn => true,
            PrefetchMode::Cbp => self.active.load(Ordering::Relaxed) < self.transition,
            _ => false,
        };
        if more && next_ok && ctx.light.trust == TRUST_MAX {
            let h2 = Hint(e.hint);
            if trusted(h2) && self.layout.is_entry_loc(h2.target()) {
                let b2 = self.meta.read_u64(t, h2.target() + OFF_BLOCKNR)?;
                if self.in_data(b2) {
                    prefetch::next_block(&*self.medium, b2 * BLOCK_SIZE as u64);
                    ctx.light.prefetched = Some(b2);
                }
            }
        }
        if !self.same_content(&mut ctx.scratch, e.blocknr, data, PrefetchMode::None, t)? {
            return Ok(None);
        }
        self.incref(ctx, target, e.refcount, t)?;
        drop(sh);
        st.hits += 1;
        self.store.on_hit(fp, target);
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
    pub(crate) fn prefetch_target(&self, target: u64, t: &mut IoTally) -> Result<()> {
        let b = self.meta.read_u64(t, target + OFF_BLOCKNR)?;
        if self.in_data(b) {
            prefetch::before_compare(&*self.medium, PrefetchMode::Ibp, b * BLOCK_SIZE as u64);
        }
        Ok(())
    }

    /// Judge the previous entry's hint against the entry this block used, update trust degrees.
    pub(crate) fn track_hint(
        &self,
        ctx: &mut WriteCtx,
        cur: Option<Prev>,
        t: &mut IoTally,
        st: &mut CallStats,
    ) -> Result<()> {
        let mut cur = cur;
        if let (Some(p), Some(c)) = (ctx.light.prev, cur.as_mut()) {
            let (nh, outcome) = update_hint(p.hint, c.loc);
            if trusted(p.hint) {
                match outcome {
                    HintOutcome::Right => st.hint_hits += 1,
                    HintOutcome::Wrong => st.hint_misses += 1,
                    HintOutcome::Created => {}
                }
            }
            ctx.light.trust = update_stream(ctx.light.trust, outcome);
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
        ctx.light.prev = cur;
        Ok(())
    }
}
