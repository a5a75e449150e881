//! `fsck --repair` (issue 5 item 6): fixes what failure recovery would, reports what it
//! changed, and is idempotent (a second repair finds nothing to fix).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use nodup_core::media::{Medium, MemMedium};
use nodup_core::FormatOptions;
use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::{fsck, Caller, FileSystem, FsOptions, MediumKind};
use nodup_torture::workload::pattern_block;

fn two_files() -> (FileSystem, Vec<u8>) {
    let m: Arc<dyn Medium> = Arc::new(MemMedium::new(8 << 20));
    let fs = FileSystem::format(
        m,
        MediumKind::Pmem,
        &FormatOptions::default(),
        &FsOptions::default(),
        Caller::default(),
    )
    .unwrap();
    let mut data = pattern_block(1);
    data.extend(pattern_block(1));
    data.extend(pattern_block(2));
    for name in ["a", "b"] {
        let (ino, _) = fs
            .mknod(
                ROOT_INO,
                name.as_bytes(),
                Kind::File,
                0o644,
                0,
                b"",
                Caller::default(),
            )
            .unwrap();
        fs.write(ino, 0, &data).unwrap();
    }
    assert!(fsck::check(&fs, false).unwrap().consistent());
    (fs, data)
}

/// Drop every engine reference of the first file block: it becomes free while referenced.
fn free_a_referenced_block(fs: &FileSystem) {
    let refs = fs.with_tables(|t| t.data_refs());
    let b = refs[0];
    for _ in refs.iter().filter(|&&x| x == b) {
        fs.engine().release(b).unwrap();
    }
}

#[test]
fn library_repair_fixes_refcounts_and_is_idempotent() {
    let (fs, data) = two_files();
    free_a_referenced_block(&fs);
    let r0 = fsck::check(&fs, false).unwrap();
    assert!(!r0.consistent(), "fsck missed a broken refcount");
    let r1 = fsck::check(&fs, true).unwrap();
    eprintln!("repair 1: {:?}", r1.repaired);
    assert!(r1.consistent(), "{:?}", r1.problems);
    assert!(
        !r1.repaired.is_empty(),
        "repair changed things but reported nothing"
    );
    let r2 = fsck::check(&fs, true).unwrap();
    assert!(r2.consistent(), "{:?}", r2.problems);
    assert!(r2.repaired.is_empty(), "second repair: {:?}", r2.repaired);
    for name in ["a", "b"] {
        let (ino, _) = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
        assert_eq!(fs.read(ino, 0, data.len()).unwrap(), data);
    }
}

fn nodup() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/nodup");
    p.exists().then_some(p)
}

/// Detach the dead daemon's mount (fusermount3, else a lazy umount); never panics, so a
/// missing tool cannot leave the mount behind through an early test abort.
fn unmount(mp: &Path) {
    let ok = Command::new("fusermount3")
        .arg("-u")
        .arg(mp)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let _ = Command::new("umount").arg("-l").arg(mp).status();
    }
}

