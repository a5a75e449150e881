//! Round trips through real mounts of the null file system: over FUSE-over-io_uring (with
//! `fuse.enable_uring` set for the duration) and over classic /dev/fuse. Skipped, with a line
//! saying why, when not root, without /dev/fuse, or when the kernel has no ring support.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nodup_uring_null::sink::fold;

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

fn can_mount() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: needs root and /dev/fuse");
        return false;
    }
    true
}

/// `enable_uring` set to Y until dropped, then back to what it was.
struct UringParam {
    old: String,
}

impl UringParam {
    fn enable() -> Option<Self> {
        let old = match fs::read_to_string(PARAM) {
            Ok(s) => s.trim().to_string(),
            Err(e) => {
                eprintln!("skipped: {PARAM}: {e} (kernel without CONFIG_FUSE_IO_URING?)");
                return None;
            }
        };
        if let Err(e) = fs::write(PARAM, "Y") {
            eprintln!("skipped: cannot set {PARAM}: {e}");
            return None;
        }
        Some(UringParam { old })
    }
}

impl Drop for UringParam {
    fn drop(&mut self) {
        let _ = fs::write(PARAM, &self.old);
    }
}

/// The daemon, mounted and ready.
struct Daemon {
    child: Child,
    lines: mpsc::Receiver<String>,
    ready: String,
}

fn start(mnt: &Path, args: &[&str]) -> Daemon {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodup-uring-null"))
        .arg(mnt)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the daemon");
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let ready = match lines.recv_timeout(Duration::from_secs(10)) {
        Ok(l) if l.starts_with("ready ") => l,
        other => {
            let _ = child.kill();
            panic!("daemon not ready: {other:?}, exit {:?}", child.wait());
        }
    };
    Daemon {
        child,
        lines,
        ready,
    }
}

impl Drop for Daemon {
    /// A failed assertion must not leave the daemon serving (and holding our output pipes).
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill on the pid of a child we started and have not reaped.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = self.child.wait();
        }
    }
}

/// SIGTERM the daemon; returns its `served ring=N classic=M` counts once it has unmounted.
fn stop(d: Daemon, mnt: &Path) -> (u64, u64) {
    let line = stop_line(d, mnt);
    (field(&line, "ring="), field(&line, "classic="))
}

/// The number after `key` in the daemon's `served ...` line.
fn field(line: &str, key: &str) -> u64 {
    let v = line.split_whitespace().find_map(|w| w.strip_prefix(key));
    v.and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

/// SIGTERM the daemon; its `served ...` line once it has unmounted.
fn stop_line(mut d: Daemon, mnt: &Path) -> String {
    // SAFETY: kill on the pid of a child we started and have not reaped.
    unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    let status = d.child.wait().expect("wait for the daemon");
    assert!(status.success(), "daemon exit: {status}");
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    assert!(
        !mounts.contains(&format!(" {} ", mnt.display())),
        "still mounted"
    );
    d.lines
        .recv_timeout(Duration::from_secs(5))
        .expect("served line")
}

/// Write (a 1 MiB block at an offset, then a short tail), fsync, stat, read back, and the
/// name semantics the file system has: exclusive create of an existing name, unlink.
fn round_trip(mnt: &Path) {
    let path = mnt.join("f");
    let mut f = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&path)
        .expect("create");
    let block = vec![0xa5u8; 1 << 20];
    f.write_all_at(&block, 4096).expect("write 1 MiB");
    f.seek(SeekFrom::Start(4096 + (1 << 20))).expect("seek");
    f.write_all(b"tail").expect("write tail");
    f.sync_all().expect("fsync");
    let want = 4096 + (1 << 20) + 4;
    assert_eq!(fs::metadata(&path).expect("stat").len(), want);
    assert_eq!(f.metadata().expect("fstat").len(), want);
    drop(f);
    // A null file system keeps sizes, not data: what comes back is zeros, all of them.
    let mut back = Vec::new();
    File::open(&path)
        .expect("open")
        .read_to_end(&mut back)
        .expect("read");
    assert_eq!(back.len() as u64, want);
    assert!(back.iter().all(|&b| b == 0));
    let again = OpenOptions::new().create_new(true).write(true).open(&path);
    assert_eq!(
        again.map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::AlreadyExists
    );
    fs::remove_file(&path).expect("unlink");
    assert!(!path.exists());
    // A burst: with the writeback cache the kernel keeps many WRITEs in flight at once, more
    // than one ring queue has entries (each must come back through COMMIT_AND_FETCH).
    let path = mnt.join("burst");
    let mut f = File::create(&path).expect("create burst");
    let page = [1u8; 4096];
    for _ in 0..4096 {
        f.write_all(&page).expect("write 4 KiB");
    }
    f.sync_all().expect("fsync burst");
    assert_eq!(fs::metadata(&path).expect("stat burst").len(), 16 << 20);
}

