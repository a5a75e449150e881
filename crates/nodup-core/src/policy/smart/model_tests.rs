//! Model tests of the two-level store: a tiny budget forces constant eviction, merging and
//! promotion; whatever it does, every live fingerprint stays findable (memory or medium), a
//! freed one is never offered as valid, and the store keeps to its budget.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use proptest::prelude::*;

use super::ondisk::{GroupIo, PER_BLOCK};
use super::store::{Eviction, SmartStore};
use crate::alloc::Allocator;
use crate::media::{Medium, MemMedium, Pmem};
use crate::store::FpStore;
use crate::BLOCK_SIZE;

const BLOCKS: u64 = 4096;

fn store(budget: u64, bits: u32, ev: Eviction) -> (SmartStore, Arc<Allocator>, Arc<dyn Medium>) {
    store_on(
        Arc::new(MemMedium::new(BLOCKS * BLOCK_SIZE as u64)),
        budget,
        bits,
        ev,
    )
}

/// [`store`] over medium `m` (a mapped one takes the in-place lookup path).
fn store_on(
    m: Arc<dyn Medium>,
    budget: u64,
    bits: u32,
    ev: Eviction,
) -> (SmartStore, Arc<Allocator>, Arc<dyn Medium>) {
    let a = Arc::new(Allocator::new(16, BLOCKS - 16));
    let io = GroupIo::new(m.clone(), a.clone());
    (SmartStore::new(budget, bits, ev, Some(io)).unwrap(), a, m)
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u8, u16),
    Remove(u8),
    Hit(u8),
    Find(u8),
    Deep(u8),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<u8>(), any::<u16>()).prop_map(|(f, l)| Op::Insert(f, l)),
        2 => any::<u8>().prop_map(Op::Remove),
        2 => any::<u8>().prop_map(Op::Hit),
        2 => any::<u8>().prop_map(Op::Find),
        3 => any::<u8>().prop_map(Op::Deep),
        1 => Just(Op::Reopen),
    ]
}

