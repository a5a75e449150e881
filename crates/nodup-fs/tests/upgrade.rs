//! A version-1 image (full-snapshot checkpoints, made by nodup at 359f281) opens read-only as
//! it is, and its first read-write open converts it to the current format with every file,
//! link, symlink and xattr intact. Its engine superblock is version 1 too, converted to
//! version 2 by the same open.

use nodup_core::engine::superblock::{self as engine_sb, PolicyParams};
use nodup_core::media::MemMedium;
use nodup_fs::inode::ROOT_INO;
use nodup_fs::superblock::{probe_medium, FS_VERSION};
use nodup_fs::{fsck, FileSystem, FsOptions};
use std::sync::Arc;

fn v1_image() -> Vec<u8> {
    let gz = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/v1-light-4m.img.gz");
    let out = std::process::Command::new("gzip")
        .args(["-dc", gz])
        .output()
        .expect("running gzip");
    assert!(out.status.success());
    out.stdout
}

fn path(fs: &FileSystem, p: &[&str]) -> u64 {
    let mut ino = ROOT_INO;
    for c in p {
        ino = fs.lookup(ino, c.as_bytes()).unwrap().0;
    }
    ino
}

fn check(fs: &FileSystem) {
    let want: Vec<u8> = (0..20000u32)
        .map(|i| ((i * 7 + i / 4096) % 251) as u8)
        .collect();
    let r1 = path(fs, &["d", "e", "r1"]);
    let r2 = path(fs, &["r2"]);
    assert!(fs.read(r1, 0, 30000).unwrap() == want);
    assert!(fs.read(r2, 0, 30000).unwrap() == want);
    let h = path(fs, &["d", "hello.txt"]);
    assert_eq!(fs.read(h, 0, 100).unwrap(), b"hello v1\n");
    assert_eq!(fs.getxattr(h, b"user.k").unwrap(), b"v");
    assert_eq!(fs.readlink(path(fs, &["link"])).unwrap(), b"d/hello.txt");
    // The two copies share their blocks.
    assert_eq!(fs.stats_json()["physical_bytes"], 5 * 4096 + 4096);
    assert!(fsck::check(fs, false).unwrap().consistent());
}

#[test]
fn version_1_image_is_read_and_converted() {
    let bytes = v1_image();
    let m = Arc::new(MemMedium::from_bytes(bytes.clone()));
    assert_eq!(probe_medium(&*m).unwrap().0.version, 1);
    assert_eq!(engine_sb::Superblock::load(&*m).unwrap().version, 1);
    let ro = FsOptions {
        read_only: true,
        ..FsOptions::default()
    };
    let fs = FileSystem::open(m.clone(), &ro).unwrap();
    check(&fs);
    fs.shutdown().unwrap();
    drop(fs);
    assert!(m.snapshot() == bytes, "a read-only open wrote to the image");
    let fs = FileSystem::open(m.clone(), &FsOptions::default()).unwrap();
    check(&fs);
    assert_eq!(probe_medium(&*m).unwrap().0.version, FS_VERSION);
    let esb = engine_sb::Superblock::load(&*m).unwrap();
    assert_eq!(esb.version, engine_sb::VERSION);
    assert_eq!(esb.params, PolicyParams::default());
    assert_eq!(fs.engine().policy_params(), PolicyParams::default());
    fs.shutdown().unwrap();
    drop(fs);
    let fs = FileSystem::open(m.clone(), &FsOptions::default()).unwrap();
    assert_eq!(fs.recovery().kind, "clean");
    check(&fs);
}
