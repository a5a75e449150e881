//! File-system steps the stores share: the directory lock, directory fsync, atomic replacement
//! of a small file, positional reads that report short files as corruption.

use crate::error::{Error, IoContext, Result};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Hold an exclusive lock on `dir/LOCK` for as long as the returned file is open, so that two
/// processes never run a store in the same directory.
pub fn lock_dir(dir: &Path) -> Result<File> {
    std::fs::create_dir_all(dir).ctx(|| format!("create {}", dir.display()))?;
    let path = dir.join("LOCK");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .ctx(|| format!("open {}", path.display()))?;
    // SAFETY: flock on a valid descriptor we own; no memory is passed.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        return Err(Error::Locked(dir.display().to_string()));
    }
    Ok(f)
}

/// Make the entries of `dir` (creations, renames, removals) durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx(|| format!("fsync directory {}", dir.display()))
}

/// Replace `dir/name` with `bytes` atomically: a crash leaves the old or the new content.
pub fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let dst = dir.join(name);
    let mut f = File::create(&tmp).ctx(|| format!("create {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .ctx(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, &dst).ctx(|| format!("rename {} to {}", tmp.display(), dst.display()))?;
    sync_dir(dir)
}

/// Remove `path`, ignoring a file that is already gone.
pub fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("remove {}", path.display()), e)),
    }
}

/// Read exactly `len` bytes at `off`; a file that ends first is corrupt (it said it held them).
pub fn read_exact_at(file: &File, path: &Path, off: u64, len: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    match file.read_exact_at(&mut buf, off) {
        Ok(()) => Ok(buf),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(Error::corrupt(
            path,
            format!("{len} bytes at offset {off} run past the end of the file"),
        )),
        Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
    }
}
