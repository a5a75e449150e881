//! `region` layout: the Light-Meta-Table (Light-Dedup §4.4).
//!
//! On-media layout of one region (one 4 KiB block):
//!
//! | offset | width      | field                                       |
//! |-------:|-----------:|---------------------------------------------|
//! | 0      | 127 x 32 B | entries (see `record`)                      |
//! | 4064   | 8          | magic `REGION_MAGIC`                        |
//! | 4072   | 16         | reserved (zero)                             |
//! | 4088   | 8          | next region's block number (0 = end)        |
//!
//! The first `HEADER_REGIONS` regions sit in a fixed area and are the list head; more regions
//! are taken from the block allocator and linked at the tail; they are never given back
//! (GC-free). A grow adds one region, as the paper's LMT does, on a medium whose fences are
//! cheap (pmem). On a block file ([`crate::media::Medium::gathers`]) a fence is an
//! `fdatasync` that writes out every dirty page of the image, and two of them per 127 new
//! blocks (508 KiB) held writes at a fraction of the disk's speed; there a grow adds a batch
//! ([`grow_count`]: about half the chain's length, at most [`GROW_MAX`], never more than the
//! free space could fill), written and linked with the same two fences for the whole batch,
//! the rest of the batch queued as allocatable (empty) regions. One grow runs at a time.
//!
//! Each writer pool has a current region it fills almost sequentially, checking entries one by
//! one. A region is allocatable (in the DRAM Region Queue) while at most half of its entries
//! (64) are in use; a deletion that brings a region back to 64 used entries re-queues it.
//! Valid-entry counters live in DRAM and are saved on clean shutdown.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::io::{IoTally, MetaIo};
use super::lazy_words::LazyWords;
use super::record::{ENTRY_SIZE, OFF_BLOCKNR};
use super::{LayoutGeometry, MetaLayout, MetaLayoutKind};
use crate::alloc::Allocator;
use crate::{BlockNr, Error, Result, BLOCK_SIZE};

/// Entries per region.
pub const REGION_ENTRIES: u64 = 127;
/// Offset of the region magic.
pub const OFF_MAGIC: u64 = REGION_ENTRIES * ENTRY_SIZE;
/// Offset of the next-region pointer.
pub const OFF_NEXT: u64 = BLOCK_SIZE as u64 - 8;
/// Magic of a region block.
pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"NDREGION");
/// Regions in the fixed header area.
pub const HEADER_REGIONS: u64 = 1;
/// A region is allocatable while at most this many entries are in use (half of 128 slots).
pub const ALLOCATABLE_MAX: i32 = 64;
/// Writer pools with their own current region.
const CUR_SLOTS: usize = 16;
/// Most regions one grow adds (256 KiB of regions, room for 8128 new blocks).
pub const GROW_MAX: usize = 64;

/// Regions a grow on a block file adds to a chain of `regions` with `free` free blocks: about
/// half the chain, so a growing table grows by about 1.5x per grow and at most a third of its
/// regions stand empty; at most [`GROW_MAX`]; and no more than the free blocks could fill
/// (each region takes one block and holds 127 entries, each naming one more block).
fn grow_count(regions: usize, free: u64) -> usize {
    let fill = (free / (REGION_ENTRIES + 1)) as usize;
    (regions / 2).min(GROW_MAX).min(fill).max(1)
}

/// What DRAM holds per region (16 bytes: the table grows by about 0.13-0.25 B per unique
/// block, as regions hold 64-127 entries).
#[derive(Debug, Clone, Copy)]
struct RegionInfo {
    block: u64,
    /// Valid entries, not counting allocations a current region has not published yet.
    valid: i32,
    queued: bool,
    cur: bool,
    /// Added by a grow of this engine and never current since: every slot is zero, so its
    /// first writer need not read slots back (see [`Cur::fresh`]).
    fresh: bool,
}

#[derive(Debug, Default)]
struct State {
    regions: Vec<RegionInfo>,
    /// Region indices sorted by block number (4 bytes per region where a hash map took about
    /// 30): finds the region of an entry being freed by binary search.
    by_block: Vec<u32>,
    queue: VecDeque<u32>,
}

