//! Helpers shared by the integration tests.
#![allow(dead_code)]

use nodup_freewrite::lsm::LsmOptions;
use nodup_freewrite::Caps;

/// A scratch directory on tmpfs when there is one (fsync is then cheap).
pub fn scratch() -> tempfile::TempDir {
    if std::path::Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").expect("tempdir in /dev/shm")
    } else {
        tempfile::tempdir().expect("tempdir")
    }
}

/// Caps on small blocks so that a few kilobytes of records already form islands.
pub fn small_caps() -> Caps {
    Caps {
        block: 256,
        bubble_cap: 0.5,
        global_cap: 0.2,
        min_bubble: 12,
    }
}

/// An LSM configuration with tiny tables, so that a few hundred writes flush and compact
/// through several levels.
pub fn tiny_lsm(freewrite: Option<Caps>, sync: bool) -> LsmOptions {
    LsmOptions {
        freewrite,
        sync,
        memtable_bytes: 3000,
        table_bytes: 2000,
        l0_trigger: 2,
        l1_bytes: 4000,
        fanout: 3,
    }
}

/// Test key `i` (8 bytes, like the paper's keys).
pub fn key(i: u32) -> Vec<u8> {
    (u64::from(i) * 7919 + 13).to_be_bytes().to_vec()
}

/// A value of `len` bytes that differs per `seed`.
pub fn value(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(97)) as u8
        })
        .collect()
}
