//! Tests of the region layout: filling, growing in batches, failed grows, fresh claims.

use super::*;
use crate::media::MemMedium;
use std::sync::Arc;

/// Blocks of the test media.
const NBLOCKS: u64 = 256;

fn setup() -> (RegionLayout, MetaIo, Allocator) {
    setup_on(Arc::new(MemMedium::new(NBLOCKS * BLOCK_SIZE as u64)))
}

/// A formatted layout (its header region in block 1) over `m`, of [`NBLOCKS`] blocks.
fn setup_on(m: Arc<dyn crate::media::Medium>) -> (RegionLayout, MetaIo, Allocator) {
    setup_sized(m, NBLOCKS)
}

/// A formatted layout over `m`, of `nblocks` blocks.
fn setup_sized(
    m: Arc<dyn crate::media::Medium>,
    nblocks: u64,
) -> (RegionLayout, MetaIo, Allocator) {
    let io = MetaIo::new(m, false);
    let geo = LayoutGeometry {
        start_block: 1,
        blocks: 1,
        slots: 0,
        nblocks,
        data_start: 2,
    };
    let l = RegionLayout::new(geo);
    let mut t = IoTally::default();
    l.format(&io, &mut t).unwrap();
    (l, io, Allocator::new(2, nblocks - 2))
}

fn commit(io: &MetaIo, loc: u64, b: u64) {
    io.write_u64(&mut IoTally::default(), loc + OFF_BLOCKNR, b)
        .unwrap();
}

#[test]
fn fills_sequentially_grows_and_requeues_at_half() {
    let (l, io, a) = setup();
    let mut t = IoTally::default();
    let mut ap = 0;
    let mut locs = Vec::new();
    for i in 0..(REGION_ENTRIES * 2) {
        let loc = l.alloc_entry(&io, &mut t, i, 0, &a, &mut ap).unwrap();
        commit(&io, loc, 100 + i);
        locs.push(loc);
    }
    // Entries come out one after the other: the header region, then one grown region.
    for w in locs.windows(2).take(REGION_ENTRIES as usize - 1) {
        assert_eq!(w[1], w[0] + ENTRY_SIZE);
    }
    assert_eq!(l.region_count(), 2);
    assert!(l.is_entry_loc(locs[200]));
    assert!(!l.is_entry_loc(locs[0] + 8));
    // Free header entries until exactly 64 remain in use: it becomes allocatable again.
    for &loc in &locs[..(REGION_ENTRIES as usize - 65)] {
        commit(&io, loc, 0);
        l.free_entry(loc);
    }
    assert!(l.state.lock().queue.is_empty());
    let loc = locs[REGION_ENTRIES as usize - 65];
    commit(&io, loc, 0);
    l.free_entry(loc);
    assert_eq!(l.state.lock().queue.len(), 1);
    // The current region is full: the next allocations reuse the header's free slots
    // (lowest first) instead of growing the table.
    let next = l.alloc_entry(&io, &mut t, 7, 0, &a, &mut ap).unwrap();
    assert_eq!(next, locs[0]);
    assert_eq!(l.region_count(), 2);
    let mut valid: Vec<u64> = locs[(REGION_ENTRIES as usize - 64)..].to_vec();
    valid.push(next);
    valid.sort_unstable();
    assert!(l.check(&valid).is_empty(), "{:?}", l.check(&valid));
    // Saved counters reload after a re-attach (normal recovery).
    let saved = l.save_state();
    l.attach(&io, &mut t).unwrap();
    l.load_state(&saved).unwrap();
    assert!(l.check(&valid).is_empty());
    assert!(l.load_state(&saved[1..]).is_err());
}