#[test]
fn ring_round_trip() {
    if !can_mount() {
        return;
    }
    // One test for both variants: the kernel switch is global, so they must not overlap.
    for args in [&[][..], &["--writeback-cache"][..]] {
        let Some(param) = UringParam::enable() else {
            return;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let d = start(dir.path(), args);
        // The connection keeps the ring once registered; the switch need not stay on.
        drop(param);
        assert!(d.ready.contains("transport=uring"), "{}", d.ready);
        let wb = !args.is_empty();
        assert!(
            d.ready.contains(&format!("writeback_cache={wb}")),
            "{}",
            d.ready
        );
        round_trip(dir.path());
        let (ring, _classic) = stop(d, dir.path());
        // create, write x2, fsync, getattr, lookups, open, read, release, unlink at least.
        assert!(ring >= 8, "only {ring} requests over the ring ({args:?})");
    }
}

#[test]
fn classic_round_trip() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(dir.path(), &["--classic", "--threads", "2"]);
    assert!(d.ready.contains("transport=classic"), "{}", d.ready);
    round_trip(dir.path());
    let (ring, classic) = stop(d, dir.path());
    assert_eq!(ring, 0);
    assert!(classic >= 8, "only {classic} requests served");
}

/// Each reference data path (`--sink`) takes every byte written, whatever request carried it
/// and whichever thread read it: the XOR of the fingerprints its daemon reports equals that of
/// the data written. Name operations between the writes go through `land`'s readv too, and
/// must get their whole request.
#[test]
fn sinks_take_every_byte() {
    if !can_mount() {
        return;
    }
    // Distinct blocks: identical ones would cancel out in the XOR.
    let data: Vec<u8> = (0..(3u64 << 20) / 8)
        .flat_map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes())
        .collect();
    let tail = b"an odd-sized tail";
    let want = fold(&data) ^ fold(tail);
    for (sink, shown) in [("copy", "Copy"), ("land", "Land"), ("store", "Store")] {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = start(dir.path(), &["--classic", "--threads", "2", "--sink", sink]);
        assert!(d.ready.contains(&format!("sink={shown}")), "{}", d.ready);
        let path = dir.path().join("data");
        let f = File::create(&path).expect("create");
        f.write_all_at(&data, 0).expect("write 3 MiB");
        // A name long enough that its requests run past the first 80 bytes read (`land` reads
        // those into its slot and must copy them back).
        let other = dir.path().join("n".repeat(200));
        File::create(&other).expect("create other");
        fs::remove_file(&other).expect("unlink other");
        f.write_all_at(tail, data.len() as u64).expect("write tail");
        f.sync_all().expect("fsync");
        let len = (data.len() + tail.len()) as u64;
        assert_eq!(fs::metadata(&path).expect("stat").len(), len);
        drop(f);
        let line = stop_line(d, dir.path());
        assert_eq!(field(&line, "sink_bytes="), len, "{sink}: {line}");
        let got = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("sink_fold="))
            .and_then(|v| u64::from_str_radix(v, 16).ok());
        assert_eq!(got, Some(want), "{sink}: {line}");
    }
}
