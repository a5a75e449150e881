//! A checkpoint that fails leaves the previous one in force: whichever medium operation of it
//! fails (a read of a segment being cleaned, a segment or manifest write, a fence, the
//! superblock switch; a write that fails after its bytes landed), the live file system, a trim
//! and a crash after it, the next checkpoint and a clean unmount all show every file as it
//! was, with no block leaked or held twice.

mod common;
use common::{block, create};

use nodup_core::media::{FaultMedium, FaultOp, FaultRule, Medium, MemMedium};
use nodup_core::{FormatOptions, BLOCK_SIZE};
use nodup_fs::inode::ROOT_INO;
use nodup_fs::{fsck, superblock, FileSystem, FsOptions, MediumKind};
use std::collections::BTreeMap;
use std::sync::Arc;

/// 16 MiB: segments of 16 KiB, so a checkpoint of a few hundred files spans several.
const IMAGE: u64 = 16 << 20;
const FILES: u64 = 240;

/// Name → (blocks, seed): file `name` holds `block(seed + i)` at block `i`.
type Model = BTreeMap<String, (u64, u64)>;

fn put(fs: &FileSystem, model: &mut Model, name: &str, blocks: u64, seed: u64) {
    let ino = match fs.lookup(ROOT_INO, name.as_bytes()) {
        Ok((ino, _)) => ino,
        Err(_) => create(fs, name),
    };
    for i in 0..blocks {
        fs.write(ino, i * BLOCK_SIZE as u64, &block(seed + i))
            .unwrap();
    }
    model.insert(name.to_string(), (blocks, seed));
}

/// Files made, checkpointed, then half deleted and the rest partly rewritten: the next
/// checkpoint has changed inodes to write and garbage-laden segments to clean.
fn populate(fs: &FileSystem) -> Model {
    let mut model = Model::new();
    for i in 0..FILES {
        put(fs, &mut model, &format!("f{i}"), 1 + i % 3, i * 100);
    }
    fs.checkpoint(false).unwrap();
    for i in (0..FILES).step_by(2) {
        let name = format!("f{i}");
        fs.unlink(ROOT_INO, name.as_bytes()).unwrap();
        model.remove(&name);
    }
    for i in (1..FILES).step_by(4) {
        put(fs, &mut model, &format!("f{i}"), 1, i * 100 + 50);
    }
    for i in 0..FILES / 4 {
        put(fs, &mut model, &format!("g{i}"), 2, 90_000 + i * 10);
    }
    model
}

fn check(fs: &FileSystem, model: &Model, what: &str) {
    let mut listed: Vec<String> = fs
        .readdir(ROOT_INO, 2, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|(_, _, _, n)| String::from_utf8_lossy(&n).into_owned())
        .collect();
    listed.sort();
    let want: Vec<&String> = model.keys().collect();
    assert_eq!(
        listed.iter().collect::<Vec<_>>(),
        want,
        "{what}: directory listing"
    );
    for (name, &(blocks, seed)) in model {
        let ino = fs.lookup(ROOT_INO, name.as_bytes()).unwrap().0;
        for i in 0..blocks {
            let got = fs.read(ino, i * BLOCK_SIZE as u64, BLOCK_SIZE).unwrap();
            assert!(got == block(seed + i), "{what}: {name} block {i}");
        }
    }
    let rep = fsck::check(fs, false).unwrap();
    assert!(rep.consistent(), "{what}: {:?}", rep.problems);
}

fn reopen(img: Vec<u8>, clean: bool, model: &Model, what: &str) {
    let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(img));
    let fs = FileSystem::open(m, &opts()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = if clean { "clean" } else { "failure" };
    assert_eq!(fs.recovery().kind, want, "{what}");
    check(&fs, model, what);
}

struct Setup {
    mem: Arc<MemMedium>,
    faulty: Arc<FaultMedium>,
    fs: FileSystem,
    model: Model,
}

/// Cleaning every segment with garbage, so each checkpoint reads and rewrites some.
fn opts() -> FsOptions {
    FsOptions {
        eager_cleaning: true,
        ..FsOptions::default()
    }
}

fn setup(kind: MediumKind) -> Setup {
    let mem = Arc::new(MemMedium::new(IMAGE));
    let faulty = Arc::new(FaultMedium::new(mem.clone(), 1));
    let fs = FileSystem::format(
        faulty.clone(),
        kind,
        &FormatOptions::default(),
        &opts(),
        Default::default(),
    )
    .unwrap();
    let model = populate(&fs);
    Setup {
        mem,
        faulty,
        fs,
        model,
    }
}

