//! What an operator meets when an image's log holds a record the file system refuses (here a
//! forged frame with a valid checksum that moves a directory below itself): `nodup stats` and
//! the mount fail with one line naming the record and the way out, `nodup fsck` reports it and
//! writes nothing, `nodup fsck --repair` ends the log before it, and the image mounts again.

mod common;
use common::*;

use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::log::record::{find_frames, Record};
use nodup_fs::{Caller, FileSystem, FsOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Offset and sequence number of the only rename frame in `img`, and its record.
fn find_rename(img: &[u8]) -> (usize, u64, Record) {
    let mut found: Vec<_> = find_frames(img)
        .into_iter()
        .filter(|(_, _, r)| matches!(r, Record::Rename { .. }))
        .collect();
    assert_eq!(found.len(), 1, "rename frames in the image");
    found.pop().unwrap()
}

/// Through the library: /d, /d/e, then /d renamed /z, and a crash (no shutdown, so the three
/// records stay in the log). Returns the inode of /d/e.
fn crashed_image(img: &Path) -> u64 {
    let (medium, _) = nodup_fs::image::open_with(img, false).unwrap();
    let fs = FileSystem::open(medium, &FsOptions::default()).unwrap();
    let mkdir = |parent, name: &[u8]| {
        fs.mknod(parent, name, Kind::Dir, 0o755, 0, b"", Caller::default())
            .unwrap()
            .0
    };
    let d = mkdir(ROOT_INO, b"d");
    let e = mkdir(d, b"e");
    fs.rename(ROOT_INO, b"d", ROOT_INO, b"z", 0).unwrap();
    // A crash: nothing more reaches the image (a drop would write its clean state).
    std::mem::forget(fs);
    e
}

#[test]
fn a_refused_log_record_is_reported_by_fsck_and_dropped_by_repair() {
    let img = std::path::PathBuf::from(format!("/dev/shm/nodup-forged-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&img);
    let _cleanup = RemoveOnDrop(img.clone());
    let p = img.to_str().unwrap();
    ok(nodup(&["mkfs", p, "--size", "16M"]));
    let e = crashed_image(&img);

    // The rename, moving /d into /d/e instead, framed with a valid checksum.
    let bytes = std::fs::read(&img).unwrap();
    let (off, seq, mut rec) = find_rename(&bytes);
    if let Record::Rename { newparent, .. } = &mut rec {
        *newparent = e;
    }
    let forged = rec.frame(seq);
    let file = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    file.write_at(&forged, off as u64).unwrap();
    drop(file);
    let before = std::fs::read(&img).unwrap();

    let o = nodup(&["stats", p]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("log record 3 refers to a directory moved below itself")
            && err.contains("nodup fsck --repair"),
        "{err}"
    );
    let o = nodup(&["fsck", p]);
    assert!(!o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("problem: log record 3 refers to a directory moved below itself"),
        "{out}"
    );
    assert!(
        std::fs::read(&img).unwrap() == before,
        "fsck wrote to the image"
    );

    let out = ok(nodup(&["fsck", "--repair", p]));
    assert!(
        out.contains("repaired: log record 3 refers") && out.contains("the log now ends before it"),
        "{out}"
    );
    let out = ok(nodup(&["fsck", p]));
    assert!(out.contains("consistent"), "{out}");
    let stats = json(&nodup(&["stats", p, "--json"]));
    assert!(stats.is_object());
}

/// Removes the image when the test ends, passed or not.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
