//! Policy `selective` on the file system, without FUSE: hot content written over and over among
//! unique data is deduplicated with a fingerprint cache far smaller than the data; the caches
//! stay within their sizes and report through the stats; a clean remount and a crash recovery
//! keep every file's bytes and a consistent image.

mod common;
use common::{block, create};

use nodup_core::media::MemMedium;
use nodup_core::policy::selective::SelectiveOptions;
use nodup_core::policy::{PolicyKind, PolicyOptions};
use nodup_core::{FormatOptions, OpenOptions, BLOCK_SIZE};
use nodup_fs::inode::ROOT_INO;
use nodup_fs::{fsck, Caller, FileSystem, FsOptions, MediumKind};
use std::sync::Arc;

fn opts(sel: SelectiveOptions) -> FsOptions {
    FsOptions {
        open: OpenOptions {
            policy: PolicyOptions {
                selective: sel,
                ..PolicyOptions::default()
            },
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The seeds of file `f`: every other block is one of 8 hot contents, the rest unique.
fn seeds(f: u64, n: u64) -> Vec<u64> {
    (0..n)
        .map(|i| {
            if i % 2 == 0 {
                i / 2 % 8
            } else {
                1_000_000 + f * n + i
            }
        })
        .collect()
}

fn write_file(fs: &FileSystem, name: &str, s: &[u64]) -> u64 {
    let ino = create(fs, name);
    for (k, chunk) in s.chunks(16).enumerate() {
        let buf: Vec<u8> = chunk.iter().flat_map(|&x| block(x)).collect();
        fs.write(ino, (k * 16 * BLOCK_SIZE) as u64, &buf).unwrap();
    }
    ino
}

fn check_file(fs: &FileSystem, ino: u64, s: &[u64]) {
    let data = fs.read(ino, 0, s.len() * BLOCK_SIZE).expect("read back");
    for (i, &x) in s.iter().enumerate() {
        assert!(
            data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE] == block(x)[..],
            "inode {ino} block {i}"
        );
    }
}

#[test]
fn hot_content_is_deduplicated_within_small_caches_and_survives_remounts() {
    let m = Arc::new(MemMedium::new(64 << 20));
    let sel = SelectiveOptions {
        fp_cache_bytes: 16 << 10,
        prefetch_bytes: 64 << 10,
        refresh_ms: None,
        refresh_ops: Some(1000),
    };
    let o = opts(sel);
    let fo = FormatOptions {
        policy: PolicyKind::Selective,
        ..Default::default()
    };
    let fs = FileSystem::format(m.clone(), MediumKind::Pmem, &fo, &o, Caller::default()).unwrap();
    assert_eq!(fs.engine().fingerprint_kind().name(), "ecc");
    const N: u64 = 1024;
    let files: Vec<(u64, Vec<u64>)> = (0..4)
        .map(|f| {
            let s = seeds(f, N);
            (write_file(&fs, &format!("f{f}"), &s), s)
        })
        .collect();
    // 8 hot contents + 512 unique per file: the cache (a few hundred fingerprints) keeps the hot
    // ones although thousands of unique fingerprints stream through it.
    let physical = fs.engine().stats().physical_bytes / BLOCK_SIZE as u64;
    assert!(physical <= 8 + 4 * N / 2 + 8, "{physical} blocks stored");
    let st = fs.stats_json();
    let sel_st = &st["selective"];
    let fpc = &sel_st["fp_cache"];
    assert!(fpc["memory_bytes"].as_u64().unwrap() <= 16 << 10, "{fpc}");
    assert!(fpc["evictions"].as_u64().unwrap() > 0, "{fpc}");
    assert!(fpc["refreshes"].as_u64().unwrap() > 0, "{fpc}");
    let pf = &sel_st["prefetch"];
    assert!(
        pf["hits"].as_u64().unwrap() > pf["verify_reads"].as_u64().unwrap(),
        "{pf}"
    );
    assert!(pf["memory_bytes"].as_u64().unwrap() <= 64 << 10, "{pf}");
    for (ino, s) in &files {
        check_file(&fs, *ino, s);
    }
    // Free one file: its unique blocks go, the hot ones stay for the others.
    fs.unlink(ROOT_INO, b"f0").unwrap();
    assert!(fsck::check(&fs, false).unwrap().consistent());
    fs.shutdown().unwrap();
    drop(fs);
    let fs = FileSystem::open(m.clone(), &o).unwrap();
    assert_eq!(fs.recovery().kind, "clean");
    for (ino, s) in &files[1..] {
        check_file(&fs, *ino, s);
    }
    // More copies of the hot content after the remount still deduplicate.
    let before = fs.engine().stats().physical_bytes;
    let s = seeds(9, 64);
    let ino = write_file(&fs, "g", &s);
    let added = (fs.engine().stats().physical_bytes - before) / BLOCK_SIZE as u64;
    assert!(added <= 32 + 8, "{added} blocks added");
    check_file(&fs, ino, &s);
    // A crash (no shutdown) recovers to the same files.
    drop(fs);
    let m2 = Arc::new(MemMedium::from_bytes(m.snapshot()));
    let fs = FileSystem::open(m2, &o).unwrap();
    for (ino, s) in &files[1..] {
        check_file(&fs, *ino, s);
    }
    check_file(&fs, ino, &s);
    assert!(fsck::check(&fs, false).unwrap().consistent());
}
