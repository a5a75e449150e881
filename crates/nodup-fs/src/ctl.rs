//! Control interface of a mounted file system: statistics through a virtual extended attribute
//! on the root directory, readable with getxattr by `nodup stats MOUNTPOINT` or any tool.

use std::ffi::CString;
use std::path::Path;

/// Name of the virtual xattr on the root directory that returns the stats JSON.
pub const STATS_XATTR: &str = "user.nodup.stats";

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
