//! Helpers shared by the file-system integration tests (each test file uses some of them).
#![allow(dead_code)]

use nodup_core::media::Medium;
use nodup_core::{FormatOptions, BLOCK_SIZE};
use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::{Caller, FileSystem, FsOptions, MediumKind};
use std::sync::Arc;

/// A pseudo-random 4 KiB block, a function of `seed` (xorshift64).
pub fn block(seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK_SIZE];
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
    v
}

/// Create an empty regular file `name` in the root directory; its inode.
pub fn create(fs: &FileSystem, name: &str) -> u64 {
    fs.mknod(
        ROOT_INO,
        name.as_bytes(),
        Kind::File,
        0o644,
        0,
        b"",
        Caller::default(),
    )
    .unwrap()
    .0
}

/// A new file system on `m` as `kind`, every option at its default.
pub fn format(m: Arc<dyn Medium>, kind: MediumKind) -> FileSystem {
    FileSystem::format(
        m,
        kind,
        &FormatOptions::default(),
        &FsOptions::default(),
        Caller::default(),
    )
    .unwrap()
}
