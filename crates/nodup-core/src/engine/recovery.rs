//! Recovery (Light-Dedup §4.5): the clean-shutdown save area and normal recovery, and failure
//! recovery driven by the caller's references.
//!
//! Save area layout (`save_start`): one header block, then the payload as little-endian u64
//! words: allocation bitmap of the data area, the store's words, layout state. The store's
//! words are the sorted entry locations of the complete index, or, for a store that saves its
//! own state (`smart`: the directory of its on-media groups, see `policy/smart/store.rs`),
//! what it saved; the policy recorded in the superblock says which.
//!
//! | offset | width | field                               |
//! |-------:|------:|-------------------------------------|
//! | 0      | 8     | magic `NDSAVE01`                    |
//! | 8      | 4     | version                             |
//! | 12     | 4     | reserved                            |
//! | 16     | 8     | bitmap words                        |
//! | 24     | 8     | store words                         |
//! | 32     | 8     | layout words                        |
//! | 40     | 8     | data blocks in use                  |
//! | 48     | 8     | xxh3-64 of the payload              |
//! | 56     | 8     | xxh3-64 of header bytes 0..56       |

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{
    Engine, RecoveryReport, STATE_NEEDS_RECOVERY, STATE_READY, STATE_READ_ONLY, STATE_SHUT,
};
use crate::alloc::bitmap::Bitmap;
use crate::alloc::Allocator;
use crate::codec::{le_u32, le_u64};
use crate::meta::io::IoTally;
use crate::meta::lazy_words::MappedWords;
use crate::meta::record::{DedupEntry, OFF_BLOCKNR, OFF_REFCOUNT, RESERVED};
use crate::{BlockNr, Error, Result, BLOCK_SIZE};

/// Save-area magic.
pub const SAVE_MAGIC: [u8; 8] = *b"NDSAVE01";
/// Save-area format version.
pub const SAVE_VERSION: u32 = 1;
const SAVE_HDR: usize = 64;

impl Engine {
    fn save_off(&self) -> u64 {
        self.geo.save_start * BLOCK_SIZE as u64
    }

    /// Normal recovery: reload allocator, index and layout counters from the save area.
    pub(super) fn load_saved(&self) -> Result<()> {
        let mut t = IoTally::default();
        let corrupt = |m: &str| Error::Corrupt(format!("save area: {m}"));
        let mut h = [0u8; SAVE_HDR];
        self.meta.read(&mut t, self.save_off(), &mut h)?;
        if h[0..8] != SAVE_MAGIC || xxhash_rust::xxh3::xxh3_64(&h[..56]) != le_u64(&h, 56) {
            return Err(corrupt("bad header"));
        }
        if le_u32(&h, 8) != SAVE_VERSION {
            return Err(corrupt("unknown version"));
        }
        let (nb, ni, nl, phys) = (
            le_u64(&h, 16),
            le_u64(&h, 24),
            le_u64(&h, 32),
            le_u64(&h, 40),
        );
        let cap_words = (self.geo.save_blocks - 1) * (BLOCK_SIZE as u64 / 8);
        if nb != Allocator::save_len_words(self.geo.data_blocks) as u64
            || ni > self.geo.data_blocks
            || nl > self.layout.max_state_words()
            || nb + ni + nl > cap_words
            || phys > self.geo.data_blocks
        {
            return Err(corrupt("sizes out of range"));
        }
        let nwords = (nb + ni + nl) as usize;
        // Up to 32 KiB per GiB of medium, read once at mount: mapped, so none of it stays
        // resident after the allocator and the store have taken what they keep.
        let mut payload = MappedWords::new(nwords)?;
        self.meta.read(
            &mut t,
            self.save_off() + BLOCK_SIZE as u64,
            payload.bytes_mut(),
        )?;
        if xxhash_rust::xxh3::xxh3_64(payload.bytes()) != le_u64(&h, 48) {
            return Err(corrupt("payload checksum mismatch"));
        }
        let words = payload.words();
        let (bitmap, rest) = words.split_at(nb as usize);
        let (locs, lw) = rest.split_at(ni as usize);
        self.alloc.load_words(bitmap)?;
        match &self.store {
            crate::store::StoreHandle::Complete(_) => self.reload_index(&mut t, locs)?,
            crate::store::StoreHandle::Own(s) => match s.restore_words(locs) {
                Err(Error::Unsupported(_)) => self.reload_index(&mut t, locs)?,
                r => r?,
            },
        }
        self.layout.load_state(lw)?;
        self.c.physical_blocks.store(phys, Ordering::Relaxed);
        self.merge_tally(&t);
        Ok(())
    }

