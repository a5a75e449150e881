//! What an operator meets: guard rails of mkfs and mount, checks that write nothing, space
//! that comes back under churn, a full backing store, fallocate and SEEK_DATA/SEEK_HOLE, `du`
//! against a model, `list` and the daemon log. Each runs the built `nodup` on real mounts.

mod common;
use common::*;

use nodup_core::media::{file_system_type, fs_magic};
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn sha(p: &Path) -> Vec<u8> {
    fs::read(p).unwrap()
}

fn scratch(tag: &str) -> PathBuf {
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    PathBuf::from(format!(
        "/dev/shm/nodup-op-{}-{tag}-{n}",
        std::process::id()
    ))
}

/// A file on a mount opened for reading and writing (created, emptied).
fn open_rw(p: &Path) -> fs::File {
    fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(p)
        .unwrap()
}

/// A libc return value as a result carrying errno.
fn sys(r: i64) -> Result<i64, Option<i32>> {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error())
    } else {
        Ok(r)
    }
}

#[test]
fn mkfs_refuses_what_it_would_destroy() {
    let img = scratch("mk.img");
    let s = img.to_str().unwrap();
    ok(nodup(&["mkfs", s, "--size", "16M"]));
    let before = sha(&img);
    // An existing image, a file with data, a directory: refused, untouched.
    one_line(
        &fail(&nodup(&["mkfs", s, "--size", "16M"])),
        "already holds a nodup image",
    );
    assert!(sha(&img) == before);
    let data = scratch("data");
    fs::write(&data, b"precious").unwrap();
    let e = fail(&nodup(&["mkfs", data.to_str().unwrap(), "--size", "16M"]));
    one_line(&e, "not empty");
    assert_eq!(fs::read(&data).unwrap(), b"precious");
    one_line(
        &fail(&nodup(&["mkfs", "/dev/shm", "--size", "16M"])),
        "not a regular file",
    );
    // --force overwrites.
    ok(nodup(&[
        "mkfs",
        data.to_str().unwrap(),
        "--size",
        "16M",
        "--force",
    ]));
    assert!(nodup_fs::superblock::probe_file(&data).is_ok());
    // Impossible sizes: one line, nothing left behind.
    let huge = scratch("huge.img");
    let h = huge.to_str().unwrap();
    one_line(&fail(&nodup(&["mkfs", h, "--size", "100T"])), "limited to");
    assert!(!huge.exists());
    one_line(&fail(&nodup(&["mkfs", h, "--size", "15T"])), "does not fit");
    assert!(!huge.exists());
    one_line(&fail(&nodup(&["mkfs", h, "--size", "1M"])), "at least");
    one_line(&fail(&nodup(&["mkfs", h])), "--size is required");
    one_line(&fail(&nodup(&["mkfs", h, "--size", "12Q"])), "invalid size");
    // Zero and a number past 64 bits say why, not only "invalid".
    one_line(
        &fail(&nodup(&["mkfs", h, "--size", "0"])),
        "too small, an image needs at least 4.00 MiB",
    );
    one_line(
        &fail(&nodup(&["mkfs", h, "--size", "99999999999999999999"])),
        "too large",
    );
    let e = fail(&nodup(&[
        "mkfs",
        h,
        "--size",
        "16M",
        "--policy",
        "smart",
        "--mem-budget",
        "0",
    ]));
    one_line(&e, "too small, smart needs at least");
    assert!(!huge.exists());
    // A size between whole blocks is rounded down, and the made line says so.
    let out = ok(nodup(&["mkfs", h, "--size", "67108865"]));
    assert!(
        out.contains("64.0 MiB, rounded down to whole 4 KiB blocks"),
        "{out}"
    );
    assert_eq!(fs::metadata(&huge).unwrap().len(), 64 << 20);
    assert!(!ok(nodup(&["mkfs", h, "--size", "64M", "--force"])).contains("rounded"));
    fs::remove_file(&huge).unwrap();
    // Options that mean nothing are refused, not ignored.
    let e = fail(&nodup(&[
        "mkfs",
        h,
        "--size",
        "16M",
        "--policy",
        "none",
        "--mem-budget",
        "1M",
    ]));
    one_line(&e, "--mem-budget");
    // selective takes only a similarity fingerprint.
    one_line(
        &fail(&nodup(&[
            "mkfs",
            h,
            "--size",
            "16M",
            "--policy",
            "selective",
            "--fingerprint",
            "sha256",
        ])),
        "similarity fingerprint",
    );
    // An empty (or unreadable) key file is refused before anything is made.
    one_line(
        &fail(&nodup(&[
            "mkfs",
            h,
            "--size",
            "16M",
            "--encrypt-key-file",
            "/dev/null",
        ])),
        "--encrypt-key-file",
    );
    assert!(!huge.exists());
    let help = ok(nodup(&["mkfs", "--help"]));
    assert!(help.contains("--encrypt-key-file") && help.contains("selective"));
    assert!(!help.contains("later issue"));
    let _ = fs::remove_file(&img);
    let _ = fs::remove_file(&data);
}

/// Kill the daemon of `fx`'s mount (as a crash would) and detach the dead mount.
fn crash(fx: &Fixture) {
    kill_daemon(fx);
    detach(&fx.mnt);
}

