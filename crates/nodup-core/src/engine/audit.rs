//! Consistency audit of the dedup metadata (tests, `fsck`): every valid entry, the reverse map,
//! the DRAM index and the layout's counters must agree. Call it while no writer is active.

use serde::Serialize;

use super::Engine;
use crate::meta::io::IoTally;
use crate::meta::revmap;
use crate::{BlockNr, Result, BLOCK_SIZE};

/// What [`Engine::audit`] found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    /// Valid entries on the medium.
    pub valid_entries: u64,
    /// Of those, entries the DRAM index finds.
    pub indexed_entries: u64,
    /// Valid entries whose fingerprint does not match their block's content.
    pub fp_mismatches: u64,
    /// The blocks of those entries (a crash may leave one for a write call in flight, whose
    /// block nobody references yet; failure recovery drops it).
    pub fp_mismatch_blocks: Vec<BlockNr>,
    /// Human-readable descriptions of every inconsistency (empty = consistent).
    pub problems: Vec<String>,
}

/// One row of [`Engine::refcount_histogram`]: data blocks whose reference count is in
/// `[refs, 2 * refs)` (the `zpool status -D` buckets).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RefBucket {
    /// Lowest reference count of the bucket (1, 2, 4, 8, ...).
    pub refs: u64,
    /// Distinct data blocks in the bucket.
    pub blocks: u64,
    /// References those blocks carry (what the files map).
    pub referenced: u64,
}

impl Engine {
    /// Data blocks in use grouped by reference count in power-of-two buckets, from the dedup
    /// entries (a block without an entry has one reference). Reads every entry slot without
    /// locks: while writers run, the counts are a snapshot of a moving target.
    pub fn refcount_histogram(&self) -> Result<Vec<RefBucket>> {
        let mut t = IoTally::default();
        let mut rows: Vec<RefBucket> = Vec::new();
        let mut with_entry = 0u64;
        let add = |rows: &mut Vec<RefBucket>, rc: u64, blocks: u64| {
            let k = (63 - rc.max(1).leading_zeros()) as usize;
            if rows.len() <= k {
                rows.resize(k + 1, RefBucket::default());
            }
            rows[k].blocks += blocks;
            rows[k].referenced += rc * blocks;
        };
        self.layout.for_each_slot(&mut |loc| {
            let e = self.meta.read_entry(&mut t, loc)?;
            if e.is_valid() && self.in_data(e.blocknr) && e.refcount > 0 {
                add(&mut rows, e.refcount, 1);
                with_entry += 1;
            }
            Ok(())
        })?;
        let phys = self
            .c
            .physical_blocks
            .load(std::sync::atomic::Ordering::Relaxed);
        add(&mut rows, 1, phys.saturating_sub(with_entry));
        for (k, r) in rows.iter_mut().enumerate() {
            r.refs = 1 << k;
        }
        rows.retain(|r| r.blocks > 0);
        Ok(rows)
    }

    /// Reference count of data block `b`: `Some(n)` from its entry, `None` when the block has
    /// no entry (a non-dedup block, whose single reference is implied).
    pub fn block_refcount(&self, b: BlockNr) -> Result<Option<u64>> {
        let mut t = IoTally::default();
        if !self.in_data(b) {
            return Err(crate::Error::Invalid(format!(
                "block {b} is not in the data area"
            )));
        }
        let loc = self.revmap.get(&self.meta, &mut t, b)?;
        if loc == 0 {
            return Ok(None);
        }
        if !self.layout.is_entry_loc(loc) {
            return Err(crate::Error::Corrupt(format!(
                "reverse map of {b} names {loc}"
            )));
        }
        let e = self.meta.read_entry(&mut t, loc)?;
        if e.blocknr != b {
            return Err(crate::Error::Corrupt(format!(
                "reverse map of {b} names an entry of {}",
                e.blocknr
            )));
        }
        Ok(Some(e.refcount))
    }

    /// Blocks of the data area held by the metadata layout itself (regions).
    pub fn layout_owned_blocks(&self) -> u64 {
        self.layout.owned_blocks().len() as u64
    }

    /// The data-area blocks the metadata layout holds (a region layout's entry blocks): a
    /// caller's reference to one is damage, which failure recovery refuses.
    pub fn layout_blocks(&self) -> Vec<BlockNr> {
        self.layout.owned_blocks()
    }

