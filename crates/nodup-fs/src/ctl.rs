//! Control interface of a mounted file system: statistics through a virtual extended attribute
//! on the root directory, readable with getxattr by `nodup stats MOUNTPOINT` or any tool.

use std::ffi::CString;
use std::path::Path;

/// Name of the virtual xattr on the root directory that returns the stats JSON.
pub const STATS_XATTR: &str = "user.nodup.stats";
/// Name of the virtual xattr on the root directory that takes commands: setting it to
/// `checkpoint` writes a checkpoint now (benchmarks, operators before a backup of the image).
pub const CTL_XATTR: &str = "user.nodup.ctl";

/// Send `command` to the nodup file system mounted at `mountpoint` (see [`CTL_XATTR`]).
pub fn command(mountpoint: &Path, command: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let inval = || std::io::Error::from_raw_os_error(libc::EINVAL);
    let path = CString::new(mountpoint.as_os_str().as_bytes()).map_err(|_| inval())?;
    let name = CString::new(CTL_XATTR).map_err(|_| inval())?;
    // SAFETY: both strings are NUL terminated; the value pointer is valid for its length.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
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

/// Read the stats JSON of the nodup file system mounted at `mountpoint`.
pub fn read_stats(mountpoint: &Path) -> std::io::Result<serde_json::Value> {
    use std::os::unix::ffi::OsStrExt;
    let path = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let name =
        CString::new(STATS_XATTR).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: both strings are NUL terminated and `buf` is valid for `buf.len()` bytes.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    serde_json::from_slice(&buf)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
