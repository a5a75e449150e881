//! The remap contract for background (out-of-line) deduplication: a caller replaces its
//! reference to block `from` by a reference to an existing, byte-identical block `to`.
//!
//! The engine's part is one call, [`Engine::remap_ref`]: under `to`'s entry lock (so `to`
//! cannot be freed or reused meanwhile) it checks that `to` has a live entry, compares the two
//! blocks byte by byte, and on a match adds one reference to `to`, durably, for the caller.
//! The caller's part, which it does under its own lock of the referencing object (for a file,
//! the inode lock a foreground write takes too, so the worker never races a write):
//!
//! 1. check that its object still names `from` at that place (a block rewritten since the
//!    request was queued is skipped);
//! 2. `remap_ref(from, to)`; on anything but [`RefGrant::Granted`], stop;
//! 3. log "place P: `from` → `to`" in its own log, atomically with its other changes (on a
//!    failure, give the new reference back with [`Engine::release`]);
//! 4. once that record is durable, release `from`.
//!
//! A crash anywhere in between leaves a reference count one too high (on `to` before step 3
//! is durable, on `from` after it): never too low, so no block is freed while named, and
//! failure recovery recounts from the caller's references, as after any interrupted write.

use super::Engine;
use crate::meta::io::IoTally;
use crate::meta::record::{OFF_FP, OFF_REFCOUNT};
use crate::{BlockNr, Error, Result, BLOCK_SIZE};

/// What [`Engine::remap_ref`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefGrant {
    /// One more reference to `to` is the caller's (durable).
    Granted,
    /// The blocks hold different bytes: nothing changed.
    Differs,
    /// `to` has no live dedup entry (it cannot count a second reference): nothing changed.
    NoEntry,
}

impl Engine {
    /// Add one reference to `to` for a caller that will replace its reference to `from` by it,
    /// when both blocks hold the same bytes (see the module doc for the whole contract).
    pub fn remap_ref(&self, from: BlockNr, to: BlockNr) -> Result<RefGrant> {
        self.check_ready()?;
        if !self.in_data(from) || !self.in_data(to) || from == to {
            return Err(Error::Invalid(format!(
                "remap of block {from} to block {to}: both must be distinct data blocks"
            )));
        }
        let mut t = IoTally::default();
        let r = self.remap_inner(&mut t, from, to);
        self.merge_tally(&t);
        r
    }

    fn remap_inner(&self, t: &mut IoTally, from: BlockNr, to: BlockNr) -> Result<RefGrant> {
        let loc = self.revmap.get(&self.meta, t, to)?;
        if loc == 0 || !self.layout.is_entry_loc(loc) {
            return Ok(RefGrant::NoEntry);
        }
        // Read without the lock to learn which entry lock to take; checked again under it.
        let fp = self.meta.read_u64(t, loc + OFF_FP)?;
        let _g = self.locks.lock(fp);
        let e = self.meta.read_entry(t, loc)?;
        if !e.is_valid() || e.blocknr != to || e.fp != fp || e.refcount == 0 {
            return Ok(RefGrant::NoEntry);
        }
        let Some(count) = e.refcount.checked_add(1).filter(|&c| c != u64::MAX) else {
            return Ok(RefGrant::NoEntry);
        };
        let mut a = vec![0u8; BLOCK_SIZE];
        let mut b = vec![0u8; BLOCK_SIZE];
        self.medium.read(from * BLOCK_SIZE as u64, &mut a)?;
        self.medium.read(to * BLOCK_SIZE as u64, &mut b)?;
        t.data_read += 2 * BLOCK_SIZE as u64;
        if a != b {
            return Ok(RefGrant::Differs);
        }
        let off = loc + OFF_REFCOUNT;
        self.store_count(t, off, e.refcount, count)?;
        self.meta.flush(off, 8);
        if let Err(err) = self.meta.fence() {
            // The count may or may not be durable, and the caller will not take the
            // reference. The old count goes back, durably, and the engine goes on (a
            // background worker's failure must not stop the mount, as in `adopt`); only if
            // that fails too is the live state no longer known (a block file's failed fence
            // fails every later one: `media/write_back.rs`).
            let undone = self.meta.write_u64(t, off, e.refcount).and_then(|()| {
                self.meta.flush(off, 8);
                self.meta.fence()
            });
            if undone.is_err() {
                self.set_state(super::STATE_NEEDS_RECOVERY);
            }
            return Err(err);
        }
        self.store.on_hit(fp, loc);
        Ok(RefGrant::Granted)
    }
}
