//! Policy `smart` on the file system, without FUSE: with a budget far below what the data's
//! fingerprints need, inline dedup finds only part of the duplicates and the out-of-line worker
//! finds the rest on the medium; blocks never fingerprinted inline are adopted and found later;
//! the run filter keeps short runs apart; the skipped buffer survives an unmount; a crash in
//! the middle recovers to a consistent file system; the policy's memory stays in its budget.

mod common;
use common::{block, create};

use nodup_core::media::{CrashMode, CrashSim, Medium, MemMedium};
use nodup_core::meta::MetaLayoutKind;
use nodup_core::policy::smart::SmartOptions;
use nodup_core::policy::{PolicyKind, PolicyOptions};
use nodup_core::{FormatOptions, OpenOptions, BLOCK_SIZE};

use nodup_fs::remap::AdoptOutcome;
use nodup_fs::{fsck, Caller, FileSystem, FsOptions, MediumKind};
use std::sync::Arc;

fn physical(fs: &FileSystem) -> u64 {
    fs.engine().stats().physical_bytes / BLOCK_SIZE as u64
}

fn opts(smart: SmartOptions, budget: u64) -> FsOptions {
    FsOptions {
        open: OpenOptions {
            mem_budget: Some(budget),
            policy: PolicyOptions {
                smart,
                ..PolicyOptions::default()
            },
            ..Default::default()
        },
        ..Default::default()
    }
}

fn format(m: &Arc<MemMedium>, o: &FsOptions) -> FileSystem {
    let fo = FormatOptions {
        policy: PolicyKind::Smart,
        mem_budget: 64 << 10,
        meta_layout: MetaLayoutKind::default_for(PolicyKind::Smart),
        ..Default::default()
    };
    FileSystem::format(m.clone(), MediumKind::Pmem, &fo, o, Caller::default()).unwrap()
}

/// A fresh file system on a 32 MiB medium: `smart` with a 64 KiB budget and its inline
/// selectivity fixed at `sel`.
fn with_selectivity(sel: f64) -> FileSystem {
    let m = Arc::new(MemMedium::new(32 << 20));
    let smart = SmartOptions {
        fixed_selectivity: Some(sel),
        ..Default::default()
    };
    format(&m, &opts(smart, 64 << 10))
}

fn check_file(fs: &FileSystem, ino: u64, seeds: &[u64]) {
    let data = fs
        .read(ino, 0, seeds.len() * BLOCK_SIZE)
        .expect("read back");
    for (i, &s) in seeds.iter().enumerate() {
        assert!(
            data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE] == block(s)[..],
            "inode {ino} block {i}"
        );
    }
}

const N: u64 = 6000;

/// Unique data, then the same blocks in another order (one block per write, as small random
/// writes come), with room in memory for a few hundred fingerprints.
fn unique_then_shuffled(fs: &FileSystem) -> (u64, u64, Vec<u64>) {
    let a = create(fs, "a");
    let first: Vec<u64> = (0..N).collect();
    for chunk in first.chunks(64) {
        let buf: Vec<u8> = chunk.iter().flat_map(|&s| block(s)).collect();
        fs.write(a, chunk[0] * BLOCK_SIZE as u64, &buf).unwrap();
    }
    let b = create(fs, "b");
    let mut order: Vec<u64> = (0..N).collect();
    // A fixed permutation (multiplicative, N prime to the step).
    order.sort_by_key(|&i| (i * 7919) % N);
    for (i, &s) in order.iter().enumerate() {
        fs.write(b, i as u64 * BLOCK_SIZE as u64, &block(s))
            .unwrap();
    }
    (a, b, order)
}

