//! `hashtable` layout: a static open-addressing hash table on the medium (DeNOVA-style).
//!
//! On-media layout: a fixed array of `slots` 32-byte entries (see `record`) starting at
//! `start_block`, sized at format time (1.25 x the blocks of the medium). An entry lives at the
//! first free slot at or after `mix(fp) % slots` (linear probing, checking `blocknr` of each
//! slot on the medium). Lookups never probe the table (they go through the policy's fingerprint
//! store: the DRAM index, or `smart`'s two-level store), so deletions need no tombstones.

use parking_lot::Mutex;

use super::io::{IoTally, MetaIo};
use super::record::{ENTRY_SIZE, OFF_BLOCKNR};
use super::{LayoutGeometry, MetaLayout, MetaLayoutKind};
use crate::alloc::Allocator;
use crate::{BlockNr, Error, Result, BLOCK_SIZE};

/// Entries per 4 KiB block of the table.
pub const SLOTS_PER_BLOCK: u64 = BLOCK_SIZE as u64 / ENTRY_SIZE;

/// The static hash table.
pub struct HashLayout {
    geo: LayoutGeometry,
    /// Serialises probing so two writers never claim the same slot.
    lock: Mutex<()>,
}

impl HashLayout {
    /// A layout over `geo`.
    pub fn new(geo: LayoutGeometry) -> HashLayout {
        HashLayout {
            geo,
            lock: Mutex::new(()),
        }
    }

    fn base(&self) -> u64 {
        self.geo.start_block * BLOCK_SIZE as u64
    }
}

impl MetaLayout for HashLayout {
    fn kind(&self) -> MetaLayoutKind {
        MetaLayoutKind::Hashtable
    }

    fn format(&self, io: &MetaIo, t: &mut IoTally) -> Result<()> {
        let zero = vec![0u8; BLOCK_SIZE];
        for b in 0..self.geo.blocks {
            io.write(t, self.base() + b * BLOCK_SIZE as u64, &zero)?;
        }
        io.flush(self.base(), self.geo.blocks * BLOCK_SIZE as u64);
        io.fence()
    }

    fn attach(&self, _io: &MetaIo, _t: &mut IoTally) -> Result<()> {
        Ok(())
    }

    fn alloc_entry(
        &self,
        io: &MetaIo,
        t: &mut IoTally,
        fp: u64,
        _pool: usize,
        _alloc: &Allocator,
        _apool: &mut usize,
    ) -> Result<u64> {
        let n = self.geo.slots;
        let home = crate::index::mix(fp.rotate_left(17)) % n;
        let _g = self.lock.lock();
        for k in 0..n {
            let loc = self.base() + ((home + k) % n) * ENTRY_SIZE;
            if io.read_u64(t, loc + OFF_BLOCKNR)? == 0 {
                super::reserve_slot(io, t, loc)?;
                return Ok(loc);
            }
        }
        Err(Error::NoSpace)
    }

    fn free_entry(&self, _loc: u64) {}

    fn is_entry_loc(&self, loc: u64) -> bool {
        loc >= self.base()
            && loc.is_multiple_of(ENTRY_SIZE)
            && (loc - self.base()) / ENTRY_SIZE < self.geo.slots
    }

    fn for_each_slot(&self, f: &mut dyn FnMut(u64) -> Result<()>) -> Result<()> {
        for s in 0..self.geo.slots {
            f(self.base() + s * ENTRY_SIZE)?;
        }
        Ok(())
    }

    fn owned_blocks(&self) -> Vec<BlockNr> {
        Vec::new()
    }

    fn rebuild(&self, _valid_sorted: &[u64]) -> Result<()> {
        Ok(())
    }

    fn save_state(&self) -> Vec<u64> {
        Vec::new()
    }

    fn load_state(&self, words: &[u64]) -> Result<()> {
        if !words.is_empty() {
            return Err(Error::Corrupt("hashtable layout has no saved state".into()));
        }
        Ok(())
    }

    fn max_state_words(&self) -> u64 {
        0
    }
}
