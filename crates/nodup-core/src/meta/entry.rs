//! `entry` layout: fixed entries handed out by a free list (the NV-Dedup / LO-Dedup layout).
//!
//! On-media layout: a fixed array of `slots` 32-byte entries (see `record`) starting at
//! `start_block`. The free list is a DRAM stack of slot numbers: a fresh image pops slots in
//! order, but after deletions new entries land wherever freed slots were, scattered over the
//! array — the locality loss Light-Dedup's Table 4 measures. It is saved on clean shutdown and
//! rebuilt from a scan after a crash.

use parking_lot::Mutex;

use super::io::{IoTally, MetaIo};
use super::record::ENTRY_SIZE;
use super::{LayoutGeometry, MetaLayout, MetaLayoutKind};
use crate::alloc::Allocator;
use crate::{BlockNr, Error, Result, BLOCK_SIZE};

/// Entries per 4 KiB block of the fixed array.
pub const SLOTS_PER_BLOCK: u64 = BLOCK_SIZE as u64 / ENTRY_SIZE;

/// The free-list layout.
pub struct EntryLayout {
    geo: LayoutGeometry,
    free: Mutex<Vec<u32>>,
}

impl EntryLayout {
    /// A layout over `geo`.
    pub fn new(geo: LayoutGeometry) -> EntryLayout {
        EntryLayout {
            geo,
            free: Mutex::new(Vec::new()),
        }
    }

    fn base(&self) -> u64 {
        self.geo.start_block * BLOCK_SIZE as u64
    }

    fn loc(&self, slot: u64) -> u64 {
        self.base() + slot * ENTRY_SIZE
    }
}

impl MetaLayout for EntryLayout {
    fn kind(&self) -> MetaLayoutKind {
        MetaLayoutKind::Entry
    }

    fn format(&self, io: &MetaIo, t: &mut IoTally) -> Result<()> {
        let zero = vec![0u8; BLOCK_SIZE];
        for b in 0..self.geo.blocks {
            let off = self.base() + b * BLOCK_SIZE as u64;
            io.write(t, off, &zero)?;
        }
        io.flush(self.base(), self.geo.blocks * BLOCK_SIZE as u64);
        io.fence()?;
        self.rebuild(&[])
    }

    fn attach(&self, _io: &MetaIo, _t: &mut IoTally) -> Result<()> {
        self.free.lock().clear();
        Ok(())
    }

    fn alloc_entry(
        &self,
        io: &MetaIo,
        t: &mut IoTally,
        _fp: u64,
        _pool: usize,
        _alloc: &Allocator,
        _apool: &mut usize,
    ) -> Result<u64> {
        let slot = self.free.lock().pop().ok_or(Error::NoSpace)?;
        let loc = self.loc(slot as u64);
        if let Err(e) = super::reserve_slot(io, t, loc) {
            self.free.lock().push(slot);
            return Err(e);
        }
        Ok(loc)
    }

    fn alloc_entries(
        &self,
        io: &MetaIo,
        t: &mut IoTally,
        _pool: usize,
        _alloc: &Allocator,
        _apool: &mut usize,
        n: usize,
        out: &mut std::collections::VecDeque<u64>,
    ) -> Result<usize> {
        let mut free = self.free.lock();
        for k in 0..n {
            let Some(slot) = free.pop() else {
                return Ok(k);
            };
            let loc = self.loc(slot as u64);
            if let Err(e) = super::reserve_slot(io, t, loc) {
                free.push(slot);
                if k > 0 && matches!(e, Error::Io(_)) {
                    t.errors_absorbed += 1;
                }
                return if k > 0 { Ok(k) } else { Err(e) };
            }
            out.push_back(loc);
        }
        Ok(n)
    }

    fn free_entry(&self, loc: u64) {
        if self.is_entry_loc(loc) {
            self.free
                .lock()
                .push(((loc - self.base()) / ENTRY_SIZE) as u32);
        }
    }

    fn is_entry_loc(&self, loc: u64) -> bool {
        loc >= self.base()
            && loc.is_multiple_of(ENTRY_SIZE)
            && (loc - self.base()) / ENTRY_SIZE < self.geo.slots
    }

    fn for_each_slot(&self, f: &mut dyn FnMut(u64) -> Result<()>) -> Result<()> {
        for s in 0..self.geo.slots {
            f(self.loc(s))?;
        }
        Ok(())
    }

    fn owned_blocks(&self) -> Vec<BlockNr> {
        Vec::new()
    }

    fn rebuild(&self, valid_sorted: &[u64]) -> Result<()> {
        let mut free = Vec::with_capacity(self.geo.slots as usize);
        let mut vi = valid_sorted.iter().rev().peekable();
        for s in (0..self.geo.slots).rev() {
            let loc = self.loc(s);
            while vi.peek().is_some_and(|&&v| v > loc) {
                vi.next();
            }
            if vi.peek().is_some_and(|&&v| v == loc) {
                continue;
            }
            free.push(s as u32);
        }
        *self.free.lock() = free;
        Ok(())
    }

    fn save_state(&self) -> Vec<u64> {
        let f = self.free.lock();
        let mut w = Vec::with_capacity(f.len() + 1);
        w.push(f.len() as u64);
        w.extend(f.iter().map(|&s| s as u64));
        w
    }

    fn load_state(&self, words: &[u64]) -> Result<()> {
        let n = words.first().copied().unwrap_or(u64::MAX);
        if n > self.geo.slots || words.len() as u64 != n + 1 {
            return Err(Error::Corrupt("saved entry free list is malformed".into()));
        }
        let mut free = Vec::with_capacity(n as usize);
        for &s in &words[1..] {
            if s >= self.geo.slots {
                return Err(Error::Corrupt(format!("saved free slot {s} out of range")));
            }
            free.push(s as u32);
        }
        *self.free.lock() = free;
        Ok(())
    }

    fn max_state_words(&self) -> u64 {
        self.geo.slots + 1
    }
}
