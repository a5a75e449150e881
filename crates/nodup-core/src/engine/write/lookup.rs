//! Lookup of one block: the policy's store under the fingerprint's entry lock, byte comparison
//! (or the store's cached answer), reference increment of a duplicate, or a new pending entry.

use super::{CallStats, Created};
use crate::engine::locks::Pending;
use crate::engine::{Engine, WriteCtx};
use crate::meta::io::IoTally;
use crate::meta::record::{DedupEntry, Hint, OFF_REFCOUNT};
use crate::policy::light::prefetch;
use crate::policy::light::Prev;
use crate::policy::PrefetchMode;
use crate::{BlockNr, Error, Result, BLOCK_SIZE};

/// How a lookup under the entry lock ended.
enum Found {
    /// An entry of this call: deduplicate against it in DRAM.
    Mine(usize),
    /// An entry of another in-flight call: not durable yet, write a non-dedup block.
    Other,
    /// A committed entry.
    Live(u64, DedupEntry),
}

impl Engine {
    /// Compare `data` with stored block `b`, prefetching as `mode` says.
    pub(crate) fn same_content(
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

    /// Confirm that `data` is the content of block `b` of the entry at `loc`, the candidate the
    /// store found for `fp`: from the store's own cache when it can answer (its verify hook),
    /// else from the medium (and then the store hears of a confirmed match).
    fn verify_live(
        &self,
        scratch: &mut Vec<u8>,
        fp: u64,
        loc: u64,
        b: BlockNr,
        data: &[u8],
        t: &mut IoTally,
    ) -> Result<bool> {
        match self.store.verify_cached(fp, b, data) {
            Some(same) => Ok(same),
            None => {
                let same = self.same_content(scratch, b, data, self.prefetch, t)?;
                if same {
                    self.store.on_verified(fp, loc, b, data);
                }
                Ok(same)
            }
        }
    }

    /// Basic dedup of one block with fingerprint `fp`; `pre` is the block it was already
    /// copied into, if it was staged. Returns the block, the entry it maps to, and whether the
    /// block is new (stored by this call) rather than a duplicate.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dedup_one(
        &self,
        ctx: &mut WriteCtx,
        blocks: &[&[u8]],
        i: usize,
        fp: u64,
        pre: Option<BlockNr>,
        lookup_only: bool,
        t: &mut IoTally,
        st: &mut CallStats,
    ) -> Result<(BlockNr, Option<Prev>, bool)> {
        let data = blocks[i];
        // On the streaming path (a staged block, likely new) a miss inserts the writer's next
        // entry slot in the same store operation: one store lock instead of two.
        let spare = match (pre, lookup_only) {
            (Some(_), false) => self.spare_slot(ctx, t),
            _ => None,
        };
        let mut sh = self.locks.lock(fp);
        let mut err = None;
        let (found, inserted) = {
            let stripe = &*sh;
            let created = &ctx.created;
            let id = ctx.id;
            self.store.find_map(fp, spare, |loc| {
                if let Some(p) = stripe.pending_at(loc) {
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
                self.store.on_hit(fp, prev.loc);
                self.note_recheck(ctx, i, fp, prev.loc);
                if let Some(p) = pre {
                    self.unclaim(ctx, p);
                }
                Ok((b, Some(prev), false))
            }
            Some(Found::Other) => {
                drop(sh);
                if ctx.join {
                    // Another call is storing this content right now: wait for its entry
                    // after this call is published, then deduplicate against it (see `join`).
                    if let Some(p) = pre {
                        self.unclaim(ctx, p);
                    }
                    ctx.waiting.push((i, fp));
                    return Ok((super::WAITING, None, true));
                }
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
                    && !self.verify_live(&mut ctx.scratch, fp, loc, e.blocknr, data, t)?
                {
                    // Same fingerprint, different bytes: a collision. Store the block without an entry.
                    st.collisions += 1;
                    drop(sh);
                    return Ok((self.place(ctx, i, pre, t)?, None, true));
                }
                self.incref(ctx, loc, e.refcount, t)?;
                self.store.on_hit(fp, loc);
                self.note_recheck(ctx, i, fp, loc);
                drop(sh);
                st.hits += 1;
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
            None if lookup_only => {
                // The policy looks this content up but does not remember it.
                drop(sh);
                Ok((self.place(ctx, i, pre, t)?, None, true))
            }
            None => {
                // A new block. Its number, entry slot and index record are claimed before the
                // data is copied (unless staging copied it already) and the entry lock is
                // dropped first: the locked instructions of the claim then do not wait for
                // the copy's stores to drain, and the copy's write-back overlaps the next
                // block's work.
                let b = match pre {
                    Some(b) => b,
                    None => self.claim_block(ctx)?,
                };
                let loc = match if inserted {
                    // The spare slot, already in the store.
                    ctx.slots.pop_front().ok_or(Error::NoSpace)
                } else {
                    self.claim_entry(ctx, fp, t)
                } {
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
                if !inserted {
                    self.store.insert(fp, loc);
                }
                sh.pending.push(Pending {
                    loc,
                    owner: ctx.id,
                    slot: k,
                    fp,
                });
                drop(sh);
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

    /// A duplicate of an entry its store still holds as provisional (made by an inline miss,
    /// not yet checked by the out-of-line worker): the worker looks at this block too, or a
    /// second copy found only on the medium would keep this one alive.
    #[inline]
    fn note_recheck(&self, ctx: &mut WriteCtx, i: usize, fp: u64, loc: u64) {
        if self.flags.reports_misses && self.store.needs_recheck(fp, loc) {
            ctx.misses.push(crate::engine::Miss {
                index: i,
                fp: Some(fp),
            });
        }
    }

    /// Refcount + 1 of a committed entry (flushed and fenced at the end of the call, one flush
    /// per line of consecutive entries).
    /// The caller holds the entry lock of its fingerprint.
    pub(crate) fn incref(
        &self,
        ctx: &mut WriteCtx,
        loc: u64,
        old: u64,
        t: &mut IoTally,
    ) -> Result<()> {
        let off = loc + OFF_REFCOUNT;
        self.store_count(t, off, old, old.saturating_add(1))?;
        ctx.touched.push(off);
        Ok(())
    }
}
