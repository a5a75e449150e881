//! Guards of what the power-loss tests set up (the logging disk's daemon, loop devices, host
//! mounts), each undone on drop even when a check fails, and never waiting forever.

use super::common::{is_mounted, spawn_mount};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Run `cmd ARGS`, which must succeed; its standard output, trimmed.
pub fn run(cmd: &str, args: &[&str]) -> String {
    let o = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        o.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// The logging disk's daemon, unmounted and ended on drop.
pub struct LogDisk {
    child: Child,
    mnt: PathBuf,
}

impl LogDisk {
    /// Serve a logging disk of `len` bytes at `mnt`, its log in `log`.
    pub fn start(log: &Path, mnt: &Path, len: usize) -> LogDisk {
        let (log, m, size) = (
            log.to_str().unwrap(),
            mnt.to_str().unwrap(),
            len.to_string(),
        );
        LogDisk {
            child: spawn_mount(&["logdisk", log, m, "--size", &size], mnt),
            mnt: mnt.to_owned(),
        }
    }

    /// Wait at most `secs` for the daemon to end; whether it did.
    fn ended_within(&mut self, secs: u64) -> bool {
        let t0 = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) {
            if t0.elapsed() > Duration::from_secs(secs) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }
}

impl Drop for LogDisk {
    fn drop(&mut self) {
        // Unmounted (retried, then lazy: a loop device lets go of its file a moment after it
        // is detached), the daemon ends by itself. If something above still holds the disk
        // (a hung nodup daemon keeping the host file system busy), SIGTERM, then SIGKILL: a
        // killed FUSE daemon aborts its connection, so every layer above gets errors instead
        // of waiting, and the test never waits forever.
        unmount(&self.mnt);
        for sig in [libc::SIGTERM, libc::SIGKILL] {
            if self.ended_within(5) {
                return;
            }
            // SAFETY: a plain kill of the child we started.
            unsafe { libc::kill(self.child.id() as i32, sig) };
        }
        let _ = self.child.wait();
    }
}

/// A loop device over a file (its path in `.0`), detached on drop.
pub struct Loop(pub String);

impl Loop {
    /// Attach a free loop device to `file`.
    pub fn attach(file: &Path) -> Loop {
        Loop(run(
            "losetup",
            &["--find", "--show", file.to_str().unwrap()],
        ))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// A file system mounted at a directory, unmounted on drop.
pub struct Mounted(PathBuf);

impl Mounted {
    /// Mount `dev` at `dir`; mount(8)'s message when it fails.
    pub fn new(dev: &str, dir: &Path) -> Result<Mounted, String> {
        let o = Command::new("mount")
            .args([dev, dir.to_str().unwrap()])
            .output()
            .expect("mount");
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).into_owned());
        }
        Ok(Mounted(dir.to_owned()))
    }

    /// Unmount, which must succeed without a lazy detach (the drop's fallback on failures).
    pub fn unmount(self) {
        let lazy = unmount(&self.0);
        assert!(
            !lazy,
            "{}: only a lazy unmount detached it",
            self.0.display()
        );
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        unmount(&self.0);
    }
}

/// Unmount `dir`, retried for 10 s (a loop device or a failing check may hold it a moment
/// longer), then lazily; whether it took the lazy unmount.
fn unmount(dir: &Path) -> bool {
    let t0 = Instant::now();
    while is_mounted(dir) && t0.elapsed() < Duration::from_secs(10) {
        let _ = Command::new("umount").arg(dir).output();
        if is_mounted(dir) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if !is_mounted(dir) {
        return false;
    }
    let _ = Command::new("umount").arg("-l").arg(dir).output();
    true
}
