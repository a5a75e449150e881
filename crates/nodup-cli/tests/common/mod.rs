//! Shared by the FUSE integration tests: running the built `nodup`, a seeded generator, a
//! fixture image in /dev/shm with its mount point, unmounted and removed on drop, and a small
//! tmpfs for a backing store that fills.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

pub const NODUP: &str = env!("CARGO_BIN_EXE_nodup");

/// The value of extended attribute `name` of `p` (at most 64 KiB), or the error getxattr(2)
/// gives (ENODATA when there is none).
pub fn getxattr(p: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid C strings and a buffer of the length passed.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let n = usize::try_from(n).map_err(|_| std::io::Error::last_os_error())?;
    buf.truncate(n);
    Ok(buf)
}

pub fn fuse_available() -> bool {
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

pub fn nodup(args: &[&str]) -> Output {
    Command::new(NODUP)
        .args(args)
        .output()
        .expect("running nodup")
}

/// The JSON a successful command printed.
pub fn json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The stderr of a command that must have failed.
pub fn fail(o: &Output) -> String {
    assert!(!o.status.success(), "expected a failure, got success");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// One line on stderr that contains `what`, no "os error" noise.
pub fn one_line(err: &str, what: &str) {
    assert_eq!(err.trim().lines().count(), 1, "one line expected: {err:?}");
    assert!(err.contains(what), "{what:?} expected in {err:?}");
    assert!(!err.contains("os error"), "errno noise in {err:?}");
}

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

pub fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "nodup failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A small deterministic generator (splitmix64), so failures replay from the printed seed.
pub struct StdRng(u64);

impl StdRng {
    pub fn seed_from_u64(s: u64) -> StdRng {
        StdRng(s)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn gen_range<T: TryFrom<u64> + Into<u64> + Copy>(&mut self, r: std::ops::Range<T>) -> T
    where
        <T as TryFrom<u64>>::Error: std::fmt::Debug,
    {
        let (lo, hi) = (r.start.into(), r.end.into());
        T::try_from(lo + self.next() % (hi - lo)).unwrap()
    }
    pub fn gen_bool(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    pub fn fill(&mut self, v: &mut [u8]) {
        for c in v.chunks_mut(8) {
            let x = self.next().to_le_bytes();
            c.copy_from_slice(&x[..c.len()]);
        }
    }
}

pub fn time_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}

/// Detach whatever is mounted on `mnt` now, lazily (cleanup: nothing to check).
pub fn detach(mnt: &Path) {
    let _ = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mnt)
        .output();
}

pub static SEQ: AtomicUsize = AtomicUsize::new(0);

/// An image in /dev/shm and a mount point; unmounted and removed on drop.
pub struct Fixture {
    pub img: PathBuf,
    pub mnt: PathBuf,
}

impl Fixture {
    pub fn new(tag: &str, size: &str, extra: &[&str]) -> Fixture {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let base = format!("nodup-test-{}-{tag}-{n}", std::process::id());
        let img = PathBuf::from(format!("/dev/shm/{base}.img"));
        let mnt = std::env::temp_dir().join(format!("{base}.mnt"));
        fs::create_dir_all(&mnt).unwrap();
        let mut args = vec!["mkfs", img.to_str().unwrap(), "--size", size];
        args.extend_from_slice(extra);
        ok(nodup(&args));
        Fixture { img, mnt }
    }
    pub fn mount(&self, extra: &[&str]) {
        let mut args = vec![
            "mount",
            self.img.to_str().unwrap(),
            self.mnt.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        ok(nodup(&args));
    }
    pub fn umount(&self) {
        ok(nodup(&["umount", self.mnt.to_str().unwrap()]));
    }
    pub fn fsck(&self) -> Output {
        nodup(&["fsck", self.img.to_str().unwrap()])
    }
    /// Unmount, then fsck must find the image clean (`what` names the case in the failure).
    pub fn umount_clean(&self, what: &str) {
        self.umount();
        let o = self.fsck();
        assert!(
            o.status.success(),
            "fsck {what}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    pub fn path(&self, p: &str) -> PathBuf {
        self.mnt.join(p)
    }
    pub fn stats(&self) -> serde_json::Value {
        let out = ok(nodup(&["stats", self.mnt.to_str().unwrap(), "--json"]));
        serde_json::from_str(&out).unwrap()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        detach(&self.mnt);
        // Wait for the daemon to let go of the image before removing it.
        for _ in 0..400 {
            // (A test may have removed the image.)
            if !self.img.exists() || nodup_fs::image::ImageLock::try_lock(&self.img).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = fs::remove_file(&self.img);
        // Where tests put the daemon's log (`--log-file`), left behind by a failed one.
        let _ = fs::remove_file(self.img.with_extension("log"));
        let _ = fs::remove_dir(&self.mnt);
    }
}

/// The pid of the daemon holding `img` (the lock in /proc/locks).
pub fn daemon_pid(img: &Path) -> i32 {
    let out = ok(nodup(&["list", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let want = img.canonicalize().unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .find(|m| Path::new(m["image"].as_str().unwrap()) == want)
        .and_then(|m| m["pid"].as_i64())
        .expect("the mount is listed with its pid") as i32
}

/// Wait (up to 5 s) until no daemon holds `img`'s lock: a mount is gone once it lets go.
pub fn wait_unlocked(img: &Path) {
    for _ in 0..200 {
        if nodup_fs::image::ImageLock::try_lock(img).is_ok() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
}

/// A tmpfs of a fixed size on a scratch directory (root only), to hold an image whose own disk
/// fills; unmounted and removed on drop, also when the test fails.
pub struct SmallTmpfs {
    pub dir: PathBuf,
}

impl SmallTmpfs {
    /// Mount a tmpfs of `size` (mount(8) syntax, `32M`) on a new directory named after `tag`.
    pub fn new(tag: &str, size: &str) -> SmallTmpfs {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("nodup-{tag}-{}-{n}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount a {size} tmpfs on {}", dir.display());
        SmallTmpfs { dir }
    }

    /// Give the file system `size` (a remount; what it holds stays).
    pub fn resize(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.dir)
            .status()
            .unwrap();
        assert!(
            st.success(),
            "remount {} with size {size}",
            self.dir.display()
        );
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        // A failed test may leave a nodup mount of an image in here: detach it first (the
        // mount names its image by the canonical path).
        let dir = fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
        let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
        for line in mounts.lines() {
            let mut f = line.split(' ');
            if let (Some(src), Some(target)) = (f.next(), f.next()) {
                if Path::new(src).starts_with(&dir) {
                    let _ = Command::new("fusermount3")
                        .args(["-u", "-z", target])
                        .output();
                }
            }
        }
        // Lazily: the daemon may still hold the image for a moment.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = fs::remove_dir(&self.dir);
    }
}