fn out(c: &mut Command) -> (bool, String) {
    let o = c.output().unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// A real crash (kill -9 of the mount daemon), then `nodup fsck`, `--repair` twice, `fsck`.
#[test]
fn cli_repair_after_kill9_reports_then_finds_nothing() {
    let Some(nodup) = nodup() else {
        eprintln!("skipped: build target/release/nodup first");
        return;
    };
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("nodup-repair")
        .tempdir_in("/dev/shm")
        .unwrap();
    let img = dir.path().join("r.img");
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let (ok, o) = out(Command::new(&nodup)
        .arg("mkfs")
        .arg(&img)
        .args(["--size", "32M"]));
    assert!(ok, "{o}");
    let (ok, o) = out(Command::new(&nodup).arg("mount").arg(&img).arg(&mp));
    assert!(ok, "{o}");
    let pid: i32 = o
        .split("daemon pid ")
        .nth(1)
        .and_then(|s| s.trim().trim_end_matches(')').parse().ok())
        .expect("daemon pid");
    let mut data = pattern_block(3);
    data.extend(pattern_block(3));
    for i in 0..20 {
        std::fs::write(mp.join(format!("f{i}")), &data).unwrap();
    }
    std::fs::remove_file(mp.join("f3")).unwrap();
    // SAFETY: kill(2) of the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    while Path::new(&format!("/proc/{pid}")).exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    unmount(&mp);
    let (ok, o0) = out(Command::new(&nodup).arg("fsck").arg(&img));
    assert!(!ok, "fsck of a crashed image must ask for recovery: {o0}");
    let (ok, o1) = out(Command::new(&nodup).args(["fsck", "--repair"]).arg(&img));
    eprintln!("repair 1:\n{o1}");
    assert!(ok, "{o1}");
    let (ok, o2) = out(Command::new(&nodup).args(["fsck", "--repair"]).arg(&img));
    eprintln!("repair 2:\n{o2}");
    assert!(ok, "{o2}");
    assert!(
        !o2.contains("repaired:"),
        "second repair changed something: {o2}"
    );
    let (ok, o3) = out(Command::new(&nodup).arg("fsck").arg(&img));
    assert!(ok, "fsck after repair: {o3}");
    assert!(o3.contains("19 files") || o3.contains("consistent"), "{o3}");
}

/// Finding 4 (nodup-cli `fsck --repair`): on a crashed image the repair is done by the
/// failure recovery inside `FileSystem::open`, whose report is not printed, so
/// `fsck --repair` says nothing about what it changed.
#[test]
fn finding4_repair_reports_recovery_changes() {
    let Some(nodup) = nodup() else { return };
    let dir = tempfile::Builder::new()
        .prefix("nodup-repair4")
        .tempdir_in("/dev/shm")
        .unwrap();
    let img = dir.path().join("r.img");
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    assert!(
        out(Command::new(&nodup)
            .arg("mkfs")
            .arg(&img)
            .args(["--size", "32M"]))
        .0
    );
    let (_, o) = out(Command::new(&nodup).arg("mount").arg(&img).arg(&mp));
    let pid: i32 = o
        .split("daemon pid ")
        .nth(1)
        .and_then(|s| s.trim().trim_end_matches(')').parse().ok())
        .expect("daemon pid");
    std::fs::write(mp.join("f"), pattern_block(9)).unwrap();
    // SAFETY: kill(2) of the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    while Path::new(&format!("/proc/{pid}")).exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    unmount(&mp);
    let (_, o1) = out(Command::new(&nodup).args(["fsck", "--repair"]).arg(&img));
    assert!(o1.contains("repaired:"), "nothing reported: {o1}");
}

/// Finding 5 (nodup-fs fsck.rs): fsck compared only the number of distinct blocks with the
/// engine's count, not each block's reference count with its references in the block maps;
/// a refcount that is too low (the next unlink frees a block another file still maps) passed.
#[test]
fn finding5_fsck_detects_a_low_refcount() {
    let (fs, data) = two_files();
    let b = fs.with_tables(|t| t.data_refs())[0];
    fs.engine().release(b).unwrap();
    let r = fsck::check(&fs, false).unwrap();
    assert!(!r.consistent(), "fsck missed a refcount one too low");
    let r1 = fsck::check(&fs, true).unwrap();
    assert!(r1.consistent(), "{:?}", r1.problems);
    assert!(!r1.repaired.is_empty());
    let r2 = fsck::check(&fs, true).unwrap();
    assert!(r2.consistent(), "{:?}", r2.problems);
    assert!(r2.repaired.is_empty(), "second repair: {:?}", r2.repaired);
    unlink_a_keeps_b(&fs, &data);
}

/// Unlink "a": "b" (which shares every block with it) must keep its content, fsck clean.
fn unlink_a_keeps_b(fs: &FileSystem, data: &[u8]) {
    fs.unlink(ROOT_INO, b"a").unwrap();
    let (ino, _) = fs.lookup(ROOT_INO, b"b").unwrap();
    assert_eq!(fs.read(ino, 0, data.len()).unwrap(), data);
    let r = fsck::check(fs, false).unwrap();
    assert!(r.consistent(), "after unlink: {:?}", r.problems);
}

/// Finding 5, root cause (nodup-core failure recovery): a block both files share loses its
/// dedup entry (every engine reference dropped, as when the entry never became durable), the
/// file system crashes, and failure recovery at the next open rebuilds from the block maps. It
/// must recreate the entry with the full count, so unlinking one file keeps the other intact.
#[test]
fn finding5_recovery_recreates_the_entry_of_a_shared_block() {
    let (fs, data) = two_files();
    free_a_referenced_block(&fs);
    let b = fs.with_tables(|t| t.data_refs())[0];
    assert_eq!(fs.engine().block_refcount(b).unwrap(), None);
    // Crash: no clean shutdown; reopen the medium as it is.
    let m = fs.engine().medium().clone();
    drop(fs);
    let fs = FileSystem::open(m, &FsOptions::default()).unwrap();
    assert_eq!(fs.recovery().kind, "failure");
    assert_eq!(fs.engine().block_refcount(b).unwrap(), Some(4));
    let r = fsck::check(&fs, false).unwrap();
    assert!(r.consistent(), "{:?}", r.problems);
    for name in ["a", "b"] {
        let (ino, _) = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
        assert_eq!(fs.read(ino, 0, data.len()).unwrap(), data);
    }
    unlink_a_keeps_b(&fs, &data);
}
