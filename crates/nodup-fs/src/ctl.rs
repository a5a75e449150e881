//! Control interface of a mounted file system: statistics through a virtual extended attribute
//! on the root directory, readable with getxattr by `nodup stats MOUNTPOINT` or any tool.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;

/// Name of the virtual xattr on the root directory that returns the stats JSON.
pub const STATS_XATTR: &str = "user.nodup.stats";
/// Name of the virtual xattr on the root directory that takes commands: setting it to
/// `checkpoint` writes a checkpoint now (benchmarks, operators before a backup of the image).
pub const CTL_XATTR: &str = "user.nodup.ctl";

/// Name of the virtual xattr on the root directory of a `smart` mount that says whether its
/// out-of-line worker has anything left to do: `idle` or `busy`. Cheap to ask often (a
/// harness waiting for the worker), unlike the stats, whose JSON is built on every read.
pub const WORKER_XATTR: &str = "user.nodup.worker";

/// Name of the virtual xattr every inode of a mount answers with its space accounting as
/// JSON (see [`crate::usage::Usage`]); `nodup du` reads it.
pub const USAGE_XATTR: &str = "user.nodup.du";

/// Read virtual xattr `name` of `path` (following symlinks) into `buf`; returns its length.
fn get_xattr(path: &Path, name: &str, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::unix::ffi::OsStrExt;
    let inval = || std::io::Error::from_raw_os_error(libc::EINVAL);
    let p = CString::new(path.as_os_str().as_bytes()).map_err(|_| inval())?;
    let n = CString::new(name).map_err(|_| inval())?;
    // SAFETY: both strings are NUL terminated and `buf` is valid for `buf.len()` bytes.
    let r = unsafe {
        libc::getxattr(
            p.as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Read virtual xattr `name` of the open file `fd` into `buf`; returns its length.
fn get_xattr_fd(fd: BorrowedFd<'_>, name: &str, buf: &mut [u8]) -> std::io::Result<usize> {
    let n = CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `fd` is open, the name is NUL terminated and `buf` is valid for `buf.len()` bytes.
    let r = unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            n.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Read a virtual xattr of `path` (following symlinks) as JSON.
pub fn read_json(path: &Path, name: &str) -> std::io::Result<serde_json::Value> {
    let mut buf = vec![0u8; 64 * 1024];
    let n = get_xattr(path, name, &mut buf)?;
    buf.truncate(n);
    serde_json::from_slice(&buf)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Send `command` to the nodup file system mounted at `mountpoint` (see [`CTL_XATTR`]).
pub fn command(mountpoint: &Path, command: &str) -> std::io::Result<()> {
    command_fd(std::fs::File::open(mountpoint)?.as_fd(), command)
}

/// [`command`] through `root`, the mount's root directory already open: no path is looked up
/// again, so the command cannot land on whatever a path names after an unmount.
pub fn command_fd(root: BorrowedFd<'_>, command: &str) -> std::io::Result<()> {
    let name =
        CString::new(CTL_XATTR).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `root` is open, the name is NUL terminated; the value pointer is valid for its
    // length.
    let r = unsafe {
        libc::fsetxattr(
            root.as_raw_fd(),
            name.as_ptr(),
            command.as_ptr() as *const libc::c_void,
            command.len(),
            0,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the `smart` worker of the file system whose root directory `root` is open is idle
/// (see [`WORKER_XATTR`]); ENODATA when the mount has no worker.
pub fn worker_idle_fd(root: BorrowedFd<'_>) -> std::io::Result<bool> {
    let mut buf = [0u8; 16];
    let n = get_xattr_fd(root, WORKER_XATTR, &mut buf)?;
    worker_state(&buf[..n])
}

/// `idle` or `busy`, as [`WORKER_XATTR`] answers.
fn worker_state(v: &[u8]) -> std::io::Result<bool> {
    match v {
        b"idle" => Ok(true),
        b"busy" => Ok(false),
        _ => Err(std::io::Error::from_raw_os_error(libc::EPROTO)),
    }
}

/// Read the stats JSON of the nodup file system mounted at `mountpoint`.
pub fn read_stats(mountpoint: &Path) -> std::io::Result<serde_json::Value> {
    read_json(mountpoint, STATS_XATTR)
}