/// A fingerprint from a small key: spread over the prefixes, a few keys share a prefix.
fn fp_of(k: u8) -> u64 {
    (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x55
}

fn run(ops: Vec<Op>, ev: Eviction, mapped: bool) -> Result<(), TestCaseError> {
    let budget = 24 << 10;
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let (mut s, mut a, mut m) = if mapped {
        let pm = Pmem::create(dir.path().join("img"), BLOCKS * BLOCK_SIZE as u64).unwrap();
        store_on(Arc::new(pm), budget, 6, ev)
    } else {
        store(budget, 6, ev)
    };
    // fp -> live locations (the engine's entries).
    let mut model: HashMap<u64, HashSet<u64>> = HashMap::new();
    for op in ops {
        match op {
            Op::Insert(k, l) => {
                let fp = fp_of(k);
                let loc = 32 * (l as u64 + 1);
                if model.values().any(|v| v.contains(&loc)) {
                    continue;
                }
                s.insert(fp, loc);
                model.entry(fp).or_default().insert(loc);
            }
            Op::Remove(k) => {
                let fp = fp_of(k);
                if let Some(v) = model.get_mut(&fp) {
                    if let Some(&loc) = v.iter().next() {
                        v.remove(&loc);
                        s.remove(fp, loc);
                    }
                }
            }
            Op::Hit(k) => {
                let fp = fp_of(k);
                if let Some(&loc) = model.get(&fp).and_then(|v| v.iter().next()) {
                    s.on_hit(fp, loc);
                    s.on_release(fp, loc, 3);
                }
            }
            Op::Find(k) => {
                let fp = fp_of(k);
                let live = model.get(&fp).cloned().unwrap_or_default();
                // Memory may have forgotten it, but never names a freed location as a match.
                let mut offered = Vec::new();
                s.find(fp, &mut |loc| {
                    offered.push(loc);
                    false
                });
                let dead: Vec<u64> = offered
                    .iter()
                    .copied()
                    .filter(|l| !live.contains(l))
                    .collect();
                prop_assert!(dead.is_empty(), "memory offered freed {:?}", dead);
            }
            Op::Deep(k) => {
                let fp = fp_of(k);
                let live = model.get(&fp).cloned().unwrap_or_default();
                let got = s.find_deep(fp, &mut |loc| live.contains(&loc), true);
                prop_assert_eq!(
                    got.is_some(),
                    !live.is_empty(),
                    "fp {:#x} live {:?}",
                    fp,
                    live
                );
            }
            Op::Reopen => {
                let w = s.save_words().unwrap().unwrap();
                // A new store over the same medium and allocator, as after a clean open; every
                // other time with other prefix bits (a changed budget).
                let bits = if w[1] & 0xff == 6 { 7 } else { 6 };
                let s2 =
                    SmartStore::new(budget, bits, ev, Some(GroupIo::new(m.clone(), a.clone())))
                        .unwrap();
                let free = a.free_blocks();
                s2.restore_words(&w).unwrap();
                // Opened read-only, the groups keep their saved width and nothing is
                // allocated; writes rebucket them.
                prop_assert_eq!(s2.prefix_bits(), (w[1] & 0xffff_ffff) as u32);
                prop_assert_eq!(s2.held(), (0, s.held().1));
                prop_assert_eq!(a.free_blocks(), free);
                s2.begin_writes();
                prop_assert_eq!(s2.prefix_bits(), bits);
                s = s2;
            }
        }
        prop_assert!(
            s.memory_bytes() <= budget,
            "{} > {}",
            s.memory_bytes(),
            budget
        );
        prop_assert_eq!(s.counters().dropped, 0);
    }
    // Every live fingerprint is still found, and with nothing live every group block is back.
    for (&fp, live) in &model {
        if !live.is_empty() {
            prop_assert!(s.find_deep(fp, &mut |l| live.contains(&l), false).is_some());
        }
    }
    for (&fp, live) in model.iter_mut() {
        for &loc in live.iter() {
            s.remove(fp, loc);
        }
        live.clear();
    }
    s.save_words().unwrap();
    prop_assert_eq!(a.free_blocks(), BLOCKS - 16);
    let _ = (&mut a, &mut m);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn group_lru_keeps_every_fingerprint_findable(ops in proptest::collection::vec(op(), 1..400)) {
        run(ops, Eviction::GroupLru, false)?;
    }

    #[test]
    fn group_lru_on_a_mapped_medium_keeps_every_fingerprint_findable(
        ops in proptest::collection::vec(op(), 1..400)
    ) {
        run(ops, Eviction::GroupLru, true)?;
    }

    #[test]
    fn lru_keeps_every_fingerprint_findable(ops in proptest::collection::vec(op(), 1..300)) {
        run(ops, Eviction::Lru, false)?;
    }

    #[test]
    fn refcount_keeps_every_fingerprint_findable(ops in proptest::collection::vec(op(), 1..300)) {
        run(ops, Eviction::RefCount, false)?;
    }
}

#[test]
fn group_eviction_moves_the_coldest_group_and_promotion_brings_one_back() {
    // An 8 KiB budget leaves room for about a hundred nodes: 100 more force evictions.
    let (s, _a, _m) = store(8 << 10, 6, Eviction::GroupLru);
    let n = s.node_capacity() + 100;
    assert!(n <= 256);
    for k in 0..n {
        s.insert(fp_of(k as u8), 32 * (k + 1));
    }
    let (mem, disk) = s.held();
    assert_eq!(mem + disk, n);
    assert!(disk > 0);
    let c = s.counters();
    assert!(c.group_evictions > 0 && c.merges > 0);
    // Key 0 went first (its group was the least recently used): not in memory, found deep.
    let fp0 = fp_of(0);
    assert!(s.find(fp0, &mut |_| true).is_none());
    assert_eq!(s.find_deep(fp0, &mut |l| l == 32, true), Some(32));
    assert_eq!(s.counters().promotions, 1);
    assert_eq!(s.find(fp0, &mut |_| true), Some(32));
}

#[test]
fn tombstones_never_grow_their_table() {
    // Frees of fingerprints on the medium leave tombstones; taking one back out (the same
    // record inserted again) leaves a deleted slot, which uses up the set's room as a record
    // would. Nothing may make the set reallocate beyond what the budget set aside.
    // At 512 KiB the set flushes at 842 tombstones and has room for 896.
    let budget = 512 << 10;
    let (s, _a, _m) = store(budget, 6, Eviction::GroupLru);
    let n = s.node_capacity() + 2000;
    let fp = |k: u64| k.wrapping_mul(0x2545_F491_4F6C_DD1D);
    for k in 0..n {
        s.insert(fp(k), 32 * (k + 1));
    }
    let (_, room) = s.tomb_room();
    let mut x = 1u64;
    for _ in 0..50_000 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let k = (x >> 33) % n;
        s.remove(fp(k), 32 * (k + 1));
        if x & (1 << 20) != 0 {
            s.insert(fp(k), 32 * (k + 1));
        }
        let (len, cap) = s.tomb_room();
        assert!(
            cap <= room && len <= cap,
            "{len} tombstones, room {cap} > {room}"
        );
    }
    assert!(s.counters().tomb_flushes > 0);
    assert!(s.memory_bytes() <= budget);
}

