//! Space accounting of the metadata: the log and the checkpoint segments stay bounded, a
//! checkpoint runs before any ENOSPC for metadata, and the space comes back without a remount.

mod common;
use common::{block, create};

use nodup_core::media::{CrashSim, Medium, MemMedium};
use nodup_core::BLOCK_SIZE;
use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::{fsck, Caller, FileSystem, FsOptions, MediumKind};
use std::sync::Arc;

fn format(bytes: u64) -> (Arc<MemMedium>, FileSystem) {
    let m = Arc::new(MemMedium::new(bytes));
    let fs = common::format(m.clone(), MediumKind::Pmem);
    (m, fs)
}

/// A block-file image (durable at the next sync) on a crash simulator: not a MemMedium, which
/// the file system takes for durable on return, as pmem.
fn format_blockfile(bytes: u64) -> (Arc<CrashSim>, FileSystem) {
    let m = Arc::new(CrashSim::new(bytes));
    let fs = common::format(m.clone(), MediumKind::BlockFile);
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

/// `fstrim` on a mount ([`FileSystem::trim`]): what was just deleted is given back to the
/// image's holder at once (on a BlockFile image its release waits for a sync, which the trim
/// does first), nothing else is, and the image recovers from a crash right after it whole.
#[test]
fn a_trim_gives_back_what_was_just_deleted_and_nothing_else() {
    let (m, fs) = format_blockfile(32 << 20);
    let who = Caller::default();
    let file = |name: &[u8], first: u64| {
        let (ino, _) = fs
            .mknod(ROOT_INO, name, Kind::File, 0o644, 0, b"", who)
            .unwrap();
        let data: Vec<u8> = (first..first + 256).flat_map(block).collect();
        fs.write(ino, 0, &data).unwrap();
        (ino, data)
    };
    let (keep, kept) = file(b"keep", 0);
    let (_, gone) = file(b"gone", 1000);
    fs.sync().unwrap();
    fs.unlink(ROOT_INO, b"gone").unwrap();
    // Where the deleted blocks are: found by their content.
    let bs = BLOCK_SIZE as u64;
    let holding = |data: &[u8]| -> Vec<u64> {
        let mut buf = vec![0u8; BLOCK_SIZE];
        let wanted: std::collections::HashSet<&[u8]> = data.chunks(BLOCK_SIZE).collect();
        (0..m.len() / bs)
            .filter(|&b| {
                m.read(b * bs, &mut buf).unwrap();
                wanted.contains(&buf[..])
            })
            .collect()
    };
    let were = holding(&gone);
    assert_eq!(were.len(), 256);
    let given = fs.trim(0, u64::MAX, 0).unwrap();
    assert!(given >= 256 * bs, "gave back {given} bytes");
    assert_eq!(holding(&gone), Vec::<u64>::new(), "deleted data still held");
    assert_eq!(holding(&kept).len(), 256);
    assert_eq!(fs.read(keep, 0, kept.len()).unwrap(), kept);
    // FITRIM's refusals, as ext4's.
    let errno = |r: nodup_fs::Result<u64>| r.unwrap_err().errno();
    assert_eq!(errno(fs.trim(m.len(), 1 << 20, 0)), libc::EINVAL);
    assert_eq!(errno(fs.trim(0, bs - 1, 0)), libc::EINVAL);
    assert_eq!(errno(fs.trim(0, u64::MAX, m.len() + 1)), libc::EINVAL);
    // A crash right after: recovery finds everything it needs.
    let m = Arc::new(MemMedium::from_bytes(m.crash_point().durable_image()));
    drop(fs);
    let fs = FileSystem::open(m.clone(), &FsOptions::default()).unwrap();
    assert!(fsck::check(&fs, false).unwrap().consistent());
    let keep = fs.lookup(ROOT_INO, b"keep").unwrap().0;
    assert_eq!(fs.read(keep, 0, kept.len()).unwrap(), kept);
    assert!(fs.lookup(ROOT_INO, b"gone").is_err());
    fs.shutdown().unwrap();
    let ro = FsOptions {
        read_only: true,
        ..Default::default()
    };
    let fs = FileSystem::open(m.clone(), &ro).unwrap();
    assert_eq!(errno(fs.trim(0, u64::MAX, 0)), libc::EROFS);
}

/// On a block file a deleted file's blocks stay counted until the next sync (their release
/// waits for the record that dropped them to be durable): a live fsck in between counts
/// those references too, and finds nothing wrong.
#[test]
fn fsck_counts_releases_waiting_for_a_sync() {
    let (_m, fs) = format_blockfile(16 << 20);
    let who = Caller::default();
    let mut data: Vec<u8> = (0..64).flat_map(block).collect();
    // Some blocks twice, so a pending release leaves a count above zero.
    let head = data[..8 * BLOCK_SIZE].to_vec();
    data.extend(head);
    // And some blocks of `a` only, so a pending release holds blocks no map names.
    let mut only_a = data.clone();
    only_a.extend((5000..5004).flat_map(block));
    for (name, content) in [(&b"a"[..], &only_a), (b"b", &data)] {
        let (ino, _) = fs
            .mknod(ROOT_INO, name, Kind::File, 0o644, 0, b"", who)
            .unwrap();
        fs.write(ino, 0, content).unwrap();
    }
    fs.sync().unwrap();
    fs.unlink(ROOT_INO, b"a").unwrap();
    let rep = fsck::check(&fs, false).unwrap();
    assert!(rep.consistent(), "{:?}", rep.problems);
    fs.sync().unwrap();
    let rep = fsck::check(&fs, false).unwrap();
    assert!(rep.consistent(), "{:?}", rep.problems);
}

/// On a block file (durable at the next sync), where every fence is an fdatasync and so a
/// flush of the device, a sync after a write fences twice when no release waits for it (an
/// append and fsync, as a database's log does): the data, then the record held back until
/// then. When one waits (the blocks an overwrite replaced), it fences a third time, for their
/// release, and the release is done. With nothing written, a sync fences once. (Session 46: a
/// write fenced, then the sync once, or twice for a release; session 47 moved the write's
/// fence into the sync.)
#[test]
fn a_sync_fences_again_only_for_a_release_waiting_for_it() {
    let (m, fs) = format_blockfile(16 << 20);
    let ino = create(&fs, "log");
    fs.sync().unwrap();
    for i in 0..4u64 {
        let before = m.fence_count();
        fs.write(ino, i * BLOCK_SIZE as u64, &block(100 + i))
            .unwrap();
        fs.sync().unwrap();
        assert_eq!(
            m.fence_count() - before,
            2,
            "append {i}: two fences to sync"
        );
    }
    let before = m.fence_count();
    fs.sync().unwrap();
    assert_eq!(m.fence_count() - before, 1, "nothing written: one fence");
    // An overwrite replaces a block (one only this place names), whose release waits for the
    // sync.
    let used_before = used(&fs);
    fs.write(ino, BLOCK_SIZE as u64, &block(200)).unwrap();
    assert_eq!(
        used(&fs),
        used_before + 1,
        "both blocks held until the sync"
    );
    let before = m.fence_count();
    fs.sync().unwrap();
    assert_eq!(
        m.fence_count() - before,
        3,
        "the data's fence, the record's, then the release's"
    );
    assert_eq!(
        used(&fs),
        used_before,
        "the replaced block released by the sync"
    );
    let rep = fsck::check(&fs, false).unwrap();
    assert!(rep.consistent(), "{:?}", rep.problems);
}

/// On a block file a write fences nothing: its data, entries and the counts it raised wait
/// for the next sync, and so does its record, held back in memory until a fence has made the
/// data it names durable (`log/held.rs`; the engine's `fenced_by_caller`; the crash
/// campaign's block-file workloads check the states this allows). The sync fences twice: for
/// the data, then for the records it has just written; only once when no new data was stored
/// since the last fence (duplicates). Until session 47 a write of new data fenced twice and a
/// write of duplicates once, and the sync once.
#[test]
fn a_block_file_write_fences_nothing_until_the_sync() {
    let (m, fs) = format_blockfile(16 << 20);
    let ino = create(&fs, "f");
    fs.sync().unwrap();
    let before = m.fence_count();
    fs.write(ino, 0, &block(300)).unwrap();
    assert_eq!(m.fence_count() - before, 0, "new data: no fence");
    fs.write(ino, BLOCK_SIZE as u64, &block(300)).unwrap();
    assert_eq!(m.fence_count() - before, 0, "a duplicate: no fence");
    assert_eq!(
        fs.engine().stats().dedup_hits,
        1,
        "the second write was a duplicate"
    );
    let before = m.fence_count();
    fs.sync().unwrap();
    assert_eq!(
        m.fence_count() - before,
        2,
        "the data's fence, then the records'"
    );
    // ... and they did it: nothing written is still waiting to be durable (an entry store
    // left unflushed would be, as a block file's flush does nothing and this medium's does).
    let pending = m.crash_point().pending().len();
    assert_eq!(pending, 0, "stores not durable after the sync");
    // A duplicate alone names only data a fence covered: its record needs no fence before
    // it, so the sync fences once.
    fs.write(ino, 2 * BLOCK_SIZE as u64, &block(300)).unwrap();
    let before = m.fence_count();
    fs.sync().unwrap();
    assert_eq!(
        m.fence_count() - before,
        1,
        "a duplicate's sync: the record's fence"
    );
    assert_eq!(m.crash_point().pending().len(), 0);
    let rep = fsck::check(&fs, false).unwrap();
    assert!(rep.consistent(), "{:?}", rep.problems);
}

/// A sync of a read-only image (fsync on a `ro` mount) succeeds: it has nothing to release.
/// (Until session 46 the engine's release, which a read-only engine refuses, ran at every
/// sync, and such an fsync failed with EINVAL.)
#[test]
fn a_sync_of_a_read_only_image_succeeds() {
    let (m, fs) = format_blockfile(16 << 20);
    let ino = create(&fs, "f");
    fs.write(ino, 0, &block(7)).unwrap();
    fs.shutdown().unwrap();
    drop(fs);
    let opts = FsOptions {
        read_only: true,
        ..FsOptions::default()
    };
    let fs = FileSystem::open(m, &opts).unwrap();
    fs.sync().unwrap();
    let (ino, _) = fs.lookup(ROOT_INO, b"f").unwrap();
    assert_eq!(fs.read(ino, 0, BLOCK_SIZE).unwrap(), block(7));
}
