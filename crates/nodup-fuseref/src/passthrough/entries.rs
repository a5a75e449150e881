//! Namespace operations of the passthrough file system: looking names up, creating inodes
//! (with the caller's ownership), links, removal and renames, each one `*at` call relative to
//! the parent's O_PATH handle.

use super::{sys, PassFs};
use crate::attr::from_stat;
use fuser::{FileAttr, Request};
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// What to create.
pub enum Make<'a> {
    Dir,
    Special(u32),
    Symlink(&'a OsStr),
}

impl PassFs {
    /// Look `name` up in directory `dir` (an fd usable as an `*at` base), counting one kernel
    /// reference on the result.
    pub(super) fn lookup_in(&self, dir: RawFd, name: &OsStr) -> io::Result<FileAttr> {
        let (ino, st) = self.inodes.lookup(dir, name)?;
        Ok(from_stat(ino, &st))
    }

    /// `name` in inode `parent`, as [`lookup_in`](Self::lookup_in).
    pub(super) fn lookup(&self, parent: u64, name: &OsStr) -> io::Result<FileAttr> {
        let p = self.inodes.fd(parent)?;
        self.lookup_in(p.raw(), name)
    }

    /// The owner a new inode in `dir` must get when the caller is not us: the caller, with the
    /// directory's group when it is set-gid (the source then sets it itself). None when the
    /// source's default (our ids) is right.
    fn owner_for(&self, req: &Request, dir: RawFd) -> io::Result<Option<(u32, u32)>> {
        if req.uid() == self.euid && req.gid() == self.egid {
            return Ok(None);
        }
        let st = sys::stat_fd(dir)?;
        let gid = if st.st_mode & libc::S_ISGID != 0 {
            u32::MAX
        } else {
            req.gid()
        };
        Ok(Some((req.uid(), gid)))
    }

    /// Create a directory, special file or symlink `name` in `parent` with `mode` already
    /// masked, owned by the caller.
    pub(super) fn make(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        mode: u32,
        what: Make,
    ) -> io::Result<FileAttr> {
        let p = self.inodes.fd(parent)?;
        let dir = p.raw();
        match what {
            Make::Dir => sys::mkdir_at(dir, name, mode & 0o7777)?,
            Make::Special(rdev) => sys::mknod_at(dir, name, mode, rdev)?,
            Make::Symlink(target) => sys::symlink_at(target, dir, name)?,
        }
        if let Some((uid, gid)) = self.owner_for(req, dir)? {
            sys::chown_at(dir, name, uid, gid)?;
        }
        self.lookup_in(dir, name)
    }

    /// Create and open the regular file `name` in `parent`: its attributes and the open file.
    pub(super) fn create(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> io::Result<(FileAttr, OwnedFd)> {
        let p = self.inodes.fd(parent)?;
        let dir = p.raw();
        let flags = self.access_flags(flags) | libc::O_CREAT | libc::O_NOFOLLOW;
        let file = sys::open_at(dir, name, flags, mode & 0o7777)?;
        if let Some((uid, gid)) = self.owner_for(req, dir)? {
            sys::chown_fd(file.as_raw_fd(), uid, gid)?;
        }
        let attr = self.lookup_in(dir, name)?;
        Ok((attr, file))
    }

    /// A new name `newname` in `newparent` for `ino`.
    pub(super) fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> io::Result<FileAttr> {
        let (n, p) = (self.inodes.fd(ino)?, self.inodes.fd(newparent)?);
        sys::link_fd(n.raw(), p.raw(), newname)?;
        self.lookup_in(p.raw(), newname)
    }

    /// Remove `name` of `parent` (a directory when `dir`).
    pub(super) fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> io::Result<()> {
        let p = self.inodes.fd(parent)?;
        sys::unlink_at(p.raw(), name, dir)
    }

    /// `renameat2` between two directories.
    pub(super) fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> io::Result<()> {
        let (a, b) = (self.inodes.fd(parent)?, self.inodes.fd(newparent)?);
        sys::rename_at(a.raw(), name, b.raw(), newname, flags)
    }
}
