//! Space accounting of the metadata: the log and the checkpoint segments stay bounded, a
//! checkpoint runs before any ENOSPC for metadata, and the space comes back without a remount.

mod common;
use common::block;

use nodup_core::media::MemMedium;
use nodup_core::{FormatOptions, BLOCK_SIZE};
use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::{fsck, Caller, FileSystem, FsOptions, MediumKind};
use std::sync::Arc;

fn format(bytes: u64) -> (Arc<MemMedium>, FileSystem) {
    let m = Arc::new(MemMedium::new(bytes));
    let fs = FileSystem::format(
        m.clone(),
        MediumKind::Pmem,
        &FormatOptions::default(),
        &FsOptions::default(),
        Caller::default(),
    )
    .unwrap();
    (m, fs)
}

/// Used blocks as `df` computes them (total - free).
fn used(fs: &FileSystem) -> u64 {
    let st = fs.statfs();
    st.blocks - st.free
}

/// Creating, writing and deleting small files on a half-full image, with no maintenance tick
/// at all: the log must never fill the device (a checkpoint runs before ENOSPC), and once a
/// checkpoint has run the used space is back where it started.
#[test]
fn churn_never_runs_out_of_space() {
    let (_m, fs) = format(16 << 20);
    let who = Caller::default();
    let (live, _) = fs
        .mknod(ROOT_INO, b"live", Kind::File, 0o644, 0, b"", who)
        .unwrap();
    let mut data = Vec::new();
    for i in 0..1800u64 {
        data.extend(block(i));
    }
    fs.write(live, 0, &data).unwrap();
    fs.checkpoint(false).unwrap();
    let start = used(&fs);
    // The old fixed 256 MiB log limit filled an image like this within about 45 000 cycles.
    for i in 0..60_000u64 {
        let name = format!("tmp{}", i % 7);
        let (ino, _) = fs
            .mknod(ROOT_INO, name.as_bytes(), Kind::File, 0o644, 0, b"", who)
            .unwrap_or_else(|e| panic!("create at cycle {i}: {e}"));
        fs.write(ino, 0, &block(1_000_000 + i)[..100])
            .unwrap_or_else(|e| panic!("write at cycle {i}: {e}"));
        fs.unlink(ROOT_INO, name.as_bytes())
            .unwrap_or_else(|e| panic!("unlink at cycle {i}: {e}"));
    }
    fs.checkpoint(false).unwrap();
    let end = used(&fs);
    assert!(
        end.abs_diff(start) <= 256,
        "used blocks {start} before the churn, {end} after"
    );
    let s = fs.stats_json();
    assert!(s["checkpoints"]["count"].as_u64().unwrap() > 2, "{s}");
    assert!(fsck::check(&fs, false).unwrap().consistent());
    assert!(fs.read(live, 0, data.len()).unwrap() == data);
}

/// Many checkpoints that each change a little of a larger namespace: segments are cleaned, so
/// what they hold stays within a small factor of the live metadata, and every remount (clean
/// or after a crash) sees exactly the latest state.
#[test]
fn segments_are_cleaned_and_reload_exactly() {
    let (m, fs) = format(64 << 20);
    let who = Caller::default();
    let mut dirs = Vec::new();
    for d in 0..8u64 {
        let (ino, _) = fs
            .mknod(
                ROOT_INO,
                format!("d{d}").as_bytes(),
                Kind::Dir,
                0o755,
                0,
                b"",
                who,
            )
            .unwrap();
        dirs.push(ino);
    }
    let mut files = Vec::new();
    for i in 0..2000u64 {
        let d = dirs[(i % 8) as usize];
        let (ino, _) = fs
            .mknod(
                d,
                format!("f{i}").as_bytes(),
                Kind::File,
                0o644,
                0,
                b"",
                who,
            )
            .unwrap();
        fs.write(ino, (i % 3) * 700 * BLOCK_SIZE as u64, &block(i % 50))
            .unwrap();
        files.push(ino);
    }
    fs.checkpoint(false).unwrap();
    let mut max_ratio: f64 = 0.0;
    for round in 0..200u64 {
        for k in 0..20u64 {
            let i = (round * 97 + k * 31) % 2000;
            fs.write(files[i as usize], 0, &block(round * 100 + k))
                .unwrap();
            fs.setxattr(files[i as usize], b"user.r", &round.to_le_bytes(), 0)
                .unwrap();
        }
        fs.checkpoint(false).unwrap();
        let s = fs.stats_json();
        let bytes = s["checkpoint_bytes"].as_u64().unwrap() as f64;
        let live = s["checkpoint_live_bytes"].as_u64().unwrap() as f64;
        max_ratio = max_ratio.max(bytes / live);
    }
    let s = fs.stats_json();
    assert!(
        s["checkpoints"]["segments_cleaned"].as_u64().unwrap() > 10,
        "{s}"
    );
    assert!(
        max_ratio < 2.6,
        "segments held {max_ratio:.2}x their live bytes"
    );
    let want: Vec<Vec<u8>> = files
        .iter()
        .map(|&f| fs.read(f, 0, BLOCK_SIZE).unwrap())
        .collect();
    // Crash (no shutdown), then a clean cycle.
    let snap = Arc::new(MemMedium::from_bytes(m.snapshot()));
    drop(fs);
    for clean in [false, true] {
        let fs = FileSystem::open(snap.clone(), &FsOptions::default()).unwrap();
        assert_eq!(fs.recovery().kind, if clean { "clean" } else { "failure" });
        for (i, &f) in files.iter().enumerate() {
            assert!(fs.read(f, 0, BLOCK_SIZE).unwrap() == want[i], "file {i}");
        }
        assert!(fsck::check(&fs, false).unwrap().consistent());
        fs.shutdown().unwrap();
    }
}
