//! Release: dropping references to data blocks, freeing a block and its entry with the last one.

use std::sync::atomic::Ordering;

use super::Engine;
use crate::meta::io::IoTally;
use crate::meta::record::{OFF_BLOCKNR, OFF_FP, OFF_REFCOUNT};
use crate::{BlockNr, Error, Result};

impl Engine {
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
                if let Some(rc) = &self.read_cache {
                    rc.invalidate(*b);
                }
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
        let _sh = self.locks.lock(fp);
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
            self.store.on_release(fp, loc, e.refcount - 1);
            return Ok(false);
        }
        // Last reference: clear the entry (blocknr 0 frees the slot) and the reverse map, then
        // take it out of the store (under the entry lock, so no writer can find it any more).
        let cleared = self
            .meta
            .write(t, loc + OFF_BLOCKNR, &[0u8; 16])
            .and_then(|_| self.revmap.set(&self.meta, t, b, 0));
        if let Err(err) = cleared {
            return Err(undo(t, err));
        }
        self.meta.flush(loc + OFF_BLOCKNR, 16);
        self.store.remove(fp, loc);
        slots.push(loc);
        Ok(true)
    }
}
