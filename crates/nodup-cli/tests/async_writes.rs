//! `nodup mount --async-writes`: large writes are answered before they are stored. These tests
//! check what must still hold through a real mount: every later call on the file sees the
//! write, fsync and close report what failed after an answer, a full image fails the write
//! itself (the room is reserved before the answer), and nothing answered is lost by a clean
//! unmount.
//!
//! Skipped (with a message) when /dev/fuse or fusermount3 is missing.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::IntoRawFd;
use std::path::Path;
use std::process::Command;

mod common;
use common::*;

const MIB: usize = 1 << 20;

/// The daemon's own count of `p`'s logical bytes (`user.nodup.du`, computed under the file's
/// lock, so it cannot be served from the kernel's caches).
fn logical_bytes(p: &Path) -> u64 {
    let du = getxattr(p, "user.nodup.du").unwrap_or_else(|e| panic!("getxattr: {e}"));
    let v: serde_json::Value = serde_json::from_slice(&du).unwrap();
    v["logical_bytes"].as_u64().unwrap()
}

/// Writes the mount at `mp` answered before storing them (the stats' `writes_answered_early`).
fn early_answers(mp: &str) -> u64 {
    let s = json(&nodup(&["stats", mp, "--json"]));
    s["writes_answered_early"]
        .as_u64()
        .unwrap_or_else(|| panic!("no writes_answered_early in {s}"))
}

/// [`early_answers`] of a fixture's mount.
fn early(fx: &Fixture) -> u64 {
    early_answers(fx.mnt.to_str().unwrap())
}

/// `len` bytes of a file as whole blocks (what `logical_bytes` counts).
fn in_blocks(len: usize) -> u64 {
    (len as u64).div_ceil(4096) * 4096
}

/// 1 MiB of random bytes.
fn unique(rng: &mut StdRng) -> Vec<u8> {
    let mut v = vec![0u8; MIB];
    rng.fill(&mut v);
    v
}

#[test]
fn answered_writes_are_seen_at_once_and_kept() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("async", "256M", &[]);
    let log = fx.img.with_extension("log");
    let opts = ["--async-writes", "--log-file", log.to_str().unwrap()];
    fx.mount(&opts);
    let mut rng = StdRng::seed_from_u64(21);
    let uniq: Vec<Vec<u8>> = (0..8).map(|_| unique(&mut rng)).collect();
    let p = fx.path("big");
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    let mut want = Vec::new();
    for k in 0..24 {
        // Unique, then a repeat of an earlier MiB: half the data deduplicates.
        let chunk = &uniq[if k % 2 == 0 { k / 3 % 8 } else { k / 4 }];
        assert_eq!(f.write_at(chunk, want.len() as u64).unwrap(), MIB);
        want.extend_from_slice(chunk);
        // The daemon's view, asked right after the answer, already has the whole write.
        assert_eq!(logical_bytes(&p), in_blocks(want.len()), "after write {k}");
        if k == 10 {
            // A truncate right behind a write: it waits for the write, then cuts it.
            let cut = want.len() - 300_000;
            f.set_len(cut as u64).unwrap();
            want.truncate(cut);
            assert_eq!(logical_bytes(&p), in_blocks(cut));
        }
    }
    f.sync_all().unwrap();
    drop(f);
    assert!(fs::read(&p).unwrap() == want, "content");
    let s = fx.stats();
    assert!(early(&fx) >= 20, "most 1 MiB writes answered early: {s}");
    assert_eq!(s["logical_bytes"].as_u64().unwrap(), in_blocks(want.len()));
    assert!(
        s["dedup_hits"].as_u64().unwrap() >= 8 * 256,
        "repeats deduplicated: {s}"
    );
    fx.umount_clean("async writes");
    // Back without the option: the data is where the answers said.
    fx.mount(&[]);
    assert!(fs::read(&p).unwrap() == want, "content after remount");
    fx.umount_clean("remount");
    let said = fs::read_to_string(&log).unwrap();
    let _ = fs::remove_file(&log);
    assert!(
        said.contains("answered before they are stored"),
        "the log names the mode: {said}"
    );
}

/// The kernel flags every write of a caller without CAP_FSETID for dropping set-id bits: such
/// writes are answered early unless the file has a bit to drop, which must be gone when the
/// write returns.
#[test]
fn unprivileged_writers_are_answered_early_unless_a_set_id_bit_must_drop() {
    use std::os::unix::fs::{chown, PermissionsExt};
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid cannot fail.
    if !fuse_available() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: needs root to write as another user");
        return;
    }
    let fx = Fixture::new("async-user", "128M", &[]);
    fx.mount(&["--async-writes"]);
    let nobody = 65534;
    let dd = |name: &str| {
        let p = fx.path(name);
        let st = Command::new("dd")
            .arg("if=/dev/urandom")
            .arg(format!("of={}", p.display()))
            .args([
                "bs=1M",
                "count=8",
                "iflag=fullblock",
                "conv=notrunc,fsync",
                "status=none",
            ])
            .uid(nobody)
            .gid(nobody)
            .status()
            .unwrap();
        assert!(st.success(), "dd as nobody into {name}");
    };
    for (name, mode) in [("plain", 0o644), ("setuid", 0o4755)] {
        let p = fx.path(name);
        fs::write(&p, b"").unwrap();
        chown(&p, Some(nobody), Some(nobody)).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    }
    let before = early(&fx);
    dd("plain");
    let plain = early(&fx) - before;
    assert!(plain >= 6, "{plain} of 8 writes by nobody answered early");
    dd("setuid");
    let mode = fs::metadata(fx.path("setuid"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o7777,
        0o755,
        "the set-user-ID bit dropped with the write"
    );
    // Only the first write had a bit to drop: it was stored before its answer, the rest not.
    let setuid = early(&fx) - before - plain;
    assert!((6..=7).contains(&setuid), "{setuid} of 8 answered early");
    fx.umount_clean("unprivileged writers");
}