impl State {
    /// Where `b` is (Ok) or would go (Err) in `by_block`.
    fn search(&self, b: u64) -> std::result::Result<usize, usize> {
        self.by_block
            .binary_search_by_key(&b, |&i| self.regions[i as usize].block)
    }

    /// Index of the region in block `b`.
    fn region_of(&self, b: u64) -> Option<u32> {
        self.search(b).ok().map(|at| self.by_block[at])
    }

    /// Add a region at the end of the chain, keeping `by_block` sorted (a new region of a
    /// running engine; the caller made sure its block is not a region yet).
    fn push(&mut self, info: RegionInfo) {
        let at = self.search(info.block).unwrap_or_else(|at| at);
        self.by_block.insert(at, self.regions.len() as u32);
        self.regions.push(info);
    }

    /// Sort `by_block` once after regions were added in chain order with `push_unsorted`
    /// (attach: inserting each in place would move O(n^2) bytes over a long chain).
    fn sort_index(&mut self) {
        let State {
            regions, by_block, ..
        } = self;
        by_block.sort_unstable_by_key(|&i| regions[i as usize].block);
    }

    /// Add a region at the end of the chain; `by_block` needs [`State::sort_index`] after.
    fn push_unsorted(&mut self, info: RegionInfo) {
        self.by_block.push(self.regions.len() as u32);
        self.regions.push(info);
    }
}

#[derive(Debug, Clone, Copy)]
struct Cur {
    ridx: u32,
    block: u64,
    next: u64,
    /// Entries claimed since the region became current (published at eviction).
    local: i32,
    /// The region was created by this writer and every slot past `next` is known free, so
    /// slots need not be read back (a fresh region's lines were just flushed out of the cache).
    fresh: bool,
    /// Bit i: slot i was free when last read (all of a fresh one's; on a block file, a queued
    /// region's, read in one call instead of one per slot). Only this writer claims in its
    /// current region, so a set bit stays true but for one case: a release whose reverse-map
    /// store fails writes the entry it had just cleared back (`engine/release.rs`). So a
    /// run of claims in a region that is not fresh reads the slots again first, which leaves
    /// the window a slot-by-slot scan has between its read and its marker. A slot freed since
    /// reads as taken and waits for the region's next turn. `None`: each slot is read as the
    /// cursor reaches it (pmem, as the paper's LMT does).
    known_free: Option<u128>,
}

/// Bits 0..127 set: every slot of a region.
const ALL_SLOTS: u128 = (1 << REGION_ENTRIES) - 1;

/// The Light-Meta-Table.
pub struct RegionLayout {
    geo: LayoutGeometry,
    state: Mutex<State>,
    curs: Vec<Mutex<Option<Cur>>>,
    /// One bit per block of the medium: is it a region (validates hint targets lock-free).
    is_region: LazyWords,
    /// Held by the one grow that runs at a time (see [`RegionLayout::grow`]).
    growing: Mutex<()>,
    /// A grow's link may be on the medium and could not be undone: the chain there may name
    /// a block the live state does not count as a region (see [`MetaLayout::unsettled`]).
    unsettled: std::sync::atomic::AtomicBool,
}