    /// Refuse a reverse map whose slot for a block in use names no entry slot of the layout
    /// (a torn or overwritten reverse-map block): releasing that block would fail half-way,
    /// after its file had already let go of it. Only slots of allocated blocks are read, 64 KiB
    /// at a time, so a clean open pays for what is stored (8 bytes per block in use), not for
    /// the medium's size. A slot naming another block's entry is left to fsck (it would cost an
    /// entry read per deduplicated block).
    pub fn check_reverse_map(&self) -> Result<()> {
        const STEP: usize = 8192;
        let alloc = self.alloc.snapshot();
        let start = self.alloc.start();
        let words = alloc.words();
        let mut t = IoTally::default();
        let mut buf = vec![0u8; STEP * revmap::SLOT as usize];
        let mut res = Ok(());
        for (k, chunk) in words.chunks(STEP / 64).enumerate() {
            if chunk.iter().all(|&w| w == 0) {
                continue;
            }
            let first = k * STEP;
            let n = (alloc.len() - first).min(STEP);
            let bytes = &mut buf[..n * revmap::SLOT as usize];
            if let Err(e) =
                self.meta
                    .read(&mut t, self.revmap.slot_off(start + first as u64), bytes)
            {
                res = Err(e);
                break;
            }
            let bad = bytes
                .chunks_exact(revmap::SLOT as usize)
                .enumerate()
                .filter(|&(i, _)| alloc.get(first + i))
                .map(|(i, slot)| (i, crate::codec::le_u64(slot, 0)))
                .find(|&(_, loc)| loc != 0 && !self.layout.is_entry_loc(loc));
            if let Some((i, loc)) = bad {
                let b = start + (first + i) as u64;
                res = Err(crate::Error::Corrupt(format!(
                    "reverse map of block {b} names {loc}, not an entry"
                )));
                break;
            }
        }
        self.merge_tally(&t);
        res
    }

    /// Blocks of the data area held by the policy's store for its on-media part.
    pub fn store_owned_blocks(&self) -> u64 {
        self.store.dyn_store().owned_blocks()
    }

    /// `f(blocks, unlisted)` with the blocks the engine itself holds (the metadata layout's
    /// regions and the store's on-media part) one by one, called while the store cannot take
    /// or give back any; `unlisted` counts the store's blocks it could not list (behind damage
    /// to a group's chain). fsck's per-block check; listing reads every group block. Call it
    /// while no writer is active (the layout grows only under a write). `f` runs under the
    /// store's lock: it must not call into the engine or the store (it would wait for itself),
    /// only copy what it needs.
    pub fn with_engine_owned_blocks(&self, f: &mut dyn FnMut(&[BlockNr], u64)) {
        let layout = self.layout.owned_blocks();
        self.store.dyn_store().list_owned_blocks(layout, f);
    }

    /// Problems with what the policy's fingerprint store keeps on the medium (its groups read
    /// and validated whole; nothing changed). Call it while no writer is active.
    pub fn store_problems(&self) -> Vec<String> {
        self.store.dyn_store().check_media()
    }

    /// Check entries, reverse map, index and layout counters against each other.
    pub fn audit(&self) -> Result<AuditReport> {
        let mut t = IoTally::default();
        let mut rep = AuditReport::default();
        let mut problems = self.store_problems();
        let total = self.geo.total_blocks as usize;
        let mut owner = vec![0u64; total];
        let mut valid = Vec::new();
        let mut block = vec![0u8; BLOCK_SIZE];
        self.layout.for_each_slot(&mut |loc| {
            let e = self.meta.read_entry(&mut t, loc)?;
            if e.blocknr == 0 {
                return Ok(());
            }
            if !e.is_valid() || !self.in_data(e.blocknr) {
                problems.push(format!("entry {loc} holds block {:#x}", e.blocknr));
                return Ok(());
            }
            let b = e.blocknr as usize;
            rep.valid_entries += 1;
            valid.push(loc);
            if owner[b] != 0 {
                problems.push(format!("block {b} has entries {} and {loc}", owner[b]));
            }
            owner[b] = loc;
            if !self.alloc.is_allocated(e.blocknr) {
                problems.push(format!("entry {loc} names free block {b}"));
            }
            if e.refcount == 0 {
                problems.push(format!("entry {loc} has refcount 0"));
            }
            self.medium
                .read(e.blocknr * BLOCK_SIZE as u64, &mut block)?;
            if self.fpr.fingerprint(&block) != e.fp {
                rep.fp_mismatches += 1;
                rep.fp_mismatch_blocks.push(e.blocknr);
                problems.push(format!(
                    "entry {loc}: block {b} does not match its fingerprint"
                ));
            }
            let _sh = self.locks.lock(e.fp);
            // Anywhere the store keeps it (a two-level store: memory or medium).
            if self.store.dyn_store().holds(e.fp, loc) {
                rep.indexed_entries += 1;
            }
            Ok(())
        })?;
        rep.problems = problems;
        // A partial store (one that may forget) only has to hold valid entries.
        let held = self.store.dyn_store().len();
        if held != rep.indexed_entries
            && self.store.dyn_store().exact_len()
            && (self.store.dyn_store().complete() || held > rep.indexed_entries)
        {
            rep.problems.push(format!(
                "index holds {} entries, {} of them valid",
                held, rep.indexed_entries
            ));
        }
        let mut buf = vec![0u8; 8];
        for b in self.geo.data_start..self.geo.total_blocks {
            self.meta.read(&mut t, self.revmap.slot_off(b), &mut buf)?;
            let r = u64::from_le_bytes([
                buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6], buf[7],
            ]);
            if r != owner[b as usize] {
                rep.problems.push(format!(
                    "reverse map of {b} is {r}, entry is {}",
                    owner[b as usize]
                ));
            }
        }
        valid.sort_unstable();
        rep.problems.extend(self.layout.check(&valid));
        Ok(rep)
    }
}
