//! A checkpoint writes its segments to the medium while it encodes them (its memory does not
//! grow with what changed): one spanning many segments reopens intact, and a write failing in
//! the middle of a cut leaves the previous checkpoint in force, the next one whole, and nothing
//! lost after a crash or a clean reopen.

mod common;
use common::{block, create};

use nodup_core::media::{FaultMedium, FaultOp, FaultRule, MemMedium};
use nodup_core::BLOCK_SIZE;
use nodup_fs::{fsck, FileSystem, FsOptions, MediumKind};
use std::sync::Arc;

/// 64 MiB: segments of 64 KiB (1/1024 of the image).
const IMAGE: u64 = 64 << 20;
const FILES: u64 = 1500;
/// Each file has a block here too, so it has a map unit beside its head.
const FAR: u64 = 3000;

fn check_all(fs: &FileSystem, inos: &[u64], round: u64) {
    for (i, &ino) in inos.iter().enumerate() {
        let i = i as u64;
        let near = fs.read(ino, 0, BLOCK_SIZE).unwrap();
        assert!(near == block(i * 10 + round), "file {i} block 0");
        let far = fs.read(ino, FAR * BLOCK_SIZE as u64, BLOCK_SIZE).unwrap();
        assert!(far == block(i * 10 + 5), "file {i} far block");
    }
}

fn rewrite_all(fs: &FileSystem, inos: &[u64], round: u64) {
    for (i, &ino) in inos.iter().enumerate() {
        fs.write(ino, 0, &block(i as u64 * 10 + round)).unwrap();
    }
}

fn ckpt(fs: &FileSystem) -> serde_json::Value {
    fs.stats_json()["checkpoints"].clone()
}

#[test]
fn a_cut_failing_halfway_leaves_the_previous_checkpoint_and_loses_nothing() {
    let mem = Arc::new(MemMedium::new(IMAGE));
    let faulty = Arc::new(FaultMedium::new(mem.clone(), 7));
    let fs = common::format(faulty.clone(), MediumKind::Pmem);
    let inos: Vec<u64> = (0..FILES)
        .map(|i| {
            let ino = create(&fs, &format!("f{i}"));
            fs.write(ino, FAR * BLOCK_SIZE as u64, &block(i * 10 + 5))
                .unwrap();
            ino
        })
        .collect();
    rewrite_all(&fs, &inos, 0);
    fs.checkpoint(false).unwrap();
    let first = ckpt(&fs);
    assert!(
        first["last_bytes"].as_u64().unwrap() > 2 * (64 << 10),
        "the checkpoint should span several segments: {first}"
    );

    // Everything changes again; the fifth write of the next cut fails (a few segment blocks
    // in: its chains are started and partly written).
    rewrite_all(&fs, &inos, 1);
    let rule = faulty.add_rule(FaultRule::new(FaultOp::Write).nth(5));
    assert!(fs.checkpoint(false).is_err());
    assert_eq!(faulty.rule(rule).unwrap().fired(), 1);
    assert_eq!(ckpt(&fs)["failed"].as_u64(), Some(1));
    faulty.clear_rules();
    check_all(&fs, &inos, 1);
    let rep = fsck::check(&fs, false).unwrap();
    assert!(rep.consistent(), "after the failed cut: {:?}", rep.problems);

    // A crash now recovers from the previous checkpoint and the log.
    let crashed = Arc::new(MemMedium::from_bytes(mem.snapshot()));
    {
        let fs2 = FileSystem::open(crashed, &FsOptions::default()).unwrap();
        assert_eq!(fs2.recovery().kind, "failure");
        check_all(&fs2, &inos, 1);
        let rep = fsck::check(&fs2, false).unwrap();
        assert!(
            rep.consistent(),
            "crash after the failed cut: {:?}",
            rep.problems
        );
    }

    // The next checkpoint writes everything the failed one did not.
    fs.checkpoint(false).unwrap();
    let after = ckpt(&fs);
    assert!(
        after["last_bytes"].as_u64().unwrap() > 2 * (64 << 10),
        "{after}"
    );
    rewrite_all(&fs, &inos, 2);
    fs.shutdown().unwrap();
    drop(fs);
    let fs = FileSystem::open(
        Arc::new(MemMedium::from_bytes(mem.snapshot())),
        &FsOptions::default(),
    )
    .unwrap();
    assert_eq!(fs.recovery().kind, "clean");
    check_all(&fs, &inos, 2);
    let rep = fsck::check(&fs, false).unwrap();
    assert!(rep.consistent(), "clean reopen: {:?}", rep.problems);
}
