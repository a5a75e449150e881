//! Failure recovery while mounted: after the engine gave up its live state (here a region grow
//! whose link write and its undo both failed, so the chain on the medium may name a block the
//! engine does not count as a region), changes are refused until the next change, the
//! maintenance tick or the unmount rebuilds the engine from the block maps; then changes go
//! on, nothing is lost or held twice, and the image opens clean, or after a crash with failure
//! recovery, showing every file.

mod common;
use common::{block, create};

use nodup_core::media::{FaultMedium, FaultOp, FaultRule, Medium, MemMedium};
use nodup_core::meta::region::{OFF_MAGIC, OFF_NEXT, REGION_ENTRIES, REGION_MAGIC};
use nodup_core::meta::MetaLayoutKind;
use nodup_core::policy::PolicyKind;
use nodup_core::{FormatOptions, KeyFile, OpenOptions, BLOCK_SIZE};
use nodup_fs::inode::ROOT_INO;
use nodup_fs::{fsck, Caller, FileSystem, FsOptions, MediumKind};
use std::sync::Arc;

const BS: u64 = BLOCK_SIZE as u64;

/// File name -> its blocks' seeds (block `i` holds `block(seeds[i])`).
type Model = Vec<(String, Vec<u64>)>;

fn put(fs: &FileSystem, model: &mut Model, name: &str, seeds: Vec<u64>) {
    let ino = create(fs, name);
    for (i, &s) in seeds.iter().enumerate() {
        fs.write(ino, i as u64 * BS, &block(s)).unwrap();
    }
    model.push((name.to_string(), seeds));
}

/// Every file reads as the model says, and fsck finds nothing.
fn check(fs: &FileSystem, model: &Model, what: &str) {
    check_reads(fs, model, what);
    let rep = fsck::check(fs, false).unwrap();
    assert!(rep.consistent(), "{what}: {:?}", rep.problems);
}

/// A light image with region entries whose header region is full, and the file system in
/// the state the failed grow leaves: the engine gave up, changes fail. The model holds what
/// was written before.
fn gave_up(landed: bool) -> (Arc<MemMedium>, Arc<FaultMedium>, FileSystem, Model) {
    let mem = Arc::new(MemMedium::new(16 << 20));
    let fm = Arc::new(FaultMedium::new(mem.clone(), 1));
    let fopts = FormatOptions {
        policy: PolicyKind::Light,
        meta_layout: MetaLayoutKind::Region,
        ..Default::default()
    };
    let fs = FileSystem::format(
        fm.clone(),
        MediumKind::Pmem,
        &fopts,
        &FsOptions::default(),
        Caller::default(),
    )
    .unwrap();
    let (data_start, _) = fs.engine().data_area();
    let head = (0..data_start)
        .find(|&b| {
            let mut m = [0u8; 8];
            mem.read(b * BS + OFF_MAGIC, &mut m).unwrap();
            u64::from_le_bytes(m) == REGION_MAGIC
        })
        .expect("a header region");
    // Distinct blocks fill the header region's entries; a duplicate takes none.
    let mut model = Model::new();
    put(&fs, &mut model, "full", (0..REGION_ENTRIES).collect());
    put(&fs, &mut model, "dup", vec![3, 3, 7]);
    assert_eq!(fs.engine().layout_owned_blocks(), 0, "no region grown yet");
    // The link to the new region fails, then so does ending the chain at the tail again.
    let at = head * BS + OFF_NEXT;
    fm.add_rule(FaultRule::new(FaultOp::Write).range(at, 8).nth(2).once());
    let link = FaultRule::new(FaultOp::Write).range(at, 8).nth(1).once();
    fm.add_rule(if landed {
        link.short_write(usize::MAX)
    } else {
        link
    });
    let ino = create(&fs, "new");
    let e = fs.write(ino, 0, &block(9_999)).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert_eq!(fm.injected(), 2, "both faults fired");
    fm.clear_rules();
    model.push(("new".into(), Vec::new()));
    let refused = fs.changes_possible().unwrap_err().to_string();
    assert!(refused.contains("gave up its live state"), "{refused}");
    check_reads(&fs, &model, "after giving up");
    (mem, fm, fs, model)
}

/// Every file reads as the model says (reads go on while changes are refused).
fn check_reads(fs: &FileSystem, model: &Model, what: &str) {
    for (name, seeds) in model {
        let ino = fs.lookup(ROOT_INO, name.as_bytes()).unwrap().0;
        for (i, &s) in seeds.iter().enumerate() {
            let got = fs.read(ino, i as u64 * BS, BLOCK_SIZE).unwrap();
            assert!(got == block(s), "{what}: {name} block {i}");
        }
    }
}

/// Changes go on: more regions, duplicates of old and new data, the first file unlinked; then the image
/// after a crash and after a clean unmount shows the same files.
fn goes_on(mem: &MemMedium, fs: FileSystem, model: Model, what: &str) {
    goes_on_with(mem, fs, model, &FsOptions::default(), what)
}

