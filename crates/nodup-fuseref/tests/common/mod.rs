//! Shared by the mount tests: the built binary, whether a directory is a mount point, a
//! mount started in the foreground, and a file made through `nodup-fs`.
// Each test crate that includes this uses only part of it.
#![allow(dead_code)]

use std::fs;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The `nodup-fuseref` binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_nodup-fuseref");

/// Whether something is mounted at `p`, as /proc/self/mountinfo says. Read there rather than
/// by comparing devices with a stat, which fails on a dead FUSE mount (ENOTCONN) and waits
/// forever on a hung one.
pub fn is_mounted(p: &Path) -> bool {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    // The fifth field is the mount point: its real path, so the parent is resolved (never the
    // mount point itself, a stat there is what must be avoided), with octal escapes, of which
    // these paths can need only those of backslash and space.
    let real = match (
        p.parent().and_then(|d| d.canonicalize().ok()),
        p.file_name(),
    ) {
        (Some(dir), Some(name)) => dir.join(name),
        _ => p.to_owned(),
    };
    let want = real
        .to_string_lossy()
        .replace('\\', "\\134")
        .replace(' ', "\\040");
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// Run `nodup-fuseref ARGS` (a mount at `mnt`, served in the foreground) and wait, at most
/// 10 s, for the mount to appear; the child is killed if it does not.
pub fn spawn_mount(args: &[&str], mnt: &Path) -> Child {
    let mut child = Command::new(BIN)
        .args(args)
        .spawn()
        .expect("running nodup-fuseref");
    let t0 = Instant::now();
    while !is_mounted(mnt) {
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("nodup-fuseref {args:?}: the mount did not appear");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Make an empty regular file `name` (mode 0644) in the root directory of `fs`; its inode.
pub fn create_file(fs: &nodup_fs::FileSystem, name: &str) -> nodup_fs::Result<u64> {
    use nodup_fs::inode::{Kind, ROOT_INO};
    let who = nodup_fs::Caller::default();
    let (ino, _) = fs.mknod(ROOT_INO, name.as_bytes(), Kind::File, 0o644, 0, b"", who)?;
    Ok(ino)
}