#[test]
fn stats_and_fsck_leave_the_image_byte_identical() {
    if !fuse_available() {
        return;
    }
    for medium in ["pmem", "blockfile"] {
        let fx = Fixture::new("ro", "32M", &["--medium", medium]);
        fx.mount(&[]);
        // 25 distinct blocks (the last one partial), written twice.
        let data: Vec<u8> = (0..100_000u32).map(|i| (i / 4096 + 1) as u8).collect();
        fs::write(fx.path("a"), &data).unwrap();
        fs::write(fx.path("b"), &data).unwrap();
        let live = ok(nodup(&["stats", fx.mnt.to_str().unwrap()]));
        assert!(live.contains("Since mount"), "{live}");
        fx.umount();
        let img = fx.img.to_str().unwrap();
        let before = sha(&fx.img);
        let o = nodup(&["stats", img]);
        assert!(
            o.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let st = ok(o);
        assert!(st.contains("dedup 2.00x"), "{st}");
        // Counters since mount mean nothing for an image that is not mounted; JSON keeps them.
        assert!(!st.contains("Since mount"), "{st}");
        let js: serde_json::Value =
            serde_json::from_str(&ok(nodup(&["stats", img, "--json"]))).unwrap();
        assert!(js["blocks_written"].is_u64(), "{js}");
        assert_eq!(js["bytes_saved"], 25 * 4096);
        assert_eq!(js["dedup_factor"].as_f64().unwrap(), 2.0);
        ok(fx.fsck());
        assert!(
            sha(&fx.img) == before,
            "{medium}: stats/fsck wrote to a clean image"
        );
        // A crashed image: stats and fsck report, and still write nothing.
        fx.mount(&[]);
        // Fsynced: a block-file image holds unsynced records in the daemon for up to half a
        // second (design.md, "Durability"), and the kill below would lose them.
        let mut c = fs::File::create(fx.path("c")).unwrap();
        std::io::Write::write_all(&mut c, b"after").unwrap();
        c.sync_all().unwrap();
        drop(c);
        crash(&fx);
        let before = sha(&fx.img);
        // stats says the image needs recovery (one line on stderr, exit 0) and claims no
        // figure recovery rebuilds: space used, bytes saved, dedup factor.
        let o = nodup(&["stats", img]);
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert!(o.status.success(), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains("not unmounted cleanly") && err.contains("fsck --repair"),
            "{err}"
        );
        for key in ["used", "saved", "index"] {
            let l = out.lines().find(|l| l.trim_start().starts_with(key));
            assert!(l.is_some_and(|l| l.contains("unknown")), "{key}: {out}");
        }
        // The index's memory is what recovery rebuilds too: no figure for it.
        let index = out.lines().find(|l| l.trim_start().starts_with("index"));
        assert!(index.is_some_and(|l| !l.contains('B')), "{out}");
        assert!(
            !out.contains("dedup 1.00x") && !out.contains("0 B   data"),
            "{out}"
        );
        let js = json(&nodup(&["stats", img, "--json"]));
        assert_eq!(js["needs_recovery"], true, "{js}");
        for key in [
            "free_blocks",
            "physical_bytes",
            "bytes_saved",
            "dedup_factor",
            "index_memory_bytes",
        ] {
            assert!(js[key].is_null(), "{key} in {js}");
        }
        assert_eq!(js["files"], 3, "{js}");
        let o = fx.fsck();
        assert!(!o.status.success());
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("failure recovery needed"), "{out}");
        // Only that: the allocator and counts recovery rebuilds are not compared before it.
        let problems = out.lines().filter(|l| l.starts_with("problem:")).count();
        assert_eq!(problems, 1, "{out}");
        assert!(
            sha(&fx.img) == before,
            "{medium}: checks wrote to a crashed image"
        );
        fx.mount(&[]);
        assert_eq!(fs::read(fx.path("c")).unwrap(), b"after");
        fx.umount();
        ok(fx.fsck());
    }
    // The policies' own figures of what recovery fills again (smart's fingerprint store,
    // selective's fingerprint cache) are unknown too; their configuration is not.
    for (policy, held, known) in [
        ("smart", "fingerprints", "Smart (memory budget"),
        ("selective", "fingerprint cache", "Selective (hot"),
    ] {
        let fx = Fixture::new(policy, "64M", &["--policy", policy]);
        fx.mount(&[]);
        let data: Vec<u8> = (0..400_000u32).flat_map(|i| i.to_le_bytes()).collect();
        fs::write(fx.path("a"), &data).unwrap();
        fs::write(fx.path("b"), &data).unwrap();
        crash(&fx);
        let img = fx.img.to_str().unwrap();
        let out = ok(nodup(&["stats", img]));
        assert!(out.contains(known), "{policy}: {out}");
        // Counters since the open mean nothing for an image read here (a mount shows them).
        for since in ["hits", "promoted", "store I/O"] {
            assert!(!out.contains(since), "{policy} {since}: {out}");
        }
        let l = out.lines().find(|l| l.trim_start().starts_with(held));
        assert!(
            l.is_some_and(|l| l.contains("unknown")),
            "{policy} {held}: {out}"
        );
        if policy == "smart" {
            let l = out
                .lines()
                .find(|l| l.trim_start().starts_with("dedup memory"));
            assert!(l.is_some_and(|l| l.contains("unknown")), "{out}");
        }
        let js = json(&nodup(&["stats", img, "--json"]));
        let nulls: &[&str] = match policy {
            "smart" => &[
                "/smart/engine/store/fingerprints_on_media",
                "/smart/memory/total_bytes",
                "/smart/memory/fingerprint_store_bytes",
            ],
            _ => &["/selective/fp_cache/entries"],
        };
        for p in nulls {
            assert!(js.pointer(p).is_some_and(|x| x.is_null()), "{p} in {js}");
        }
        // Recovered, the figures are back.
        fx.mount(&[]);
        let live = ok(nodup(&["stats", fx.mnt.to_str().unwrap()]));
        assert!(live.contains("hits"), "{policy}: {live}");
        fx.umount();
        let js = json(&nodup(&["stats", img, "--json"]));
        for p in nulls {
            assert!(
                js.pointer(p).is_some_and(|x| x.as_u64() > Some(0)),
                "{p} in {js}"
            );
        }
    }
    // A `smart` image last mounted with another budget than the one recorded at mkfs: its
    // fingerprint groups were saved for other prefixes. stats and fsck read them as saved
    // (every fingerprint counted) and still write nothing.
    let fx = Fixture::new(
        "ro-smart",
        "64M",
        &["--policy", "smart", "--mem-budget", "64K"],
    );
    fx.mount(&["--mem-budget", "1M"]);
    let data: Vec<u8> = (0..3000u32 * 1024)
        .flat_map(|i| (i ^ 0x5bd1_e995).to_le_bytes())
        .collect();
    fs::write(fx.path("a"), &data).unwrap();
    fx.umount();
    let img = fx.img.to_str().unwrap();
    let before = sha(&fx.img);
    let js: serde_json::Value =
        serde_json::from_str(&ok(nodup(&["stats", img, "--json"]))).unwrap();
    assert_eq!(js["index_entries"], 3000, "{js}");
    assert_eq!(
        js["smart"]["engine"]["store"]["fingerprints_on_media"],
        3000
    );
    let text = ok(nodup(&["stats", img]));
    assert!(text.contains("prefix bits as saved"), "{text}");
    ok(fx.fsck());
    assert!(
        sha(&fx.img) == before,
        "smart: stats/fsck wrote to a clean image"
    );
    fx.mount(&[]);
    assert_eq!(fs::read(fx.path("a")).unwrap(), data);
    fx.umount();
    ok(fx.fsck());
    // Not a mount point, not an image: one line, no errno noise.
    one_line(
        &fail(&nodup(&["stats", "/tmp"])),
        "not a mounted nodup file system",
    );
    one_line(&fail(&nodup(&["stats", "/nonexistent"])), "no such image");
}

#[test]
fn mount_refuses_to_hide_things() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("hide", "16M", &[]);
    let img = fx.img.to_str().unwrap();
    let mnt = fx.mnt.to_str().unwrap();
    fs::write(fx.mnt.join("underneath"), b"x").unwrap();
    one_line(&fail(&nodup(&["mount", img, mnt])), "not empty");
    ok(nodup(&["mount", img, mnt, "--nonempty"]));
    assert!(!fx.path("underneath").exists());
    // Its own mount point is now a mount: a second image is refused there.
    let other = Fixture::new("hide2", "16M", &[]);
    let e = fail(&nodup(&["mount", other.img.to_str().unwrap(), mnt]));
    one_line(&e, "already a mount point");
    one_line(
        &fail(&nodup(&["mount", img, "/tmp/x-y-z-missing"])),
        "mount point",
    );
    let e = fail(&nodup(&["mount", img, other.mnt.to_str().unwrap()]));
    one_line(&e, "already mounted");
    fx.umount();
    assert!(fx.mnt.join("underneath").exists());
    fs::remove_file(fx.mnt.join("underneath")).unwrap();
    let e = fail(&nodup(&["mount", img, mnt, "--threads", "0"]));
    assert!(e.contains("--threads"), "{e}");
}

/// Used bytes as df shows them.
fn df_used(mnt: &Path) -> u64 {
    let c = std::ffi::CString::new(mnt.to_str().unwrap()).unwrap();
    // SAFETY: `c` is NUL terminated; `st` is filled by the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_blocks - st.f_bfree) * st.f_frsize
}

/// Space freed in the file system goes back to what holds the image at a clean unmount: the
/// image file shrinks (pmem and blockfile alike), and what is kept reads back.
#[test]
fn an_unmount_gives_freed_space_back_to_the_image_file() {
    if !fuse_available() {
        return;
    }
    for medium in ["pmem", "blockfile"] {
        let fx = Fixture::new("punch", "256M", &["--medium", medium]);
        let held = || fs::metadata(&fx.img).unwrap().blocks() * 512;
        fx.mount(&[]);
        let mut big = vec![0u8; 64 << 20];
        StdRng::seed_from_u64(9).fill(&mut big);
        fs::write(fx.path("big"), &big).unwrap();
        let keep = b"kept across the unmount\n".repeat(500);
        fs::write(fx.path("keep"), &keep).unwrap();
        fx.umount_clean(medium);
        let full = held();
        assert!(full >= 64 << 20, "{medium}: image holds {full} bytes");
        let log = scratch("punch.log");
        fx.mount(&["--log-file", log.to_str().unwrap()]);
        fs::remove_file(fx.path("big")).unwrap();
        fx.umount_clean(medium);
        // The daemon says what it gave back.
        let text = fs::read_to_string(&log).unwrap();
        let _ = fs::remove_file(&log);
        let mib = text
            .lines()
            .find(|l| l.contains("back to what holds the image"))
            .and_then(|l| {
                l.split(" MiB)")
                    .next()?
                    .rsplit('(')
                    .next()?
                    .parse::<u64>()
                    .ok()
            });
        assert!(mib.is_some_and(|m| m >= 60), "{medium}: {text}");
        let after = held();
        assert!(
            after + (60 << 20) <= full,
            "{medium}: image still holds {after} of {full} bytes after the rm"
        );
        fx.mount(&[]);
        assert!(fs::read(fx.path("keep")).unwrap() == keep, "{medium}");
        // The given-back space is written again without trouble.
        fs::write(fx.path("big"), &big).unwrap();
        assert!(fs::read(fx.path("big")).unwrap() == big, "{medium}");
        fx.umount_clean(medium);
    }
}

