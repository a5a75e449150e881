//! Attribute changes of the passthrough file system (chmod, chown, truncate, times), and the
//! set-id clearing the kernel leaves to us under HANDLE_KILLPRIV_V2.

use super::{sys, PassFs};
use crate::attr::{from_stat, killed_suidgid, to_timespec};
use fuser::{FileAttr, Request, TimeOrNow};
use std::io;
use std::os::fd::RawFd;

/// The changes one SETATTR asks for.
pub struct Changes {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    /// The open file a truncate came through (ftruncate).
    pub fh: Option<RawFd>,
}

impl PassFs {
    /// The attributes of `ino`.
    pub(super) fn getattr(&self, ino: u64) -> io::Result<FileAttr> {
        let n = self.inodes.fd(ino)?;
        Ok(from_stat(ino, &sys::stat_fd(n.raw())?))
    }

    /// Apply `c` to `ino` and return its new attributes.
    pub(super) fn setattr(&self, req: &Request, ino: u64, c: &Changes) -> io::Result<FileAttr> {
        let n = self.inodes.fd(ino)?;
        let fd = n.raw();
        if let Some(m) = c.mode {
            if n.symlink() {
                return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
            }
            sys::chmod_fd(fd, m & 0o7777)?;
        }
        if c.uid.is_some() || c.gid.is_some() {
            // The source clears set-id bits on chown itself.
            sys::chown_fd(fd, c.uid.unwrap_or(u32::MAX), c.gid.unwrap_or(u32::MAX))?;
        }
        if let Some(s) = c.size {
            match c.fh {
                Some(f) => sys::truncate_fd(f, true, s)?,
                None => sys::truncate_fd(fd, false, s)?,
            }
            // We truncate as ourselves (root keeps set-id bits); the caller may not.
            if self.caching.granted.killpriv && c.mode.is_none() && req.uid() != 0 {
                self.kill_suidgid(fd, req.gid())?;
            }
        }
        if c.atime.is_some() || c.mtime.is_some() {
            sys::utimens_fd(fd, &[to_timespec(c.atime), to_timespec(c.mtime)])?;
        }
        Ok(from_stat(ino, &sys::stat_fd(fd)?))
    }

    /// Clear the set-id bits of the inode `fd` refers to after a change by a caller in group
    /// `gid`, as the kernel would for that caller.
    pub(super) fn kill_suidgid(&self, fd: RawFd, gid: u32) -> io::Result<()> {
        let st = sys::stat_fd(fd)?;
        let perm = st.st_mode & 0o7777;
        let killed = killed_suidgid(perm, st.st_gid, gid);
        if killed != perm {
            sys::chmod_fd(fd, killed)?;
        }
        Ok(())
    }
}
