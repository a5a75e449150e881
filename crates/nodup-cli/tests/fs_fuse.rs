//! FUSE integration tests: each mounts a real nodup file system with the built `nodup` binary
//! (image in /dev/shm) and drives it with ordinary programs and syscalls.
//!
//! Skipped (with a message) when /dev/fuse or fusermount3 is missing.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;

mod common;
use common::*;

/// Content with many duplicate blocks (`dup`) or unique bytes.
fn content(rng: &mut StdRng, len: usize, dup: bool) -> Vec<u8> {
    if dup {
        let pat = rng.gen_range(0..4u64) as u8;
        (0..len)
            .map(|i| pat.wrapping_mul(31).wrapping_add((i % 4096 % 11) as u8))
            .collect()
    } else {
        let mut v = vec![0u8; len];
        rng.fill(&mut v);
        v
    }
}

fn punch(f: &File, off: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: fallocate on a valid descriptor.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as i64,
            len as i64,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn compare_dirs(a: &Path, b: &Path, names: &[String]) {
    for n in names {
        let (pa, pb) = (a.join(n), b.join(n));
        match (fs::symlink_metadata(&pa), fs::symlink_metadata(&pb)) {
            (Err(_), Err(_)) => {}
            (Ok(ma), Ok(mb)) => {
                assert_eq!(ma.len(), mb.len(), "size of {n}");
                assert_eq!(ma.nlink(), mb.nlink(), "nlink of {n}");
                let (da, db) = (fs::read(&pa).unwrap(), fs::read(&pb).unwrap());
                assert!(da == db, "content of {n} differs");
            }
            (x, y) => panic!(
                "{n}: exists on one side only: {:?} vs {:?}",
                x.is_ok(),
                y.is_ok()
            ),
        }
    }
}
use std::os::unix::fs::MetadataExt;

/// fsx-like: random writes, truncates, punches, renames, links and unlinks, with random and
/// duplicate content, on the mount and on a reference directory in tmpfs; every file is
/// compared after every step.
#[test]
fn random_operations_match_a_reference_directory() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("fsx", "256M", &[]);
    fx.mount(&[]);
    let reference = PathBuf::from(format!("/dev/shm/nodup-test-ref-{}", std::process::id()));
    let _ = fs::remove_dir_all(&reference);
    fs::create_dir_all(&reference).unwrap();
    let seed: u64 = std::env::var("NODUP_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(time_seed);
    eprintln!("random_operations seed = {seed} (NODUP_TEST_SEED to replay)");
    let mut rng = StdRng::seed_from_u64(seed);
    let names: Vec<String> = (0..6).map(|i| format!("f{i}")).collect();
    let dirs = [fx.mnt.clone(), reference.clone()];
    for step in 0..400 {
        let a = &names[rng.gen_range(0..names.len() as u64) as usize];
        let b = &names[rng.gen_range(0..names.len() as u64) as usize];
        let kind = rng.gen_range(0..10u64);
        let off = if rng.gen_bool(0.1) {
            rng.gen_range(0..(1u64 << 20))
        } else {
            rng.gen_range(0..100_000u64)
        };
        let len = rng.gen_range(1..50_000u64) as usize;
        let dup = rng.gen_bool(0.6);
        let data = content(&mut rng, len, dup);
        let size = rng.gen_range(0..120_000u64);
        let mut results = Vec::new();
        for d in &dirs {
            let r: std::io::Result<()> = (|| match kind {
                0..=3 => {
                    let f = OpenOptions::new()
                        .create(true)
                        .write(true)
                        .truncate(false)
                        .open(d.join(a))?;
                    f.write_all_at(&data, off)
                }
                4 => OpenOptions::new()
                    .write(true)
                    .open(d.join(a))?
                    .set_len(size),
                5 => punch(
                    &OpenOptions::new().write(true).open(d.join(a))?,
                    off,
                    len as u64,
                ),
                6 => fs::rename(d.join(a), d.join(b)),
                7 => fs::hard_link(d.join(a), d.join(b)),
                8 => fs::remove_file(d.join(a)),
                _ => {
                    // Read back through a fresh descriptor at a random offset.
                    let mut f = File::open(d.join(a))?;
                    f.seek(SeekFrom::Start(off))?;
                    let mut buf = vec![0u8; len];
                    let n = f.read(&mut buf)?;
                    buf.truncate(n);
                    fs::write(d.join(format!("{a}.read")), &buf).map(|_| ())?;
                    fs::remove_file(d.join(format!("{a}.read")))
                }
            })();
            results.push(r.map_err(|e| e.raw_os_error()));
        }
        assert_eq!(
            results[0], results[1],
            "step {step}: op {kind} on {a}/{b} differs"
        );
        compare_dirs(&fx.mnt, &reference, &names);
    }
    // Everything survives a clean remount and fsck agrees.
    fx.umount_clean("");
    fx.mount(&[]);
    compare_dirs(&fx.mnt, &reference, &names);
    fx.umount();
    let _ = fs::remove_dir_all(&reference);
}

/// A real tree copied in with cp -a, compared, and compared again after a remount.
#[test]
fn real_tree_copy_and_tools() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("tree", "1G", &[]);
    fx.mount(&[]);
    let src = Path::new("/usr/share/doc");
    let st = Command::new("cp")
        .arg("-a")
        .arg(src)
        .arg(fx.path("doc"))
        .status()
        .unwrap();
    assert!(st.success());
    let st = Command::new("cp")
        .arg("-a")
        .arg(src)
        .arg(fx.path("doc2"))
        .status()
        .unwrap();
    assert!(st.success());
    let diff = |p: &str| {
        let o = Command::new("diff")
            .args(["-r", "--no-dereference"])
            .arg(src)
            .arg(fx.path(p))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "diff {p}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    };
    diff("doc");
    diff("doc2");
    let s = fx.stats();
    assert!(
        s["dedup_ratio"].as_f64().unwrap() >= 0.45,
        "second copy must dedup: {s}"
    );
    // Everyday programs work unchanged.
    let sh = |cmd: &str| {
        let o = Command::new("bash")
            .arg("-ec")
            .arg(cmd)
            .current_dir(&fx.mnt)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{cmd}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    };
    if Command::new("rsync").arg("--version").output().is_ok() {
        sh("rsync -a doc/ rs/ && diff -r --no-dereference doc rs");
    }
    sh("tar cf /dev/shm/nodup-test-$$.tar -C doc . && mkdir tx && tar xf /dev/shm/nodup-test-$$.tar -C tx && rm /dev/shm/nodup-test-$$.tar && diff -r --no-dereference doc tx");
    if Command::new("git").arg("--version").output().is_ok() {
        sh("git init -q src && cd src && git config user.email t@e && git config user.name t && \
            cp -a ../doc/git* . 2>/dev/null || true; echo x > f && git add -A && git commit -qm one && cd .. && \
            git clone -q src dst && test -f dst/f && cd dst && git fsck --full 2>&1 | tail -1 && git log --oneline | grep -q one");
    }
    if Command::new("sqlite3").arg("--version").output().is_ok() {
        sh("sqlite3 db.sqlite 'create table t(a,b); with recursive c(x) as (select 1 union all select x+1 from c where x<20000) insert into t select x, hex(randomblob(50)) from c; pragma integrity_check;' | grep -q ok && \
            test $(sqlite3 db.sqlite 'select count(*) from t') = 20000");
    }
    fx.umount();
    fx.mount(&[]);
    diff("doc");
    diff("doc2");
    fx.umount_clean("");
}

/// fio with crc32c verification, on a pmem image and a blockfile image with the writeback cache.
#[test]
fn fio_verify() {
    if !fuse_available() || Command::new("fio").arg("--version").output().is_err() {
        return;
    }
    for (medium, extra) in [("pmem", vec![]), ("blockfile", vec!["--writeback-cache"])] {
        let fx = Fixture::new("fio", "512M", &["--medium", medium]);
        fx.mount(&extra);
        for (rw, bs) in [("randwrite", "4k"), ("write", "1m"), ("randrw", "16k")] {
            let o = Command::new("fio")
                .args([
                    "--name=v",
                    &format!("--directory={}", fx.mnt.display()),
                    "--size=48M",
                    &format!("--rw={rw}"),
                    &format!("--bs={bs}"),
                    "--ioengine=psync",
                    "--verify=crc32c",
                    "--do_verify=1",
                    "--dedupe_percentage=50",
                    "--numjobs=2",
                    "--end_fsync=1",
                    "--output-format=terse",
                    "--verify_state_save=0",
                ])
                .current_dir(&fx.mnt)
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "fio {rw} {bs} on {medium}: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        fx.umount_clean(medium);
    }
}

/// One writer of 1 MiB requests, each split across threads or not (the default), new data
/// written with non-temporal stores (the default) or stores + flushes: the same bytes read back,
/// also from a fresh mount, and the same blocks shared either way (every other MiB repeats an
/// earlier one, so exactly half the data is stored).
#[test]
fn one_large_writer_in_every_write_mode() {
    if !fuse_available() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(11);
    let uniq: Vec<Vec<u8>> = (0..16).map(|_| content(&mut rng, 1 << 20, false)).collect();
    for (split, stream) in [("0", "true"), ("1", "true"), ("1", "false"), ("4", "false")] {
        let case = format!("split {split}, stream-data {stream}");
        let fx = Fixture::new("split", "256M", &[]);
        let stream_opt = format!("--stream-data={stream}");
        let log = fx.img.with_extension("log");
        let log_arg = log.to_str().unwrap();
        let opts = [
            "--split-writes",
            split,
            stream_opt.as_str(),
            "--log-file",
            log_arg,
        ];
        fx.mount(&opts);
        let p = fx.path("big");
        let mut f = File::create(&p).unwrap();
        let mut want = Vec::new();
        for k in 0..32 {
            let chunk = if k % 2 == 0 {
                &uniq[k / 2]
            } else {
                &uniq[k / 4]
            };
            f.write_all(chunk).unwrap();
            want.extend_from_slice(chunk);
        }
        f.sync_all().unwrap();
        drop(f);
        assert!(fs::read(&p).unwrap() == want, "{case}: content");
        let s = fx.stats();
        assert_eq!(s["logical_bytes"].as_u64().unwrap(), 32 << 20, "{s}");
        assert_eq!(
            s["physical_bytes"].as_u64().unwrap(),
            16 << 20,
            "{case}: {s}"
        );
        fx.umount_clean(&case);
        fx.mount(&opts);
        assert!(
            fs::read(&p).unwrap() == want,
            "{case}: content after remount"
        );
        fx.umount_clean(&case);
        let said = fs::read_to_string(&log).unwrap();
        let _ = fs::remove_file(&log);
        let mode = if stream == "true" {
            "non-temporal stores"
        } else {
            "stores + cache-line flushes"
        };
        assert!(said.contains(mode), "{case}: the log names {mode}: {said}");
    }
}

/// Each serving thread's request buffer is a mapping advised for huge pages (`hg` in smaps), so
/// the kernel pins one huge page instead of 256 small ones per 1 MiB WRITE; with
/// `--huge-buffers=false`, advised against them (`nh`). The advice, not the pages: whether the
/// kernel grants huge pages is its business (THP off, no free 2 MiB page). Fails when fuser's
/// buffer no longer has the size `RequestBufferAlloc` looks for.
#[test]
fn request_buffers_are_advised_for_huge_pages() {
    use nodup_fs::fuse::request_buffer::REQUEST_BUFFER_MAPPING;
    if !fuse_available() {
        return;
    }
    for (opt, flag) in [(None, "hg"), (Some("--huge-buffers=false"), "nh")] {
        let fx = Fixture::new("hugebuf", "64M", &[]);
        let mut args = vec!["--threads", "4"];
        args.extend(opt);
        fx.mount(&args);
        fs::write(fx.path("f"), vec![5u8; 4 << 20]).unwrap();
        // The mount is usable before every serving thread has mapped its buffer: wait for them.
        let smaps = format!("/proc/{}/smaps", daemon_pid(&fx.img));
        let want = 4 * REQUEST_BUFFER_MAPPING as u64;
        let mut advised = 0;
        for _ in 0..200 {
            advised = smaps_bytes_flagged(&fs::read_to_string(&smaps).unwrap(), flag);
            if advised >= want {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        assert!(
            advised >= want,
            "{opt:?}: {advised} bytes flagged {flag}, want 4 request buffers of {REQUEST_BUFFER_MAPPING}"
        );
        fx.umount_clean("");
    }
}

/// Bytes of the mappings in `smaps` whose VmFlags include `flag`.
fn smaps_bytes_flagged(smaps: &str, flag: &str) -> u64 {
    let (mut size, mut total) = (0u64, 0u64);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                size = b - a;
            }
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            if flags.split_whitespace().any(|f| f == flag) {
                total += size;
            }
        }
    }
    total
}

/// Several threads write identical content to different files at once.
#[test]
fn parallel_identical_writers() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("par", "512M", &[]);
    fx.mount(&[]);
    let mut rng = StdRng::seed_from_u64(7);
    let data = std::sync::Arc::new(content(&mut rng, 16 << 20, false));
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let p = fx.path(&format!("same{i}"));
            let data = data.clone();
            std::thread::spawn(move || {
                let mut f = File::create(&p).unwrap();
                for chunk in data.chunks(1 << 20) {
                    f.write_all(chunk).unwrap();
                }
                f.sync_all().unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for i in 0..4 {
        assert!(fs::read(fx.path(&format!("same{i}"))).unwrap() == *data);
    }
    let s = fx.stats();
    assert_eq!(s["logical_bytes"].as_u64().unwrap(), 4 * (16 << 20));
    // Concurrent first writes of one block race in the engine (both miss the index and both
    // are written), so how much is shared depends on scheduling; never more than was written.
    let phys = s["physical_bytes"].as_u64().unwrap();
    eprintln!(
        "parallel identical writers: physical {} MiB of 64 MiB logical",
        phys >> 20
    );
    assert!((16 << 20..=64 << 20).contains(&phys), "{s}");
    fx.umount_clean("");
}

/// kill -9 of the daemon during a copy: the next mount recovers, fsck is clean, and every file
/// whose fsync returned is intact.
#[test]
fn crash_during_copy_recovers() {
    if !fuse_available() {
        return;
    }
    for medium in ["pmem", "blockfile"] {
        let fx = Fixture::new("crash", "512M", &["--medium", medium]);
        fx.mount(&[]);
        let pid = daemon_pid(&fx.img);
        let mnt = fx.mnt.clone();
        let writer = std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(11);
            let mut synced: HashMap<String, Vec<u8>> = HashMap::new();
            for i in 0..100_000 {
                let name = format!("file{i}");
                let len = rng.gen_range(1..200_000u64) as usize;
                let dup = rng.gen_bool(0.5);
                let data = content(&mut rng, len, dup);
                let r = (|| -> std::io::Result<()> {
                    let mut f = File::create(mnt.join(&name))?;
                    f.write_all(&data)?;
                    f.sync_all()
                })();
                match r {
                    Ok(()) => {
                        synced.insert(name, data);
                    }
                    Err(_) => break,
                }
            }
            synced
        });
        std::thread::sleep(std::time::Duration::from_millis(1500));
        // SAFETY: sending SIGKILL to the daemon we started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let synced = writer.join().unwrap();
        assert!(
            synced.len() > 5,
            "the writer made too little progress ({})",
            synced.len()
        );
        eprintln!("{medium}: {} files fsynced before the kill", synced.len());
        let _ = Command::new("fusermount3").arg("-u").arg(&fx.mnt).output();
        fx.mount(&[]);
        let s = fx.stats();
        assert_eq!(s["recovery"]["kind"], "failure", "{s}");
        for (name, data) in &synced {
            let got =
                fs::read(fx.path(name)).unwrap_or_else(|e| panic!("{medium}: {name} lost: {e}"));
            assert!(got == *data, "{medium}: {name} changed after the crash");
        }
        fx.umount_clean(medium);
    }
}