/// `fstrim MNT` gives freed space back while mounted (FITRIM, which the kernel forwards to the
/// daemon): the image file shrinks at once, pmem and blockfile alike, what is kept reads
/// back, the space is written again, and a caller without CAP_SYS_ADMIN is refused.
#[test]
fn fstrim_gives_freed_space_back_while_mounted() {
    if !fuse_available() || !is_root() {
        return;
    }
    for medium in ["pmem", "blockfile"] {
        let fx = Fixture::new("fstrim", "256M", &["--medium", medium]);
        let held = || fs::metadata(&fx.img).unwrap().blocks() * 512;
        let log = scratch("fstrim.log");
        fx.mount(&["--log-file", log.to_str().unwrap()]);
        let mut big = vec![0u8; 64 << 20];
        StdRng::seed_from_u64(10).fill(&mut big);
        fs::write(fx.path("big"), &big).unwrap();
        let keep = b"kept across the trim\n".repeat(500);
        fs::write(fx.path("keep"), &keep).unwrap();
        let full = held();
        assert!(full >= 64 << 20, "{medium}: image holds {full} bytes");
        fs::remove_file(fx.path("big")).unwrap();
        // "MNT: 190.9 MiB (200105984 bytes) trimmed", for `fstrim -v ARGS MNT`.
        let fstrim = |args: &[&str]| {
            let out = Command::new("fstrim")
                .arg("-v")
                .args(args)
                .arg(&fx.mnt)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            let bytes = text
                .rsplit('(')
                .next()
                .and_then(|t| t.split(" bytes").next()?.parse::<u64>().ok());
            (
                out.status.success().then_some(bytes).flatten(),
                format!("{text}{err}"),
            )
        };
        // The range and the minimum reach the daemon: a quarter of the image gives back at
        // most that, and a minimum no free run can reach is refused, as ext4 refuses one.
        let (part, text) = fstrim(&["--offset", "64M", "--length", "64M"]);
        assert!(
            part.is_some_and(|b| b > 0 && b <= 64 << 20),
            "{medium}: {text}"
        );
        let (none, text) = fstrim(&["--minimum", "1G"]);
        assert!(
            none.is_none() && text.contains("Invalid argument"),
            "{medium}: {text}"
        );
        let (bytes, text) = fstrim(&[]);
        assert!(bytes.is_some_and(|b| b >= 64 << 20), "{medium}: {text}");
        assert!(bytes > part, "{medium}: {text}");
        let after = held();
        assert!(
            after + (60 << 20) <= full,
            "{medium}: image still holds {after} of {full} bytes after the fstrim"
        );
        assert!(fs::read(fx.path("keep")).unwrap() == keep, "{medium}");
        fs::write(fx.path("big"), &big).unwrap();
        assert!(fs::read(fx.path("big")).unwrap() == big, "{medium}");
        // FITRIM asks for CAP_SYS_ADMIN, as on every Linux file system; a user namespace of
        // its own (where this kernel lets an unprivileged user make one) does not give it.
        let nobody = ["--reuid=65534", "--regid=65534", "--clear-groups"];
        let as_nobody = |cmd: &[&str]| {
            Command::new("setpriv")
                .args(nobody)
                .args(cmd)
                .arg(&fx.mnt)
                .output()
                .unwrap()
        };
        let can_unshare = as_nobody(&["unshare", "-Ur", "test", "-d"])
            .status
            .success();
        for cmd in [&["fstrim"][..], &["unshare", "-Ur", "fstrim"]] {
            if cmd.len() > 1 && !can_unshare {
                continue;
            }
            let out = as_nobody(cmd);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && err.contains("not permitted"),
                "{medium}: {cmd:?}: {err}"
            );
        }
        fx.umount_clean(medium);
        let text = fs::read_to_string(&log).unwrap();
        let _ = fs::remove_file(&log);
        assert!(text.contains("fstrim: gave"), "{medium}: {text}");
        fx.mount(&[]);
        assert!(fs::read(fx.path("keep")).unwrap() == keep, "{medium}");
        assert!(fs::read(fx.path("big")).unwrap() == big, "{medium}");
        fx.umount_clean(medium);
    }
}

/// The log must not fill a small image under churn (the old fixed 256 MiB log limit did after
/// about 30 000 cycles on this image), and the space comes back without a remount.
#[test]
fn churn_on_a_small_image_gives_no_false_enospc() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("churn", "16M", &[]);
    fx.mount(&[]);
    let mut live = Vec::new();
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..(8 << 20) / 8 {
        live.extend_from_slice(&rng.next().to_le_bytes());
    }
    fs::write(fx.path("live"), &live).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let start = df_used(&fx.mnt);
    let out = ok(nodup(&[
        "bench",
        "churn",
        fx.mnt.to_str().unwrap(),
        "--cycles",
        "50000",
    ]));
    assert!(out.contains("cycles_per_second"), "{out}");
    // An idle file system folds its log in within a couple of seconds.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let end = df_used(&fx.mnt);
    assert!(
        end.abs_diff(start) <= 1 << 20,
        "df used {start} before the churn, {end} after"
    );
    assert!(fs::read(fx.path("live")).unwrap() == live);
    fx.umount();
    ok(fx.fsck());
}

/// The disk holding the image fills: writes get ENOSPC (not EIO), the daemon stays up, and
/// once the disk has room again writes go on without a remount, the unmount is clean, and the
/// log holds one line for the error with the number of requests it failed, not one per request.
/// On either medium: the mapped one allocates ahead of its stores, the block file ahead of its
/// writes, so no write fails halfway through what the engine was doing.
#[test]
fn a_full_backing_store_gives_enospc_until_there_is_room_again() {
    if !fuse_available() || !is_root() {
        eprintln!("skipping: needs root for a small tmpfs");
        return;
    }
    for medium in ["pmem", "blockfile"] {
        let small = SmallTmpfs::new("op-small", "32M");
        let img = small.dir.join("x.img");
        let log = scratch("small-log").with_extension("log");
        let mnt = scratch("small-mnt");
        fs::create_dir_all(&mnt).unwrap();
        let (i, mp, l) = (
            img.to_str().unwrap(),
            mnt.to_str().unwrap(),
            log.to_str().unwrap(),
        );
        one_line(
            &fail(&nodup(&["mkfs", i, "--size", "128M", "--medium", medium])),
            "does not fit",
        );
        ok(nodup(&[
            "mkfs", i, "--size", "128M", "--medium", medium, "--force",
        ]));
        ok(nodup(&["mount", i, mp, "--log-file", l]));
        fs::write(mnt.join("early"), b"written before the disk filled").unwrap();
        let mut rng = StdRng::seed_from_u64(9);
        let mut big = vec![0u8; 60 << 20];
        rng.fill(&mut big);
        // The block file's mount keeps writes in the page cache (the writeback cache): the
        // error may come at fsync, as on any file system that allocates at write-back.
        let write_synced = |name: &str, data: &[u8]| -> std::io::Result<()> {
            let mut f = fs::File::create(mnt.join(name))?;
            f.write_all(data)?;
            f.sync_all()
        };
        let e =
            write_synced("big", &big).expect_err(&format!("{medium}: 60 MB cannot fit on 32 MiB"));
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{medium}: {e}");
        // The daemon is alive and serves reads.
        assert_eq!(
            fs::read(mnt.join("early")).unwrap(),
            b"written before the disk filled"
        );
        ok(nodup(&["stats", mp]));
        // Still full (what the failed writes took was given back, but not 60 MB).
        let e = write_synced("more", &big).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{medium}: {e}");
        // Room again: the same mount takes new data.
        small.resize("256M");
        write_synced("after", &big[1 << 20..9 << 20]).unwrap();
        assert!(fs::read(mnt.join("after")).unwrap() == big[1 << 20..9 << 20]);
        ok(nodup(&["umount", mp]));
        ok(nodup(&["fsck", i]));
        ok(nodup(&["mount", i, mp]));
        assert_eq!(
            fs::read(mnt.join("early")).unwrap(),
            b"written before the disk filled"
        );
        assert!(fs::read(mnt.join("after")).unwrap() == big[1 << 20..9 << 20]);
        ok(nodup(&["umount", mp]));
        let text = fs::read_to_string(&log).unwrap();
        let full: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("No space left"))
            .collect();
        assert!(
            !full.is_empty() && full.len() <= 3,
            "{medium}: one line per kind of error and ten seconds: {text}"
        );
        assert!(
            full.iter().any(|l| l.contains("more time")),
            "{medium}: the repeats are counted: {text}"
        );
        assert!(!text.contains("gave up"), "{medium}: {text}");
        // Unmounted while the disk is full again: the final checkpoint writes blocks the
        // checkpoint reserve holds, the engine's save an area taken at the mount, so the
        // unmount is clean. Then mounted on a disk that is full already (the unmount gave
        // back what was freed; the filler takes it): the blocks the unmount kept for this
        // mount's checkpoint reserve, and those a delete frees, make its unmount clean too.
        ok(nodup(&["mount", i, mp]));
        let _ = write_synced("fill", &big);
        let filler = fs::File::create(small.dir.join("filler")).unwrap();
        let mut at = 0;
        let mut fill_disk = || {
            for size in [1 << 20, 4096] {
                while filler.write_all_at(&big[..size], at).is_ok() {
                    at += size as u64;
                }
            }
        };
        fill_disk();
        for round in ["full at the unmount", "full at the mount"] {
            ok(nodup(&["umount", mp]));
            let st = nodup(&["stats", i]);
            let said = String::from_utf8_lossy(&st.stderr);
            assert!(st.status.success(), "{medium}, {round}: {said}");
            assert!(
                !said.contains("not unmounted cleanly"),
                "{medium}, {round}: {said}"
            );
            fill_disk();
            ok(nodup(&["mount", i, mp]));
            assert!(fs::read(mnt.join("after")).unwrap() == big[1 << 20..9 << 20]);
        }
        fs::remove_file(mnt.join("fill")).unwrap();
        ok(nodup(&["umount", mp]));
        assert!(!String::from_utf8_lossy(&nodup(&["stats", i]).stderr).contains("cleanly"));
        let _ = fs::remove_file(&log);
        let _ = fs::remove_dir(&mnt);
    }
}