#[test]
fn per_fingerprint_lru_costs_more_group_io_than_group_lru() {
    let mut io = Vec::new();
    for ev in [Eviction::GroupLru, Eviction::Lru] {
        let (s, _a, _m) = store(8 << 10, 6, ev);
        for k in 0..2000u64 {
            s.insert(k.wrapping_mul(0x2545_F491_4F6C_DD1D), 32 * (k + 1));
        }
        let r = s.report().unwrap();
        io.push(r["store_io_written_bytes"].as_u64().unwrap());
    }
    assert!(io[0] * 2 < io[1], "group LRU {} vs LRU {}", io[0], io[1]);
}

#[test]
fn reference_count_eviction_keeps_the_most_referenced() {
    let (s, _a, _m) = store(8 << 10, 6, Eviction::RefCount);
    let hot = fp_of(200);
    s.insert(hot, 32);
    for _ in 0..10 {
        s.on_hit(hot, 32);
    }
    for k in 0..150u64 {
        s.insert(fp_of(k as u8) ^ 1, 64 + 32 * k);
    }
    assert_eq!(s.find(hot, &mut |_| true), Some(32));
}

#[test]
fn damaged_directories_are_refused() {
    let (s, a, m) = store(24 << 10, 6, Eviction::GroupLru);
    for k in 0..400u64 {
        s.insert(fp_of(k as u8) ^ k << 8, 32 * (k + 1));
    }
    let w = s.save_words().unwrap().unwrap();
    let fresh = || {
        SmartStore::new(
            24 << 10,
            6,
            Eviction::GroupLru,
            Some(GroupIo::new(m.clone(), a.clone())),
        )
        .unwrap()
    };
    assert!(fresh().restore_words(&w).is_ok());
    let n = (w[1] >> 32) as usize;
    assert!(n >= 2);
    let mut bad: Vec<Vec<u64>> = Vec::new();
    let mut x = w.clone();
    x[0] ^= 1; // magic
    bad.push(x);
    let mut x = w.clone();
    x[1] = 40 | (n as u64) << 32; // prefix bits out of range
    bad.push(x);
    let mut x = w.clone();
    x[1] += 1 << 32; // one group more than the words hold
    bad.push(x);
    let mut x = w.clone();
    x.swap(2, 4); // prefixes out of order
    x.swap(3, 5);
    bad.push(x);
    let mut x = w.clone();
    x[3] = 2; // a block outside the data area
    bad.push(x);
    let mut x = w.clone();
    x[2] &= 0xffff_ffff; // an empty group
    bad.push(x);
    for (i, b) in bad.iter().enumerate() {
        assert!(fresh().restore_words(b).is_err(), "damage {i} accepted");
    }
    // A free block named by the directory is refused too.
    let head = w[3];
    a.free(head).unwrap();
    assert!(fresh().restore_words(&w).is_err());
}