/// Not a nodup image, a newer version, a corrupted image: one clear error, non-zero exit,
/// nothing written to the image.
#[test]
fn bad_images_are_refused_untouched() {
    if !fuse_available() {
        return;
    }
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let mnt = std::env::temp_dir().join(format!("nodup-test-{}-bad-{n}.mnt", std::process::id()));
    fs::create_dir_all(&mnt).unwrap();
    let check_refused = |img: &Path, what: &str| {
        let before = fs::read(img).unwrap();
        let o = nodup(&["mount", img.to_str().unwrap(), mnt.to_str().unwrap()]);
        assert!(!o.status.success(), "{what}: mount succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{what}: one-line error expected, got {err:?}"
        );
        assert!(err.contains(what), "{what}: unexpected error {err:?}");
        assert!(
            fs::read(img).unwrap() == before,
            "{what}: image was modified"
        );
    };
    let junk = PathBuf::from(format!(
        "/dev/shm/nodup-test-{}-junk-{n}",
        std::process::id()
    ));
    fs::write(&junk, vec![0x5au8; 8 << 20]).unwrap();
    check_refused(&junk, "not a nodup image");
    let _ = fs::remove_file(&junk);

    let fx = Fixture::new("bad", "64M", &[]);
    let (sb, slot, area) = nodup_fs::superblock::probe_file(&fx.img).unwrap();
    let pristine = fs::read(&fx.img).unwrap();
    // Newer version: both superblock copies claim version + 1 (with valid checksums).
    let mut newer = sb.clone();
    newer.version += 1;
    let f = OpenOptions::new().write(true).open(&fx.img).unwrap();
    for s in 0..2 {
        f.write_all_at(&newer.encode(), (area + s) * 4096).unwrap();
    }
    drop(f);
    check_refused(&fx.img, "version");
    // Corrupted checkpoint.
    fs::write(&fx.img, &pristine).unwrap();
    let f = OpenOptions::new().write(true).open(&fx.img).unwrap();
    f.write_all_at(&[0xff; 16], sb.ckpt_head * 4096 + 40 + 40)
        .unwrap();
    drop(f);
    let _ = slot;
    check_refused(&fx.img, "corrupt");
    let _ = fs::remove_dir(&mnt);
}

/// A full device gives ENOSPC to the application and everything written before stays readable.
#[test]
fn full_device_enospc() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("full", "48M", &[]);
    fx.mount(&[]);
    let mut rng = StdRng::seed_from_u64(5);
    let mut written: Vec<(String, Vec<u8>)> = Vec::new();
    let mut hit = false;
    for i in 0..1000 {
        let name = format!("f{i}");
        let data = content(&mut rng, 1 << 20, false);
        let r = File::create(fx.path(&name))
            .and_then(|mut f| f.write_all(&data).and_then(|_| f.sync_all()));
        match r {
            Ok(()) => written.push((name, data)),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                hit = true;
                break;
            }
        }
    }
    assert!(hit, "never ran out of space");
    assert!(written.len() > 10);
    for (name, data) in &written {
        assert!(fs::read(fx.path(name)).unwrap() == *data, "{name} damaged");
    }
    fx.umount();
    fx.mount(&[]);
    for (name, data) in &written {
        assert!(
            fs::read(fx.path(name)).unwrap() == *data,
            "{name} damaged after remount"
        );
    }
    fx.umount();
    assert!(fx.fsck().status.success());
}