/// A grow whose region write or link fails gives its block back (after ending the chain at
/// the tail again when the link may have landed), so a failed entry allocation leaks
/// nothing; the next one grows.
#[test]
fn a_grow_that_fails_gives_its_block_back() {
    use crate::media::{FaultMedium, FaultOp, FaultRule, Medium};
    let mut grow_failed = 0;
    for op in [FaultOp::Write, FaultOp::Fence] {
        for nth in 1..=4 {
            let mem = Arc::new(MemMedium::new(NBLOCKS * BLOCK_SIZE as u64));
            let fm = Arc::new(FaultMedium::new(mem.clone(), nth));
            let (l, io, a) = setup_on(fm.clone());
            let mut t = IoTally::default();
            let mut ap = 0;
            // Fill the header region: the next entry needs a new region.
            for i in 0..REGION_ENTRIES {
                let loc = l.alloc_entry(&io, &mut t, i, 0, &a, &mut ap).unwrap();
                commit(&io, loc, 100 + i);
            }
            let free = a.free_blocks();
            fm.add_rule(FaultRule::new(op).nth(nth).once());
            let r = l.alloc_entry(&io, &mut t, 9, 0, &a, &mut ap);
            fm.clear_rules();
            if r.is_err() && l.region_count() == 1 {
                grow_failed += 1;
                assert_eq!(
                    a.free_blocks(),
                    free,
                    "{op:?} {nth}: the block is given back"
                );
                let mut next = [0u8; 8];
                mem.read(BLOCK_SIZE as u64 + OFF_NEXT, &mut next).unwrap();
                assert_eq!(u64::from_le_bytes(next), 0, "{op:?} {nth}: the chain ends");
            }
            let loc = l.alloc_entry(&io, &mut t, 10, 0, &a, &mut ap).unwrap();
            commit(&io, loc, 200);
            assert_eq!(l.region_count(), 2, "{op:?} {nth}");
        }
    }
    assert!(grow_failed >= 4, "only {grow_failed} failed grows");
}

/// A queued region whose free slots were overwritten behind the engine's back (the count
/// says half of it is free, the medium says none is) is an error for the writer that
/// finds it, not an endless scan; the next writer gets a slot elsewhere.
#[test]
fn a_region_with_no_free_slot_against_its_count_is_an_error() {
    let (l, io, a) = setup();
    let (l, io, a) = (Arc::new(l), Arc::new(io), Arc::new(a));
    let mut t = IoTally::default();
    let mut ap = 0;
    let mut locs = Vec::new();
    for i in 0..(REGION_ENTRIES + 1) {
        let loc = l.alloc_entry(&io, &mut t, i, 0, &a, &mut ap).unwrap();
        commit(&io, loc, 100 + i);
        locs.push(loc);
    }
    // The header region comes back to the queue, then a stray write fills its slots.
    for &loc in &locs[..(REGION_ENTRIES as usize - 64)] {
        commit(&io, loc, 0);
        l.free_entry(loc);
    }
    assert_eq!(l.state.lock().queue.len(), 1);
    for &loc in &locs[..(REGION_ENTRIES as usize - 64)] {
        commit(&io, loc, 0xdbdb_dbdb_dbdb_dbdb);
    }
    // The current region has 126 free slots left; then the header region is tried.
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let (l, io, a) = (l.clone(), io.clone(), a.clone());
        std::thread::spawn(move || {
            let mut t = IoTally::default();
            let mut ap = 0;
            let mut got = Vec::new();
            for i in 0..REGION_ENTRIES + 1 {
                let r = l.alloc_entry(&io, &mut t, 1000 + i, 0, &a, &mut ap);
                if let Ok(loc) = &r {
                    commit(&io, *loc, 1000 + i);
                }
                got.push(r.map_err(|e| e.to_string()));
            }
            let _ = tx.send(got);
        });
    }
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("allocation never returned");
    let errors: Vec<&String> = got.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(errors.len(), 1, "{got:?}");
    assert!(errors[0].contains("no free slot"), "{}", errors[0]);
    assert!(got.last().unwrap().is_ok(), "the writers go on elsewhere");
    assert_eq!(l.region_count(), 3);
}