#[test]
fn a_full_image_fails_the_answered_write_itself() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("async-full", "64M", &[]);
    fx.mount(&["--async-writes"]);
    // Two writers, so one's write is admitted while the other's is still being stored: the
    // room that one holds must count. Their data is made beforehand, so each write follows
    // the last one's answer at once.
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let p = fx.path(&format!("fill{w}"));
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(22 + w);
                let chunks: Vec<Vec<u8>> = (0..64).map(|_| unique(&mut rng)).collect();
                let mut f = File::create(&p).unwrap();
                let mut kept = Vec::new();
                let err = chunks
                    .iter()
                    .find_map(|chunk| match f.write(chunk) {
                        Ok(n) => {
                            assert_eq!(n, MIB, "one request, all or nothing");
                            kept.extend_from_slice(chunk);
                            None
                        }
                        Err(e) => Some(e),
                    })
                    .expect("128 MiB of new data fit in a 64 MiB image");
                assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
                // Every answered write was stored: nothing is left to fail at fsync.
                f.sync_all().unwrap();
                (p, kept)
            })
        })
        .collect();
    let files: Vec<_> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(early(&fx) > 0, "no write was answered early");
    let total: usize = files.iter().map(|(_, k)| k.len()).sum();
    assert!(total >= 32 * MIB, "only {} MiB fit", total / MIB);
    for (p, kept) in &files {
        assert!(fs::read(p).unwrap() == *kept, "content of {}", p.display());
    }
    fx.umount_clean("full image");
    fx.mount(&[]);
    for (p, kept) in &files {
        assert!(
            fs::read(p).unwrap() == *kept,
            "after remount: {}",
            p.display()
        );
    }
    fx.umount_clean("remount");
}

#[test]
fn a_full_backing_store_is_reported_at_fsync_or_before() {
    // SAFETY: geteuid cannot fail.
    if !fuse_available() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: needs root for a small tmpfs");
        return;
    }
    let small = SmallTmpfs::new("async-small", "32M");
    let img = small.dir.join("x.img");
    let mnt = small.dir.with_extension("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let (i, mp) = (img.to_str().unwrap(), mnt.to_str().unwrap());
    ok(nodup(&["mkfs", i, "--size", "128M", "--force"]));
    ok(nodup(&["mount", i, mp, "--async-writes"]));
    let early = b"written and fsynced before the disk filled";
    let mut e = File::create(mnt.join("early")).unwrap();
    e.write_all(early).unwrap();
    e.sync_all().unwrap();
    drop(e);
    // 60 MiB cannot fit in 32: either a write fails, or fsync must.
    let mut rng = StdRng::seed_from_u64(23);
    let mut f = File::create(mnt.join("big")).unwrap();
    let mut failed = None;
    for _ in 0..60 {
        if let Err(e) = f.write_all(&unique(&mut rng)) {
            failed = Some(e);
            break;
        }
    }
    // close(2) through the file's result: the error code of a closed descriptor.
    let close = |fd: std::fs::File| -> std::io::Result<()> {
        // SAFETY: closes a descriptor the File owned; its result is what close(2) reports.
        match unsafe { libc::close(fd.into_raw_fd()) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    };
    // A write that failed after its answer: a close of a duplicate reports it without taking
    // it from the writer's fsync, which reports it once; the last close then has nothing.
    let dup_closed = close(f.try_clone().unwrap());
    let synced = f.sync_all();
    let closed = close(f);
    assert_eq!(
        dup_closed.is_err(),
        synced.is_err(),
        "the close of a duplicate ({dup_closed:?}) and fsync ({synced:?}) tell the same"
    );
    assert!(closed.is_ok(), "fsync took the error: {closed:?}");
    let deferred = synced.is_err();
    let e = failed
        .or(synced.err())
        .expect("60 MiB on a 32 MiB tmpfs: no write and no fsync failed");
    assert!(
        matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EIO)),
        "{e}"
    );
    // The daemon is alive, and what was fsynced before is intact.
    assert_eq!(fs::read(mnt.join("early")).unwrap(), early);
    if deferred {
        // A failure came after an answer: from then on writes are stored before they are
        // answered, so the next one fails at write(2) itself, and none is answered early.
        let before = early_answers(mp);
        let mut g = OpenOptions::new()
            .append(true)
            .open(mnt.join("big"))
            .unwrap();
        let e = g
            .write_all(&unique(&mut rng))
            .expect_err("the disk is still full");
        assert!(
            matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EIO)),
            "{e}"
        );
        assert_eq!(early_answers(mp), before, "answered early after a failure");
    } else {
        eprintln!("no write failed after its answer here: the check after one was skipped");
    }
    let _ = Command::new("fusermount3").arg("-u").arg(&mnt).status();
    wait_unlocked(&img);
    small.resize("256M");
    ok(nodup(&["mount", i, mp]));
    assert_eq!(fs::read(mnt.join("early")).unwrap(), early);
    ok(nodup(&["umount", mp]));
    ok(nodup(&["fsck", i]));
    let _ = fs::remove_dir(&mnt);
}
