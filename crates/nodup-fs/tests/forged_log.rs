//! A log record whose checksum and sequence number are valid but which asks for something the
//! tree cannot hold (here a directory moved below itself, which would cut it off from the
//! root) makes the open fail as corrupt, naming what it asked for, and leaves the image as it
//! was. The same image without the forgery recovers normally.

use nodup_core::media::MemMedium;
use nodup_core::FormatOptions;
use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::log::record::{Record, FRAME_HEADER};
use nodup_fs::{fsck, Caller, FileSystem, FsError, FsOptions, MediumKind};
use std::sync::Arc;

/// Offset and sequence number of the only rename frame in `img`, and its record.
fn find_rename(img: &[u8]) -> (usize, u64, Record) {
    let mut found = Vec::new();
    for off in 0..img.len() - FRAME_HEADER {
        let buf = &img[off..];
        if Record::declared_len(buf).is_none() {
            continue;
        }
        let seq = u64::from_le_bytes(buf[8..16].try_into().unwrap());
        if let Some((rec @ Record::Rename { .. }, _)) = Record::parse(buf, seq) {
            found.push((off, seq, rec));
        }
    }
    assert_eq!(found.len(), 1, "rename frames in the image");
    found.pop().unwrap()
}

#[test]
fn a_forged_record_that_would_break_the_tree_is_refused() {
    let medium = Arc::new(MemMedium::new(16 << 20));
    let fs = FileSystem::format(
        medium.clone(),
        MediumKind::Pmem,
        &FormatOptions::default(),
        &FsOptions::default(),
        Caller::default(),
    )
    .unwrap();
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
    let (off, seq, rec) = find_rename(&img);
    let Record::Rename {
        parent,
        name,
        newname,
        now,
        ..
    } = rec
    else {
        unreachable!()
    };
    let forged = Record::Rename {
        parent,
        name,
        newparent: e,
        newname,
        now,
    }
    .frame(seq);
    let mut bad = img.clone();
    assert_eq!(Record::declared_len(&bad[off..]), Some(forged.len()));
    bad[off..off + forged.len()].copy_from_slice(&forged);
    let bad = Arc::new(MemMedium::from_bytes(bad));
    let before = bad.snapshot();
    let err = FileSystem::open(bad.clone(), &FsOptions::default())
        .err()
        .unwrap();
    assert!(
        matches!(&err, FsError::Corrupt(m) if m.contains("below itself")),
        "{err}"
    );
    assert!(
        bad.snapshot() == before,
        "a refused open wrote to the image"
    );
}