#[test]
fn grow_count_follows_the_chain_within_the_free_space() {
    assert_eq!(grow_count(1, 1 << 20), 1);
    assert_eq!(grow_count(9, 1 << 20), 4);
    assert_eq!(grow_count(1000, 1 << 20), GROW_MAX);
    // No more regions than the free blocks could fill, and always one.
    assert_eq!(grow_count(100, 10 * (REGION_ENTRIES + 1)), 10);
    assert_eq!(grow_count(100, 0), 1);
}

/// Fill every slot of every region, committing each entry; returns the entries.
fn fill_all(l: &RegionLayout, io: &MetaIo, a: &Allocator, t: &mut IoTally) -> Vec<u64> {
    let mut locs = Vec::new();
    let mut ap = 0;
    while l.counters().iter().sum::<i64>() < l.region_count() as i64 * REGION_ENTRIES as i64 {
        let loc = l.alloc_entry(io, t, 0, 0, a, &mut ap).unwrap();
        commit(io, loc, 100 + locs.len() as u64);
        locs.push(loc);
    }
    locs
}

/// A formatted layout of 4096 blocks on a crash simulator that takes a block file's stores
/// ([`crate::media::Medium::gathers`]).
fn on_block_file() -> (Arc<crate::media::CrashSim>, RegionLayout, MetaIo, Allocator) {
    let sim = Arc::new(crate::media::CrashSim::new(4096 * BLOCK_SIZE as u64));
    sim.set_gathers(true);
    let (l, io, a) = setup_sized(sim.clone(), 4096);
    (sim, l, io, a)
}

/// Grow the table to at least 8 regions and fill every slot; returns the block of the last but
/// one region, which on a block file a batch queued fresh and a writer then filled before it
/// went on to the last one.
fn grown_and_full(
    l: &RegionLayout,
    io: &MetaIo,
    a: &Allocator,
    t: &mut IoTally,
    ap: &mut usize,
) -> u64 {
    while l.region_count() < 8 {
        let loc = l.alloc_entry(io, t, 0, 0, a, ap).unwrap();
        commit(io, loc, 100);
    }
    fill_all(l, io, a, t);
    let st = l.state.lock();
    st.regions[st.regions.len() - 2].block
}

/// On pmem (fences are cheap) a grow adds one region, as the paper's LMT does.
#[test]
fn grows_one_region_at_a_time_on_pmem() {
    let (l, io, a) = setup_sized(Arc::new(MemMedium::new(4096 * BLOCK_SIZE as u64)), 4096);
    let mut t = IoTally::default();
    let mut ap = 0;
    for i in 0..(REGION_ENTRIES * 20) {
        let loc = l.alloc_entry(&io, &mut t, i, 0, &a, &mut ap).unwrap();
        commit(&io, loc, 100 + i);
    }
    assert_eq!(l.region_count(), 20);
    assert!(l.state.lock().queue.is_empty());
}

/// On a block file a growing table adds regions in batches, each for two fences (each an
/// `fdatasync` there), and the regions a batch queues are claimed without reading a slot
/// back, as the grown one is. The chain on the medium holds them all.
#[test]
fn grows_in_batches_for_two_fences_each() {
    let (sim, l, io, a) = on_block_file();
    let mut t = IoTally::default();
    let mut ap = 0;
    // The header region first (claimed from the queue: its slots are read).
    for i in 0..REGION_ENTRIES {
        let loc = l.alloc_entry(&io, &mut t, i, 0, &a, &mut ap).unwrap();
        commit(&io, loc, 100 + i);
    }
    let fences = sim.fence_count();
    let read = t.meta_read;
    let mut grows = 0;
    let mut locs = Vec::new();
    for i in 0..(REGION_ENTRIES * 40) {
        let before = l.region_count();
        let loc = l.alloc_entry(&io, &mut t, i, 0, &a, &mut ap).unwrap();
        commit(&io, loc, 1000 + i);
        locs.push(loc);
        if l.region_count() > before {
            grows += 1;
        }
    }
    let regions = l.region_count();
    assert!(regions > 41, "{regions} regions for 41 full ones");
    assert!(grows <= 10, "{grows} grows for {regions} regions");
    assert_eq!(sim.fence_count() - fences, 2 * grows as u64);
    assert_eq!(
        t.meta_read, read,
        "a fresh region's slots are not read back"
    );
    // At most a third of the regions (and one) stand empty.
    let empty = l.counters().iter().filter(|&&c| c == 0).count();
    assert!(
        empty * 3 <= regions + 3,
        "{empty} of {regions} regions empty"
    );
    let mut valid = fill_all(&l, &io, &a, &mut t);
    valid.extend(&locs);
    let first: Vec<u64> = (0..REGION_ENTRIES)
        .map(|i| BLOCK_SIZE as u64 + i * ENTRY_SIZE)
        .collect();
    valid.extend(first);
    valid.sort_unstable();
    assert!(l.check(&valid).is_empty(), "{:?}", l.check(&valid));
    l.attach(&io, &mut t).unwrap();
    assert_eq!(l.region_count(), regions, "the chain holds every region");
    l.rebuild(&valid).unwrap();
    assert!(l.check(&valid).is_empty(), "{:?}", l.check(&valid));
}