#[test]
fn merge_buffers_do_not_grow_with_the_groups() {
    // Reserved at open: the group I/O's block buffer, the merge's queue (two blocks' records)
    // and output block, a chain list of four, one in-memory group's worth of records.
    let open = BLOCK_SIZE as u64 + (4 * PER_BLOCK as u64) * 16 + 4 * 8;
    for budget in [8u64 << 10, 320 << 10, 3 << 20] {
        let (s, _a, _m) = store(budget, 6, Eviction::GroupLru);
        assert_eq!(s.scratch_bytes(), open, "{budget}");
    }
    // 64 groups grown to about 15 blocks each (far past a budget of 8 KiB): the merge
    // buffers keep their size but for the chain list, 8 bytes per block of the group.
    let (s, _a, _m) = store(8 << 10, 6, Eviction::GroupLru);
    let fp = |k: u64| k.wrapping_mul(0x2545_F491_4F6C_DD1D);
    for k in 0..240_000u64 {
        s.insert(fp(k), 32 * (k + 1));
    }
    let (_, disk) = s.held();
    let blocks = (disk / 64).div_ceil(PER_BLOCK as u64);
    assert!(blocks >= 14, "{blocks}");
    assert!(s.counters().merges > 1000);
    let chain_list = blocks.next_power_of_two() * 8;
    assert!(
        s.scratch_bytes() <= open - 4 * 8 + chain_list * 2,
        "{} {blocks}",
        s.scratch_bytes()
    );
}

#[test]
fn groups_of_many_blocks_are_rebucketed_for_another_width() {
    // 64 groups of about 940 records (four blocks), saved, then opened with wider and with
    // narrower prefixes: read-only, the groups are read at the width they were saved with;
    // opened for writing, they are rewritten for the new one, every fingerprint is found, none
    // is lost, and the allocator holds exactly the new groups' blocks.
    let (s, a, m) = store(8 << 10, 6, Eviction::GroupLru);
    let fp = |k: u64| k.wrapping_mul(0x2545_F491_4F6C_DD1D);
    let n = 60_000u64;
    for k in 0..n {
        s.insert(fp(k), 32 * (k + 1));
    }
    let mut w = s.save_words().unwrap().unwrap();
    let image = |m: &Arc<dyn Medium>| {
        let mut v = vec![0u8; (BLOCKS * BLOCK_SIZE as u64) as usize];
        m.read(0, &mut v).unwrap();
        v
    };
    let mut saved_bits = 6;
    for bits in [8u32, 7, 6] {
        let s2 = SmartStore::new(
            8 << 10,
            bits,
            Eviction::GroupLru,
            Some(GroupIo::new(m.clone(), a.clone())),
        )
        .unwrap();
        // A read-only open (fsck, the stats of an image): the saved width, every record
        // found, nothing written or allocated.
        let (before, free) = (image(&m), a.free_blocks());
        s2.restore_words(&w).unwrap();
        assert_eq!(s2.prefix_bits(), saved_bits);
        assert_eq!(s2.held().1, n, "{bits}");
        assert!(s2.check_media().is_empty());
        for k in (0..n).step_by(331) {
            let loc = 32 * (k + 1);
            assert!(s2.holds(fp(k), loc), "{bits} {k}");
        }
        assert_eq!(a.free_blocks(), free);
        assert!(image(&m) == before, "a read-only open wrote to the medium");
        // Opened for writing: rebucketed for the budget's width.
        s2.begin_writes();
        saved_bits = bits;
        assert_eq!(s2.prefix_bits(), bits);
        assert_eq!(s2.counters().dropped, 0);
        assert_eq!(s2.held().1, n, "{bits}");
        assert_eq!(a.len() - a.free_blocks(), s2.owned_blocks(), "{bits}");
        assert!(s2.check_media().is_empty());
        for k in (0..n).step_by(97) {
            let loc = 32 * (k + 1);
            assert_eq!(
                s2.find_deep(fp(k), &mut |l| l == loc, false),
                Some(loc),
                "{bits} {k}"
            );
        }
        w = s2.save_words().unwrap().unwrap();
    }
}