/// [`goes_on`], reopening with `opts`.
fn goes_on_with(mem: &MemMedium, fs: FileSystem, mut model: Model, opts: &FsOptions, what: &str) {
    assert!(fs.changes_possible().is_ok(), "{what}");
    put(&fs, &mut model, "more", (500..800).chain(0..40).collect());
    let gone = model[0].0.clone();
    fs.unlink(ROOT_INO, gone.as_bytes()).unwrap();
    model.remove(0);
    check(&fs, &model, what);
    // A block file holds its records back until the tick writes them out (unsynced, as they
    // were written before session 47): the crash comes after that.
    fs.write_out_log().unwrap();
    let crashed = Arc::new(MemMedium::from_bytes(mem.snapshot()));
    fs.shutdown().unwrap();
    drop(fs);
    for (img, kind) in [
        (crashed, "failure"),
        (Arc::new(MemMedium::from_bytes(mem.snapshot())), "clean"),
    ] {
        let m: Arc<dyn Medium> = img;
        let fs = FileSystem::open(m, opts).unwrap();
        assert_eq!(fs.recovery().kind, kind, "{what}");
        check(&fs, &model, &format!("{what}: reopened ({kind})"));
        let ino = create(&fs, "after");
        fs.write(ino, 0, &block(20_000)).unwrap();
        fs.shutdown().unwrap();
    }
}

#[test]
fn the_tick_rebuilds_an_engine_that_gave_up_and_changes_go_on() {
    for landed in [false, true] {
        let what = format!("link write failing (landed {landed})");
        let (mem, _fm, fs, model) = gave_up(landed);
        fs.tick().unwrap();
        assert_eq!(fs.live_recoveries(), (1, 0), "{what}");
        let js = fs.stats_json();
        assert!(js["changes_refused"].is_null(), "{what}: {js}");
        assert_eq!(js["live_recoveries"]["done"], 1, "{what}");
        goes_on(&mem, fs, model, &what);
    }
}

/// The next change rebuilds the engine itself (no tick ran) and goes through: only the
/// operation that met the failure saw it.
#[test]
fn the_next_change_rebuilds_the_engine_and_goes_through() {
    let (mem, _fm, fs, mut model) = gave_up(false);
    let ino = fs.lookup(ROOT_INO, b"new").unwrap().0;
    fs.write(ino, 0, &block(10_000)).unwrap();
    model.retain(|(n, _)| n != "new");
    model.push(("new".into(), vec![10_000]));
    assert_eq!(fs.live_recoveries(), (1, 0));
    goes_on(&mem, fs, model, "after the next change");
}

#[test]
fn a_failed_try_waits_and_the_next_one_heals() {
    let (mem, fm, fs, model) = gave_up(false);
    // The recovery's first medium operation (a read of the region chain) fails: it stays
    // refused, and the next tick does not try.
    fm.add_rule(FaultRule::new(FaultOp::Any).nth(1).once());
    fs.tick().unwrap();
    assert_eq!(fm.injected(), 3, "the recovery met the fault");
    assert_eq!(fs.live_recoveries(), (0, 1));
    assert!(fs.changes_possible().is_err());
    // A change before the wait is over does not try either: it fails.
    let e = fs.write(fs.lookup(ROOT_INO, b"new").unwrap().0, 0, &block(10_000));
    assert_eq!(e.map_err(|e| e.errno()).unwrap_err(), libc::EIO);
    assert_eq!(
        fs.live_recoveries(),
        (0, 1),
        "a change tried before the wait"
    );
    let refused = fs.stats_json()["changes_refused"].clone();
    assert!(
        refused.as_str().is_some_and(|s| s.contains("gave up")),
        "{refused}"
    );
    fs.tick().unwrap();
    assert_eq!(fs.live_recoveries(), (0, 1), "tried again before its wait");
    check_reads(&fs, &model, "after a failed try");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    fs.tick().unwrap();
    assert_eq!(fs.live_recoveries(), (1, 1));
    goes_on(&mem, fs, model, "after a failed try and a good one");
}

#[test]
fn an_unmount_rebuilds_an_engine_that_gave_up_and_is_clean() {
    let (mem, _fm, fs, model) = gave_up(true);
    // No tick ran: the unmount tries it and saves a clean image.
    fs.shutdown().unwrap();
    assert_eq!(fs.live_recoveries(), (1, 0));
    drop(fs);
    let m: Arc<dyn Medium> = mem.clone();
    let fs = FileSystem::open(m, &FsOptions::default()).unwrap();
    assert_eq!(fs.recovery().kind, "clean");
    check(&fs, &model, "reopened");
    goes_on(&mem, fs, model, "reopened");
}