    /// Rebuild the policy's store from saved entry locations: the entries are read and checked
    /// first (two threads), then handed to the store in one [`crate::store::FpStore::load`], which the
    /// complete index uses to size each shard for its final count before filling it (saved in
    /// hash order and inserted one by one into growing tables, they would all land in the low
    /// end of each table and form one long probe chain: quadratic time).
    fn reload_index(&self, t: &mut IoTally, locs: &[u64]) -> Result<()> {
        let corrupt = |m: &str| Error::Corrupt(format!("save area: {m}"));
        let read_part = |part: &[u64]| -> Result<(Vec<(u64, u64)>, IoTally)> {
            let mut t = IoTally::default();
            let mut out = Vec::with_capacity(part.len());
            for &loc in part {
                if !self.layout.is_entry_loc(loc) {
                    return Err(corrupt("saved index location is not an entry"));
                }
                let e = self.meta.read_entry(&mut t, loc)?;
                if !e.is_valid() || !self.in_data(e.blocknr) || !self.alloc.is_allocated(e.blocknr)
                {
                    return Err(corrupt("saved index names an invalid entry"));
                }
                out.push((e.fp, loc));
            }
            Ok((out, t))
        };
        // Entries are read in medium order: saved in hash order they were random reads across
        // the region blocks (a cache miss and often a page fault each). Saves since this build
        // are sorted already.
        let sorted;
        let locs = if locs.is_sorted() {
            locs
        } else {
            let mut v = locs.to_vec();
            v.sort_unstable();
            sorted = v;
            &sorted[..]
        };
        let half = locs.len() / 2;
        let (a, b) = if locs.len() < 1 << 16 {
            (read_part(locs)?, (Vec::new(), IoTally::default()))
        } else {
            std::thread::scope(|sc| {
                let h = sc.spawn(|| read_part(&locs[half..]));
                let a = read_part(&locs[..half]);
                let b = h
                    .join()
                    .unwrap_or_else(|_| Err(corrupt("index reload thread panicked")));
                Ok::<_, Error>((a?, b?))
            })?
        };
        for x in [&a.1, &b.1] {
            t.meta_read += x.meta_read;
            t.meta_written += x.meta_written;
        }
        let mut pairs = a.0;
        pairs.extend_from_slice(&b.0);
        drop(b);
        self.store.dyn_store().load(&pairs);
        Ok(())
    }