impl RegionLayout {
    /// A layout over `geo` (call `format` or `attach` next).
    pub fn new(geo: LayoutGeometry) -> RegionLayout {
        RegionLayout {
            geo,
            state: Mutex::new(State::default()),
            curs: (0..CUR_SLOTS).map(|_| Mutex::new(None)).collect(),
            is_region: LazyWords::new(geo.nblocks.div_ceil(64) as usize),
            growing: Mutex::new(()),
            unsettled: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn mark_region(&self, b: u64) {
        self.is_region[(b / 64) as usize].fetch_or(1 << (b % 64), Ordering::Relaxed);
    }

    fn block_is_region(&self, b: u64) -> bool {
        b < self.geo.nblocks
            && self.is_region[(b / 64) as usize].load(Ordering::Relaxed) & (1 << (b % 64)) != 0
    }

    /// Write empty regions into `blocks`, each naming the next as its successor (the last
    /// none), then one fence: the batch is whole on the medium before anything links it.
    fn init_regions(io: &MetaIo, t: &mut IoTally, blocks: &[u64]) -> Result<()> {
        let mut buf = vec![0u8; BLOCK_SIZE];
        buf[OFF_MAGIC as usize..OFF_MAGIC as usize + 8]
            .copy_from_slice(&REGION_MAGIC.to_le_bytes());
        for (i, &b) in blocks.iter().enumerate() {
            let next = blocks.get(i + 1).copied().unwrap_or(0);
            buf[OFF_NEXT as usize..].copy_from_slice(&next.to_le_bytes());
            let off = b * BLOCK_SIZE as u64;
            io.write(t, off, &buf)?;
            io.flush(off, BLOCK_SIZE as u64);
        }
        io.fence()
    }

    /// Publish a current region's claims and hand it back (queued when allocatable).
    fn evict(&self, st: &mut State, c: Cur) {
        if let Some(r) = st.regions.get_mut(c.ridx as usize) {
            r.valid += c.local;
            r.cur = false;
            if r.valid <= ALLOCATABLE_MAX && !r.queued {
                r.queued = true;
                st.queue.push_back(c.ridx);
            }
        }
    }

    /// The next queued region as a writer's current one (a fresh one is claimed without
    /// reading its slots back, once; on a block file another one's slots are read in one call).
    fn pop_queued(&self, io: &MetaIo, t: &mut IoTally) -> Option<Cur> {
        let mut c = {
            let mut st = self.state.lock();
            let r = st.queue.pop_front()?;
            let ri = &mut st.regions[r as usize];
            ri.queued = false;
            ri.cur = true;
            let fresh = std::mem::take(&mut ri.fresh);
            Cur {
                ridx: r,
                block: ri.block,
                next: 0,
                local: 0,
                fresh,
                known_free: fresh.then_some(ALL_SLOTS),
            }
        };
        if !c.fresh && io.medium().gathers() {
            // A failed read leaves the slots to be read one by one, as on pmem.
            c.known_free = Self::free_slots(io, t, c.block).ok();
        }
        Some(c)
    }

    /// Which slots of the region in `block` are free (one read of its entries).
    fn free_slots(io: &MetaIo, t: &mut IoTally, block: u64) -> Result<u128> {
        let mut buf = vec![0u8; OFF_MAGIC as usize];
        io.read(t, block * BLOCK_SIZE as u64, &mut buf)?;
        Ok((0..REGION_ENTRIES as usize)
            .filter(|&i| {
                crate::codec::le_u64(&buf, i * ENTRY_SIZE as usize + OFF_BLOCKNR as usize) == 0
            })
            .fold(0u128, |m, i| m | 1 << i))
    }

    /// New regions from the block allocator (one; [`grow_count`] of them on a block file),
    /// linked at the tail of the chain; the first becomes the writer's current region, the rest
    /// are queued.
    fn grow(
        &self,
        io: &MetaIo,
        t: &mut IoTally,
        alloc: &Allocator,
        apool: &mut usize,
    ) -> Result<Cur> {
        // One grow at a time: writers that ran out of regions together would each add a batch
        // sized from the same counts, more than the free space could fill.
        let _one = self.growing.lock();
        if let Some(c) = self.pop_queued(io, t) {
            // Another writer's grow queued regions while this one waited.
            return Ok(c);
        }
        let (tail, regions) = {
            let st = self.state.lock();
            let tail = st
                .regions
                .last()
                .map(|r| r.block)
                .ok_or_else(|| Error::Corrupt("region chain has no head".into()))?;
            (tail, st.regions.len())
        };
        let want = if io.medium().gathers() {
            grow_count(regions, alloc.free_blocks())
        } else {
            1
        };
        let mut blocks = Vec::with_capacity(want);
        while blocks.len() < want {
            match alloc.alloc(apool) {
                Ok(b) => blocks.push(b),
                // Fewer serve (another writer took the last blocks meanwhile).
                Err(_) if !blocks.is_empty() => break,
                Err(e) => return Err(e),
            }
        }
        let give_back = |blocks: &[u64]| {
            for &b in blocks {
                let _ = alloc.free(b);
            }
        };
        if let Some(b) = blocks.iter().find(|&&b| self.block_is_region(b)) {
            // Checked before the chain links it: a second link would make a cycle on media.
            let e = Error::Corrupt(format!("block {b} is a region already"));
            give_back(&blocks);
            return Err(e);
        }
        let mut written = Self::init_regions(io, t, &blocks);
        if written.is_err() && blocks.len() > 1 {
            // A batch that could not be written (a full disk under a sparse image) may leave
            // room for one region.
            give_back(&blocks[1..]);
            blocks.truncate(1);
            written = Self::init_regions(io, t, &blocks);
        }
        if let Err(e) = written {
            // Nothing on the medium names them yet.
            give_back(&blocks);
            return Err(e);
        }
        let off = tail * BLOCK_SIZE as u64 + OFF_NEXT;
        let mut link = |to: u64| {
            io.write_u64(t, off, to).and_then(|()| {
                io.flush(off, 8);
                io.fence()
            })
        };
        if let Err(e) = link(blocks[0]) {
            // The link may be on the medium all the same: the chain would take the blocks in
            // at the next open while the allocator hands them out. End the chain at the tail
            // again (it was the end) before giving the blocks back. If even that fails, the
            // blocks stay allocated and the engine gives up its live state (see
            // `MetaLayout::unsettled`): failure recovery reads the chain from the medium.
            if link(0).is_ok() {
                give_back(&blocks);
            } else {
                self.unsettled.store(true, Ordering::Release);
            }
            return Err(e);
        }
        let mut st = self.state.lock();
        let ridx = st.regions.len() as u32;
        for (i, &b) in blocks.iter().enumerate() {
            let first = i == 0;
            st.push(RegionInfo {
                block: b,
                valid: 0,
                queued: !first,
                cur: first,
                fresh: !first,
            });
            if !first {
                st.queue.push_back(ridx + i as u32);
            }
            self.mark_region(b);
        }
        Ok(Cur {
            ridx,
            block: blocks[0],
            next: 0,
            local: 0,
            fresh: true,
            known_free: Some(ALL_SLOTS),
        })
    }

    /// Number of regions (for tests and stats).
    pub fn region_count(&self) -> usize {
        self.state.lock().regions.len()
    }

    /// Valid-entry counter of every region, current regions' unpublished claims included.
    pub fn counters(&self) -> Vec<i64> {
        let mut v: Vec<i64> = self
            .state
            .lock()
            .regions
            .iter()
            .map(|r| i64::from(r.valid))
            .collect();
        for c in &self.curs {
            if let Some(c) = *c.lock() {
                if let Some(x) = v.get_mut(c.ridx as usize) {
                    *x += i64::from(c.local);
                }
            }
        }
        v
    }

    fn publish_all(&self) {
        for c in &self.curs {
            let mut g = c.lock();
            if let Some(cur) = g.take() {
                self.evict(&mut self.state.lock(), cur);
            }
        }
    }
}

impl RegionLayout {
    /// Claim the next free slot of the writer's current region (`cur`, whose lock the caller
    /// holds), moving to a queued region or a new one when it is full.
    fn claim(
        &self,
        cur: &mut Option<Cur>,
        io: &MetaIo,
        t: &mut IoTally,
        alloc: &Allocator,
        apool: &mut usize,
    ) -> Result<u64> {
        loop {
            if let Some(c) = cur.as_mut() {
                // Check the entries of the current region one by one for a free one.
                while c.next < REGION_ENTRIES {
                    let i = c.next;
                    let loc = c.block * BLOCK_SIZE as u64 + i * ENTRY_SIZE;
                    c.next += 1;
                    let free = match c.known_free {
                        Some(m) => m >> i & 1 == 1,
                        None => io.read_u64(t, loc + OFF_BLOCKNR)? == 0,
                    };
                    if free {
                        super::reserve_slot(io, t, loc)?;
                        c.local += 1;
                        return Ok(loc);
                    }
                }
                let done = *c;
                *cur = None;
                if done.local == 0 && !done.fresh {
                    // Its count said at least half of it was free, and no slot is: the region
                    // on the medium is not what the engine wrote there (a stray write, a
                    // damaged medium). Queued again it would be scanned forever; left out,
                    // the writers go on in other regions.
                    if let Some(r) = self.state.lock().regions.get_mut(done.ridx as usize) {
                        r.cur = false;
                    }
                    return Err(Error::Corrupt(format!(
                        "entry region at block {} has no free slot, though its count says it has",
                        done.block
                    )));
                }
                self.evict(&mut self.state.lock(), done);
            }
            let next = self.pop_queued(io, t);
            *cur = Some(match next {
                Some(c) => c,
                None => self.grow(io, t, alloc, apool)?,
            });
        }
    }
}

impl RegionLayout {
    /// Claim up to `n` consecutive free slots of the current region in one store, on a medium
    /// that makes a system call per store ([`crate::media::Medium::gathers`]), where the region's
    /// free slots are known ([`Cur::known_free`]): used slots at the cursor are passed over, then
    /// whole slots holding only the reserved marker are written over the run (a free slot's
    /// other fields mean nothing). Returns the run's first slot index (`c.next` is past its
    /// last), or `None` when no free slot is left. `reread`: a region that is not fresh has its
    /// slots read again first (see [`Cur::known_free`]). On a failed store the slots are cleared
    /// (best effort) and skipped, as [`super::reserve_slot`] leaves a slot whose marker failed.
    fn claim_run(
        c: &mut Cur,
        io: &MetaIo,
        t: &mut IoTally,
        n: usize,
        reread: bool,
    ) -> Result<Option<u64>> {
        use super::record::{DedupEntry, RESERVED};
        let Some(mut free) = c.known_free else {
            return Ok(None);
        };
        if reread && !c.fresh {
            // See `Cur::known_free`: one read per batch of claims, not per slot.
            free &= Self::free_slots(io, t, c.block)?;
            c.known_free = Some(free);
        }
        let is_free = |i: u64| i < REGION_ENTRIES && free >> i & 1 == 1;
        while c.next < REGION_ENTRIES && !is_free(c.next) {
            c.next += 1;
        }
        let start = c.next;
        let mut end = start;
        while end < start + n as u64 && is_free(end) {
            end += 1;
        }
        if end == start {
            return Ok(None);
        }
        let marked = DedupEntry {
            blocknr: RESERVED,
            ..DedupEntry::default()
        }
        .to_bytes();
        let run: Vec<u8> = (start..end).flat_map(|_| marked).collect();
        let off = c.block * BLOCK_SIZE as u64 + start * ENTRY_SIZE;
        c.next = end;
        if let Err(e) = io.write(t, off, &run) {
            let _ = io.write(t, off, &vec![0u8; run.len()]);
            return Err(e);
        }
        c.local += (end - start) as i32;
        Ok(Some(start))
    }
}

impl RegionLayout {
    /// One step of [`MetaLayout::alloc_entries`]: on a medium that gathers its stores, a run
    /// of up to `want` free slots of the current region in one store ([`Self::claim_run`]);
    /// else, or when the region is used up, one slot ([`Self::claim`], which moves on to
    /// another region). The slots go to `out`; returns how many.
    #[allow(clippy::too_many_arguments)]
    fn claim_some(
        &self,
        cur: &mut Option<Cur>,
        io: &MetaIo,
        t: &mut IoTally,
        alloc: &Allocator,
        apool: &mut usize,
        want: usize,
        reread: bool,
        out: &mut VecDeque<u64>,
    ) -> Result<usize> {
        if let Some(c) = cur.as_mut().filter(|_| io.medium().gathers()) {
            if let Some(start) = Self::claim_run(c, io, t, want, reread)? {
                let base = c.block * BLOCK_SIZE as u64;
                out.extend((start..c.next).map(|i| base + i * ENTRY_SIZE));
                return Ok((c.next - start) as usize);
            }
        }
        out.push_back(self.claim(cur, io, t, alloc, apool)?);
        Ok(1)
    }
}

impl MetaLayout for RegionLayout {
    fn kind(&self) -> MetaLayoutKind {
        MetaLayoutKind::Region
    }

    fn format(&self, io: &MetaIo, t: &mut IoTally) -> Result<()> {
        let start = self.geo.start_block;
        let header: Vec<u64> = (start..start + HEADER_REGIONS).collect();
        Self::init_regions(io, t, &header)?;
        self.attach(io, t)?;
        self.rebuild(&[])
    }

    fn attach(&self, io: &MetaIo, t: &mut IoTally) -> Result<()> {
        self.unsettled.store(false, Ordering::Release);
        let mut st = State::default();
        // Only words with a bit set are written, so pages of the bitmap stay untouched.
        for w in self.is_region.iter() {
            if w.load(Ordering::Relaxed) != 0 {
                w.store(0, Ordering::Relaxed);
            }
        }
        let mut b = self.geo.start_block;
        let max = self.geo.nblocks;
        loop {
            let base = b * BLOCK_SIZE as u64;
            if io.read_u64(t, base + OFF_MAGIC)? != REGION_MAGIC {
                return Err(Error::Corrupt(format!(
                    "block {b} in the region chain is not a region"
                )));
            }
            let info = RegionInfo {
                block: b,
                valid: 0,
                queued: false,
                cur: false,
                fresh: false,
            };
            if st.regions.len() as u64 >= max || self.block_is_region(b) {
                return Err(Error::Corrupt("region chain has a cycle".into()));
            }
            st.push_unsorted(info);
            self.mark_region(b);
            let next = io.read_u64(t, base + OFF_NEXT)?;
            if next == 0 {
                break;
            }
            if next < self.geo.data_start || next >= self.geo.nblocks {
                return Err(Error::Corrupt(format!(
                    "region pointer {next} outside the data area"
                )));
            }
            b = next;
        }
        if (st.regions.len() as u64) < HEADER_REGIONS {
            return Err(Error::Corrupt("region header area is short".into()));
        }
        st.sort_index();
        *self.state.lock() = st;
        for c in &self.curs {
            *c.lock() = None;
        }
        Ok(())
    }

    fn alloc_entry(
        &self,
        io: &MetaIo,
        t: &mut IoTally,
        _fp: u64,
        pool: usize,
        alloc: &Allocator,
        apool: &mut usize,
    ) -> Result<u64> {
        let mut cur = self.curs[pool % CUR_SLOTS].lock();
        self.claim(&mut cur, io, t, alloc, apool)
    }

    fn alloc_entries(
        &self,
        io: &MetaIo,
        t: &mut IoTally,
        pool: usize,
        alloc: &Allocator,
        apool: &mut usize,
        n: usize,
        out: &mut std::collections::VecDeque<u64>,
    ) -> Result<usize> {
        let mut cur = self.curs[pool % CUR_SLOTS].lock();
        let mut k = 0;
        // The slots of a current region that is not fresh are read again once per call.
        let mut reread = true;
        while k < n {
            let step = std::mem::take(&mut reread);
            match self.claim_some(&mut cur, io, t, alloc, apool, n - k, step, out) {
                Ok(got) => k += got,
                // The slots claimed so far serve; a media error is noted as absorbed.
                Err(e) if k > 0 => {
                    if matches!(e, crate::Error::Io(_)) {
                        t.errors_absorbed += 1;
                    }
                    return Ok(k);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    fn unsettled(&self) -> bool {
        self.unsettled.load(Ordering::Acquire)
    }

    fn free_entry(&self, loc: u64) {
        let b = loc / BLOCK_SIZE as u64;
        let mut st = self.state.lock();
        let Some(ridx) = st.region_of(b) else {
            return;
        };
        let r = &mut st.regions[ridx as usize];
        r.valid -= 1;
        // Exactly half free again: the region becomes allocatable (unless a writer holds it).
        if !r.cur && !r.queued && r.valid <= ALLOCATABLE_MAX {
            r.queued = true;
            st.queue.push_back(ridx);
        }
    }

    fn is_entry_loc(&self, loc: u64) -> bool {
        loc.is_multiple_of(ENTRY_SIZE)
            && (loc % BLOCK_SIZE as u64) / ENTRY_SIZE < REGION_ENTRIES
            && self.block_is_region(loc / BLOCK_SIZE as u64)
    }

    fn for_each_slot(&self, f: &mut dyn FnMut(u64) -> Result<()>) -> Result<()> {
        let blocks: Vec<u64> = self.state.lock().regions.iter().map(|r| r.block).collect();
        for b in blocks {
            for i in 0..REGION_ENTRIES {
                f(b * BLOCK_SIZE as u64 + i * ENTRY_SIZE)?;
            }
        }
        Ok(())
    }

    fn owned_blocks(&self) -> Vec<BlockNr> {
        let st = self.state.lock();
        st.regions
            .iter()
            .map(|r| r.block)
            .filter(|&b| b >= self.geo.data_start)
            .collect()
    }

    fn rebuild(&self, valid_sorted: &[u64]) -> Result<()> {
        for c in &self.curs {
            *c.lock() = None;
        }
        let mut st = self.state.lock();
        for r in st.regions.iter_mut() {
            *r = RegionInfo {
                valid: 0,
                queued: false,
                cur: false,
                fresh: false,
                ..*r
            };
        }
        for &loc in valid_sorted {
            let b = loc / BLOCK_SIZE as u64;
            let ridx = st
                .region_of(b)
                .ok_or_else(|| Error::Corrupt(format!("entry {loc} outside every region")))?;
            st.regions[ridx as usize].valid += 1;
        }
        st.queue.clear();
        for i in 0..st.regions.len() {
            if st.regions[i].valid <= ALLOCATABLE_MAX {
                st.regions[i].queued = true;
                st.queue.push_back(i as u32);
            }
        }
        Ok(())
    }

    fn save_state(&self) -> Vec<u64> {
        self.publish_all();
        let st = self.state.lock();
        let mut w = Vec::with_capacity(st.regions.len() + 1);
        w.push(st.regions.len() as u64);
        w.extend(st.regions.iter().map(|r| r.valid.max(0) as u64));
        w
    }

    fn load_state(&self, words: &[u64]) -> Result<()> {
        for c in &self.curs {
            *c.lock() = None;
        }
        let mut st = self.state.lock();
        let n = st.regions.len();
        if words.first().copied() != Some(n as u64) || words.len() != n + 1 {
            return Err(Error::Corrupt(
                "saved region counters do not match the region chain".into(),
            ));
        }
        st.queue.clear();
        for i in 0..n {
            let v = words[i + 1];
            if v > REGION_ENTRIES {
                return Err(Error::Corrupt(format!(
                    "region counter {v} exceeds {REGION_ENTRIES}"
                )));
            }
            let r = &mut st.regions[i];
            r.valid = v as i32;
            r.cur = false;
            r.fresh = false;
            r.queued = r.valid <= ALLOCATABLE_MAX;
            if r.queued {
                st.queue.push_back(i as u32);
            }
        }
        Ok(())
    }

    fn max_state_words(&self) -> u64 {
        // Regions are blocks of the medium.
        self.geo.nblocks + 1
    }

    fn check(&self, valid_sorted: &[u64]) -> Vec<String> {
        let counters = self.counters();
        let st = self.state.lock();
        let mut real = vec![0i64; st.regions.len()];
        let mut out = Vec::new();
        for &loc in valid_sorted {
            match st.region_of(loc / BLOCK_SIZE as u64) {
                Some(r) => real[r as usize] += 1,
                None => out.push(format!("entry {loc} is outside every region")),
            }
        }
        for (i, (&c, &r)) in counters.iter().zip(&real).enumerate() {
            // Claimed-but-uncommitted slots are counted too, so only idle engines compare equal.
            if c != r {
                out.push(format!("region {i} counter {c}, {r} valid entries"));
            }
            let ri = &st.regions[i];
            if !ri.cur && !ri.queued && c <= i64::from(ALLOCATABLE_MAX) {
                out.push(format!(
                    "region {i} has {c} entries in use but is not allocatable"
                ));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for &q in &st.queue {
            if !seen.insert(q) {
                out.push(format!("region {q} queued twice"));
            }
        }
        out
    }
}

#[cfg(test)]
#[path = "region_tests.rs"]
mod tests;