/// On a medium that makes a system call per store, a writer's batch of slots in a fresh
/// region is claimed with one store: whole slots holding the reserved marker.
#[test]
fn a_batch_of_fresh_slots_is_claimed_in_one_store() {
    use crate::media::Medium;
    use crate::meta::record::{DedupEntry, RESERVED};
    let (sim, l, io, a) = on_block_file();
    let mut t = IoTally::default();
    fill_all(&l, &io, &a, &mut t);
    let mut ap = 0;
    let mut out = std::collections::VecDeque::new();
    // The first slot comes with the grow (its own store); the next 40 from the new region
    // in one store.
    assert_eq!(
        l.alloc_entries(&io, &mut t, 0, &a, &mut ap, 1, &mut out)
            .unwrap(),
        1
    );
    let stores = sim.pending_count();
    assert_eq!(
        l.alloc_entries(&io, &mut t, 0, &a, &mut ap, 40, &mut out)
            .unwrap(),
        40
    );
    assert_eq!(sim.pending_count() - stores, 1, "one store for the batch");
    let locs: Vec<u64> = out.iter().copied().collect();
    for w in locs.windows(2) {
        assert_eq!(w[1], w[0] + ENTRY_SIZE);
    }
    let marked = DedupEntry {
        blocknr: RESERVED,
        ..DedupEntry::default()
    };
    for &loc in &locs {
        let mut b = [0u8; 32];
        sim.read(loc, &mut b).unwrap();
        assert_eq!(DedupEntry::from_bytes(&b), marked, "slot {loc}");
    }
    // A batch never runs past its region: the rest comes from the next one.
    out.clear();
    let got = l
        .alloc_entries(&io, &mut t, 0, &a, &mut ap, 100, &mut out)
        .unwrap();
    assert_eq!(got, 100);
    let end = locs[0] / BLOCK_SIZE as u64 * BLOCK_SIZE as u64 + REGION_ENTRIES * ENTRY_SIZE;
    assert_eq!(
        out.iter()
            .filter(|&&loc| loc < end && loc >= locs[0])
            .count(),
        86
    );
}

