//! A log record whose checksum and sequence number are valid but which asks for something the
//! tree cannot hold (here a directory moved below itself, which would cut it off from the
//! root) makes the open fail as corrupt, naming what it asked for and the way out, and leaves
//! the image as it was. fsck reports it without writing, and with --repair ends the log
//! before it. The same image without the forgery recovers normally.

mod common;

use nodup_core::media::MemMedium;
use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::log::record::{find_frames, Record};
use nodup_fs::{fsck, Caller, FileSystem, FsError, FsOptions, MediumKind};
use std::sync::Arc;

/// `img` with its only frame of the kind `is_kind` picks rewritten by `change`, framed again
/// with a valid checksum and its own sequence number (returned with it).
fn reframe(
    img: &[u8],
    is_kind: impl Fn(&Record) -> bool,
    change: impl FnOnce(&mut Record),
) -> (Vec<u8>, u64) {
    let mut found: Vec<_> = find_frames(img)
        .into_iter()
        .filter(|(_, _, r)| is_kind(r))
        .collect();
    assert_eq!(found.len(), 1, "frames of the kind in the image");
    let (off, seq, mut rec) = found.pop().unwrap();
    change(&mut rec);
    let forged = rec.frame(seq);
    let mut bad = img.to_vec();
    assert_eq!(Record::declared_len(&bad[off..]), Some(forged.len()));
    bad[off..off + forged.len()].copy_from_slice(&forged);
    (bad, seq)
}

/// A new 16 MiB pmem file system in memory.
fn fresh() -> (Arc<MemMedium>, FileSystem) {
    let medium = Arc::new(MemMedium::new(16 << 20));
    let fs = common::format(medium.clone(), MediumKind::Pmem);
    (medium, fs)
}

