//! A block-file image opened on a disk's file system keeps its cached pages when its last
//! close was clean (a remount stays warm), and drops them otherwise, so a recovery reads what
//! reached the disk (`media/write_back.rs`). Skipped where /var/tmp is a tmpfs, whose pages
//! are the only copy.

mod common;

use common::{block, create};
use nodup_core::media::{file_system_type, fs_magic};
use nodup_fs::{image, FileSystem, FsOptions, MediumKind};
use std::os::fd::AsRawFd;
use std::path::Path;

/// The share of `path`'s pages in the page cache (mincore over a mapping that touches none).
fn resident_share(path: &Path) -> f64 {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let pages = len.div_ceil(4096);
    let mut v = vec![0u8; pages];
    // SAFETY: a fresh read-only shared mapping of `len` bytes of `f`, only passed to mincore
    // (which fills `v`, one byte per page) and unmapped; nothing reads through it.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(libc::mincore(p, len, v.as_mut_ptr()), 0);
        libc::munmap(p, len);
    }
    v.iter().filter(|&&b| b & 1 != 0).count() as f64 / pages as f64
}

/// Read the whole file, so that all of it is cached.
fn warm(path: &Path) {
    std::fs::read(path).unwrap();
    assert!(
        resident_share(path) > 0.99,
        "the read did not cache the file"
    );
}

#[test]
fn an_open_keeps_the_cache_of_a_cleanly_closed_image_only() {
    let Ok(dir) = tempfile::tempdir_in("/var/tmp") else {
        eprintln!("skipping: no /var/tmp");
        return;
    };
    let tmpfs = std::fs::File::open(dir.path())
        .ok()
        .and_then(|d| file_system_type(&d))
        == Some(fs_magic::TMPFS);
    if tmpfs {
        eprintln!("skipping: /var/tmp is a tmpfs");
        return;
    }
    let path = dir.path().join("img");
    let m = image::create(&path, 64 << 20, MediumKind::BlockFile).unwrap();
    let fs = common::format(m, MediumKind::BlockFile);
    let ino = create(&fs, "f");
    fs.write(ino, 0, &block(1)).unwrap();
    fs.shutdown().unwrap();
    drop(fs);

    // Clean: both opens keep what is cached.
    for read_only in [false, true] {
        warm(&path);
        let (m, _) = image::open_with(&path, read_only).unwrap();
        let share = resident_share(&path);
        assert!(
            share > 0.99,
            "read-only {read_only}: a clean image's cache went ({share})"
        );
        drop(m);
    }

    // A run that ends without its shutdown leaves the image unclean: the next open drops the
    // cache (read-only or not), and the recovery's reads bring back only what they touch.
    let (m, _) = image::open(&path).unwrap();
    let fs = FileSystem::open(m, &FsOptions::default()).unwrap();
    drop(fs);
    for read_only in [true, false] {
        warm(&path);
        let (m, _) = image::open_with(&path, read_only).unwrap();
        let share = resident_share(&path);
        assert!(
            share < 0.5,
            "read-only {read_only}: an unclean image's cache stayed ({share})"
        );
        drop(m);
    }
    let (m, _) = image::open(&path).unwrap();
    let fs = FileSystem::open(m, &FsOptions::default()).unwrap();
    assert_eq!(fs.recovery().kind, "failure");
    assert!(fs.read(ino, 0, 4096).unwrap() == block(1));
    fs.shutdown().unwrap();
}
