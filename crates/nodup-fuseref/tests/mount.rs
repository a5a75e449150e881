//! Real mounts of both reference file systems: the binary mounts in the foreground, files and
//! directories go through the kernel, and SIGTERM unmounts. Skipped (with a message) when
//! /dev/fuse or fusermount3 is missing.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

mod common;
use common::{is_mounted, spawn_mount};

fn fuse_available() -> bool {
    let ok = Path::new("/dev/fuse").exists()
        && Command::new("fusermount3")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipping: FUSE is not available on this machine");
    }
    ok
}

/// A running `nodup-fuseref` mount; unmounted by SIGTERM on drop.
struct Mount {
    child: Child,
    mnt: PathBuf,
}

impl Mount {
    fn start(args: &[&str], mnt: &Path) -> Mount {
        Mount {
            child: spawn_mount(args, mnt),
            mnt: mnt.to_owned(),
        }
    }

    /// SIGTERM, then the process must exit cleanly and leave nothing mounted.
    fn stop(mut self) {
        self.terminate();
    }

    fn terminate(&mut self) {
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("waiting for nodup-fuseref");
        assert!(status.success(), "exit status {status}");
        assert!(!is_mounted(&self.mnt), "still mounted after SIGTERM");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            // SAFETY: signalling our own child by its pid.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = self.child.wait();
        }
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The namespace round trip both file systems must pass; `data` says whether contents are
/// kept (passthrough) or discarded (null: only what the page cache still holds reads back).
fn round_trip(m: &Path, data: bool) {
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    fs::create_dir_all(m.join("a/b")).unwrap();
    let mut f = fs::File::create(m.join("a/f")).unwrap();
    f.write_all(&payload).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut back = Vec::new();
    fs::File::open(m.join("a/f"))
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert_eq!(back.len(), payload.len());
    if data {
        assert_eq!(back, payload);
    }
    // Never written, so not in the page cache: the file system itself answers the read
    // (zeros from null and from the source's hole alike).
    fs::File::create(m.join("a/z"))
        .unwrap()
        .set_len(70_000)
        .unwrap();
    let z = fs::read(m.join("a/z")).unwrap();
    assert!(z.len() == 70_000 && z.iter().all(|&b| b == 0));
    fs::remove_file(m.join("a/z")).unwrap();
    // Overwrite in the middle and extend past the end.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(m.join("a/f"))
        .unwrap();
    f.seek(SeekFrom::Start(400_000)).unwrap();
    f.write_all(b"tail").unwrap();
    drop(f);
    assert_eq!(fs::metadata(m.join("a/f")).unwrap().len(), 400_004);

    fs::rename(m.join("a/f"), m.join("a/b/g")).unwrap();
    assert!(!m.join("a/f").exists());
    std::os::unix::fs::symlink("g", m.join("a/b/l")).unwrap();
    fs::hard_link(m.join("a/b/g"), m.join("a/h")).unwrap();
    assert_eq!(fs::metadata(m.join("a/h")).unwrap().nlink(), 2);
    assert_eq!(fs::read_link(m.join("a/b/l")).unwrap(), Path::new("g"));
    fs::set_permissions(m.join("a/h"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(m.join("a/b/g")).unwrap().mode() & 0o777, 0o600);
    assert_eq!(names(&m.join("a")), ["b", "h"]);
    assert_eq!(names(&m.join("a/b")), ["g", "l"]);

    // Enough entries that a listing takes several requests.
    for i in 0..600 {
        fs::File::create(m.join(format!("a/n{i:03}"))).unwrap();
    }
    assert_eq!(names(&m.join("a")).len(), 602);
    for i in 0..600 {
        fs::remove_file(m.join(format!("a/n{i:03}"))).unwrap();
    }
    fs::remove_file(m.join("a/h")).unwrap();
    assert_eq!(fs::metadata(m.join("a/b/g")).unwrap().nlink(), 1);
    assert!(fs::remove_dir(m.join("a/b")).is_err(), "not empty");
    fs::remove_file(m.join("a/b/g")).unwrap();
    fs::remove_file(m.join("a/b/l")).unwrap();
    fs::remove_dir(m.join("a/b")).unwrap();
    assert_eq!(names(m), ["a"]);
}

#[test]
fn null_mount_round_trip() {
    if !fuse_available() {
        return;
    }
    for wb in [false, true] {
        let t = tempfile::tempdir().unwrap();
        let mnt = t.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        let mut args = vec!["null", mnt.to_str().unwrap()];
        if wb {
            args.push("--writeback-cache");
        }
        let m = Mount::start(&args, &mnt);
        round_trip(&mnt, false);
        m.stop();
    }
}

#[test]
fn passthrough_mount_round_trip() {
    if !fuse_available() {
        return;
    }
    // The last run holds no descriptors on inodes: every request reopens a file handle.
    for (wb, budget) in [(false, None), (true, None), (false, Some("0"))] {
        let t = tempfile::tempdir().unwrap();
        let (src, mnt) = (t.path().join("src"), t.path().join("mnt"));
        fs::create_dir(&src).unwrap();
        fs::create_dir(&mnt).unwrap();
        let mut args = vec!["passthrough", src.to_str().unwrap(), mnt.to_str().unwrap()];
        if wb {
            args.push("--writeback-cache");
        }
        if let Some(b) = budget {
            args.extend(["--fd-budget", b]);
        }
        let m = Mount::start(&args, &mnt);
        round_trip(&mnt, true);
        fs::write(mnt.join("kept"), b"through").unwrap();
        m.stop();
        assert_eq!(
            fs::read(src.join("kept")).unwrap(),
            b"through",
            "in the source"
        );
        assert_eq!(names(&src), ["a", "kept"]);
    }
}

/// A block-file image on a disk whose write-back fails (the passthrough's fsync answers EIO
/// while a trigger file exists): from the first failed `fdatasync` on, nothing the file
/// system does is called durable, even once the disk answers again, and the reopened image
/// holds what was synced before.
#[test]
fn a_failed_write_back_fails_every_later_sync_of_the_image() {
    use nodup_core::media::{BlockFile, BlockFileOptions, Medium};
    use nodup_core::{FormatOptions, BLOCK_SIZE};
    use nodup_fs::inode::ROOT_INO;
    use nodup_fs::{fsck, Caller, FileSystem, FsOptions, MediumKind};
    use std::sync::Arc;
    if !fuse_available() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (src, mnt, trigger) = (
        t.path().join("src"),
        t.path().join("mnt"),
        t.path().join("fail"),
    );
    fs::create_dir(&src).unwrap();
    fs::create_dir(&mnt).unwrap();
    let args = [
        "passthrough",
        src.to_str().unwrap(),
        mnt.to_str().unwrap(),
        "--fail-fsync-while",
        trigger.to_str().unwrap(),
    ];
    let m = Mount::start(&args, &mnt);
    let img = mnt.join("img");
    let medium: Arc<dyn Medium> =
        Arc::new(BlockFile::create(&img, 64 << 20, BlockFileOptions::default()).unwrap());
    let fs = FileSystem::format(
        medium,
        MediumKind::BlockFile,
        &FormatOptions::default(),
        &FsOptions::default(),
        Caller::default(),
    )
    .unwrap();
    let file = |name: &str, fill: u8| {
        let ino = common::create_file(&fs, name)?;
        fs.write(ino, 0, &vec![fill; 3 * BLOCK_SIZE])
    };
    file("a", 1).unwrap();
    fs.sync().unwrap();
    file("b", 2).unwrap();
    fs::write(&trigger, b"").unwrap();
    assert!(fs.sync().is_err(), "a sync while the disk fails write-back");
    fs::remove_file(&trigger).unwrap();
    // The disk answers again, but the pages it dropped would be gone: no later sync may
    // succeed, nor a write that needs its data durable before its record.
    let after = fs.sync().unwrap_err();
    assert!(
        after.to_string().contains("an earlier write-back"),
        "a sync after a failed write-back: {after}"
    );
    // Nor any other change: it could not be made durable, and would be lost at the remount.
    let e = file("c", 3).unwrap_err();
    assert_eq!(
        e.errno(),
        libc::EIO,
        "a new file after a failed write-back: {e}"
    );
    assert!(
        e.to_string().contains("no change can be made durable"),
        "{e}"
    );
    let e = fs.unlink(ROOT_INO, b"a").unwrap_err();
    assert_eq!(
        e.errno(),
        libc::EIO,
        "an unlink after a failed write-back: {e}"
    );
    assert!(
        fs.shutdown().is_err(),
        "a clean unmount after a failed write-back"
    );
    // The daemon shuts down twice (at the kernel's destroy, then to be sure): the second
    // call must not report a clean unmount.
    assert!(fs.shutdown().is_err(), "the second shutdown call");
    drop(fs);
    // Reopened (here the disk kept everything): failure recovery, and what was synced reads
    // back.
    let medium: Arc<dyn Medium> =
        Arc::new(BlockFile::open(&img, BlockFileOptions::default()).unwrap());
    let fs = FileSystem::open(medium, &FsOptions::default()).unwrap();
    assert_eq!(fs.recovery().kind, "failure");
    let (ino, _) = fs.lookup(ROOT_INO, b"a").unwrap();
    assert!(
        fs.lookup(ROOT_INO, b"c").is_err(),
        "the refused file is not there"
    );
    assert_eq!(
        fs.read(ino, 0, 3 * BLOCK_SIZE).unwrap(),
        vec![1; 3 * BLOCK_SIZE]
    );
    let rep = fsck::check(&fs, false).unwrap();
    assert!(rep.consistent(), "{:?}", rep.problems);
    fs.shutdown().unwrap();
    drop(fs);
    m.stop();
}

/// The logging disk keeps what is written to `disk`, and logs each write, zeroed range, fsync
/// and mark in the order they were answered, in the format `src/logdisk.rs` gives.
#[test]
fn the_logging_disk_logs_writes_zeroed_ranges_flushes_and_marks_in_order() {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    if !fuse_available() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (log, mnt) = (t.path().join("log"), t.path().join("mnt"));
    fs::create_dir(&mnt).unwrap();
    let m = Mount::start(
        &[
            "logdisk",
            log.to_str().unwrap(),
            mnt.to_str().unwrap(),
            "--size",
            "1048576",
        ],
        &mnt,
    );
    assert_eq!(names(&mnt), ["disk", "mark"]);
    let disk = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mnt.join("disk"))
        .unwrap();
    assert_eq!(disk.metadata().unwrap().len(), 1 << 20);
    disk.write_all_at(b"abc", 4096).unwrap();
    disk.sync_data().unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("mark"))
        .unwrap()
        .write_all(b"m1")
        .unwrap();
    // SAFETY: fallocate on an open descriptor.
    let r = unsafe {
        libc::fallocate(
            disk.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            4096,
            2,
        )
    };
    assert_eq!(r, 0, "punch hole: {}", std::io::Error::last_os_error());
    let mut back = [0u8; 4];
    disk.read_exact_at(&mut back, 4095).unwrap();
    assert_eq!(&back, b"\0\0\0c", "the zeroed range reads back as zeros");
    // Past the end: refused, and not logged.
    assert!(disk.write_all_at(b"x", 1 << 20).is_err());
    drop(disk);
    m.stop();
    let mut want = vec![b'W'];
    want.extend(4096u64.to_le_bytes());
    want.extend(3u32.to_le_bytes());
    want.extend(b"abcF");
    want.push(b'M');
    want.extend(2u32.to_le_bytes());
    want.extend(b"m1Z");
    want.extend(4096u64.to_le_bytes());
    want.extend(2u64.to_le_bytes());
    assert_eq!(fs::read(&log).unwrap(), want);
}
