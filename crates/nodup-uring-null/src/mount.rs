//! Mounting without libfuse or fusermount: open /dev/fuse, mount(2) with its descriptor (root
//! only), clone per-thread descriptors, and unmount.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// File-system type shown in /proc/mounts.
pub const FS_TYPE: &str = "fuse.nodupnull";
/// Source shown in /proc/mounts.
pub const FS_NAME: &str = "nodup-null";

/// `FUSE_DEV_IOC_CLONE`, `_IOR(229, 0, uint32_t)`: attach a new /dev/fuse descriptor to the
/// connection of an existing one (each serving thread then reads its own descriptor).
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

fn cstring(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))
}

/// Open /dev/fuse and mount a connection on it at `mountpoint`; the returned descriptor is
/// where INIT arrives.
pub fn mount(mountpoint: &Path) -> io::Result<File> {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    // Same permission model as nodup: the kernel checks modes (default_permissions), every
    // user may enter (allow_other).
    let data = format!(
        "fd={},rootmode=40000,user_id={uid},group_id={gid},default_permissions,allow_other",
        dev.as_raw_fd()
    );
    let target = cstring(mountpoint.as_os_str().as_bytes())?;
    let source = cstring(FS_NAME.as_bytes())?;
    let fstype = cstring(FS_TYPE.as_bytes())?;
    let data = cstring(data.as_bytes())?;
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(dev)
}

/// A new descriptor on the same FUSE connection as `dev`.
pub fn clone_fd(dev: &File) -> io::Result<File> {
    let new = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let master = dev.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the master descriptor) from the pointer.
    let rc = unsafe { libc::ioctl(new.as_raw_fd(), FUSE_DEV_IOC_CLONE, &master as *const u32) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(new)
}

/// Unmount `mountpoint`; a busy mount is detached (it goes once its last user leaves).
pub fn unmount(mountpoint: &Path) -> io::Result<()> {
    let target = cstring(mountpoint.as_os_str().as_bytes())?;
    // SAFETY: `target` is a valid NUL-terminated string.
    if unsafe { libc::umount2(target.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EBUSY) {
        return Err(err);
    }
    // SAFETY: as above.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
