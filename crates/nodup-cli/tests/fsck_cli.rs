//! `nodup fsck --repair` changes an image only when something needs repairing: a consistent,
//! cleanly unmounted image is left byte for byte as it was (a read-write open alone would
//! rewrite its superblocks, saved state and checkpoint), while one that was not unmounted
//! cleanly is recovered and then checks consistent.

mod common;
use common::*;

use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::{Caller, FileSystem, FsOptions};
use std::path::Path;

/// A 32 MiB image at `img` holding a file of two identical blocks and one other, written
/// through the library; shut down cleanly unless `crash`.
fn populated(img: &Path, crash: bool) {
    ok(nodup(&[
        "mkfs",
        img.to_str().unwrap(),
        "--size",
        "32M",
        "--force",
    ]));
    let (medium, _) = nodup_fs::image::open_with(img, false).unwrap();
    let fs = FileSystem::open(medium, &FsOptions::default()).unwrap();
    let (f, _) = fs
        .mknod(ROOT_INO, b"f", Kind::File, 0o644, 0, b"", Caller::default())
        .unwrap();
    let mut data = vec![5u8; 8192];
    data.extend(std::iter::repeat_n(9u8, 4096));
    fs.write(f, 0, &data).unwrap();
    if crash {
        // Nothing more reaches the image (a drop would write its clean state).
        std::mem::forget(fs);
    } else {
        fs.shutdown().unwrap();
    }
}

#[test]
fn repair_leaves_a_consistent_image_untouched() {
    let img = std::env::temp_dir().join(format!("nodup-fsck-cli-{}.img", std::process::id()));
    let path = img.to_str().unwrap();
    populated(&img, false);
    let before = std::fs::read(&img).unwrap();
    let out = ok(nodup(&["fsck", "--repair", path]));
    assert!(out.contains("consistent"), "{out}");
    assert!(
        std::fs::read(&img).unwrap() == before,
        "fsck --repair changed a consistent image"
    );

    populated(&img, true);
    let before = std::fs::read(&img).unwrap();
    let out = ok(nodup(&["fsck", "--repair", path]));
    assert!(out.contains("repaired: failure recovery"), "{out}");
    assert!(
        std::fs::read(&img).unwrap() != before,
        "nothing was repaired"
    );
    let out = ok(nodup(&["fsck", path]));
    assert!(out.ends_with("consistent\n"), "{out}");
    std::fs::remove_file(&img).unwrap();
}
