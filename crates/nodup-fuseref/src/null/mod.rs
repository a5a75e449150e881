//! The null file system: a real namespace in memory whose files keep no data (writes are
//! accepted and only move the size, reads return zeros; extended attributes are accepted and
//! dropped, so reading one gives ENODATA). Every request does the least a file
//! system can, so a benchmark through it measures the FUSE path itself: the ceiling.

mod tree;

use self::tree::{Creator, Tree};
use crate::session::{self, TTL};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use nodup_fs::fuse::kernel::Caching;
use parking_lot::Mutex;
use std::ffi::OsStr;
use std::path::Path;
use std::time::SystemTime;

/// What a read returns: zeros, up to the largest read the kernel sends.
static ZEROS: [u8; session::MAX_WRITE as usize] = [0; session::MAX_WRITE as usize];

/// The null file system.
pub struct NullFs {
    tree: Mutex<Tree>,
    /// nodup's caching rules (`caching.granted.killpriv`: clearing set-id bits is ours).
    caching: Caching,
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

fn now_or(t: Option<TimeOrNow>) -> Option<SystemTime> {
    t.map(|t| match t {
        TimeOrNow::Now => SystemTime::now(),
        TimeOrNow::SpecificTime(s) => s,
    })
}

impl NullFs {
    /// An empty null file system, its root owned by the calling user, caching as `caching`.
    pub fn new(caching: Caching) -> NullFs {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        NullFs {
            tree: Mutex::new(Tree::new(uid, gid)),
            caching,
        }
    }

    /// The owner of a new inode in `parent`: the caller, or the directory's group when it is
    /// set-gid (new directories then inherit the bit).
    fn creator(&self, req: &Request, parent: u64, mode: u32, umask: u32, dir: bool) -> Creator {
        let mut perm = (mode & !umask & 0o7777) as u16;
        let mut gid = req.gid();
        if let Ok(p) = self.tree.lock().attr(parent.max(1)) {
            if p.perm & libc::S_ISGID as u16 != 0 {
                gid = p.gid;
                if dir {
                    perm |= libc::S_ISGID as u16;
                }
            }
        }
        Creator {
            uid: req.uid(),
            gid,
            perm,
        }
    }