/// A pmem image copied with its zero blocks made holes (`cp --sparse=always`: its save area's,
/// a file of zeros' data block) onto a disk that is then full: the daemon mounts it and reads
/// every file (a load from a hole through the mapping would take a page the full tmpfs does
/// not have: SIGBUS, the daemon gone, at the open or at the read of the zeros), and once there
/// is room again the image mounts with everything.
#[test]
fn a_sparse_copy_of_a_pmem_image_mounts_and_reads_on_a_full_disk() {
    if !fuse_available() || !is_root() {
        eprintln!("skipping: needs root for a small tmpfs");
        return;
    }
    let (big, small) = (
        SmallTmpfs::new("op-sparse-src", "96M"),
        SmallTmpfs::new("op-sparse-dst", "32M"),
    );
    let (src, img) = (big.dir.join("x.img"), small.dir.join("x.img"));
    let log = scratch("sparse-log").with_extension("log");
    let mnt = scratch("sparse-mnt");
    fs::create_dir_all(&mnt).unwrap();
    let (s, i, mp, l) = (
        src.to_str().unwrap(),
        img.to_str().unwrap(),
        mnt.to_str().unwrap(),
        log.to_str().unwrap(),
    );
    ok(nodup(&["mkfs", s, "--size", "64M", "--medium", "pmem"]));
    ok(nodup(&["mount", s, mp]));
    let mut rng = StdRng::seed_from_u64(11);
    let mut data = vec![0u8; 4 << 20];
    rng.fill(&mut data[..]);
    let zeros = vec![0u8; 64 << 10];
    fs::write(mnt.join("data"), &data).unwrap();
    fs::write(mnt.join("zeros"), &zeros).unwrap();
    ok(nodup(&["umount", mp]));
    let cp = Command::new("cp")
        .args(["--sparse=always", s, i])
        .status()
        .unwrap();
    assert!(cp.success());
    let filler = fs::File::create(small.dir.join("filler")).unwrap();
    let mut at = 0;
    for size in [1 << 20, 4096] {
        while filler.write_all_at(&data[..size], at).is_ok() {
            at += size as u64;
        }
    }
    ok(nodup(&["mount", i, mp, "--log-file", l]));
    assert!(fs::read(mnt.join("data")).unwrap() == data);
    assert!(fs::read(mnt.join("zeros")).unwrap() == zeros);
    ok(nodup(&["stats", mp]));
    // No room for the save area the copy left as holes: the unmount may leave the image to
    // failure recovery (the log says so), but it detaches.
    let _ = nodup(&["umount", mp]);
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("no room on the disk holding the image"),
        "{text}"
    );
    drop(filler);
    fs::remove_file(small.dir.join("filler")).unwrap();
    ok(nodup(&["mount", i, mp]));
    assert!(fs::read(mnt.join("data")).unwrap() == data);
    assert!(fs::read(mnt.join("zeros")).unwrap() == zeros);
    ok(nodup(&["umount", mp]));
    ok(nodup(&["fsck", i]));
    let _ = fs::remove_file(&log);
    let _ = fs::remove_dir(&mnt);
}

#[test]
fn fallocate_never_claims_a_reservation() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("falloc", "64M", &[]);
    fx.mount(&[]);
    let f = open_rw(&fx.path("f"));
    let fa = |mode: i32, off: i64, len: i64| {
        // SAFETY: fallocate on a valid descriptor.
        sys(unsafe { libc::fallocate(f.as_raw_fd(), mode, off, len) } as i64).map(|_| ())
    };
    let before = df_used(&fx.mnt);
    assert_eq!(fa(0, 0, 100 << 30), Err(Some(libc::EOPNOTSUPP)));
    assert_eq!(
        fa(libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20),
        Err(Some(libc::EOPNOTSUPP))
    );
    assert_eq!(f.metadata().unwrap().len(), 0);
    f.write_all_at(&vec![3u8; 64 << 10], 0).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    assert_eq!(fa(punch, 4096, 8192), Ok(()));
    assert_eq!(fa(libc::FALLOC_FL_ZERO_RANGE, 16384, 4096), Ok(()));
    let mut got = vec![0u8; 64 << 10];
    f.read_exact_at(&mut got, 0).unwrap();
    for (i, b) in got.iter().enumerate() {
        let zero = (4096..12288).contains(&i) || (16384..20480).contains(&i);
        assert_eq!(*b, if zero { 0 } else { 3 }, "byte {i}");
    }
    assert!(df_used(&fx.mnt) < before + (1 << 20));
    drop(f);
    fx.umount();
}

#[test]
fn seek_data_and_hole_skip_holes() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("seek", "64M", &[]);
    fx.mount(&[]);
    let f = open_rw(&fx.path("sparse"));
    f.set_len(5 << 30).unwrap();
    f.write_all_at(b"island", 3 << 30).unwrap();
    f.write_all_at(b"tail", (5 << 30) - 4).unwrap();
    // SAFETY: lseek on a valid descriptor.
    let seek = |off: i64, whence: i32| sys(unsafe { libc::lseek(f.as_raw_fd(), off, whence) });
    assert_eq!(seek(0, libc::SEEK_DATA), Ok(3 << 30));
    assert_eq!(seek(0, libc::SEEK_HOLE), Ok(0));
    assert_eq!(seek(3 << 30, libc::SEEK_HOLE), Ok((3 << 30) + 4096));
    assert_eq!(seek((3 << 30) + 5, libc::SEEK_DATA), Ok((3 << 30) + 5));
    assert_eq!(
        seek((3 << 30) + 4096, libc::SEEK_DATA),
        Ok((5 << 30) - 4096)
    );
    assert_eq!(seek((5 << 30) - 1, libc::SEEK_HOLE), Ok(5 << 30));
    assert_eq!(seek(5 << 30, libc::SEEK_DATA), Err(Some(libc::ENXIO)));
    drop(f);
    // cp --sparse=always copies the two data blocks, not 5 GiB.
    let copy = scratch("sparse-copy");
    let st = Command::new("cp")
        .arg("--sparse=always")
        .arg(fx.path("sparse"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(st.success());
    let m = fs::metadata(&copy).unwrap();
    assert_eq!(m.len(), 5 << 30);
    assert!(
        m.blocks() * 512 <= 64 << 10,
        "{} bytes allocated",
        m.blocks() * 512
    );
    let _ = fs::remove_file(&copy);
    fx.umount();
}

/// A file of the `du` model: its 4 KiB blocks (None = hole; the tail zero-padded).
type MFile = Vec<Option<Vec<u8>>>;

/// The `du` model: every stored block of every file (holes excluded), identical content stored
/// once; `files` maps a path to its inode, `inodes` an inode to its blocks.
fn model_du(
    files: &[(PathBuf, usize)],
    inodes: &[MFile],
    paths: &[PathBuf],
) -> Vec<(u64, u64, u64)> {
    let blocks_under = |root: &Path| -> Vec<Vec<u8>> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (p, ino) in files {
            if p.starts_with(root) && seen.insert(*ino) {
                out.extend(inodes[*ino].iter().flatten().cloned());
            }
        }
        out
    };
    let mut total: HashMap<Vec<u8>, u64> = HashMap::new();
    for f in inodes {
        for b in f.iter().flatten() {
            *total.entry(b.clone()).or_default() += 1;
        }
    }
    paths
        .iter()
        .map(|p| {
            let mine = blocks_under(p);
            let logical = mine.len() as u64 * 4096;
            let mut local: HashMap<Vec<u8>, u64> = HashMap::new();
            for b in mine {
                *local.entry(b).or_default() += 1;
            }
            let (mut ex, mut sh) = (0, 0);
            for (b, n) in local {
                if n == total[&b] {
                    ex += 4096;
                } else {
                    sh += 4096;
                }
            }
            (logical, ex, sh)
        })
        .collect()
}

