//! The passthrough file system: every request forwarded to a source directory with plain
//! system calls (O_PATH handles per inode, pread/pwrite on an fd per open file). Through it
//! a benchmark measures FUSE plus a real file system underneath, with no storage engine.

mod attrs;
mod dirs;
mod entries;
mod inodes;
pub(crate) mod sys;

use self::attrs::Changes;
use self::dirs::Dirs;
use self::entries::Make;
use self::inodes::Inodes;
use crate::session::{self, MAX_WRITE, TTL};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use nodup_fs::fuse::kernel::Caching;
use std::cell::RefCell;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The passthrough file system over one source directory.
pub struct PassFs {
    inodes: Inodes,
    dirs: Dirs,
    /// nodup's caching rules (`caching.granted.killpriv`: clearing set-id bits is ours).
    caching: Caching,
    euid: u32,
    egid: u32,
    /// While this path exists, fsync answers EIO: a disk whose write-back fails, for tests
    /// of what sits on top.
    fail_fsync_while: Option<PathBuf>,
}

thread_local! {
    /// Each serving thread's read buffer (reads are at most `MAX_WRITE` bytes).
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn errno(e: io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn ok_or(reply: ReplyEmpty, r: io::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

fn entry(reply: ReplyEntry, r: io::Result<FileAttr>) {
    match r {
        Ok(a) => reply.entry(&TTL, &a, Generation(0)),
        Err(e) => reply.error(errno(e)),
    }
}

/// Attributes carried by "." and ".." in readdirplus (the kernel ignores those entries').
fn dot_attr(ino: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::Directory,
        perm: 0o755,
        nlink: 2,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// The handle number of an open file: its fd, owned by the kernel's handle until release.
fn file_handle(fd: OwnedFd) -> FileHandle {
    FileHandle(fd.into_raw_fd() as u64)
}

impl PassFs {
    /// A passthrough file system over `source`, caching as `caching`, holding at most
    /// `fd_budget` descriptors on inodes (file handles beyond).
    pub fn new(
        source: &Path,
        caching: Caching,
        fd_budget: usize,
        fail_fsync_while: Option<PathBuf>,
    ) -> io::Result<PassFs> {
        let root = sys::open_path(libc::AT_FDCWD, source.as_os_str())?;
        let st = sys::stat_fd(root.as_raw_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        // SAFETY: geteuid/getegid cannot fail.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Ok(PassFs {
            inodes: Inodes::new(root, &st, fd_budget)?,
            dirs: Dirs::default(),
            caching,
            fail_fsync_while,
            euid,
            egid,
        })
    }

    /// Open flags as the source must see them: under the writeback cache the kernel reads
    /// through write-only handles (to fill partial pages) and handles O_APPEND itself.
    fn access_flags(&self, flags: i32) -> i32 {
        let mut f = flags & !libc::O_NOCTTY;
        if self.caching.writeback {
            if f & libc::O_ACCMODE == libc::O_WRONLY {
                f = (f & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            f &= !libc::O_APPEND;
        }
        f
    }

    fn open_file(&self, ino: u64, flags: i32) -> io::Result<OwnedFd> {
        let n = self.inodes.fd(ino)?;
        sys::reopen(
            n.raw(),
            self.access_flags(flags) & !(libc::O_CREAT | libc::O_EXCL),
        )
    }

    fn open_dir(&self, ino: u64) -> io::Result<u64> {
        let n = self.inodes.fd(ino)?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY;
        self.dirs
            .open(sys::open_at(n.raw(), ".".as_ref(), flags, 0)?)
    }

    /// Extended attribute calls go to the inode through its /proc path; symlinks carry none
    /// here (there is no race-free way to reach a symlink's own attributes): `none` for them.
    fn xattr<T>(
        &self,
        ino: u64,
        none: io::Result<T>,
        f: impl FnOnce(RawFd) -> io::Result<T>,
    ) -> io::Result<T> {
        let n = self.inodes.fd(ino)?;
        if n.symlink() {
            none
        } else {
            f(n.raw())
        }
    }
}

/// Serve a passthrough file system over `source` at `mountpoint` until unmounted or signalled.
pub fn run(
    source: &Path,
    mountpoint: &Path,
    opts: &session::Options,
    fd_budget: usize,
    fail_fsync_while: Option<PathBuf>,
) -> io::Result<()> {
    // Modes arrive with the caller's umask applied by us (FUSE_DONT_MASK), so ours is 0.
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(0) };
    let fs = PassFs::new(source, opts.caching(), fd_budget, fail_fsync_while)?;
    session::serve(fs, mountpoint, opts, "nodup-passthrough")
}

impl Filesystem for PassFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        self.caching.negotiate(config);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lookup(parent.0, name) {
            // A negative entry (inode 0) lets the kernel cache "does not exist", as nodup does.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                reply.entry(&TTL, &dot_attr(0), Generation(0))
            }
            r => entry(reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let c = Changes {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            fh: fh.map(|f| f.0 as i32),
        };
        match self.setattr(req, ino.0, &c) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self
            .inodes
            .fd(ino.0)
            .and_then(|n| sys::readlink_fd(n.raw()))
        {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let m = mode & !(umask & 0o7777);
        entry(
            reply,
            self.make(req, parent.0, name, m, Make::Special(rdev)),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        entry(
            reply,
            self.make(req, parent.0, name, mode & !umask, Make::Dir),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        ok_or(reply, self.remove(parent.0, name, false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        ok_or(reply, self.remove(parent.0, name, true));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let what = Make::Symlink(target.as_os_str());
        entry(reply, self.make(req, parent.0, link_name, 0o777, what));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = self.rename(parent.0, name, newparent.0, newname, flags.bits());
        ok_or(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        entry(reply, self.link(ino.0, newparent.0, newname));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(ino.0, flags.0) {
            Ok(fd) => reply.opened(file_handle(fd), self.caching.open_flags(flags.0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let size = (size as usize).min(MAX_WRITE as usize);
        READ_BUF.with_borrow_mut(|buf| {
            if buf.len() < size {
                buf.resize(size, 0);
            }
            match sys::pread_full(fh.0 as i32, &mut buf[..size], offset) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(errno(e)),
            }
        })
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let fd = fh.0 as i32;
        match sys::pwrite_full(fd, data, offset) {
            Ok(n) => {
                // Set only when the writer lacks CAP_FSETID and the file has a set-id bit.
                if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
                    let _ = self.kill_suidgid(fd, req.gid());
                }
                reply.written(n as u32)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        // As nodup: ENOSYS, so the kernel stops sending FLUSH at close(2).
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // SAFETY: the handle is the fd `open`/`create` gave away; the kernel releases it once.
        drop(unsafe { OwnedFd::from_raw_fd(fh.0 as i32) });
        reply.ok()
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        if self.fail_fsync_while.as_ref().is_some_and(|p| p.exists()) {
            return reply.error(Errno::EIO);
        }
        ok_or(reply, sys::sync_fd(fh.0 as i32, datasync));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.open_dir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let stream = match self.dirs.get(fh.0) {
            Ok(s) => s,
            Err(e) => return reply.error(errno(e)),
        };
        let mut s = stream.lock();
        s.seek(offset as i64);
        loop {
            let before = s.pos();
            match s.next_entry() {
                Ok(Some(d)) => {
                    let kind = dirs::file_type(d.kind);
                    if reply.add(INodeNo(d.ino), d.next as u64, kind, &d.name) {
                        s.seek(before);
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => return reply.error(errno(e)),
            }
        }
        reply.ok()
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let stream = match self.dirs.get(fh.0) {
            Ok(s) => s,
            Err(e) => return reply.error(errno(e)),
        };
        let mut s = stream.lock();
        s.seek(offset as i64);
        loop {
            let before = s.pos();
            let d = match s.next_entry() {
                Ok(Some(d)) => d,
                Ok(None) => break,
                Err(e) => return reply.error(errno(e)),
            };
            let dot = d.name == "." || d.name == "..";
            // The kernel takes a reference on every entry but "." and ".."; an entry that
            // vanished since the listing is skipped.
            let (a, counted) = if dot {
                (dot_attr(if d.name == "." { ino.0 } else { d.ino }), false)
            } else {
                match self.lookup_in(s.fd(), &d.name) {
                    Ok(a) => (a, true),
                    Err(_) => continue,
                }
            };
            if reply.add(a.ino, d.next as u64, &d.name, &TTL, &a, Generation(0)) {
                if counted {
                    self.inodes.forget(a.ino.0, 1);
                }
                s.seek(before);
                break;
            }
        }
        reply.ok()
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.close(fh.0);
        reply.ok()
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self
            .dirs
            .get(fh.0)
            .and_then(|s| sys::sync_fd(s.lock().fd(), datasync));
        ok_or(reply, r);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.inodes.fd(1).and_then(|n| sys::statvfs_fd(n.raw())) {
            Ok(st) => reply.statfs(
                st.f_blocks,
                st.f_bfree,
                st.f_bavail,
                st.f_files,
                st.f_ffree,
                st.f_bsize as u32,
                st.f_namemax as u32,
                st.f_frsize as u32,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let none = Err(io::Error::from_raw_os_error(libc::ENOTSUP));
        let r = self.xattr(ino.0, none, |fd| sys::xattr::set(fd, name, value, flags));
        ok_or(reply, r);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let none = Err(io::Error::from_raw_os_error(libc::ENODATA));
        let r = self.xattr(ino.0, none, |fd| sys::xattr::get(fd, name, size));
        xattr_reply(reply, size, r);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let r = self.xattr(ino.0, Ok(Vec::new()), |fd| sys::xattr::list(fd, size));
        xattr_reply(reply, size, r);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let none = Err(io::Error::from_raw_os_error(libc::ENODATA));
        let r = self.xattr(ino.0, none, |fd| sys::xattr::remove(fd, name));
        ok_or(reply, r);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel checks the mode bits; only existence matters here.
        ok_or(reply, self.inodes.fd(ino.0).map(drop));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.create(req, parent.0, name, mode & !umask, flags) {
            Ok((a, fd)) => reply.created(
                &TTL,
                &a,
                Generation(0),
                file_handle(fd),
                self.caching.open_flags(flags),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        ok_or(reply, sys::fallocate(fh.0 as i32, mode, offset, length));
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match sys::lseek(fh.0 as i32, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // The reply carries a 32-bit count; callers loop over larger copies.
        let len = len.min(1 << 30);
        let (a, b) = (fh_in.0 as i32, fh_out.0 as i32);
        match sys::copy_range(a, offset_in, b, offset_out, len) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }
}

fn xattr_reply(reply: ReplyXattr, size: u32, r: io::Result<Vec<u8>>) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(errno(e)),
    }
}