    fn reply_entry(reply: ReplyEntry, r: tree::Result<FileAttr>) {
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn make(
        &self,
        parent: INodeNo,
        name: &OsStr,
        kind: FileType,
        c: Creator,
        rdev: u32,
        target: Option<&OsStr>,
    ) -> tree::Result<FileAttr> {
        self.tree
            .lock()
            .create(parent.0, name, kind, c, rdev, target)
    }
}

/// Serve a null file system at `mountpoint` until unmounted or signalled.
pub fn run(mountpoint: &Path, opts: &session::Options) -> std::io::Result<()> {
    session::serve(NullFs::new(opts.caching()), mountpoint, opts, "nodup-null")
}

impl Filesystem for NullFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.caching.negotiate(config);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.tree.lock().lookup(parent.0, name) {
            // A negative entry (inode 0) lets the kernel cache "does not exist", as nodup does.
            Err(libc::ENOENT) => reply.entry(&TTL, &NEGATIVE, Generation(0)),
            r => Self::reply_entry(reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.tree.lock().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.tree.lock().attr(ino.0) {
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
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut t = self.tree.lock();
        let killpriv = self.caching.granted.killpriv;
        let a = match t.attr_mut(ino.0) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(e)),
        };
        if let Some(m) = mode {
            a.perm = (m & 0o7777) as u16;
        }
        // With KILLPRIV_V2 the kernel leaves set-id clearing on chown and truncate to us.
        let chown = uid.is_some() || gid.is_some();
        let trunc = size.is_some() && req.uid() != 0;
        if killpriv && mode.is_none() && a.kind != FileType::Directory && (chown || trunc) {
            let caller_gid = if chown { a.gid } else { req.gid() };
            a.perm = crate::attr::killed_suidgid(a.perm as u32, a.gid, caller_gid) as u16;
        }
        a.uid = uid.unwrap_or(a.uid);
        a.gid = gid.unwrap_or(a.gid);
        if let Some(s) = size {
            a.size = s;
            a.mtime = SystemTime::now();
        }
        a.atime = now_or(atime).unwrap_or(a.atime);
        a.mtime = now_or(mtime).unwrap_or(a.mtime);
        a.ctime = ctime.unwrap_or_else(SystemTime::now);
        reply.attr(&TTL, a)
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.tree.lock().readlink(ino.0) {
            Ok(t) => reply.data(t.as_encoded_bytes()),
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
        let kind = crate::attr::kind_of(mode);
        if kind == FileType::Directory || kind == FileType::Symlink {
            return reply.error(Errno::EINVAL);
        }
        let c = self.creator(req, parent.0, mode, umask, false);
        Self::reply_entry(reply, self.make(parent, name, kind, c, rdev, None));
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
        let c = self.creator(req, parent.0, mode, umask, true);
        let r = self.make(parent, name, FileType::Directory, c, 0, None);
        Self::reply_entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.tree.lock().remove(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.tree.lock().remove(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let c = self.creator(req, parent.0, 0o777, 0, false);
        let r = self.make(
            parent,
            link_name,
            FileType::Symlink,
            c,
            0,
            Some(target.as_os_str()),
        );
        Self::reply_entry(reply, r);
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
        let r = self
            .tree
            .lock()
            .rename(parent.0, name, newparent.0, newname, flags.bits());
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        Self::reply_entry(reply, self.tree.lock().link(ino.0, newparent.0, newname));
    }

    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), self.caching.open_flags(flags.0))
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let end = match self.tree.lock().attr(ino.0) {
            Ok(a) => a.size,
            Err(e) => return reply.error(errno(e)),
        };
        let n = end.saturating_sub(offset).min(size as u64) as usize;
        reply.data(&ZEROS[..n.min(ZEROS.len())])
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let now = SystemTime::now();
        let mut t = self.tree.lock();
        match t.attr_mut(ino.0) {
            Ok(a) => {
                a.size = a.size.max(offset + data.len() as u64);
                a.mtime = now;
                a.ctime = now;
            }
            Err(e) => return reply.error(errno(e)),
        }
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            t.kill_suidgid(ino.0, req.gid());
        }
        drop(t);
        reply.written(data.len() as u32)
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

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.tree.lock().attr(ino.0) {
            Ok(a) if a.kind == FileType::Directory => {
                reply.opened(FileHandle(0), FopenFlags::empty())
            }
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.tree.lock().list(ino.0, offset, 1024) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(e)),
        };
        for (cookie, child, kind, name) in entries {
            if reply.add(INodeNo(child), cookie, kind, &name) {
                break;
            }
        }
        reply.ok()
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut t = self.tree.lock();
        let entries = match t.list(ino.0, offset, 256) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(e)),
        };
        for (cookie, child, _kind, name) in entries {
            let Ok(a) = t.attr(child) else { continue };
            if reply.add(INodeNo(child), cookie, &name, &TTL, &a, Generation(0)) {
                break;
            }
            // The kernel takes a reference on every entry it is sent but "." and "..".
            if name != "." && name != ".." {
                t.hold(child);
            }
        }
        drop(t);
        reply.ok()
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = 1u64 << 32;
        reply.statfs(blocks, blocks, blocks, blocks, blocks, 4096, 255, 4096);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        // Accepted and discarded like file data, so clients (cp -a setting ACLs) take the
        // same path as on nodup instead of a fallback.
        reply.ok()
    }

    fn getxattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, _size: u32, r: ReplyXattr) {
        r.error(Errno::ENODATA)
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
        }
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.ok()
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel checks the mode bits; only existence matters here.
        match self.tree.lock().attr(ino.0) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
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
        let c = self.creator(req, parent.0, mode, umask, false);
        let kind = crate::attr::kind_of(mode);
        match self.make(parent, name, kind, c, 0, None) {
            Ok(a) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(0),
                self.caching.open_flags(flags),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        use libc::FALLOC_FL_ZERO_RANGE as ZERO;
        use libc::{FALLOC_FL_KEEP_SIZE as KEEP, FALLOC_FL_PUNCH_HOLE as PUNCH};
        // As nodup: no preallocation (mode 0 is refused), holes and zeroed ranges accepted.
        if mode & !(KEEP | PUNCH | ZERO) != 0 || mode & (PUNCH | ZERO) == 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let mut t = self.tree.lock();
        match t.attr_mut(ino.0) {
            Ok(a) => {
                if mode & KEEP == 0 {
                    a.size = a.size.max(offset + length);
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(e)),
        }
    }
}

/// The attributes of a negative entry (only the inode number, 0, matters to the kernel).
const NEGATIVE: FileAttr = FileAttr {
    ino: INodeNo(0),
    size: 0,
    blocks: 0,
    atime: SystemTime::UNIX_EPOCH,
    mtime: SystemTime::UNIX_EPOCH,
    ctime: SystemTime::UNIX_EPOCH,
    crtime: SystemTime::UNIX_EPOCH,
    kind: FileType::RegularFile,
    perm: 0,
    nlink: 0,
    uid: 0,
    gid: 0,
    rdev: 0,
    blksize: 4096,
    flags: 0,
};