/// Write `f` to `p`: its data blocks only, so its holes stay holes; `len` bytes long.
fn write_model_file(p: &Path, f: &MFile, len: u64) {
    let h = fs::File::create(p).unwrap();
    h.set_len(len).unwrap();
    for (i, b) in f.iter().enumerate() {
        if let Some(b) = b {
            let off = i as u64 * 4096;
            let n = (len - off).min(4096) as usize;
            h.write_all_at(&b[..n], off).unwrap();
        }
    }
}

#[test]
fn du_matches_a_model_on_random_trees() {
    if !fuse_available() {
        return;
    }
    let seed = time_seed();
    eprintln!("du model seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let fx = Fixture::new("du", "64M", &[]);
    fx.mount(&[]);
    // A pool of block contents: files draw from it, so blocks are shared within and across
    // files and directories.
    let pool: Vec<Vec<u8>> = (0..40)
        .map(|_| {
            let mut b = vec![0u8; 4096];
            rng.fill(&mut b);
            b
        })
        .collect();
    let dirs = ["a", "a/b", "a/b/c", "d", "e"];
    for d in dirs {
        fs::create_dir_all(fx.path(d)).unwrap();
    }
    let mut inodes: Vec<MFile> = Vec::new();
    let mut lens: Vec<u64> = Vec::new();
    let mut files: Vec<(PathBuf, usize)> = Vec::new();
    for i in 0..40 {
        let d = dirs[rng.gen_range(0..dirs.len() as u64) as usize];
        let p = fx.path(&format!("{d}/f{i}"));
        let nb = rng.gen_range(0..12u64) as usize;
        let mut f: MFile = (0..nb)
            .map(|_| Some(pool[rng.gen_range(0..pool.len() as u64) as usize].clone()))
            .collect();
        let mut len = nb as u64 * 4096;
        if rng.gen_bool(0.3) && nb > 0 {
            // A partial tail: the stored block is zero-padded.
            len -= rng.gen_range(1..4000u64);
            let keep = (len % 4096) as usize;
            if let Some(Some(b)) = f.last_mut() {
                b[keep..].fill(0);
            }
        }
        if rng.gen_bool(0.3) && nb > 2 {
            f[1] = None;
        }
        write_model_file(&p, &f, len);
        inodes.push(f);
        lens.push(len);
        files.push((p, i));
    }
    // Copies (new inodes with the same blocks and holes) and hard links (the same inode).
    for i in 0..6 {
        let (src, ino) = files[rng.gen_range(0..40u64) as usize].clone();
        let dst = fx.path(&format!("e/copy{i}"));
        if i % 2 == 0 {
            write_model_file(&dst, &inodes[ino], lens[ino]);
            inodes.push(inodes[ino].clone());
            lens.push(lens[ino]);
            files.push((dst, inodes.len() - 1));
        } else {
            fs::hard_link(&src, &dst).unwrap();
            files.push((dst, ino));
        }
    }
    let mut paths: Vec<PathBuf> = dirs.iter().map(|d| fx.path(d)).collect();
    paths.push(fx.mnt.clone());
    paths.extend(files.iter().take(8).map(|(p, _)| p.clone()));
    let want = model_du(&files, &inodes, &paths);
    let mut args = vec!["du", "--json"];
    let ps: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    args.extend(ps.iter().map(|s| s.as_str()));
    let got: serde_json::Value = serde_json::from_str(&ok(nodup(&args))).unwrap();
    for (i, w) in want.iter().enumerate() {
        let g = &got[i];
        assert_eq!(g["path"].as_str().unwrap(), ps[i]);
        let t = (
            g["logical_bytes"].as_u64().unwrap(),
            g["exclusive_bytes"].as_u64().unwrap(),
            g["shared_bytes"].as_u64().unwrap(),
        );
        assert_eq!(t, *w, "{} (seed {seed})", ps[i]);
    }
    // The whole tree has nothing shared outside itself, and its exclusive bytes are what the
    // file system stores.
    let s = fx.stats();
    assert_eq!(want[5].2, 0);
    assert_eq!(want[5].1, s["physical_bytes"].as_u64().unwrap());
    let e = fail(&nodup(&["du", "/tmp"]));
    one_line(&e, "not on a mounted nodup file system");
    fx.umount();
}

#[test]
fn list_shows_the_mount_and_the_daemon_logs() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("list", "16M", &[]);
    let log = scratch("daemon.log");
    fx.mount(&["--log-file", log.to_str().unwrap()]);
    let out = ok(nodup(&["list"]));
    assert!(out.contains(fx.mnt.to_str().unwrap()), "{out}");
    assert!(out.contains("light"), "{out}");
    let pid = daemon_pid(&fx.img);
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    fs::write(fx.path("x"), b"y").unwrap();
    nodup_fs::ctl::command(&fx.mnt, "checkpoint").unwrap();
    fx.umount();
    let text = fs::read_to_string(&log).unwrap();
    for want in [
        "mounting",
        "clean mount, recovery",
        "mounted on",
        "checkpoint",
        "unmounted cleanly",
    ] {
        assert!(
            text.contains(want),
            "{want:?} missing from the log:\n{text}"
        );
    }
    let _ = fs::remove_file(&log);
    let mut f = fs::File::create(fx.mnt.join(".keep")).unwrap();
    f.write_all(b"").unwrap();
    fs::remove_file(fx.mnt.join(".keep")).unwrap();
}

/// `kill -9` the daemon of `fx`'s mount and wait until the mount answers ENOTCONN.
fn kill_daemon(fx: &Fixture) {
    let pid = daemon_pid(&fx.img);
    // SAFETY: a signal to the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_unlocked(&fx.img);
    // The kernel aborts the connection once the dying daemon's /dev/fuse descriptor is closed,
    // which can take a moment after its lock is released.
    let t0 = Instant::now();
    while !fs::metadata(&fx.mnt).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN)) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the mount never died"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A dead mount whose image was removed meanwhile is still detached by `nodup umount`, as the
/// dead-mount message says.
#[test]
fn umount_detaches_a_dead_mount_whose_image_is_gone() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("dead-gone", "16M", &[]);
    fx.mount(&[]);
    kill_daemon(&fx);
    fs::remove_file(&fx.img).unwrap();
    fx.umount();
    let mounted = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mnt = fx.mnt.canonicalize().unwrap();
    assert!(
        !mounted.contains(&format!(" {} ", mnt.display())),
        "still mounted: {mounted}"
    );
}

/// A mount held by an open file: `nodup umount` waits about a second for it, then fails with
/// one line and leaves the file system mounted and working; a file that is closed within that
/// second (a process finishing) does not fail it.
#[test]
fn umount_of_a_busy_mount_retries_briefly_then_fails() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("busy", "16M", &[]);
    fx.mount(&[]);
    fs::write(fx.path("f"), b"data").unwrap();
    let held = fs::File::open(fx.path("f")).unwrap();
    let t0 = std::time::Instant::now();
    let o = nodup(&["umount", fx.mnt.to_str().unwrap()]);
    assert!(!o.status.success());
    one_line(&fail(&o), "the mount is busy, a process still uses it");
    assert!(t0.elapsed() >= std::time::Duration::from_millis(900));
    assert!(is_mounted(&fx.mnt));
    assert_eq!(fs::read(fx.path("f")).unwrap(), b"data");
    drop(held);
    // A process that holds a file a little longer: gone within the second.
    let f = fx.path("f");
    let holder = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("exec 3<'{}'; sleep 0.3", f.display()))
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let o = nodup(&["umount", fx.mnt.to_str().unwrap()]);
    let mut holder = holder;
    let _ = holder.wait();
    assert!(o.status.success(), "{}", fail(&o));
    assert!(!is_mounted(&fx.mnt));
    assert!(fx.fsck().status.success());
}

/// Whether `mnt` is still a mount point (by /proc/self/mountinfo, which asks no daemon).
fn is_mounted(mnt: &Path) -> bool {
    let mnt = mnt.canonicalize().unwrap();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(mnt.to_str().unwrap()))
}