#[test]
fn the_worker_finds_what_memory_forgot() {
    let m = Arc::new(MemMedium::new(96 << 20));
    let o = opts(SmartOptions::default(), 64 << 10);
    let fs = format(&m, &o);
    let (a, b, order) = unique_then_shuffled(&fs);
    let s = fs.stats_json();
    let inline = s["smart"]["inline_hits"].as_u64().unwrap();
    assert!(inline < N / 2, "only part inline: {inline} of {N}");
    assert!(physical(&fs) > N + N / 2);
    assert!(!fs.smart_idle());
    fs.smart_settle().unwrap();
    assert!(fs.smart_idle());
    assert_eq!(physical(&fs), N, "every duplicate found out of line");
    let s = fs.stats_json();
    let sm = &s["smart"];
    assert!(sm["out_of_line_hits"].as_u64().unwrap() + inline >= N);
    assert!(sm["store_io_read_bytes"].as_u64().unwrap() > 0);
    let mem = sm["memory"]["total_bytes"].as_u64().unwrap();
    assert!(mem <= 64 << 10, "dedup memory {mem} over the budget");
    check_file(&fs, a, &(0..N).collect::<Vec<_>>());
    check_file(&fs, b, &order);
    assert!(fsck::check(&fs, false).unwrap().consistent());
    // Clean remount: the store's groups come back from the save area.
    fs.shutdown().unwrap();
    drop(fs);
    let fs = FileSystem::open(m.clone(), &o).unwrap();
    assert_eq!(fs.recovery().kind, "clean");
    let c = create(&fs, "c");
    for s in 0..200 {
        fs.write(c, s * BLOCK_SIZE as u64, &block(s)).unwrap();
    }
    fs.smart_settle().unwrap();
    assert_eq!(
        physical(&fs),
        N,
        "new copies found through the reloaded groups"
    );
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

#[test]
fn blocks_not_fingerprinted_inline_are_adopted_then_found() {
    let fs = with_selectivity(0.3);
    let a = create(&fs, "a");
    let buf: Vec<u8> = (0..300).flat_map(block).collect();
    fs.write(a, 0, &buf).unwrap();
    fs.smart_settle().unwrap();
    let w = &fs.stats_json()["smart"]["fs"]["worker"];
    assert!(w["adopted"].as_u64().unwrap() >= 150, "{w}");
    let b = create(&fs, "b");
    fs.write(b, 0, &buf).unwrap();
    fs.smart_settle().unwrap();
    assert_eq!(physical(&fs), 300);
    check_file(&fs, b, &(0..300).collect::<Vec<_>>());
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

#[test]
fn the_run_filter_leaves_short_runs_apart() {
    let m = Arc::new(MemMedium::new(32 << 20));
    let smart = SmartOptions {
        min_run: 4,
        ..Default::default()
    };
    let fs = format(&m, &opts(smart, 256 << 10));
    let a = create(&fs, "a");
    let buf: Vec<u8> = (0..64).flat_map(block).collect();
    fs.write(a, 0, &buf).unwrap();
    // b: a run of 8 duplicates, then single duplicates between unique blocks.
    let b = create(&fs, "b");
    let mut seeds: Vec<u64> = (0..8).collect();
    for k in 0..8 {
        seeds.push(1000 + k);
        seeds.push(20 + 2 * k);
    }
    let data: Vec<u8> = seeds.iter().flat_map(|&s| block(s)).collect();
    fs.write(b, 0, &data).unwrap();
    fs.smart_settle().unwrap();
    // The run of 8 shares a's blocks; the 8 singles and 8 unique blocks are stored apart.
    assert_eq!(physical(&fs), 64 + 16);
    check_file(&fs, b, &seeds);
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

#[test]
fn queued_blocks_survive_an_unmount_and_a_crash() {
    let m = Arc::new(MemMedium::new(96 << 20));
    let o = opts(SmartOptions::default(), 64 << 10);
    let fs = format(&m, &o);
    let (_, b, order) = unique_then_shuffled(&fs);
    fs.shutdown().unwrap();
    drop(fs);
    let fs = FileSystem::open(m.clone(), &o).unwrap();
    assert!(!fs.smart_idle(), "the checkpoint brought the queue back");
    // Part of the work, then a crash (the image is copied as it is now).
    fs.smart_step(1000).unwrap();
    let img = m.snapshot();
    fs.smart_settle().unwrap();
    assert_eq!(physical(&fs), N);
    drop(fs);
    let m2 = Arc::new(MemMedium::from_bytes(img));
    let fs = FileSystem::open(m2, &o).unwrap();
    assert_eq!(fs.recovery().kind, "failure");
    assert!(fsck::check(&fs, false).unwrap().consistent());
    check_file(&fs, b, &order);
    fs.smart_settle().unwrap();
    assert_eq!(physical(&fs), N, "the rebuilt store still finds every copy");
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

/// Blocks holding the store's fingerprint groups: allocated, held by no file and no metadata,
/// and starting with the group magic.
fn group_blocks(fs: &FileSystem, m: &MemMedium) -> Vec<u64> {
    let eng = fs.engine();
    let (start, len) = eng.data_area();
    let held: std::collections::HashSet<u64> = fs
        .with_tables(|t| t.data_refs())
        .into_iter()
        .chain(fs.meta_blocks())
        .collect();
    let mut magic = [0u8; 8];
    (start..start + len)
        .filter(|&b| eng.allocator().is_allocated(b) && !held.contains(&b))
        .filter(|&b| {
            m.read(b * BLOCK_SIZE as u64, &mut magic).unwrap();
            &magic == b"NDSGRP01"
        })
        .collect()
}

/// A `smart` file system on 96 MiB with a 64 KiB budget after [`unique_then_shuffled`]
/// (file `b` in `order`), settled and consistent, with the blocks of its fingerprint groups.
struct Settled {
    m: Arc<MemMedium>,
    o: FsOptions,
    fs: FileSystem,
    b: u64,
    order: Vec<u64>,
    groups: Vec<u64>,
}

fn settled_with_groups() -> Settled {
    let m = Arc::new(MemMedium::new(96 << 20));
    let o = opts(SmartOptions::default(), 64 << 10);
    let fs = format(&m, &o);
    let (_, b, order) = unique_then_shuffled(&fs);
    fs.smart_settle().unwrap();
    assert!(fsck::check(&fs, false).unwrap().consistent());
    let groups = group_blocks(&fs, &m);
    assert!(groups.len() > 8, "{} group blocks", groups.len());
    assert_eq!(groups.len() as u64, fs.engine().store_owned_blocks());
    Settled {
        m,
        o,
        fs,
        b,
        order,
        groups,
    }
}

/// The image of `s` shut down, one byte of one record of its middle group block flipped behind
/// the file system's back, and opened again.
fn reopen_with_a_damaged_group(s: Settled) -> FileSystem {
    let Settled {
        m, o, fs, groups, ..
    } = s;
    fs.shutdown().unwrap();
    drop(fs);
    let at = groups[groups.len() / 2] * BLOCK_SIZE as u64 + 1000;
    let mut x = [0u8; 1];
    m.read(at, &mut x).unwrap();
    m.write(at, &[x[0] ^ 0x40]).unwrap();
    FileSystem::open(m, &o).unwrap()
}

#[test]
fn fsck_finds_a_damaged_fingerprint_group_and_repair_rebuilds_the_groups() {
    let s = settled_with_groups();
    let (b, order) = (s.b, s.order.clone());
    let fs = reopen_with_a_damaged_group(s);
    assert_eq!(fs.recovery().kind, "clean");
    let rep = fsck::check(&fs, false).unwrap();
    assert_eq!(rep.problems.len(), 1, "{:?}", rep.problems);
    assert!(
        rep.problems[0].contains("fingerprint group") && rep.problems[0].contains("--repair"),
        "{:?}",
        rep.problems
    );
    // Checking is not the store's I/O: its counters stay as they were.
    let io = |fs: &FileSystem| {
        let s = fs.stats_json();
        let st = &s["smart"]["engine"]["store"];
        (
            st["store_io_read_bytes"].clone(),
            st["store_io_errors"].clone(),
        )
    };
    let before = io(&fs);
    assert_eq!(fs.engine().store_problems().len(), 1);
    assert_eq!(io(&fs), before);
    // The engine's audit reports it too, and changes nothing either.
    assert_eq!(fs.engine().audit().unwrap().problems.len(), 1);
    assert_eq!(io(&fs), before);
    assert_eq!(fs.engine().store_problems().len(), 1);
    // The worker's lookups, reading the group for copies of its contents, drop it (its
    // fingerprints are no longer found), and its blocks stay allocated: fsck finds them leaked.
    let c = create(&fs, "c");
    for s in 0..N {
        fs.write(c, s * BLOCK_SIZE as u64, &block(s)).unwrap();
    }
    fs.smart_settle().unwrap();
    assert!(fs.engine().store_problems().is_empty());
    let rep = fsck::check(&fs, false).unwrap();
    assert_eq!(rep.problems.len(), 1, "{:?}", rep.problems);
    assert!(rep.problems[0].contains("leaked"), "{:?}", rep.problems);
    let rep = fsck::check(&fs, true).unwrap();
    assert!(rep.consistent(), "{:?}", rep.problems);
    assert!(!rep.repaired.is_empty());
    check_file(&fs, b, &order);
    check_file(&fs, c, &(0..N).collect::<Vec<_>>());
    // Every group is whole again, and duplicates are found through them.
    assert!(fs.engine().store_problems().is_empty());
    let before = physical(&fs);
    let d = create(&fs, "d");
    for s in 0..200 {
        fs.write(d, s * BLOCK_SIZE as u64, &block(s)).unwrap();
    }
    fs.smart_settle().unwrap();
    assert_eq!(physical(&fs), before);
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

#[test]
fn fsck_finds_a_fingerprint_group_block_free_in_the_allocator() {
    // The allocator gives back one block of a group behind the store's back: the store still
    // holds it, so one of the engine's blocks is free in the allocator. fsck says so (and the
    // group's check names the block). Then one free block is taken behind everyone's back as
    // well: the allocator's count is right again, so a count of held blocks against it would
    // see nothing; block by block, fsck reports both. --repair rebuilds the allocator and the
    // groups.
    let Settled {
        fs,
        b,
        order,
        groups,
        ..
    } = settled_with_groups();
    let alloc = fs.engine().allocator();
    let (start, len) = fs.engine().data_area();
    let loose = (start..start + len)
        .find(|&x| !alloc.is_allocated(x))
        .expect("a free block");
    alloc.free(groups[0]).unwrap();
    // The group's own check names the block.
    let named = format!("names block {}, not an allocated", groups[0]);
    let rep = fsck::check(&fs, false).unwrap();
    assert_eq!(rep.problems.len(), 2, "{:?}", rep.problems);
    assert!(
        rep.problems[0].starts_with(ENGINE_FREE),
        "{:?}",
        rep.problems
    );
    assert!(rep.problems[1].contains(&named), "{:?}", rep.problems);
    assert!(alloc.mark_used(loose).unwrap());
    let rep = fsck::check(&fs, false).unwrap();
    assert_eq!(rep.problems.len(), 3, "{:?}", rep.problems);
    assert!(
        rep.problems[0].starts_with("1 allocated blocks are held by no file"),
        "{:?}",
        rep.problems
    );
    assert!(
        rep.problems[1].starts_with(ENGINE_FREE),
        "{:?}",
        rep.problems
    );
    assert!(rep.problems[2].contains(&named), "{:?}", rep.problems);
    let rep = fsck::check(&fs, true).unwrap();
    assert!(rep.consistent(), "{:?}", rep.problems);
    assert!(fsck::check(&fs, false).unwrap().consistent());
    check_file(&fs, b, &order);
    fs.shutdown().unwrap();
}

#[test]
fn fsck_tells_a_leak_beyond_the_blocks_of_a_damaged_group() {
    // A group damaged mid-chain cannot list its blocks past the damage: those are allocated
    // and held, but not known which, so fsck does not call them leaked (the group's own check
    // reports the damage). Blocks taken behind everyone's back on top of them are reported,
    // exactly as many, with the damaged group's share named.
    let fs = reopen_with_a_damaged_group(settled_with_groups());
    let rep = fsck::check(&fs, false).unwrap();
    assert_eq!(rep.problems.len(), 1, "{:?}", rep.problems);
    let alloc = fs.engine().allocator();
    let (start, len) = fs.engine().data_area();
    let loose: Vec<u64> = (start..start + len)
        .filter(|&x| !alloc.is_allocated(x))
        .take(3)
        .collect();
    for &b in &loose {
        assert!(alloc.mark_used(b).unwrap());
    }
    let rep = fsck::check(&fs, false).unwrap();
    assert_eq!(rep.problems.len(), 2, "{:?}", rep.problems);
    assert!(
        rep.problems[0].starts_with("3 allocated blocks are held by no file")
            && rep.problems[0].contains("beyond the"),
        "{:?}",
        rep.problems
    );
    let rep = fsck::check(&fs, true).unwrap();
    assert!(rep.consistent(), "{:?}", rep.problems);
    fs.shutdown().unwrap();
}

/// How fsck's message about engine blocks free in the allocator starts.
const ENGINE_FREE: &str =
    "1 block(s) of the engine's metadata layout or fingerprint store are free in the allocator";

#[test]
fn a_read_only_open_with_another_budget_writes_nothing_and_sees_every_group() {
    // Groups saved by a mount with a larger budget (wider prefixes), then the image checked
    // with the budget recorded at mkfs, as `nodup fsck` and `nodup stats IMAGE` do: nothing is
    // written, every group is read at the width it was saved with (a damaged one is found),
    // and only a read-write open rewrites them for the narrower prefixes.
    let Settled {
        m,
        o: small,
        fs,
        b,
        order,
        ..
    } = settled_with_groups();
    fs.shutdown().unwrap();
    drop(fs);
    let bits = |fs: &FileSystem| {
        fs.stats_json()["smart"]["engine"]["store"]["prefix_bits"]
            .as_u64()
            .unwrap()
    };
    let big = opts(SmartOptions::default(), 1 << 20);
    let fs = FileSystem::open(m.clone(), &big).unwrap();
    let wide = bits(&fs);
    let held = fs.engine().stats().index_entries;
    assert!(held >= N, "{held}");
    fs.shutdown().unwrap();
    let groups = group_blocks(&fs, &m);
    drop(fs);
    let image = |m: &MemMedium| {
        let mut v = vec![0u8; 96 << 20];
        m.read(0, &mut v).unwrap();
        v
    };
    let read_only = FsOptions {
        read_only: true,
        ..small.clone()
    };
    let before = image(&m);
    let fs = FileSystem::open(m.clone(), &read_only).unwrap();
    assert_eq!(bits(&fs), wide);
    assert_eq!(fs.engine().stats().index_entries, held);
    assert!(fsck::check(&fs, false).unwrap().consistent());
    check_file(&fs, b, &order);
    drop(fs);
    assert!(image(&m) == before, "a read-only open wrote to the image");
    // A damaged group of the wider width is found by the read-only check.
    let at = groups[groups.len() / 2] * BLOCK_SIZE as u64 + 1000;
    let mut x = [0u8; 1];
    m.read(at, &mut x).unwrap();
    m.write(at, &[x[0] ^ 0x40]).unwrap();
    let fs = FileSystem::open(m.clone(), &read_only).unwrap();
    let rep = fsck::check(&fs, false).unwrap();
    assert_eq!(rep.problems.len(), 1, "{:?}", rep.problems);
    assert!(
        rep.problems[0].contains("fingerprint group"),
        "{:?}",
        rep.problems
    );
    drop(fs);
    m.write(at, &x).unwrap();
    // Opened for writing with the small budget: rebucketed, nothing lost.
    let fs = FileSystem::open(m.clone(), &small).unwrap();
    assert!(bits(&fs) < wide, "{} {wide}", bits(&fs));
    assert_eq!(fs.engine().stats().index_entries, held);
    assert!(fsck::check(&fs, false).unwrap().consistent());
    fs.shutdown().unwrap();
}

#[test]
fn a_crash_while_groups_are_rebucketed_recovers_with_whole_groups() {
    // An image saved with a 64 KiB budget, opened for writing with 1 MiB (wider prefixes):
    // the groups are rewritten on open, reusing the old groups' blocks. Every crash state of
    // that open recovers to whole groups and intact files: either the clean image as saved
    // (no group rewritten yet) or, once the image was marked in use, failure recovery. With
    // the rewrite before the mark, a state with some group blocks rewritten and the mark lost
    // reopened clean with damaged groups (their blocks then leaked).
    let sim = Arc::new(CrashSim::new(96 << 20));
    let small = opts(SmartOptions::default(), 64 << 10);
    let fo = FormatOptions {
        policy: PolicyKind::Smart,
        mem_budget: 64 << 10,
        meta_layout: MetaLayoutKind::default_for(PolicyKind::Smart),
        ..Default::default()
    };
    let fs = FileSystem::format(
        sim.clone(),
        MediumKind::Pmem,
        &fo,
        &small,
        Caller::default(),
    )
    .unwrap();
    let (_, b, order) = unique_then_shuffled(&fs);
    fs.smart_settle().unwrap();
    fs.shutdown().unwrap();
    drop(fs);
    let big = opts(SmartOptions::default(), 1 << 20);
    sim.set_capture_filter(Box::new(|_| true));
    let fs = FileSystem::open(sim.clone(), &big).unwrap();
    sim.clear_capture_filter();
    let merges = fs.stats_json()["smart"]["engine"]["store"]["counters"]["merges"]
        .as_u64()
        .unwrap();
    assert!(merges > 0, "no rebucketing");
    let mut points = sim.take_captures();
    points.push(sim.crash_point());
    drop(fs);
    assert!(points.len() >= 2, "{} crash points", points.len());
    // A handful of fences (the open's, each followed by the pending stores of its epoch, which
    // the random modes persist in part): every one is tested.
    assert!(points.len() <= 64, "{} crash points", points.len());
    // The image as saved (the first point, nothing of the open persisted) and its groups'
    // blocks, read without rebucketing.
    let saved = points[0].materialize(&CrashMode::DropAll);
    let old_groups = {
        let m = Arc::new(MemMedium::from_bytes(saved.clone()));
        let ro = FsOptions {
            read_only: true,
            ..small.clone()
        };
        let fs = FileSystem::open(m.clone(), &ro).unwrap();
        group_blocks(&fs, &m)
    };
    assert!(!old_groups.is_empty());
    let mut kinds = std::collections::BTreeSet::new();
    // States with the in-use mark persisted and an old group block already overwritten: the
    // window the mark must cover.
    let mut in_window = 0;
    for (i, p) in points.iter().enumerate() {
        let seed = i as u64;
        let mut modes = vec![
            CrashMode::DropAll,
            CrashMode::KeepAll,
            CrashMode::Random { seed },
            CrashMode::Random { seed: seed + 1000 },
        ];
        // Prefixes of the epoch's stores in program order (each a state in-order write-back
        // can leave): deterministic states with some of the rewrite persisted and whatever was
        // stored after it lost, which is what a rewrite ordered before the mark gets wrong.
        let n = p.pending().len();
        let mut by_seq: Vec<usize> = (0..n).collect();
        by_seq.sort_by_key(|&k| p.pending()[k].seq);
        for eighth in 1..8 {
            let mut keep = vec![false; n];
            for &k in &by_seq[..n * eighth / 8] {
                keep[k] = true;
            }
            modes.push(CrashMode::Subset(keep));
        }
        // Modes by index in messages (a subset prints as a long list).
        for (j, mode) in modes.iter().enumerate() {
            let bytes = p.materialize(mode);
            let rewritten = old_groups.iter().any(|&g| {
                let r = g as usize * BLOCK_SIZE..(g as usize + 1) * BLOCK_SIZE;
                bytes[r.clone()] != saved[r]
            });
            let m = Arc::new(MemMedium::from_bytes(bytes));
            let fs = FileSystem::open(m, &big).unwrap();
            kinds.insert(fs.recovery().kind.clone());
            in_window += usize::from(rewritten && fs.recovery().kind == "failure");
            let problems = fs.engine().store_problems();
            assert!(problems.is_empty(), "point {i} mode {j}: {problems:?}");
            let rep = fsck::check(&fs, false).unwrap();
            assert!(rep.consistent(), "point {i} mode {j}: {:?}", rep.problems);
            check_file(&fs, b, &order);
            fs.shutdown().unwrap();
        }
    }
    assert!(kinds.contains("failure"), "{kinds:?}");
    assert!(in_window > 0, "no crash state inside the rewrite");
}

#[test]
fn memory_stays_in_the_budget_while_unique_data_grows_ten_times_past_it() {
    let m = Arc::new(MemMedium::new(96 << 20));
    let budget = 64 << 10;
    let fs = format(&m, &opts(SmartOptions::default(), budget));
    let cap = fs.stats_json()["smart"]["engine"]["store"]["node_capacity"]
        .as_u64()
        .unwrap();
    let f = create(&fs, "f");
    let total = 10 * cap;
    let mut written = 0;
    while written < total {
        let n = 256.min(total - written);
        let buf: Vec<u8> = (written..written + n)
            .flat_map(|s| block(s + 1_000_000))
            .collect();
        fs.write(f, written * BLOCK_SIZE as u64, &buf).unwrap();
        written += n;
        let s = fs.stats_json();
        let mem = s["smart"]["memory"]["total_bytes"].as_u64().unwrap();
        assert!(
            mem <= budget,
            "{mem} bytes of dedup memory after {written} blocks"
        );
        fs.smart_step(512).unwrap();
    }
    let s = fs.stats_json();
    let st = &s["smart"]["engine"]["store"];
    assert!(st["fingerprints_on_media"].as_u64().unwrap() >= total - cap);
    assert!(st["counters"]["group_evictions"].as_u64().unwrap() > 0);
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

/// A content whose fingerprint memory forgot, written twice more before the worker runs: the
/// second new copy deduplicates inline against the first new copy, not the original; both are
/// queued (the first as a miss, the second because its match is still provisional), and the
/// worker leaves one copy.
#[test]
fn copies_made_while_memory_forgot_end_as_one() {
    let m = Arc::new(MemMedium::new(96 << 20));
    let fs = format(&m, &opts(SmartOptions::default(), 64 << 10));
    let a = create(&fs, "a");
    let data: Vec<u8> = (0..100).flat_map(block).collect();
    fs.write(a, 0, &data).unwrap();
    let filler = create(&fs, "filler");
    let fill: Vec<u8> = (1000..3000).flat_map(block).collect();
    fs.write(filler, 0, &fill).unwrap();
    fs.smart_settle().unwrap();
    assert_eq!(physical(&fs), 2100);
    let b = create(&fs, "b");
    fs.write(b, 0, &data).unwrap();
    let c = create(&fs, "c");
    fs.write(c, 0, &data).unwrap();
    let before = physical(&fs);
    assert!(
        before > 2150,
        "b stored apart ({before}), c deduplicated against b"
    );
    fs.smart_settle().unwrap();
    assert_eq!(physical(&fs), 2100, "one copy left");
    // With 64 KiB a step holds 24 blocks: b's and c's references to their shared copy fall
    // into different steps, are kept in place on their first visit, and move on their second.
    let w = &fs.stats_json()["smart"]["fs"]["worker"];
    assert!(w["second_visits"].as_u64().unwrap() > 0, "{w}");
    for f in [a, b, c] {
        check_file(&fs, f, &(0..100).collect::<Vec<_>>());
    }
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

/// Random duplicate runs of earlier contents (contents written up to five times), far more
/// than memory holds: after the worker settles, every content is stored exactly once.
#[test]
fn random_duplicate_runs_settle_to_one_copy_each() {
    let m = Arc::new(MemMedium::new(512 << 20));
    let fs = format(&m, &opts(SmartOptions::default(), 128 << 10));
    let n = 32768usize;
    let mut contents: Vec<u64> = Vec::with_capacity(n);
    let mut uniq = 0u64;
    let mut st = 12345u64;
    let mut rnd = || {
        st ^= st << 13;
        st ^= st >> 7;
        st ^= st << 17;
        st
    };
    while contents.len() < n {
        let len = 1 + rnd() % 16;
        if uniq > 100 && rnd() % 2 == 0 {
            let start = rnd() % (uniq - len.min(uniq));
            contents.extend(start..start + len);
        } else {
            contents.extend(uniq..uniq + len);
            uniq += len;
        }
    }
    contents.truncate(n);
    let f = create(&fs, "f");
    for (c, chunk) in contents.chunks(512).enumerate() {
        let buf: Vec<u8> = chunk.iter().flat_map(|&k| block(k)).collect();
        fs.write(f, (c * 512 * BLOCK_SIZE) as u64, &buf).unwrap();
    }
    fs.smart_settle().unwrap();
    let mut distinct = contents.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(physical(&fs), distinct.len() as u64);
    check_file(&fs, f, &contents);
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

/// The file's block `lbn` has an entry (it was fingerprinted inline), or not.
fn has_entry(fs: &FileSystem, ino: u64, lbn: u64) -> bool {
    let b = fs.mapped_block(ino, lbn).unwrap();
    fs.engine().block_entry(b).unwrap().is_some()
}

/// A block written through write(2) and fingerprinted inline is queued with its fingerprint;
/// when the file block is then rewritten another way (a truncate's or a punch's partial
/// block, a copy's unshareable block) and not fingerprinted inline, the worker must not give
/// the new block an entry under the old block's fingerprint (crash campaign seed 17: "entry N:
/// block B does not match its fingerprint"). With selectivity 0.5 every second block is
/// fingerprinted inline; the scratch writes keep the rewrites on the other blocks.
#[test]
fn blocks_rewritten_outside_write_are_not_adopted_under_the_old_fingerprint() {
    let fs = with_selectivity(0.5);
    let scratch = create(&fs, "scratch");
    let mut k = 0;
    let mut skip_one = |fs: &FileSystem| {
        k += 1;
        fs.write(scratch, k * BLOCK_SIZE as u64, &block(1000 + k))
            .unwrap();
    };
    skip_one(&fs);
    // Truncate into the block.
    let t = create(&fs, "t");
    fs.write(t, 0, &block(1)).unwrap();
    assert!(has_entry(&fs, t, 0), "precondition: fingerprinted inline");
    fs.truncate(t, 100).unwrap();
    assert!(!has_entry(&fs, t, 0), "precondition: rewritten without");
    // Punch part of the block.
    let p = create(&fs, "p");
    fs.write(p, 0, &block(2)).unwrap();
    assert!(has_entry(&fs, p, 0), "precondition: fingerprinted inline");
    fs.fallocate(
        p,
        100,
        200,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    )
    .unwrap();
    assert!(!has_entry(&fs, p, 0), "precondition: rewritten without");
    // Copy a block without an entry (not shareable: its data is written anew) over a block
    // that was fingerprinted inline.
    skip_one(&fs);
    let src = create(&fs, "src");
    fs.write(src, 0, &block(3)).unwrap();
    assert!(
        !has_entry(&fs, src, 0),
        "precondition: not fingerprinted inline"
    );
    let c = create(&fs, "c");
    fs.write(c, 0, &block(4)).unwrap();
    assert!(has_entry(&fs, c, 0), "precondition: fingerprinted inline");
    fs.copy_range(src, 0, c, 0, BLOCK_SIZE as u64).unwrap();
    assert!(!has_entry(&fs, c, 0), "precondition: written anew without");
    fs.smart_settle().unwrap();
    let rep = fs.engine().audit().unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    assert!(fsck::check(&fs, false).unwrap().consistent());
    // The old contents written again are stored as they are, and every file reads back.
    let again = create(&fs, "again");
    let old: Vec<u8> = [1, 2, 4].iter().flat_map(|&s| block(s)).collect();
    fs.write(again, 0, &old).unwrap();
    fs.smart_settle().unwrap();
    assert_eq!(fs.read(again, 0, old.len()).unwrap(), old);
    assert_eq!(fs.read(t, 0, 100).unwrap(), block(1)[..100]);
    check_file(&fs, c, &[3]);
    let rep = fs.engine().audit().unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

/// The worker's check of a queued fingerprint: a block whose bytes have another fingerprint
/// is not adopted, and its own fingerprint is returned.
#[test]
fn adopting_under_a_fingerprint_checks_the_bytes_when_asked() {
    let fs = with_selectivity(0.0);
    let a = create(&fs, "a");
    fs.write(a, 0, &block(8)).unwrap();
    let b = fs.mapped_block(a, 0).unwrap();
    assert!(
        !has_entry(&fs, a, 0),
        "precondition: not fingerprinted inline"
    );
    let (own, other) = (
        fs.engine().fingerprint(&block(8)),
        fs.engine().fingerprint(&block(9)),
    );
    assert_eq!(
        fs.adopt_block(a, 0, b, other, true).unwrap(),
        AdoptOutcome::Stale(own)
    );
    assert!(!has_entry(&fs, a, 0));
    assert_eq!(
        fs.adopt_block(a, 0, b, own, true).unwrap(),
        AdoptOutcome::Adopted
    );
    assert_eq!(fs.engine().block_entry(b).unwrap().map(|e| e.0), Some(own));
    let rep = fs.engine().audit().unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

/// An adoption whose write or fence fails (whole, or after its bytes landed) is undone: the
/// engine goes on (a background worker's failure must not stop the mount), the block is again
/// one without an entry, the audit and fsck are clean, a retry adopts it, and a crash image
/// recovers. Only when the undo fails too does the engine give up its live state.
#[test]
fn a_failed_adoption_is_undone_and_the_engine_goes_on() {
    use nodup_core::media::{FaultMedium, FaultOp, FaultRule};
    let mut failed = 0;
    for (op, landed) in [
        (FaultOp::Write, false),
        (FaultOp::Write, true),
        (FaultOp::Fence, false),
    ] {
        for nth in 1..=6 {
            let what = format!("{op:?} {nth} failing, landed {landed}");
            let mem = Arc::new(MemMedium::new(32 << 20));
            let fm = Arc::new(FaultMedium::new(mem.clone(), 1));
            let fo = FormatOptions {
                policy: PolicyKind::Smart,
                mem_budget: 64 << 10,
                meta_layout: MetaLayoutKind::default_for(PolicyKind::Smart),
                ..Default::default()
            };
            let smart = SmartOptions {
                fixed_selectivity: Some(0.0),
                ..Default::default()
            };
            let fs = FileSystem::format(
                fm.clone(),
                MediumKind::Pmem,
                &fo,
                &opts(smart, 64 << 10),
                Caller::default(),
            )
            .unwrap();
            let a = create(&fs, "a");
            fs.write(a, 0, &block(8)).unwrap();
            let b = fs.mapped_block(a, 0).unwrap();
            let fp = fs.engine().fingerprint(&block(8));
            let rule = FaultRule::new(op).nth(nth).once();
            fm.add_rule(if landed {
                rule.short_write(usize::MAX)
            } else {
                rule
            });
            let r = fs.adopt_block(a, 0, b, fp, false);
            fm.clear_rules();
            if r.is_ok() {
                continue;
            }
            failed += 1;
            fs.engine()
                .check_ready()
                .unwrap_or_else(|e| panic!("{what}: the engine gave up: {e}"));
            assert!(!has_entry(&fs, a, 0), "{what}");
            let rep = fs.engine().audit().unwrap();
            assert!(rep.problems.is_empty(), "{what}: {:?}", rep.problems);
            let rep = fsck::check(&fs, false).unwrap();
            assert!(rep.consistent(), "{what}: {:?}", rep.problems);
            let crashed = FileSystem::open(
                Arc::new(MemMedium::from_bytes(mem.snapshot())),
                &FsOptions::default(),
            )
            .unwrap();
            let rep = fsck::check(&crashed, false).unwrap();
            assert!(rep.consistent(), "{what}: crash image: {:?}", rep.problems);
            drop(crashed);
            assert_eq!(
                fs.adopt_block(a, 0, b, fp, false).unwrap(),
                AdoptOutcome::Adopted,
                "{what}: the retry"
            );
            let rep = fs.engine().audit().unwrap();
            assert!(rep.problems.is_empty(), "{what}: {:?}", rep.problems);
        }
    }
    assert!(failed >= 6, "only {failed} adoptions failed");
}