/// Every policy's index is rebuilt while mounted (`smart`'s fingerprint groups on the medium
/// and its worker's queue, `selective`'s caches, an encrypted image), after giving up at a
/// moment when nothing failed: the same files, and dedup against data written before.
#[test]
fn every_policy_is_rebuilt_while_mounted() {
    let key = b"live recovery key".to_vec();
    for (policy, encrypted, kind) in [
        (PolicyKind::Light, true, MediumKind::Pmem),
        (PolicyKind::Smart, false, MediumKind::Pmem),
        (PolicyKind::Selective, false, MediumKind::Pmem),
        (PolicyKind::Strong, false, MediumKind::Pmem),
        (PolicyKind::Light, false, MediumKind::BlockFile),
    ] {
        let what = format!("{policy:?} (encrypted {encrypted}, {kind:?})");
        let opts = FsOptions {
            open: OpenOptions {
                key: encrypted.then(|| KeyFile(key.clone())),
                ..Default::default()
            },
            ..Default::default()
        };
        let fopts = FormatOptions {
            policy,
            meta_layout: MetaLayoutKind::default_for(policy),
            encrypt: encrypted.then(|| KeyFile(key.clone())),
            mem_budget: if policy == PolicyKind::Smart {
                16 << 10
            } else {
                0
            },
            ..Default::default()
        };
        let mem = Arc::new(MemMedium::new(16 << 20));
        // A block file (not durable at each write) through a medium without rules: releases
        // wait for the next sync, and recovery must count them as still held.
        let medium: Arc<dyn Medium> = match kind {
            MediumKind::BlockFile => Arc::new(FaultMedium::new(mem.clone(), 1)),
            _ => mem.clone(),
        };
        let fs = FileSystem::format(medium, kind, &fopts, &opts, Caller::default()).unwrap();
        let mut model = Model::new();
        put(&fs, &mut model, "a", (0..300).collect());
        put(&fs, &mut model, "b", (150..450).collect());
        let c = create(&fs, "c");
        model.push(("c".into(), Vec::new()));
        // Overwritten: the old blocks of `a` wait for a sync on a block file.
        fs.sync().unwrap();
        let a = fs.lookup(ROOT_INO, b"a").unwrap().0;
        fs.write(a, 0, &(1000..1100).flat_map(block).collect::<Vec<u8>>())
            .unwrap();
        model[0].1.splice(0..100, 1000..1100);
        let waiting = fs.unmapped_refs().len();
        assert_eq!(
            waiting > 0,
            kind == MediumKind::BlockFile,
            "{what}: {waiting}"
        );
        fs.engine().give_up_live_state();
        assert!(fs.changes_possible().is_err(), "{what}");
        check_reads(&fs, &model, &what);
        fs.tick().unwrap();
        assert_eq!(fs.live_recoveries(), (1, 0), "{what}");
        fs.write(c, 0, &block(1)).unwrap();
        model.retain(|(n, _)| n != "c");
        model.push(("c".into(), vec![1]));
        // Data written before the rebuild is found again.
        let used = fs.engine().stats().physical_bytes;
        put(&fs, &mut model, "d", (100..450).chain(1000..1100).collect());
        if policy != PolicyKind::Smart {
            assert_eq!(
                fs.engine().stats().physical_bytes,
                used,
                "{what}: no dedup after"
            );
        }
        goes_on_with(&mem, fs, model, &opts, &what);
    }
}

/// Blocks allocated with nothing holding them (as a fingerprint group lost to a medium error
/// leaves them) are freed once the engine suspects a leak: by the next tick after a second
/// without operations, or by the unmount. Not suspected, they stay (fsck reports them).
#[test]
fn suspected_leaks_are_freed_when_idle_and_at_unmount() {
    for at_unmount in [false, true] {
        let what = if at_unmount {
            "at unmount"
        } else {
            "when idle"
        };
        let mem = Arc::new(MemMedium::new(16 << 20));
        let fs = common::format(mem.clone(), MediumKind::Pmem);
        let mut model = Model::new();
        put(&fs, &mut model, "a", (0..40).chain(0..10).collect());
        let mut pool = 0;
        for _ in 0..5 {
            fs.engine().allocator().alloc(&mut pool).unwrap();
        }
        let leaked = |fs: &FileSystem| !fsck::check(fs, false).unwrap().consistent();
        std::thread::sleep(std::time::Duration::from_millis(1100));
        fs.tick().unwrap();
        assert!(leaked(&fs), "{what}: freed without a suspicion");
        fs.engine().allocator().suspect_leak();
        if at_unmount {
            fs.shutdown().unwrap();
            drop(fs);
            let m: Arc<dyn Medium> = mem.clone();
            let fs = FileSystem::open(m, &FsOptions::default()).unwrap();
            assert_eq!(fs.recovery().kind, "clean", "{what}");
            check(&fs, &model, what);
            continue;
        }
        std::thread::sleep(std::time::Duration::from_millis(1100));
        fs.tick().unwrap();
        assert!(!leaked(&fs), "{what}: still leaked");
        assert_eq!(fs.stats_json()["live_recoveries"]["for_leaks"], 1, "{what}");
        assert!(!fs.engine().allocator().leak_suspected());
        goes_on(&mem, fs, model, what);
    }
}