/// Medium operations of kind `op` the checkpoint after [`populate`] takes.
fn ops_of_checkpoint(kind: MediumKind, op: FaultOp) -> u64 {
    let s = setup(kind);
    let rule = s.faulty.add_rule(FaultRule::new(op).probability(0.0));
    s.fs.checkpoint(false).unwrap();
    let seen = s.faulty.rule(rule).unwrap().seen();
    let stats = s.fs.stats_json()["checkpoints"].clone();
    assert!(
        stats["segments_cleaned"].as_u64().unwrap() > 0,
        "the checkpoint under test cleans no segment: {stats}"
    );
    seen
}

/// What a checkpoint that failed (`Err`) leaves, and what one that got past a fault in its
/// step 3 (`Ok`: written, a release retried) does.
fn after(mut s: Setup, failed: bool, what: &str) {
    check(&s.fs, &s.model, &format!("{what}: live"));
    s.fs.trim(0, IMAGE, BLOCK_SIZE as u64).unwrap();
    reopen(
        s.mem.snapshot(),
        false,
        &s.model,
        &format!("{what}: trim and crash"),
    );
    if failed {
        // Changes, a second checkpoint failing early in its writes (into blocks the first
        // may have used), and a crash. The changes are synced first: on a block file they
        // are otherwise held back in memory until the checkpoint writes them out, so its
        // first writes would be theirs, and a crash may lose what was not synced.
        put(&s.fs, &mut s.model, "after", 2, 77_000);
        s.fs.sync().unwrap();
        s.faulty
            .add_rule(FaultRule::new(FaultOp::Write).nth(3).once());
        assert!(
            s.fs.checkpoint(false).is_err(),
            "{what}: the second failure"
        );
        s.faulty.clear_rules();
        reopen(
            s.mem.snapshot(),
            false,
            &s.model,
            &format!("{what}: a second failed checkpoint and a crash"),
        );
    }
    // The next checkpoint.
    put(&s.fs, &mut s.model, "f1", 1, 78_000);
    put(&s.fs, &mut s.model, "after", 1, 79_000);
    s.fs.checkpoint(false).unwrap();
    check(&s.fs, &s.model, &format!("{what}: next checkpoint"));
    s.fs.trim(0, IMAGE, BLOCK_SIZE as u64).unwrap();
    reopen(
        s.mem.snapshot(),
        false,
        &s.model,
        &format!("{what}: next checkpoint, trim and crash"),
    );
    s.fs.shutdown().unwrap();
    reopen(
        s.mem.snapshot(),
        true,
        &s.model,
        &format!("{what}: clean reopen"),
    );
}

#[test]
fn a_failed_checkpoint_leaves_every_file_and_the_next_one_whole() {
    let cases = [
        (MediumKind::Pmem, FaultOp::Read, false),
        (MediumKind::Pmem, FaultOp::Write, false),
        (MediumKind::Pmem, FaultOp::Write, true),
        (MediumKind::Pmem, FaultOp::Fence, false),
        (MediumKind::BlockFile, FaultOp::Write, true),
        (MediumKind::BlockFile, FaultOp::Fence, false),
    ];
    for (kind, op, landed) in cases {
        let total = ops_of_checkpoint(kind, op);
        let mut failed = 0;
        // Every operation of the first 64 (the cut, the manifest, the switch), then a sample
        // (a block file's step 3: releases waiting for the sync).
        let stride = (total / 32).max(1);
        for nth in (1..=total).filter(|n| *n <= 64 || n.is_multiple_of(stride)) {
            let what = format!("{kind:?}: {op:?} {nth} of {total} failing, landed {landed}");
            let s = setup(kind);
            let rule = FaultRule::new(op).nth(nth).once();
            let rule = s.faulty.add_rule(if landed {
                rule.short_write(usize::MAX)
            } else {
                rule
            });
            let seq = || superblock::probe_medium(&*s.mem).unwrap().0.seq;
            let before = seq();
            let r = s.fs.checkpoint(false);
            // It reports failure exactly when the previous checkpoint stays in force.
            assert_eq!(seq() == before, r.is_err(), "{what}: {r:?}");
            let fired = s.faulty.rule(rule).unwrap().fired() > 0;
            s.faulty.clear_rules();
            assert!(fired, "{what}: the checkpoint took fewer");
            failed += u64::from(r.is_err());
            after(s, r.is_err(), &what);
        }
        assert!(
            failed > 0,
            "{kind:?}: no {op:?} failure failed the checkpoint"
        );
    }
}