/// A batch grow that fails at any of its stores or fences gives every block of the batch
/// back and leaves the chain ending where it did; one whose batch cannot be written grows by
/// one region instead. Every block the allocator lost is a region on the medium.
#[test]
fn a_failed_batch_grow_gives_every_block_back() {
    use crate::media::{FaultMedium, FaultOp, FaultRule, Medium};
    let (mut failed, mut one) = (0, 0);
    for op in [FaultOp::Write, FaultOp::Fence] {
        for nth in 1..=7 {
            let what = format!("{op:?} {nth}");
            let mem = Arc::new(MemMedium::new(4096 * BLOCK_SIZE as u64));
            let fm = Arc::new(FaultMedium::new(mem.clone(), nth));
            fm.set_gathers(true);
            let (l, io, a) = setup_sized(fm.clone(), 4096);
            let mut t = IoTally::default();
            let mut ap = 0;
            grown_and_full(&l, &io, &a, &mut t, &mut ap);
            let (regions, free) = (l.region_count(), a.free_blocks());
            let batch = grow_count(regions, free);
            assert!(batch >= 4, "{batch}");
            let tail = l.state.lock().regions.last().unwrap().block;
            fm.add_rule(FaultRule::new(op).nth(nth).once());
            let r = l.alloc_entry(&io, &mut t, 9, 0, &a, &mut ap);
            fm.clear_rules();
            let grown = l.region_count() - regions;
            if r.is_err() && grown == 0 {
                failed += 1;
                assert_eq!(grown, 0, "{what}");
                assert_eq!(a.free_blocks(), free, "{what}: blocks given back");
                let mut next = [0u8; 8];
                mem.read(tail * BLOCK_SIZE as u64 + OFF_NEXT, &mut next)
                    .unwrap();
                assert_eq!(u64::from_le_bytes(next), 0, "{what}: the chain ends");
                let loc = l.alloc_entry(&io, &mut t, 10, 0, &a, &mut ap).unwrap();
                commit(&io, loc, 200);
                assert_eq!(l.region_count(), regions + batch, "{what}");
            } else if grown == 1 {
                one += 1;
            } else {
                // (A fault after the grow fails the slot's own claim.)
                assert_eq!(grown, batch, "{what}");
            }
            let grown = l.region_count() - regions;
            assert_eq!(a.free_blocks(), free - grown as u64, "{what}");
            l.attach(&io, &mut t).unwrap();
            assert_eq!(l.region_count(), regions + grown, "{what}: on the medium");
        }
    }
    // Failed: the link's store or fence. One region: a fault in any region's store or the
    // batch's fence.
    assert!(failed >= 2, "only {failed} failed grows");
    assert!(one >= 4, "only {one} batches fell back to one region");
}

/// A region a batch queued fresh, then filled, thinned to half by deletions and queued
/// again, is scanned slot by slot: its next writer gets only the freed slots, never a live
/// entry's.
#[test]
fn a_requeued_region_is_scanned_not_claimed_fresh() {
    use crate::media::Medium;
    let (sim, l, io, a) = on_block_file();
    let mut t = IoTally::default();
    let mut ap = 0;
    let r = grown_and_full(&l, &io, &a, &mut t, &mut ap);
    let slot = |i: u64| r * BLOCK_SIZE as u64 + i * ENTRY_SIZE;
    let blocknr = |loc: u64| {
        let mut b = [0u8; 8];
        sim.read(loc + OFF_BLOCKNR, &mut b).unwrap();
        u64::from_le_bytes(b)
    };
    let live: Vec<(u64, u64)> = (1..REGION_ENTRIES)
        .step_by(2)
        .map(|i| (slot(i), blocknr(slot(i))))
        .collect();
    assert!(live.iter().all(|&(_, b)| b != 0));
    let freed: Vec<u64> = (0..REGION_ENTRIES).step_by(2).map(slot).collect();
    for &loc in &freed {
        commit(&io, loc, 0);
        l.free_entry(loc);
    }
    assert_eq!(l.state.lock().queue.len(), 1);
    let mut out = std::collections::VecDeque::new();
    let read = t.meta_read;
    l.alloc_entries(&io, &mut t, 0, &a, &mut ap, freed.len(), &mut out)
        .unwrap();
    let got: Vec<u64> = out.into_iter().collect();
    assert_eq!(got, freed, "only the freed slots, in order");
    // On a block file its slots are read in one call, not one per slot.
    assert_eq!(t.meta_read - read, OFF_MAGIC);
    for &(loc, b) in &live {
        assert_eq!(blocknr(loc), b, "live entry {loc} kept");
    }
}

/// A block file in memory whose fences take a millisecond, as an `fdatasync` does: a grow
/// takes long enough for the other writers to run out of regions meanwhile.
struct SlowFences(MemMedium);