    /// Clean shutdown: write the save area, then set the clean flag.
    pub(super) fn save_and_close(&self) -> Result<()> {
        let _g = self.admin.lock();
        self.check_ready()?;
        self.set_state(STATE_SHUT);
        let mut t = IoTally::default();
        // The store first: saving its own state may take and give back blocks.
        let own = self.store.dyn_store().save_words()?;
        let bitmap = self.alloc.save_words();
        let locs = match own {
            Some(w) => w,
            None => {
                let mut locs = self.store.dyn_store().locations();
                // Medium order, so the next open reads the entries sequentially.
                locs.sort_unstable();
                locs
            }
        };
        let lw = self.layout.save_state();
        let cap_words = (self.geo.save_blocks - 1) * (BLOCK_SIZE as u64 / 8);
        if (bitmap.len() + locs.len() + lw.len()) as u64 > cap_words {
            return Err(Error::NoSpace);
        }
        let mut payload = Vec::with_capacity((bitmap.len() + locs.len() + lw.len()) * 8);
        for w in bitmap.iter().chain(locs.iter()).chain(lw.iter()) {
            payload.extend_from_slice(&w.to_le_bytes());
        }
        let poff = self.save_off() + BLOCK_SIZE as u64;
        self.meta.write(&mut t, poff, &payload)?;
        self.meta.flush(poff, payload.len() as u64);
        self.meta.fence()?;
        let mut h = [0u8; SAVE_HDR];
        h[0..8].copy_from_slice(&SAVE_MAGIC);
        h[8..12].copy_from_slice(&SAVE_VERSION.to_le_bytes());
        let fields = [
            bitmap.len() as u64,
            locs.len() as u64,
            lw.len() as u64,
            self.c.physical_blocks.load(Ordering::Relaxed),
            xxhash_rust::xxh3::xxh3_64(&payload),
        ];
        for (i, v) in fields.iter().enumerate() {
            h[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        let hs = xxhash_rust::xxh3::xxh3_64(&h[..56]);
        h[56..64].copy_from_slice(&hs.to_le_bytes());
        self.meta.write(&mut t, self.save_off(), &h)?;
        self.meta.flush(self.save_off(), SAVE_HDR as u64);
        self.meta.fence()?;
        self.merge_tally(&t);
        let mut sb = self.sb.lock();
        sb.clean = true;
        sb.store(&*self.meta_medium)?;
        drop(sb);
        // The image is clean and durable, and nothing runs any more: give the free blocks
        // back to what holds the image. A failure here changes nothing the image says (the
        // blocks stay allocated where it lives), so it does not fail the shutdown.
        *self.given_back.lock() = Some(self.discard_free().map_err(|e| e.to_string()));
        self.reserve_for_next_open();
        Ok(())
    }

    /// Failure recovery (see [`Engine::recover`]).
    pub(super) fn failure_recovery(
        &self,
        data_refs: &mut dyn Iterator<Item = BlockNr>,
        meta_blocks: &mut dyn Iterator<Item = BlockNr>,
    ) -> Result<RecoveryReport> {
        let _g = self.admin.lock();
        // Not an engine shut down or opened read-only: its image is saved, or not to be
        // written (a caller that waited for its locks through a shutdown finds it so).
        match self.state.load(Ordering::Acquire) {
            STATE_SHUT => return Err(Error::Invalid("the engine was shut down".into())),
            STATE_READ_ONLY => {
                return Err(Error::Invalid("the engine was opened read-only".into()))
            }
            _ => {}
        }
        let t0 = Instant::now();
        self.set_state(STATE_NEEDS_RECOVERY);
        let mut t = IoTally::default();
        let mut rep = RecoveryReport::default();
        self.layout.attach(&self.meta, &mut t)?;
        self.store.dyn_store().clear();
        self.locks.clear();
        // Helpers' stream state may name entries dropped below (recovery while mounted).
        self.split_ctxs.lock().clear();
        if let Some(rc) = &self.read_cache {
            rc.clear();
        }
        // The fingerprints to index, handed to the store in one `load` once the allocator is
        // rebuilt (a store that keeps part of itself on the medium takes blocks from it).
        // Fingerprint -> the one entry location indexed for it.
        let mut indexed: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
        let mut pairs: Vec<(u64, u64)> = Vec::new();
        let total = self.geo.total_blocks as usize;

        // 1. What the caller references: the source of truth.
        let mut refs = vec![0u32; total];
        for b in data_refs {
            if !self.in_data(b) {
                return Err(Error::Invalid(format!(
                    "referenced block {b} is outside the data area"
                )));
            }
            refs[b as usize] = refs[b as usize].saturating_add(1);
        }
        let mut taken = Bitmap::new(total);
        for b in meta_blocks {
            if !self.in_data(b) || refs[b as usize] != 0 {
                return Err(Error::Invalid(format!(
                    "metadata block {b} is outside the data area or also data"
                )));
            }
            taken.set(b as usize);
        }
        for b in self.layout.owned_blocks() {
            if refs[b as usize] != 0 || taken.set(b as usize) {
                return Err(Error::Corrupt(format!(
                    "region block {b} is also referenced by the caller"
                )));
            }
        }

        // 2. Walk every entry slot: keep entries whose block is referenced and whose
        //    fingerprint matches the block, set their refcount, invalidate the rest.
        let mut ent_at = vec![0u64; total];
        let mut valid = Vec::new();
        // Kept entries of blocks referenced once: the only ones step 5 may give up for room.
        let mut single: Vec<(u64, BlockNr)> = Vec::new();
        let mut block = vec![0u8; BLOCK_SIZE];
        let mm = &**self.meta.medium();
        let verify = self.policy.verify();
        self.layout.for_each_slot(&mut |loc| {
            rep.entries_scanned += 1;
            let e = self.meta.read_entry(&mut t, loc)?;
            if e.blocknr == 0 {
                return Ok(());
            }
            let b = e.blocknr;
            let usable = e.is_valid()
                && self.in_data(b)
                && !taken.get(b as usize)
                && ent_at[b as usize] == 0;
            if !(usable && refs[b as usize] > 0) {
                if usable {
                    rep.leaked_blocks_freed += 1;
                }
                self.meta.write(&mut t, loc + OFF_BLOCKNR, &[0u8; 16])?;
                mm.flush(loc + OFF_BLOCKNR, 16);
                rep.entries_invalidated += 1;
                return Ok(());
            }
            // A referenced block keeps its entry (it carries the block's reference count), but
            // the entry is indexed only when no other entry already holds that fingerprint and,
            // for a policy that trusts a match without comparing bytes, when the fingerprint
            // matches the block: such a lookup must never find a wrong block. A verifying
            // policy compares every candidate anyway, so it skips reading every data block
            // (most of the recovery time on a large image).
            let fp_ok = if verify {
                true
            } else {
                self.medium.read(b * BLOCK_SIZE as u64, &mut block)?;
                t.data_read += BLOCK_SIZE as u64;
                self.fpr.fingerprint(&block) == e.fp
            };
            let index_it = fp_ok && !indexed.contains_key(&e.fp);
            if index_it {
                indexed.insert(e.fp, loc);
            }
            if !index_it {
                rep.entries_unindexed += 1;
            }
            let want = refs[b as usize] as u64;
            if e.refcount != want {
                self.meta.write_u64(&mut t, loc + OFF_REFCOUNT, want)?;
                mm.flush(loc + OFF_REFCOUNT, 8);
                rep.refcounts_fixed += 1;
            }
            ent_at[b as usize] = loc;
            valid.push(loc);
            if want == 1 {
                single.push((loc, b));
            }
            if index_it {
                pairs.push((e.fp, loc));
            }
            Ok(())
        })?;

        // 3. Reverse map: exactly the surviving entries.
        let per = BLOCK_SIZE / 8;
        let mut buf = vec![0u8; BLOCK_SIZE];
        for chunk in 0..self.geo.revmap_blocks {
            let first = chunk as usize * per;
            if first >= total {
                break;
            }
            let off = self.revmap.start + chunk * BLOCK_SIZE as u64;
            self.meta.read(&mut t, off, &mut buf)?;
            let mut changed = false;
            for i in 0..per.min(total - first) {
                let want = ent_at[first + i];
                if le_u64(&buf, i * 8) != want {
                    buf[i * 8..i * 8 + 8].copy_from_slice(&want.to_le_bytes());
                    changed = true;
                }
            }
            if changed {
                self.meta.write(&mut t, off, &buf)?;
                mm.flush(off, BLOCK_SIZE as u64);
            }
        }
        self.meta.fence()?;

        // 4. Allocator: referenced data, caller metadata and the layout's own blocks.
        self.alloc.reset_all_free();
        let mut phys = 0u64;
        for b in self.geo.data_start..self.geo.total_blocks {
            let i = b as usize;
            if refs[i] > 0 {
                phys += 1;
            }
            if refs[i] > 0 || taken.get(i) {
                self.alloc.mark_used(b)?;
            }
        }
        valid.sort_unstable();
        self.layout.rebuild(&valid)?;
        self.c.physical_blocks.store(phys, Ordering::Relaxed);
        rep.referenced_blocks = phys;
        self.store.dyn_store().load(&pairs);
        drop(pairs);

        // 5. A block referenced more than once must carry an entry with its count: a block
        //    without one counts as a single reference, and the next release would free it
        //    while other references remain. Its entry can be missing after a crash (torn or
        //    never persisted) or dropped above as malformed, so it is recreated here, once
        //    allocator and layout are rebuilt (a region layout may need a new region block).
        //    Entries of blocks referenced once are given up, in slot order, when no slot is
        //    left: such a block needs no entry, it only stops being a dedup target.
        single.sort_unstable();
        let mut victims = single.into_iter();
        let mut apool = 0usize;
        for b in self.geo.data_start..self.geo.total_blocks {
            let want = refs[b as usize];
            if want < 2 || ent_at[b as usize] != 0 {
                continue;
            }
            self.medium.read(b * BLOCK_SIZE as u64, &mut block)?;
            t.data_read += BLOCK_SIZE as u64;
            let fp = self.fpr.fingerprint(&block);
            let loc = loop {
                match self
                    .layout
                    .alloc_entry(&self.meta, &mut t, fp, 0, &self.alloc, &mut apool)
                {
                    Ok(l) => break l,
                    Err(Error::NoSpace) => {
                        let Some((vloc, vb)) = victims.next() else {
                            // Carrying on would leave the latent double free; the caller can
                            // free space (or grow the image) and recover again.
                            return Err(Error::NoSpace);
                        };
                        let vfp = self.drop_entry(&mut t, vloc, vb)?;
                        if indexed.get(&vfp) == Some(&vloc) {
                            indexed.remove(&vfp);
                        }
                        ent_at[vb as usize] = 0;
                        rep.entries_invalidated += 1;
                    }
                    Err(x) => return Err(x),
                }
            };
            self.recreate_entry(&mut t, loc, b, fp, want as u64)?;
            ent_at[b as usize] = loc;
            rep.entries_recreated += 1;
            if let std::collections::hash_map::Entry::Vacant(v) = indexed.entry(fp) {
                v.insert(loc);
                let _sh = self.locks.lock(fp);
                self.store.insert(fp, loc);
            } else {
                rep.entries_unindexed += 1;
            }
        }
        self.merge_tally(&t);
        self.set_state(STATE_READY);
        let _ = self.reserve_save_area();
        rep.seconds = t0.elapsed().as_secs_f64();
        Ok(rep)
    }

    /// Write a new entry for block `b` into the claimed slot `loc`, crash-safely: the body goes
    /// first under `RESERVED` (which no recovery trusts), and only once it is durable the
    /// commit field names the block, together with the reverse-map slot. A crash in between
    /// leaves a reserved slot, which the next recovery clears and recreates.
    pub(super) fn recreate_entry(
        &self,
        t: &mut IoTally,
        loc: u64,
        b: BlockNr,
        fp: u64,
        refcount: u64,
    ) -> Result<()> {
        let e = DedupEntry {
            fp,
            blocknr: RESERVED,
            refcount,
            hint: 0,
        };
        self.meta.write_entry(t, loc, &e)?;
        self.meta.flush(loc, 32);
        self.meta.fence()?;
        self.meta.write_u64(t, loc + OFF_BLOCKNR, b)?;
        self.meta.flush(loc + OFF_BLOCKNR, 8);
        self.revmap.set(&self.meta, t, b, loc)?;
        self.meta.fence()
    }

    /// Give up the entry at `loc` of block `b` (referenced once, so it needs none): unindex
    /// it, clear it and its reverse-map slot durably, then hand the slot back to the layout.
    /// Returns the fingerprint it held.
    fn drop_entry(&self, t: &mut IoTally, loc: u64, b: BlockNr) -> Result<u64> {
        let e = self.meta.read_entry(t, loc)?;
        {
            let _sh = self.locks.lock(e.fp);
            self.store.remove(e.fp, loc);
        }
        self.clear_entry(t, loc, b)?;
        Ok(e.fp)
    }

    /// Clear the entry slot at `loc` of block `b` (its commit field and count) and the block's
    /// reverse-map slot, durably, then hand the slot back to the layout. No index may name it.
    pub(super) fn clear_entry(&self, t: &mut IoTally, loc: u64, b: BlockNr) -> Result<()> {
        self.meta.write(t, loc + OFF_BLOCKNR, &[0u8; 16])?;
        self.meta.flush(loc + OFF_BLOCKNR, 16);
        self.revmap.set(&self.meta, t, b, 0)?;
        self.meta.fence()?;
        self.layout.free_entry(loc);
        Ok(())
    }
}