/// One prefix's group of 3000 records saved to the medium, its 10 smallest removed (tombstones,
/// met in the group's first block); the store, its allocator and medium, and more records of
/// that prefix.
fn one_group_ten_removed() -> (
    SmartStore,
    Arc<Allocator>,
    Arc<dyn Medium>,
    impl Iterator<Item = u64>,
) {
    let (s, a, m) = store(8 << 10, 6, Eviction::GroupLru);
    let mut ours = (0u64..)
        .map(|k| k.wrapping_mul(0x2545_F491_4F6C_DD1D))
        .filter(|&fp| crate::index::mix(fp) >> 58 == 5);
    let mut first: Vec<u64> = ours.by_ref().take(3000).collect();
    first.sort_unstable_by_key(|&fp| crate::index::mix(fp));
    for (i, &fp) in first.iter().enumerate() {
        s.insert(fp, 32 * (i as u64 + 1));
    }
    s.save_words().unwrap();
    assert_eq!(s.held(), (0, 3000));
    for (i, &fp) in first.iter().enumerate().take(10) {
        s.remove(fp, 32 * (i as u64 + 1));
    }
    assert_eq!(s.tomb_room().0, 10);
    (s, a, m, ours)
}

/// New records until an eviction merges into the group; then every record must be in memory,
/// on the medium, removed (the 10) or counted lost, and every tombstone met.
fn merge_once_and_count(s: &SmartStore, more: &mut impl Iterator<Item = u64>) -> u64 {
    let merges = s.counters().merges;
    let mut added = 0u64;
    while s.counters().merges == merges {
        s.insert(more.next().unwrap(), 1 << 40 | added);
        added += 1;
    }
    let (mem, disk) = s.held();
    assert_eq!(s.tomb_room().0, 0, "every tombstone was met");
    assert_eq!(3000 + added - 10, mem + disk + s.counters().dropped);
    disk
}

#[test]
fn a_merge_into_a_damaged_group_counts_only_live_records_lost() {
    // The group's last block damaged: the merge meets the tombstones, then the damage, and
    // drops the group; the removed records are not counted lost with it.
    let (s, a, m, mut more) = one_group_ten_removed();
    let last = (16..BLOCKS).rev().find(|&b| a.is_allocated(b)).unwrap();
    let at = last * BLOCK_SIZE as u64 + 100;
    let mut x = [0u8; 1];
    m.read(at, &mut x).unwrap();
    m.write(at, &[x[0] ^ 0x10]).unwrap();
    assert!(!a.leak_suspected());
    let disk = merge_once_and_count(&s, &mut more);
    assert!(disk < 3000, "the damaged group was dropped");
    // Its blocks stay allocated, and the allocator says a rebuild would free some.
    assert!(a.leak_suspected());
}

#[test]
fn a_merge_that_cannot_allocate_counts_only_live_records_lost() {
    // The allocator exhausted: the merge must grow the group and cannot; the removed records
    // are not counted lost with it.
    let (s, a, _m, mut more) = one_group_ten_removed();
    let mut pool = 0;
    while a.alloc(&mut pool).is_ok() {}
    let disk = merge_once_and_count(&s, &mut more);
    assert_eq!(disk, 0, "the group could not be written");
}