/// A superblock switch whose new copy lands though its write fails, and whose putting back of
/// the current copy fails too: the medium names the new checkpoint, whose blocks went back to
/// the reserve. Nothing may reuse them: every later change and checkpoint fails, and a crash
/// recovers every file (checkpoints that ran on and failed would have overwritten them).
#[test]
fn a_switch_that_cannot_be_undone_stops_every_change() {
    let s = setup(MediumKind::Pmem);
    let (sb, slot, area) = superblock::probe_medium(&*s.mem).unwrap();
    let at = (area + 1 - slot as u64) * BLOCK_SIZE as u64;
    // The new copy lands and fails; putting the current one back fails (the first rule takes
    // the first write, so the second sees only the next).
    s.faulty.add_rule(
        FaultRule::new(FaultOp::Write)
            .range(at, BLOCK_SIZE as u64)
            .nth(1)
            .short_write(usize::MAX)
            .once(),
    );
    s.faulty.add_rule(
        FaultRule::new(FaultOp::Write)
            .range(at, BLOCK_SIZE as u64)
            .nth(1)
            .once(),
    );
    assert!(s.fs.checkpoint(false).is_err());
    assert_eq!(s.faulty.injected(), 2);
    s.faulty.clear_rules();
    assert_eq!(
        superblock::probe_medium(&*s.mem).unwrap().0.seq,
        sb.seq + 1,
        "the new copy is on the medium"
    );
    let ino = s.fs.lookup(ROOT_INO, b"f1").unwrap().0;
    let e = s.fs.write(ino, 0, &block(5)).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(s.fs.unlink(ROOT_INO, b"f3").is_err());
    // Checkpoints failing at the fence before their switch would take the reserve in turn
    // and write over the named checkpoint's blocks (without the stop, the crash image below
    // has lost its manifest).
    for _ in 0..60 {
        s.faulty
            .add_rule(FaultRule::new(FaultOp::Fence).nth(1).once());
        assert!(s.fs.checkpoint(false).is_err());
        s.faulty.clear_rules();
    }
    reopen(s.mem.snapshot(), false, &s.model, "crash after the switch");
    assert!(s.fs.shutdown().is_err());
    reopen(
        s.mem.snapshot(),
        false,
        &s.model,
        "after the unmount that failed",
    );
}

/// A clean unmount of a block-file image whose final checkpoint's step 3 has both kinds of
/// releases: those that waited for the switch (a file deleted since the last sync) and an
/// unlinked file still open (its blocks go with the final checkpoint). Each write of the
/// unmount failing once in turn: when the unmount reports success, the clean image holds
/// every file and no block that nothing holds (every part of step 3 ran, though one failed).
#[test]
fn a_clean_unmount_whose_release_fails_once_gives_everything_back() {
    let build = || {
        let mem = Arc::new(MemMedium::new(IMAGE));
        let faulty = Arc::new(FaultMedium::new(mem.clone(), 1));
        let fs = FileSystem::format(
            faulty.clone(),
            MediumKind::BlockFile,
            &FormatOptions::default(),
            &opts(),
            Default::default(),
        )
        .unwrap();
        let mut model = Model::new();
        for i in 0..8 {
            put(&fs, &mut model, &format!("f{i}"), 3, 1000 + i * 10);
        }
        fs.sync().unwrap();
        // Unlinked while open: released by the final checkpoint.
        let open = fs.lookup(ROOT_INO, b"f0").unwrap().0;
        fs.open_handle(open).unwrap();
        fs.unlink(ROOT_INO, b"f0").unwrap();
        model.remove("f0");
        // Deleted since the last sync: released after the final checkpoint's switch.
        fs.unlink(ROOT_INO, b"f1").unwrap();
        model.remove("f1");
        (mem, faulty, fs, model)
    };
    let writes = {
        let (_, faulty, fs, _) = build();
        let rule = faulty.add_rule(FaultRule::new(FaultOp::Write).probability(0.0));
        fs.shutdown().unwrap();
        faulty.rule(rule).unwrap().seen()
    };
    let mut clean = 0;
    for nth in 1..=writes {
        let what = format!("write {nth} of {writes} of the unmount failing");
        let (mem, faulty, fs, model) = build();
        faulty.add_rule(FaultRule::new(FaultOp::Write).nth(nth).once());
        let r = fs.shutdown();
        faulty.clear_rules();
        drop(fs);
        let img = mem.snapshot();
        if r.is_ok() {
            clean += 1;
        }
        reopen(img, r.is_ok(), &model, &what);
    }
    assert!(clean > 0, "no unmount got past its failed write");
}
