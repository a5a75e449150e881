//! Sharing blocks a caller already references (server-side copy, `copy_file_range`): one more
//! reference on each block's dedup entry, no data written.
//!
//! A copy shares thousands of blocks per call, so the metadata is read and written in spans:
//! the reverse-map slots and the entries of neighbouring blocks are each one medium access
//! (on a blockfile image every access is a system call, and per-block accesses made a 1 GiB
//! copy take 0.6 s instead of a few hundredths).

use std::sync::atomic::Ordering;

use super::Engine;
use crate::codec::le_u64;
use crate::meta::io::IoTally;
use crate::meta::record::{DedupEntry, ENTRY_SIZE, OFF_REFCOUNT};
use crate::meta::revmap::SLOT;
use crate::{BlockNr, Error, Result};

/// Largest gap (bytes) read through rather than split into two accesses.
const MAX_GAP: u64 = 512;

impl Engine {
    /// Add one reference to each of `blocks`, which the caller references already (it must hold
    /// them while this runs). Returns, per block, whether it got the reference: a block without
    /// a dedup entry (a policy that keeps none, or a block recovery left without one) cannot
    /// count a second reference, and the caller copies its data instead. Durable on return.
    /// On an error no reference is granted: the counts already written are put back (and the
    /// engine keeps serving); only when putting them back fails too does it ask for failure
    /// recovery (which recounts from the files) before more writes.
    pub fn share(&self, blocks: &[BlockNr]) -> Result<Vec<bool>> {
        self.check_ready()?;
        if let Some(&b) = blocks.iter().find(|&&b| !self.in_data(b)) {
            return Err(Error::Invalid(format!("block {b} is not in the data area")));
        }
        let mut t = IoTally::default();
        let r = self.share_inner(&mut t, blocks);
        self.merge_tally(&t);
        let out = r?;
        let shared = out.iter().filter(|&&s| s).count() as u64;
        self.c.blocks_shared.fetch_add(shared, Ordering::Relaxed);
        Ok(out)
    }

