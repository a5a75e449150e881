//! Thin safe wrappers over the `*at` system calls the passthrough file system forwards to,
//! each returning `io::Result`.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `s` as a C string (EINVAL when it holds a NUL byte).
pub fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The /proc path that reopens whatever `fd` refers to.
pub fn proc_path(fd: RawFd) -> CString {
    // A decimal number never holds a NUL byte.
    CString::new(format!("/proc/self/fd/{fd}")).unwrap_or_default()
}

/// An O_PATH handle on `name` in directory `dir`, not following a final symlink.
pub fn open_path(dir: RawFd, name: &OsStr) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `c` is a valid C string; the returned fd is owned by us alone.
    let fd = cvt(unsafe { libc::openat(dir, c.as_ptr(), flags) })?;
    // SAFETY: `fd` was just opened and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open `name` in `dir` with `flags` (and `mode` when creating).
pub fn open_at(dir: RawFd, name: &OsStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: `c` is a valid C string; the returned fd is owned by us alone.
    let fd = cvt(unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
    // SAFETY: `fd` was just opened and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open the file an O_PATH handle refers to, for reading and writing as `flags` say.
pub fn reopen(fd: RawFd, flags: i32) -> io::Result<OwnedFd> {
    let p = proc_path(fd);
    // SAFETY: `p` is a valid C string; the returned fd is owned by us alone.
    let fd = cvt(unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: `fd` was just opened and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The status of what `fd` refers to (an O_PATH handle, a symlink itself included).
pub fn stat_fd(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is valid; the kernel fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: empty C string, valid out pointer.
    cvt(unsafe { libc::fstatat(fd, c"".as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// `mkdirat`.
pub fn mkdir_at(dir: RawFd, name: &OsStr, mode: u32) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: valid C string.
    cvt(unsafe { libc::mkdirat(dir, c.as_ptr(), mode) }).map(drop)
}

/// `mknodat`.
pub fn mknod_at(dir: RawFd, name: &OsStr, mode: u32, rdev: u32) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: valid C string.
    cvt(unsafe { libc::mknodat(dir, c.as_ptr(), mode, rdev as libc::dev_t) }).map(drop)
}

/// `symlinkat`: `name` in `dir` pointing at `target`.
pub fn symlink_at(target: &OsStr, dir: RawFd, name: &OsStr) -> io::Result<()> {
    let (t, c) = (cstr(target)?, cstr(name)?);
    // SAFETY: valid C strings.
    cvt(unsafe { libc::symlinkat(t.as_ptr(), dir, c.as_ptr()) }).map(drop)
}

/// `unlinkat` (`AT_REMOVEDIR` when `dir_entry`).
pub fn unlink_at(dir: RawFd, name: &OsStr, dir_entry: bool) -> io::Result<()> {
    let c = cstr(name)?;
    let flags = if dir_entry { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: valid C string.
    cvt(unsafe { libc::unlinkat(dir, c.as_ptr(), flags) }).map(drop)
}

/// `renameat2`.
pub fn rename_at(
    dir: RawFd,
    name: &OsStr,
    newdir: RawFd,
    newname: &OsStr,
    flags: u32,
) -> io::Result<()> {
    let (a, b) = (cstr(name)?, cstr(newname)?);
    // SAFETY: valid C strings.
    cvt(unsafe { libc::renameat2(dir, a.as_ptr(), newdir, b.as_ptr(), flags) }).map(drop)
}

/// A new link `newname` in `newdir` to the inode `fd` refers to.
pub fn link_fd(fd: RawFd, newdir: RawFd, newname: &OsStr) -> io::Result<()> {
    let c = cstr(newname)?;
    // SAFETY: valid C strings. AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; without it the /proc
    // path (followed once, to the inode itself) does the same.
    let r = unsafe { libc::linkat(fd, c"".as_ptr(), newdir, c.as_ptr(), libc::AT_EMPTY_PATH) };
    if r == 0 {
        return Ok(());
    }
    let p = proc_path(fd);
    let flags = libc::AT_SYMLINK_FOLLOW;
    // SAFETY: valid C strings.
    cvt(unsafe { libc::linkat(libc::AT_FDCWD, p.as_ptr(), newdir, c.as_ptr(), flags) }).map(drop)
}

/// The target of the symlink `fd` refers to.
pub fn readlink_fd(fd: RawFd) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: `buf` is writable for its length.
    let n = cvt_size(unsafe {
        libc::readlinkat(fd, c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// `fchownat` on what `fd` refers to (`u32::MAX` leaves an id unchanged).
pub fn chown_fd(fd: RawFd, uid: u32, gid: u32) -> io::Result<()> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: empty C string.
    cvt(unsafe { libc::fchownat(fd, c"".as_ptr(), uid, gid, flags) }).map(drop)
}

/// `fchownat` on `name` in `dir`, not following a final symlink.
pub fn chown_at(dir: RawFd, name: &OsStr, uid: u32, gid: u32) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: valid C string.
    cvt(unsafe { libc::fchownat(dir, c.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) }).map(drop)
}

/// `chmod` of the (non-symlink) inode `fd` refers to.
pub fn chmod_fd(fd: RawFd, mode: u32) -> io::Result<()> {
    let p = proc_path(fd);
    // SAFETY: valid C string.
    cvt(unsafe { libc::chmod(p.as_ptr(), mode) }).map(drop)
}

/// Truncate (or extend) the regular file `fd` (open, or an O_PATH handle) refers to.
pub fn truncate_fd(fd: RawFd, open: bool, size: u64) -> io::Result<()> {
    if open {
        // SAFETY: plain syscall on an fd.
        return cvt(unsafe { libc::ftruncate(fd, size as libc::off_t) }).map(drop);
    }
    let p = proc_path(fd);
    // SAFETY: valid C string.
    cvt(unsafe { libc::truncate(p.as_ptr(), size as libc::off_t) }).map(drop)
}

/// Set the access and modification times of what `fd` refers to (symlinks included).
pub fn utimens_fd(fd: RawFd, times: &[libc::timespec; 2]) -> io::Result<()> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: empty C string, two valid timespecs.
    cvt(unsafe { libc::utimensat(fd, c"".as_ptr(), times.as_ptr(), flags) }).map(drop)
}

/// Read up to `buf.len()` bytes at `off`, stopping early only at end of file.
pub fn pread_full(fd: RawFd, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is writable for its length.
        let r = unsafe {
            libc::pread(
                fd,
                rest.as_mut_ptr().cast(),
                rest.len(),
                (off + done as u64) as i64,
            )
        };
        match cvt_size(r) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Write all of `data` at `off`.
pub fn pwrite_full(fd: RawFd, data: &[u8], off: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < data.len() {
        let rest = &data[done..];
        // SAFETY: `rest` is readable for its length.
        let r = unsafe {
            libc::pwrite(
                fd,
                rest.as_ptr().cast(),
                rest.len(),
                (off + done as u64) as i64,
            )
        };
        match cvt_size(r) {
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// `fsync` or `fdatasync`.
pub fn sync_fd(fd: RawFd, datasync: bool) -> io::Result<()> {
    // SAFETY: plain syscalls on an fd.
    cvt(unsafe {
        if datasync {
            libc::fdatasync(fd)
        } else {
            libc::fsync(fd)
        }
    })
    .map(drop)
}

/// `fallocate`.
pub fn fallocate(fd: RawFd, mode: i32, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an fd.
    cvt(unsafe { libc::fallocate(fd, mode, off as i64, len as i64) }).map(drop)
}

/// `lseek` (SEEK_DATA / SEEK_HOLE queries).
pub fn lseek(fd: RawFd, off: i64, whence: i32) -> io::Result<i64> {
    // SAFETY: plain syscall on an fd.
    let r = unsafe { libc::lseek(fd, off, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `copy_file_range` between two open files; returns the bytes copied.
pub fn copy_range(
    fd_in: RawFd,
    off_in: u64,
    fd_out: RawFd,
    off_out: u64,
    len: u64,
) -> io::Result<usize> {
    let (mut a, mut b) = (off_in as i64, off_out as i64);
    // SAFETY: valid offset pointers; plain syscall on fds.
    cvt_size(
        unsafe { libc::copy_file_range(fd_in, &mut a, fd_out, &mut b, len as usize, 0) }
            as libc::ssize_t,
    )
}

/// `statvfs` of the file system `fd` is on.
pub fn statvfs_fd(fd: RawFd) -> io::Result<libc::statvfs> {
    let p = proc_path(fd);
    // SAFETY: an all-zero `statvfs` is valid; the kernel fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer.
    cvt(unsafe { libc::statvfs(p.as_ptr(), &mut st) })?;
    Ok(st)
}

/// Extended attribute calls on the inode `fd` refers to (through its /proc path).
pub mod xattr {
    use super::*;

    /// The value of `name` (its size only when `size` is 0), or ERANGE when longer than `size`.
    pub fn get(fd: RawFd, name: &OsStr, size: u32) -> io::Result<Vec<u8>> {
        let (p, n) = (proc_path(fd), cstr(name)?);
        let mut buf = vec![0u8; size as usize];
        // SAFETY: valid C strings; `buf` is writable for its length (null when empty).
        let r =
            unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        let len = cvt_size(r)?;
        if size == 0 {
            buf = vec![0; len];
        } else {
            buf.truncate(len);
        }
        Ok(buf)
    }

    /// The NUL-separated attribute names (sized like [`get`]).
    pub fn list(fd: RawFd, size: u32) -> io::Result<Vec<u8>> {
        let p = proc_path(fd);
        let mut buf = vec![0u8; size as usize];
        // SAFETY: valid C string; `buf` is writable for its length.
        let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        let len = cvt_size(r)?;
        if size == 0 {
            buf = vec![0; len];
        } else {
            buf.truncate(len);
        }
        Ok(buf)
    }

    /// Set `name` to `value` (`flags`: XATTR_CREATE / XATTR_REPLACE).
    pub fn set(fd: RawFd, name: &OsStr, value: &[u8], flags: i32) -> io::Result<()> {
        let (p, n) = (proc_path(fd), cstr(name)?);
        // SAFETY: valid C strings; `value` readable for its length.
        cvt(unsafe {
            libc::setxattr(
                p.as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        })
        .map(drop)
    }

    /// Remove `name`.
    pub fn remove(fd: RawFd, name: &OsStr) -> io::Result<()> {
        let (p, n) = (proc_path(fd), cstr(name)?);
        // SAFETY: valid C strings.
        cvt(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) }).map(drop)
    }
}

/// Words of a `struct file_handle` buffer: the 8-byte header and MAX_HANDLE_SZ bytes.
const HANDLE_WORDS: usize = 2 + libc::MAX_HANDLE_SZ as usize / 4;

/// A file handle (`name_to_handle_at`): names an inode for as long as it exists, without
/// holding a file descriptor.
#[derive(Debug, Clone)]
pub struct Handle(Box<[u32]>);

/// The handle of `name` in `dir` (`name` empty: of `dir` itself), not following a final
/// symlink.
pub fn name_to_handle(dir: RawFd, name: &OsStr) -> io::Result<Handle> {
    let c = cstr(name)?;
    let mut buf = [0u32; HANDLE_WORDS];
    buf[0] = libc::MAX_HANDLE_SZ as u32;
    let mut mount_id = 0;
    let flags = if name.is_empty() {
        libc::AT_EMPTY_PATH
    } else {
        0
    };
    // SAFETY: `buf` is u32-aligned and large enough for a file_handle of MAX_HANDLE_SZ bytes.
    cvt(unsafe {
        libc::name_to_handle_at(
            dir,
            c.as_ptr(),
            buf.as_mut_ptr().cast(),
            &mut mount_id,
            flags,
        )
    })?;
    let words = 2 + (buf[0] as usize).div_ceil(4);
    Ok(Handle(buf[..words.min(HANDLE_WORDS)].into()))
}

/// An O_PATH descriptor on the inode `h` names, on the file system `mount_fd` is on.
pub fn open_handle(mount_fd: RawFd, h: &Handle) -> io::Result<OwnedFd> {
    let mut buf = [0u32; HANDLE_WORDS];
    buf[..h.0.len()].copy_from_slice(&h.0);
    let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `buf` holds a file_handle as the kernel returned it; it is only read.
    let fd = cvt(unsafe { libc::open_by_handle_at(mount_fd, buf.as_mut_ptr().cast(), flags) })?;
    // SAFETY: `fd` was just opened and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat` of `name` in `dir`, not following a final symlink.
pub fn stat_at(dir: RawFd, name: &OsStr) -> io::Result<libc::stat> {
    let c = cstr(name)?;
    // SAFETY: an all-zero `stat` is valid; the kernel fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer.
    cvt(unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}