#[test]
fn a_forged_record_that_would_break_the_tree_is_refused() {
    let (medium, fs) = fresh();
    let mkdir = |parent, name: &[u8]| {
        fs.mknod(parent, name, Kind::Dir, 0o755, 0, b"", Caller::default())
            .unwrap()
            .0
    };
    let d = mkdir(ROOT_INO, b"d");
    let e = mkdir(d, b"e");
    fs.rename(ROOT_INO, b"d", ROOT_INO, b"z", 0).unwrap();
    // A crash: the log after the format's checkpoint holds the two creations and the rename.
    let img = medium.snapshot();
    drop(fs);

    let good = Arc::new(MemMedium::from_bytes(img.clone()));
    let fs = FileSystem::open(good, &FsOptions::default()).unwrap();
    let z = fs.lookup(ROOT_INO, b"z").unwrap().0;
    assert_eq!(fs.lookup(z, b"e").unwrap().0, e);
    assert!(fsck::check(&fs, false).unwrap().consistent());
    drop(fs);

    // The same rename, moving /d into /d/e instead, framed with a valid checksum.
    let (bad, _) = reframe(
        &img,
        |r| matches!(r, Record::Rename { .. }),
        |r| {
            if let Record::Rename { newparent, .. } = r {
                *newparent = e;
            }
        },
    );
    let bad = Arc::new(MemMedium::from_bytes(bad));
    let before = bad.snapshot();
    let err = FileSystem::open(bad.clone(), &FsOptions::default())
        .err()
        .unwrap();
    assert!(
        matches!(&err, FsError::Corrupt(m) if m.contains("below itself") && m.contains("fsck --repair")),
        "{err}"
    );
    assert!(
        bad.snapshot() == before,
        "a refused open wrote to the image"
    );

    // fsck's opens: read-only, the log is read up to the record, which fsck reports, and
    // nothing is written; read-write, the log ends before it, and the rename is gone.
    let fsck_opts = |read_only| FsOptions {
        read_only,
        fsck: true,
        ..FsOptions::default()
    };
    let fs = FileSystem::open(bad.clone(), &fsck_opts(true)).unwrap();
    let rep = fsck::check(&fs, false).unwrap();
    assert!(
        rep.problems
            .iter()
            .any(|p| p.contains("log record 3 refers to a directory moved below itself")),
        "{:?}",
        rep.problems
    );
    drop(fs);
    assert!(
        bad.snapshot() == before,
        "a read-only fsck open wrote to the image"
    );
    let fs = FileSystem::open(bad.clone(), &fsck_opts(false)).unwrap();
    let rep = fsck::check(&fs, true).unwrap();
    assert!(rep.consistent(), "{:?}", rep.problems);
    assert!(
        rep.repaired
            .iter()
            .any(|r| r.contains("the log now ends before it")),
        "{:?}",
        rep.repaired
    );
    fs.shutdown().unwrap();
    drop(fs);
    let fs = FileSystem::open(bad, &FsOptions::default()).unwrap();
    assert!(fs.lookup(ROOT_INO, b"z").is_err());
    assert_eq!(fs.lookup(d, b"e").unwrap().0, e);
    assert_eq!(fs.lookup(ROOT_INO, b"d").unwrap().0, d);
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

/// Library calls whose record the checks would refuse are errors before anything is logged:
/// a target on a non-symlink, and a rename into a directory removed while open. The file
/// system goes on, and a crash right after replays cleanly.
#[test]
fn calls_the_checks_would_refuse_fail_before_the_log() {
    let (medium, fs) = fresh();
    let who = Caller::default();
    let err = fs
        .mknod(ROOT_INO, b"f", Kind::File, 0o644, 0, b"target", who)
        .unwrap_err();
    assert!(matches!(err, FsError::Errno(libc::EINVAL)), "{err}");
    fs.mknod(ROOT_INO, b"f", Kind::File, 0o644, 0, b"", who)
        .unwrap();
    let (r, _) = fs
        .mknod(ROOT_INO, b"r", Kind::Dir, 0o755, 0, b"", who)
        .unwrap();
    fs.open_handle(r).unwrap();
    fs.rmdir(ROOT_INO, b"r").unwrap();
    let err = fs.rename(ROOT_INO, b"f", r, b"g", 0).unwrap_err();
    assert!(matches!(err, FsError::Errno(libc::ENOENT)), "{err}");
    let img = medium.snapshot();
    drop(fs);
    let fs = FileSystem::open(Arc::new(MemMedium::from_bytes(img)), &FsOptions::default()).unwrap();
    assert!(fs.lookup(ROOT_INO, b"f").is_ok());
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

/// A replayed write of file block 0 forged to map the block `target` picks: failure recovery
/// refuses it, so the open fails naming the block and the way out, and fsck --repair (whose
/// open leaves the reference to its table check) unmaps it, after which the image mounts.
fn replayed_block_repaired_by_fsck(target: impl Fn(&FileSystem) -> u64) {
    let (medium, fs) = fresh();
    let f = fs
        .mknod(
            ROOT_INO,
            b"f",
            Kind::File,
            0o644,
            0,
            b"",
            Default::default(),
        )
        .unwrap()
        .0;
    // 300 distinct blocks in one write (one record): more dedup entries than the fixed
    // region holds, so the region layout has taken blocks of the data area too.
    let data: Vec<u8> = (0..300 * 4096u32)
        .map(|i| (i / 4096 + i % 7) as u8)
        .collect();
    fs.write(f, 0, &data).unwrap();
    let block = target(&fs);
    let img = medium.snapshot();
    drop(fs);
    let (bad, _) = reframe(
        &img,
        |r| matches!(r, Record::Write { .. }),
        |r| {
            if let Record::Write { blocks, .. } = r {
                blocks[0] = block;
            }
        },
    );

    let m = Arc::new(MemMedium::from_bytes(bad.clone()));
    let err = FileSystem::open(m, &FsOptions::default()).err().unwrap();
    assert!(
        matches!(&err, FsError::Corrupt(msg) if msg.contains(&format!("block {block}")) && msg.contains("fsck --repair")),
        "{err}"
    );
    let m = Arc::new(MemMedium::from_bytes(bad));
    let opts = FsOptions {
        fsck: true,
        ..FsOptions::default()
    };
    let fs = FileSystem::open(m.clone(), &opts).unwrap();
    let rep = fsck::check(&fs, true).unwrap();
    assert!(
        rep.repaired
            .iter()
            .any(|r| r.contains("unmapped invalid block 0")),
        "{:?}",
        rep.repaired
    );
    assert!(rep.consistent(), "{:?}", rep.problems);
    fs.shutdown().unwrap();
    drop(fs);
    let fs = FileSystem::open(
        Arc::new(MemMedium::from_bytes(m.snapshot())),
        &FsOptions::default(),
    )
    .unwrap();
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

/// Block 1 holds the file system's superblocks, outside the engine's data area: the record
/// checks know no geometry and pass it.
#[test]
fn a_replayed_block_outside_the_data_area_is_repaired_by_fsck() {
    replayed_block_repaired_by_fsck(|_| 1);
}

/// A block of the engine's metadata layout (the region holding the dedup entries) is inside
/// the data area; unlinking the file would free it under the engine.
#[test]
fn a_replayed_block_of_the_engine_metadata_is_repaired_by_fsck() {
    replayed_block_repaired_by_fsck(|fs| {
        *fs.engine()
            .layout_blocks()
            .first()
            .expect("the light policy's region layout holds a block")
    });
}