    fn share_inner(&self, t: &mut IoTally, blocks: &[BlockNr]) -> Result<Vec<bool>> {
        // Sorted vectors and binary searches rather than maps: a copy of a sequential file
        // passes its blocks in order, which the sorts pass through in linear time.
        let mut uniq: Vec<BlockNr> = blocks.to_vec();
        uniq.sort_unstable();
        uniq.dedup();
        // Reverse-map slots: block -> entry offset.
        let slots: Vec<u64> = uniq.iter().map(|&b| self.revmap.slot_off(b)).collect();
        let raw = self.read_spans(t, &slots, SLOT)?;
        let loc_at: Vec<u64> = raw
            .chunks_exact(SLOT as usize)
            .map(|s| le_u64(s, 0))
            .collect();
        let loc_of = |b: BlockNr| uniq.binary_search(&b).map_or(0, |i| loc_at[i]);
        // References wanted per entry (a block can be listed more than once).
        let mut pairs: Vec<(u64, BlockNr)> = blocks
            .iter()
            .map(|&b| (loc_of(b), b))
            .filter(|&(loc, _)| loc != 0 && self.layout.is_entry_loc(loc))
            .collect();
        pairs.sort_unstable();
        let mut locs: Vec<u64> = Vec::with_capacity(pairs.len());
        let mut want: Vec<(BlockNr, u64)> = Vec::with_capacity(pairs.len());
        for (loc, b) in pairs {
            match (locs.last(), want.last_mut()) {
                (Some(&l), Some(w)) if l == loc => {
                    // Two blocks naming one entry (damage): only the first is tried; the
                    // other is reported unshared and copied.
                    if w.0 == b {
                        w.1 += 1;
                    }
                }
                _ => {
                    locs.push(loc);
                    want.push((b, 1));
                }
            }
        }
        // Unlocked read: the fingerprints say which entry locks to take. The caller's
        // references keep every one of these entries valid meanwhile; only counts change.
        let first = self.read_spans(t, &locs, ENTRY_SIZE)?;
        let fps: Vec<u64> = first
            .chunks_exact(ENTRY_SIZE as usize)
            .map(|c| entry_of(c).fp)
            .collect();
        let mut shards: Vec<usize> = fps.iter().map(|&fp| self.locks.stripe_of(fp)).collect();
        shards.sort_unstable();
        shards.dedup();
        // Every path but this one holds one entry lock at a time, so taking several in
        // ascending order cannot deadlock.
        let _guards: Vec<_> = shards.iter().map(|&s| self.locks.lock_stripe(s)).collect();
        // Under the locks: the current counts, validated, incremented in place.
        let mut now = self.read_spans(t, &locs, ENTRY_SIZE)?;
        // The entries as read, to put back if the call fails half-way.
        let orig = now.clone();
        let mut ok = vec![false; locs.len()];
        for (k, &(b, n)) in want.iter().enumerate() {
            let at = k * ENTRY_SIZE as usize;
            let e = entry_of(&now[at..at + ENTRY_SIZE as usize]);
            if !e.is_valid() || e.blocknr != b || e.fp != fps[k] {
                continue;
            }
            let Some(count) = e.refcount.checked_add(n).filter(|&c| c != u64::MAX) else {
                continue;
            };
            let r = at + OFF_REFCOUNT as usize;
            now[r..r + 8].copy_from_slice(&count.to_le_bytes());
            ok[k] = true;
        }
        // Write back runs of adjacent entries that were all incremented. Their other fields
        // are rewritten with what was just read under the locks; only a prefetch hint, which
        // writers update without a lock as performance state, can be set back.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut k = 0;
        while k < locs.len() {
            if !ok[k] {
                k += 1;
                continue;
            }
            let mut j = k + 1;
            while j < locs.len() && ok[j] && locs[j] == locs[j - 1] + ENTRY_SIZE {
                j += 1;
            }
            runs.push((k, j));
            k = j;
        }
        let mut written = 0;
        let mut res = Ok(());
        for &(k, j) in &runs {
            let (a, z) = (k * ENTRY_SIZE as usize, j * ENTRY_SIZE as usize);
            // Counted as written even when the store fails: a short write may have landed.
            written += 1;
            res = self.meta.write(t, locs[k], &now[a..z]);
            self.meta.flush(locs[k], (z - a) as u64);
            if res.is_err() {
                break;
            }
        }
        let res = res.and_then(|_| self.meta.fence());
        if let Err(e) = res {
            // No reference is granted: put back every run that may have been written (still
            // under the locks), durably, so the counts are the caller's again.
            let mut undo = Ok(());
            for &(k, j) in &runs[..written] {
                let (a, z) = (k * ENTRY_SIZE as usize, j * ENTRY_SIZE as usize);
                undo = undo.and_then(|_| self.meta.write(t, locs[k], &orig[a..z]));
                self.meta.flush(locs[k], (z - a) as u64);
            }
            if undo.and_then(|_| self.meta.fence()).is_err() {
                self.set_state(super::STATE_NEEDS_RECOVERY);
            }
            return Err(e);
        }
        Ok(blocks
            .iter()
            .map(|&b| {
                let loc = loc_of(b);
                locs.binary_search(&loc)
                    .is_ok_and(|k| ok[k] && want[k].0 == b)
            })
            .collect())
    }

    /// Read `item` bytes at each of `offs` (sorted, distinct), neighbours in one access;
    /// returns the items concatenated in the order of `offs`.
    fn read_spans(&self, t: &mut IoTally, offs: &[u64], item: u64) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(offs.len() * item as usize);
        let mut buf = Vec::new();
        let mut i = 0;
        while i < offs.len() {
            let mut j = i + 1;
            while j < offs.len() && offs[j] - (offs[j - 1] + item) <= MAX_GAP {
                j += 1;
            }
            let start = offs[i];
            buf.resize((offs[j - 1] + item - start) as usize, 0);
            self.meta.read(t, start, &mut buf)?;
            for &o in &offs[i..j] {
                let at = (o - start) as usize;
                out.extend_from_slice(&buf[at..at + item as usize]);
            }
            i = j;
        }
        Ok(out)
    }
}

/// Decode an entry from a 32-byte slice.
fn entry_of(b: &[u8]) -> DedupEntry {
    let mut a = [0u8; ENTRY_SIZE as usize];
    a.copy_from_slice(&b[..ENTRY_SIZE as usize]);
    DedupEntry::from_bytes(&a)
}