impl crate::media::Medium for SlowFences {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> crate::Result<()> {
        self.0.read(off, buf)
    }
    fn write(&self, off: u64, data: &[u8]) -> crate::Result<()> {
        self.0.write(off, data)
    }
    fn flush(&self, off: u64, len: u64) {
        self.0.flush(off, len)
    }
    fn fence(&self) -> crate::Result<()> {
        std::thread::sleep(std::time::Duration::from_millis(1));
        self.0.fence()
    }
    fn sync_all(&self) -> crate::Result<()> {
        self.0.sync_all()
    }
    fn gathers(&self) -> bool {
        true
    }
    fn kind(&self) -> &'static str {
        "slow-fence test medium"
    }
}

/// Writers that run out of regions together grow the table once between them: the batch a
/// grow queues serves the writers that waited for it, so no more regions stand empty than
/// one batch leaves.
#[test]
fn writers_growing_together_add_one_batch() {
    let m = Arc::new(SlowFences(MemMedium::new(16384 * BLOCK_SIZE as u64)));
    let (l, io, a) = setup_sized(m, 16384);
    let (l, io, a) = (Arc::new(l), Arc::new(io), Arc::new(a));
    for round in 0..6 {
        let go = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|pool| {
                let (l, io, a, go) = (l.clone(), io.clone(), a.clone(), go.clone());
                std::thread::spawn(move || {
                    let mut t = IoTally::default();
                    let mut ap = pool;
                    go.wait();
                    for i in 0..300 {
                        let loc = l.alloc_entry(&io, &mut t, i, pool, &a, &mut ap).unwrap();
                        commit(&io, loc, 100 + i);
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        let counters = l.counters();
        let empty = counters.iter().filter(|&&c| c == 0).count();
        let regions = counters.len();
        assert!(
            // One batch is about a third of the regions; two batches sized from the same
            // counts leave about half empty.
            empty * 5 <= regions * 2 + 5,
            "round {round}: {empty} of {regions} regions empty"
        );
    }
}

/// A region emptied by deletions and queued again is claimed, on a block file, with a read of
/// its slots and one store for a writer's whole batch of them.
#[test]
fn an_emptied_region_is_claimed_with_one_store_per_batch() {
    use crate::media::Medium;
    let (sim, l, io, a) = on_block_file();
    let mut t = IoTally::default();
    let mut ap = 0;
    let r = grown_and_full(&l, &io, &a, &mut t, &mut ap);
    let slots: Vec<u64> = (0..REGION_ENTRIES)
        .map(|i| r * BLOCK_SIZE as u64 + i * ENTRY_SIZE)
        .collect();
    for &loc in &slots {
        commit(&io, loc, 0);
        l.free_entry(loc);
    }
    sim.fence().unwrap();
    let read = t.meta_read;
    let mut out = std::collections::VecDeque::new();
    // The first claim moves the writer off its full region (one store for it), then 100
    // slots come in one more.
    l.alloc_entries(&io, &mut t, 0, &a, &mut ap, 1, &mut out)
        .unwrap();
    // A release whose reverse-map store failed writes back the entry it had cleared: slot
    // 50, free when the writer took the region, holds an entry again.
    commit(&io, slots[50], 777);
    let stores = sim.pending_count();
    l.alloc_entries(&io, &mut t, 0, &a, &mut ap, 100, &mut out)
        .unwrap();
    assert_eq!(sim.pending_count() - stores, 2, "one store per run");
    // One read when the writer took the region, one again before the batch (`known_free`).
    assert_eq!(t.meta_read - read, 2 * OFF_MAGIC, "two reads of the region");
    let got: Vec<u64> = out.into_iter().collect();
    let want: Vec<u64> = slots[..50].iter().chain(&slots[51..102]).copied().collect();
    assert_eq!(got, want);
    let mut b = [0u8; 8];
    sim.read(slots[50] + OFF_BLOCKNR, &mut b).unwrap();
    assert_eq!(u64::from_le_bytes(b), 777, "the entry written back is kept");
}
