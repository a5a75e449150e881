//! What an out-of-line dedup worker (`smart`'s, in the file system) asks the engine, beside
//! the remap contract (`remap.rs`): what entry a block has, where another copy of a content is
//! stored (searching the whole store, the medium included), and an entry for a block that was
//! stored without one (not fingerprinted inline), so later copies can find it.

use super::Engine;
use crate::meta::io::IoTally;
use crate::{BlockNr, Error, Result};

/// What [`Engine::adopt`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adopted {
    /// The block now has an entry (reference count 1) and is in the store.
    Done,
    /// The block already has an entry: nothing changed.
    HasEntry,
    /// No entry slot is free: nothing changed (the block is simply not a dedup target).
    NoSlot,
}

impl Engine {
    /// The fingerprint and reference count in the entry of block `b`, if it has one.
    pub fn block_entry(&self, b: BlockNr) -> Result<Option<(u64, u64)>> {
        if !self.in_data(b) {
            return Err(Error::Invalid(format!("block {b} is not in the data area")));
        }
        let mut t = IoTally::default();
        let loc = self.revmap.get(&self.meta, &mut t, b)?;
        if loc == 0 || !self.layout.is_entry_loc(loc) {
            self.merge_tally(&t);
            return Ok(None);
        }
        let e = self.meta.read_entry(&mut t, loc)?;
        self.merge_tally(&t);
        Ok((e.is_valid() && e.blocknr == b).then_some((e.fp, e.refcount)))
    }

    /// The stored block with fingerprint `fp` other than `own` that has the most references
    /// (the lowest block number on a tie), found anywhere in the policy's store (a match on the
    /// medium is promoted to memory), with its reference count. Only a candidate:
    /// [`Engine::remap_ref`] compares the bytes.
    pub fn find_duplicate(&self, fp: u64, own: BlockNr) -> Result<Option<(BlockNr, u64)>> {
        self.check_ready()?;
        let mut t = IoTally::default();
        let mut err = None;
        // (references, block, entry location) of the best candidate so far.
        let mut best: Option<(u64, BlockNr, u64)> = None;
        {
            let _g = self.locks.lock(fp);
            let store = self.store.dyn_store();
            store.find_deep(
                fp,
                &mut |loc| {
                    if !self.layout.is_entry_loc(loc) {
                        return false;
                    }
                    match self.meta.read_entry(&mut t, loc) {
                        Ok(e) => {
                            let ok = e.is_valid()
                                && e.fp == fp
                                && e.blocknr != own
                                && self.in_data(e.blocknr);
                            let better = best.is_none_or(|(r, b, _)| {
                                e.refcount > r || (e.refcount == r && e.blocknr < b)
                            });
                            if ok && better {
                                best = Some((e.refcount, e.blocknr, loc));
                            }
                            // Every candidate is looked at.
                            false
                        }
                        Err(x) => {
                            err = Some(x);
                            true
                        }
                    }
                },
                false,
            );
            if let (None, Some((_, _, loc))) = (&err, best) {
                store.promote(fp, loc);
            }
        }
        self.merge_tally(&t);
        match err {
            Some(e) => Err(e),
            None => Ok(best.map(|(r, b, _)| (b, r))),
        }
    }

    /// The out-of-line worker found no other copy of block `b` (fingerprint `fp`): its entry
    /// is the one later copies should find (the store stops asking for rechecks).
    pub fn confirm_unique(&self, b: BlockNr, fp: u64) -> Result<()> {
        let mut t = IoTally::default();
        let loc = self.revmap.get(&self.meta, &mut t, b)?;
        self.merge_tally(&t);
        if loc != 0 {
            let _g = self.locks.lock(fp);
            self.store.dyn_store().confirm(fp, loc);
        }
        Ok(())
    }

    /// Give block `b`, stored without an entry and holding content with fingerprint `fp`, an
    /// entry with reference count 1, and put it in the store. The caller holds the block's one
    /// reference under its own lock (the file's inode lock), so the block cannot be released
    /// meanwhile. Crash-safe as recovery's recreated entries: the body is written under the
    /// reserved marker first and committed once durable.
    pub fn adopt(&self, b: BlockNr, fp: u64) -> Result<Adopted> {
        self.check_ready()?;
        if !self.in_data(b) || !self.alloc.is_allocated(b) {
            return Err(Error::Invalid(format!(
                "block {b} is not an allocated data block"
            )));
        }
        let mut t = IoTally::default();
        let r = (|| {
            let _g = self.locks.lock(fp);
            if self.revmap.get(&self.meta, &mut t, b)? != 0 {
                return Ok(Adopted::HasEntry);
            }
            let mut apool = 0usize;
            let loc =
                match self
                    .layout
                    .alloc_entry(&self.meta, &mut t, fp, 0, &self.alloc, &mut apool)
                {
                    Ok(l) => l,
                    Err(Error::NoSpace) => return Ok(Adopted::NoSlot),
                    Err(e) => return Err(e),
                };
            if let Err(e) = self.recreate_entry(&mut t, loc, b, fp, 1) {
                // The slot may hold the reserved marker or the whole entry, and the block's
                // reverse-map slot may name it: both are cleared (durably) and the slot goes
                // back, so the block is again one without an entry and the engine goes on (a
                // background worker's failure must not stop the mount). Only if that fails
                // too is the live state no longer known: failure recovery settles it.
                if self.clear_entry(&mut t, loc, b).is_err() {
                    self.set_state(super::STATE_NEEDS_RECOVERY);
                }
                return Err(e);
            }
            self.store.insert(fp, loc);
            Ok(Adopted::Done)
        })();
        self.merge_tally(&t);
        r
    }
}