/// A daemon that dies during its clean shutdown (stopped before the unmount, killed while
/// `nodup umount` waits for it) makes `nodup umount` fail with one line, though the file system
/// is detached; the next mount recovers what was synced.
#[test]
fn umount_fails_when_the_clean_shutdown_does_not_finish() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("stopped", "16M", &[]);
    fx.mount(&[]);
    let mut f = fs::File::create(fx.path("kept")).unwrap();
    f.write_all(b"synced before the unmount").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let pid = daemon_pid(&fx.img);
    // SAFETY: signals to the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let umount = Command::new(NODUP)
        .args(["umount", fx.mnt.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The kernel detaches a FUSE mount without its daemon; `nodup umount` then waits for the
    // daemon's clean shutdown, which the kill ends before it begins.
    let t0 = Instant::now();
    while is_mounted(&fx.mnt) {
        assert!(t0.elapsed() < Duration::from_secs(20), "never detached");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let e = fail(&umount.wait_with_output().unwrap());
    one_line(&e, "was not unmounted cleanly");
    assert!(
        e.contains("did not finish") && e.contains("failure recovery"),
        "{e}"
    );
    fx.mount(&[]);
    assert_eq!(
        fs::read(fx.path("kept")).unwrap(),
        b"synced before the unmount"
    );
    fx.umount_clean("after a clean shutdown that did not finish");
}

#[test]
fn a_dead_mount_is_named_as_such_with_the_way_back() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("dead", "16M", &[]);
    fx.mount(&[]);
    let mut f = fs::File::create(fx.path("kept")).unwrap();
    f.write_all(b"synced before the kill").unwrap();
    f.sync_all().unwrap();
    drop(f);
    kill_daemon(&fx);
    let mnt = fx.mnt.to_str().unwrap();
    let file = fx.path("kept");
    for args in [
        vec!["stats", mnt],
        vec!["ctl", mnt, "--checkpoint"],
        vec!["du", file.to_str().unwrap()],
        // Mounting onto it again names nodup's own way to detach it.
        vec!["mount", fx.img.to_str().unwrap(), mnt],
    ] {
        let e = fail(&nodup(&args));
        one_line(&e, "is gone");
        assert!(e.contains(&format!("nodup umount {mnt}")), "{args:?}: {e}");
        assert!(!e.contains("no such"), "{args:?}: {e}");
    }
    let o = nodup(&["list"]);
    let out = String::from_utf8_lossy(&o.stdout);
    let row = out
        .lines()
        .find(|l| l.contains(mnt))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("dead"), "{row}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("is gone"));
    let v: serde_json::Value = serde_json::from_str(&ok(nodup(&["list", "--json"]))).unwrap();
    let m = v
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountpoint"] == mnt)
        .unwrap();
    assert_eq!(m["dead"], true, "{m}");
    // The way back the message gives: umount works without the daemon, the next mount
    // recovers the image. The unclean image is no failure of this unmount (the daemon was
    // gone before it): exit 0, with one warning line.
    let o = nodup(&["umount", mnt]);
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    ok(o);
    one_line(&e, "was already gone");
    fx.mount(&[]);
    assert_eq!(
        fs::read(fx.path("kept")).unwrap(),
        b"synced before the kill"
    );
    fx.umount_clean("after recovering a dead mount");
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    // "nodup 0.1.0 (commit 1a2b3c4)", "-dirty" when built from changed sources, "unknown"
    // outside a git checkout: benchmark reports quote it to name the code behind a figure.
    let v = ok(nodup(&["--version"]));
    let (_, rest) = v
        .trim()
        .split_once(" (commit ")
        .unwrap_or_else(|| panic!("{v}"));
    let id = rest.strip_suffix(')').unwrap_or_else(|| panic!("{v}"));
    let hex = id.strip_suffix("-dirty").unwrap_or(id);
    assert!(
        id == "unknown" || (hex.len() >= 7 && hex.chars().all(|c| c.is_ascii_hexdigit())),
        "{v}"
    );
    if let Ok(o) = Command::new("git").args(["rev-parse", "HEAD"]).output() {
        let head = String::from_utf8_lossy(&o.stdout);
        if o.status.success() && id != "unknown" {
            assert!(head.starts_with(hex), "{v} vs HEAD {head}");
        }
    }
}

/// `nodup` with a time limit: a command that blocks (in an open of a FIFO) fails the test
/// instead of hanging it.
fn nodup_within(args: &[&str], secs: u64) -> std::process::Output {
    let mut child = Command::new(NODUP)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("nodup {args:?} still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn commands_refuse_a_fifo_as_an_image() {
    let fifo = scratch("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mnt = scratch("fifo.mnt");
    fs::create_dir(&mnt).unwrap();
    let (f, m) = (fifo.to_str().unwrap(), mnt.to_str().unwrap());
    for args in [
        vec!["stats", f],
        vec!["fsck", f],
        vec!["fsck", "--repair", f],
        vec!["mount", f, m],
    ] {
        let e = fail(&nodup_within(&args, 10));
        one_line(&e, "not a regular file or block device");
    }
    let _ = fs::remove_file(&fifo);
    let _ = fs::remove_dir(&mnt);
}

#[test]
fn a_mem_budget_beyond_the_machine_is_refused_up_front() {
    let huge = scratch("budget.img");
    let h = huge.to_str().unwrap();
    let args = ["--size", "64M", "--policy", "smart", "--mem-budget", "1T"];
    let mut mk = vec!["mkfs", h];
    mk.extend_from_slice(&args);
    one_line(&fail(&nodup(&mk)), "--mem-budget 1T");
    assert!(!huge.exists(), "a refused mkfs left {h} behind");
    // Over a valid image with --force: refused before the old image is touched.
    ok(nodup(&["mkfs", h, "--size", "16M", "--policy", "smart"]));
    let before = sha(&huge);
    mk.push("--force");
    one_line(&fail(&nodup(&mk)), "--mem-budget 1T");
    assert!(sha(&huge) == before, "the old image changed");
    // mount's override: the same check, before any daemon starts.
    let mnt = scratch("budget.mnt");
    fs::create_dir(&mnt).unwrap();
    let m = mnt.to_str().unwrap();
    let o = nodup(&["mount", h, m, "--mem-budget", "1T"]);
    // Should it have mounted after all, leave nothing mounted behind.
    detach(Path::new(m));
    one_line(&fail(&o), "--mem-budget 1T");
    wait_unlocked(&huge);
    // A budget recorded in the image beyond this machine (made on a larger one; here forged):
    // mount, stats and fsck say so in one line instead of aborting on the allocation, and a
    // mount with its own --mem-budget works.
    let (medium, _) = nodup_fs::image::open_with(&huge, true).unwrap();
    let mut sb = nodup_core::engine::superblock::Superblock::load(&*medium).unwrap();
    drop(medium);
    sb.params.mem_budget = 1 << 50;
    fs::OpenOptions::new()
        .write(true)
        .open(&huge)
        .unwrap()
        .write_all_at(&sb.encode(), 0)
        .unwrap();
    let before = sha(&huge);
    for cmd in [vec!["stats", h], vec!["fsck", h], vec!["mount", h, m]] {
        one_line(&fail(&nodup(&cmd)), "more than this machine's memory");
    }
    detach(Path::new(m));
    assert!(sha(&huge) == before, "a refused open changed the image");
    if fuse_available() {
        ok(nodup(&["mount", h, m, "--mem-budget", "4M"]));
        ok(nodup(&["umount", m]));
    }
    wait_unlocked(&huge);
    let _ = fs::remove_file(&huge);
    let _ = fs::remove_dir(&mnt);
}

#[test]
fn ctl_writes_only_to_the_root_of_a_nodup_mount() {
    let no_ctl = |p: &Path| {
        let e = getxattr(p, nodup_fs::ctl::CTL_XATTR).unwrap_err();
        assert!(
            matches!(e.raw_os_error(), Some(libc::ENODATA) | Some(libc::ENOTSUP)),
            "{}: {e}",
            p.display()
        );
    };
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("nodup-op-{}-ctl-{n}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let file = dir.join("plain");
    fs::write(&file, b"x").unwrap();
    for p in [&dir, &file] {
        for flag in [["--checkpoint", ""], ["--worker-rate", "5"]] {
            let mut args = vec!["ctl", p.to_str().unwrap()];
            args.extend(flag.iter().filter(|a| !a.is_empty()));
            one_line(&fail(&nodup(&args)), "not a mounted nodup file system");
            no_ctl(p);
        }
    }
    let _ = fs::remove_dir_all(&dir);
    if !fuse_available() {
        return;
    }
    // Inside a mount: a subdirectory and a file are not its root.
    let fx = Fixture::new("ctl", "16M", &[]);
    fx.mount(&[]);
    fs::create_dir(fx.path("sub")).unwrap();
    fs::write(fx.path("f"), b"x").unwrap();
    for p in [fx.path("sub"), fx.path("f")] {
        let e = fail(&nodup(&["ctl", p.to_str().unwrap(), "--checkpoint"]));
        one_line(&e, "not a mounted nodup file system");
        no_ctl(&p);
    }
    // A bind mount of a directory inside the mount is the root of a nodup mount in the mount
    // table, yet not the file system's root: what is sent must be which mount the opened
    // directory is on, and where in it.
    // (Bind mounts need root.)
    if is_root() {
        let bind =
            std::env::temp_dir().join(format!("nodup-op-{}-ctl-bind-{n}", std::process::id()));
        fs::create_dir_all(&bind).unwrap();
        let st = Command::new("mount")
            .arg("--bind")
            .arg(fx.path("sub"))
            .arg(&bind)
            .status()
            .unwrap();
        assert!(st.success(), "bind mount of {}", fx.path("sub").display());
        let o = nodup(&["ctl", bind.to_str().unwrap(), "--checkpoint"]);
        let _ = Command::new("umount").arg(&bind).status();
        let _ = fs::remove_dir(&bind);
        one_line(&fail(&o), "not a mounted nodup file system");
        no_ctl(&fx.path("sub"));
    }
    ok(nodup(&["ctl", fx.mnt.to_str().unwrap(), "--checkpoint"]));
    fx.umount();
}

#[test]
fn mount_names_a_log_file_it_cannot_write() {
    let img = scratch("log.img");
    let i = img.to_str().unwrap();
    ok(nodup(&["mkfs", i, "--size", "16M"]));
    let mnt = scratch("log.mnt");
    fs::create_dir(&mnt).unwrap();
    let m = mnt.to_str().unwrap();
    for log in ["/nonexistent-nodup-dir/sub/log", "/dev/shm"] {
        let o = nodup(&["mount", i, m, "--log-file", log]);
        detach(Path::new(m));
        one_line(&fail(&o), &format!("{log}: log file"));
    }
    wait_unlocked(&img);
    let _ = fs::remove_file(&img);
    let _ = fs::remove_dir(&mnt);
}

#[test]
fn mkfs_refuses_a_fingerprint_its_policy_ignores() {
    let img = scratch("fp.img");
    let i = img.to_str().unwrap();
    for (policy, fp) in [
        ("strong", "crc32c"),
        ("strong", "xxh3"),
        ("none", "sha256"),
        ("weak-verify", "xxh3"),
    ] {
        let o = nodup(&[
            "mkfs",
            i,
            "--size",
            "16M",
            "--policy",
            policy,
            "--fingerprint",
            fp,
        ]);
        one_line(&fail(&o), &format!("--fingerprint {fp}"));
        assert!(!img.exists(), "{policy} {fp}: image made");
    }
    // What a policy uses is accepted and recorded.
    let out = ok(nodup(&[
        "mkfs",
        i,
        "--size",
        "16M",
        "--policy",
        "strong",
        "--fingerprint",
        "blake3",
    ]));
    assert!(out.contains("fingerprint blake3"), "{out}");
    let _ = fs::remove_file(&img);
}

#[test]
fn the_mount_helper_names_the_o_options_typed() {
    // mount(8) runs `mount.fuse.nodup IMAGE DIR -o OPTS`: the binary under that name.
    let dir = tempfile::tempdir().unwrap();
    let helper = dir.path().join("mount.fuse.nodup");
    std::os::unix::fs::symlink(NODUP, &helper).unwrap();
    let fx = Fixture::new("helper", "16M", &[]);
    for (o, says) in [
        ("eviction=lru", "eviction, selectivity"),
        ("mem_budget=1M", "mem_budget: policy light"),
        ("fp_cache=64K", "fp_cache, prefetch_cache"),
    ] {
        let out = Command::new(&helper)
            .arg(&fx.img)
            .arg(&fx.mnt)
            .args(["-o", o])
            .output()
            .unwrap();
        let e = fail(&out);
        one_line(&e, says);
        assert!(!e.contains("--"), "{o}: a command-line flag named in {e:?}");
    }
}

/// A pmem image on a disk's file system (here /var/tmp, skipped where that is tmpfs) mounts,
/// says in its log that every fence is an msync and which option gathers small writes, keeps
/// what a writer fsynced with and without that option, and checks clean.
/// On one boot the round trip cannot tell an msync from a store fence (both read the cache):
/// the core test `a_fence_on_a_disk_file_system_writes_the_store_back` shows the write-back.
#[test]
fn a_pmem_image_on_a_disk_file_system_fences_by_msync() {
    if !fuse_available() {
        return;
    }
    let Ok(dir) = tempfile::tempdir_in("/var/tmp") else {
        eprintln!("skipping: no /var/tmp");
        return;
    };
    if statfs_magic(dir.path()) == fs_magic::TMPFS {
        eprintln!("skipping: /var/tmp is a tmpfs");
        return;
    }
    let (img, mnt, log) = (
        dir.path().join("x.img"),
        dir.path().join("mnt"),
        dir.path().join("log"),
    );
    fs::create_dir(&mnt).unwrap();
    let (i, mp, l) = (
        img.to_str().unwrap(),
        mnt.to_str().unwrap(),
        log.to_str().unwrap(),
    );
    let mk = nodup(&["mkfs", i, "--size", "64M", "--medium", "pmem"]);
    assert!(mk.status.success(), "{mk:?}");
    let note = String::from_utf8_lossy(&mk.stderr);
    assert!(
        note.contains("pmem image on a file system with a page cache"),
        "{note}"
    );
    ok(nodup(&["mount", i, mp, "--log-file", l]));
    let data: Vec<u8> = (0..(1u32 << 20)).map(|n| (n * 31 % 251) as u8).collect();
    {
        let mut f = fs::File::create(mnt.join("f")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    ok(nodup(&["umount", mp]));
    let said = fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("written back by msync at every fence"),
        "{said}"
    );
    // msyncs in every request make small writes crawl (2.9 MiB/s at 4 KiB on the root ext4
    // here): the log names the option that gathers them.
    assert!(said.contains("--writeback-cache gathers them"), "{said}");
    // With it, small writes reach the image at fsync.
    let log2 = dir.path().join("log2");
    let l2 = log2.to_str().unwrap();
    ok(nodup(&[
        "mount",
        i,
        mp,
        "--writeback-cache",
        "--log-file",
        l2,
    ]));
    assert!(fs::read(mnt.join("f")).unwrap() == data);
    {
        let mut g = fs::File::create(mnt.join("g")).unwrap();
        for c in data.chunks(4096) {
            g.write_all(c).unwrap();
        }
        g.sync_all().unwrap();
    }
    ok(nodup(&["umount", mp]));
    let said = fs::read_to_string(&log2).unwrap();
    assert!(said.contains("writeback cache: writes are kept"), "{said}");
    assert!(!said.contains("--writeback-cache gathers them"), "{said}");
    ok(nodup(&["mount", i, mp]));
    assert!(fs::read(mnt.join("g")).unwrap() == data);
    ok(nodup(&["umount", mp]));
    assert!(ok(nodup(&["fsck", i])).contains("consistent"));
}

/// mkfs makes the new image's name durable, for both media: it fsyncs the image's directory
/// once the file exists (a file's own fsync does not cover the entry naming it, so a power loss
/// after mkfs returned could leave no image there). No power loss can be staged on this
/// machine's disk, so strace shows the call; skipped without strace.
#[test]
fn mkfs_makes_the_new_image_name_durable() {
    // Skipped without strace, or where tracing is not permitted (a container without ptrace).
    let traces = Command::new("strace")
        .args(["-o", "/dev/null", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !traces {
        eprintln!("skipping: strace is missing or cannot trace here");
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let real = dir.path().canonicalize().unwrap();
    for medium in ["blockfile", "pmem"] {
        let (img, trace) = (real.join(format!("{medium}.img")), real.join("trace"));
        let out = Command::new("strace")
            .args(["-f", "-y", "-e", "trace=fsync", "-o"])
            .arg(&trace)
            .arg(env!("CARGO_BIN_EXE_nodup"))
            .arg("mkfs")
            .arg(&img)
            .args(["--size", "64M", "--medium", medium])
            .output()
            .unwrap();
        assert!(out.status.success(), "{medium}: {out:?}");
        let t = fs::read_to_string(&trace).unwrap();
        let named = format!("<{}>)", real.display());
        assert!(
            t.lines()
                .any(|l| l.contains("fsync(") && l.contains(&named) && l.ends_with("= 0")),
            "{medium}: no fsync of {} in\n{t}",
            real.display()
        );
    }
}

/// An image on a file system that cannot allocate ahead (here a nodup mount, which refuses
/// plain `fallocate` as a deduplicating copy-on-write store must) is named as such by mkfs and
/// in the mount's log, and works all the same; an image in /dev/shm is not.
#[test]
fn an_image_where_fallocate_is_unsupported_is_named_at_mkfs_and_mount() {
    if !fuse_available() {
        return;
    }
    let says = "cannot allocate space ahead of a write";
    let (outer, a, b) = (scratch("nf.img"), scratch("nf.a"), scratch("nf.b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    // Whatever happens, the inner mount goes first, then the outer one and the files.
    struct Cleanup(PathBuf, PathBuf, PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            detach(&self.2);
            detach(&self.1);
            let _ = fs::remove_dir(&self.2);
            let _ = fs::remove_dir(&self.1);
            wait_unlocked(&self.0);
            let _ = fs::remove_file(&self.0);
            let _ = fs::remove_file(self.0.with_extension("log"));
        }
    }
    let _cleanup = Cleanup(outer.clone(), a.clone(), b.clone());
    let (o, am, bm) = (
        outer.to_str().unwrap(),
        a.to_str().unwrap(),
        b.to_str().unwrap(),
    );
    let mk = nodup(&["mkfs", o, "--size", "256M"]);
    assert!(mk.status.success(), "{mk:?}");
    assert!(!String::from_utf8_lossy(&mk.stderr).contains(says));
    ok(nodup(&["mount", o, am]));
    let inner = a.join("inner.img");
    let (i, log) = (inner.to_str().unwrap(), outer.with_extension("log"));
    let mk = nodup(&["mkfs", i, "--size", "32M"]);
    assert!(mk.status.success(), "{mk:?}");
    let note = String::from_utf8_lossy(&mk.stderr);
    assert!(note.contains(says), "{note}");
    ok(nodup(&[
        "mount",
        i,
        bm,
        "--log-file",
        log.to_str().unwrap(),
    ]));
    fs::write(b.join("f"), b"kept").unwrap();
    ok(nodup(&["umount", bm]));
    let said = fs::read_to_string(&log).unwrap();
    assert!(said.contains(says), "{said}");
    ok(nodup(&["mount", i, bm]));
    assert_eq!(fs::read(b.join("f")).unwrap(), b"kept");
    ok(nodup(&["umount", bm]));
    ok(nodup(&["umount", am]));
}

/// An image on a copy-on-write file system (btrfs on a loop device over a sparse file in
/// /dev/shm), where even a rewrite needs new space at write-back, is named as such by mkfs and
/// in the mount's log, and works all the same; one on /var/tmp (ext4 here) is not. Skipped
/// without root, loop devices or mkfs.btrfs.
#[test]
fn an_image_on_a_copy_on_write_file_system_is_named_at_mkfs_and_mount() {
    if !fuse_available() || !is_root() {
        return;
    }
    let says = "a copy-on-write file system";
    let plain = tempfile::tempdir_in("/var/tmp").unwrap();
    let p = plain.path().join("x.img");
    let mk = nodup(&["mkfs", p.to_str().unwrap(), "--size", "16M"]);
    assert!(mk.status.success(), "{mk:?}");
    if statfs_magic(plain.path()) != fs_magic::BTRFS {
        assert!(!String::from_utf8_lossy(&mk.stderr).contains(says));
    }
    let (file, dir, mnt) = (scratch("cow.disk"), scratch("cow.fs"), scratch("cow.mnt"));
    // Undone in reverse: the nodup mount, the btrfs and its loop device, then the file.
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = fs::remove_file(&self.0);
        }
    }
    let _file = Remove(file.clone());
    fs::File::create(&file).unwrap().set_len(256 << 20).unwrap();
    let made = Command::new("mkfs.btrfs")
        .arg("-q")
        .arg(&file)
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        eprintln!("skipping: no mkfs.btrfs here");
        return;
    }
    let Some(_btrfs) = LoopMount::new(&file, &dir) else {
        return;
    };
    struct Fuse(PathBuf);
    impl Drop for Fuse {
        fn drop(&mut self) {
            detach(&self.0);
            let _ = fs::remove_dir(&self.0);
        }
    }
    fs::create_dir_all(&mnt).unwrap();
    let _fuse = Fuse(mnt.clone());
    let img = dir.join("x.img");
    let (i, m) = (img.to_str().unwrap(), mnt.to_str().unwrap());
    let log = dir.join("log");
    let mk = nodup(&["mkfs", i, "--size", "32M"]);
    assert!(mk.status.success(), "{mk:?}");
    let note = String::from_utf8_lossy(&mk.stderr);
    assert!(note.contains(&format!("is on btrfs, {says}")), "{note}");
    ok(nodup(&["mount", i, m, "--log-file", log.to_str().unwrap()]));
    fs::write(mnt.join("f"), b"kept").unwrap();
    ok(nodup(&["umount", m]));
    let said = fs::read_to_string(&log).unwrap();
    assert!(said.contains(&format!("is on btrfs, {says}")), "{said}");
    ok(nodup(&["mount", i, m]));
    assert_eq!(fs::read(mnt.join("f")).unwrap(), b"kept");
    ok(nodup(&["umount", m]));
}

/// A file-system image file attached to a loop device and mounted on a directory (created),
/// all undone when dropped: the directory is unmounted lazily, the device detached and the
/// directory removed.
struct LoopMount {
    dir: PathBuf,
    dev: String,
}

impl LoopMount {
    /// `file` mounted on `dir`; `None`, after a line on stderr, where there is no loop device.
    fn new(file: &Path, dir: &Path) -> Option<LoopMount> {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .ok()
            .filter(|o| o.status.success());
        let Some(out) = out else {
            eprintln!("skipping: no loop device here");
            return None;
        };
        fs::create_dir_all(dir).unwrap();
        let lm = LoopMount {
            dir: dir.to_path_buf(),
            dev: String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        };
        let mounted = Command::new("mount")
            .arg(&lm.dev)
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(mounted, "mount {} on {}", lm.dev, dir.display());
        Some(lm)
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = fs::remove_dir(&self.dir);
    }
}

/// The file-system type (statfs f_type) of `p`.
fn statfs_magic(p: &Path) -> i64 {
    file_system_type(&fs::File::open(p).unwrap()).unwrap()
}

/// `nodup fsck` of an image whose last write-back failed after its writer was gone (the kernel
/// could not write pages stored into a hole, and nobody fenced them) says so on stderr, checks
/// what reached the disk, and a mount after it is not failed by that old error. The image is a
/// block file on an ext4 on a loop device over a small tmpfs: once the tmpfs is full, the
/// ext4's write-back of blocks it newly takes fails.
#[test]
fn fsck_reports_a_write_back_that_failed_before_it_opened_the_image() {
    if !fuse_available() || !is_root() {
        return;
    }
    let run = |cmd: &mut Command| cmd.output().map(|o| o.status.success()).unwrap_or(false);
    let disk = SmallTmpfs::new("op-wb", "64M");
    let file = disk.dir.join("ext4");
    fs::File::create(&file).unwrap().set_len(48 << 20).unwrap();
    let ext4 = scratch("wb-ext4");
    fs::create_dir_all(&ext4).unwrap();
    let made = run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&file))
        && run(Command::new("fallocate").args(["-l", "48M"]).arg(&file));
    if !made {
        eprintln!("skipping: no mkfs.ext4 here");
        let _ = fs::remove_dir(&ext4);
        return;
    }
    let Some(_ext4) = LoopMount::new(&file, &ext4) else {
        let _ = fs::remove_dir(&ext4);
        return;
    };
    let img = ext4.join("x.img");
    let i = img.to_str().unwrap();
    ok(nodup(&[
        "mkfs",
        i,
        "--size",
        "16M",
        "--medium",
        "blockfile",
    ]));
    // Free blocks of the ext4 become holes of the tmpfs file, then the tmpfs is filled.
    assert!(run(Command::new("fstrim").arg(&ext4)));
    let filler = disk.dir.join("filler");
    {
        let f = fs::File::create(&filler).unwrap();
        let chunk = vec![1u8; 64 << 10];
        let mut at = 0u64;
        while f.write_all_at(&chunk, at).is_ok() {
            at += chunk.len() as u64;
        }
    }
    // A store into a hole at the image's end (free space nodup reads as zeros), never fenced;
    // its write-back fails.
    {
        let f = fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all_at(&[0xa5u8; 64 << 10], (16 << 20) - (64 << 10))
            .unwrap();
    }
    // SAFETY: sync(2) takes no arguments.
    unsafe { libc::sync() };
    fs::remove_file(&filler).unwrap();
    let fsck = nodup(&["fsck", i]);
    let err = String::from_utf8_lossy(&fsck.stderr).into_owned();
    assert!(
        err.contains("a write-back of the image failed before this open"),
        "{err}"
    );
    assert!(
        String::from_utf8_lossy(&fsck.stdout).contains("consistent"),
        "{err}"
    );
    let mnt = scratch("wb-mnt");
    fs::create_dir_all(&mnt).unwrap();
    let mp = mnt.to_str().unwrap();
    ok(nodup(&["mount", i, mp]));
    fs::write(mnt.join("f"), b"after").unwrap();
    ok(nodup(&["umount", mp]));
    let _ = fs::remove_dir(&mnt);
    assert!(ok(nodup(&["fsck", i])).contains("consistent"));
}
