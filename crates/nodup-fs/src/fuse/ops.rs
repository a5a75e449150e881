//! The kernel's requests: the `fuser::Filesystem` implementation, one method per FUSE request,
//! each translated into [`FileSystem`](crate::fs::FileSystem) calls and a reply. A trait is
//! implemented in one block, so the requests stay together here; what they share is in the
//! parent module.

use super::caller::{caller, creator, has_sys_admin, killed_suidgid};
use super::direct::{DIRECT_FH, READER_FH};
use super::trim::FITRIM;
use super::{err, ftype, requested_time, time, Adapter, TTL};
use crate::error::FsError;
use crate::fs::SetAttr;
use crate::inode::{Attr, Kind, Ts};
use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, IoctlFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

impl Filesystem for Adapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.caching.negotiate(config);
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.fs.shutdown() {
            crate::logging::error(&format!("clean shutdown failed: {e}"));
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(parent.0, name.as_bytes()) {
            // A negative entry (inode 0) lets the kernel cache "does not exist" for TTL; every
            // namespace change goes through this mount, so the kernel invalidates it itself.
            Err(FsError::Errno(libc::ENOENT)) => {
                let now = Ts::now();
                let a = Attr {
                    kind: Kind::File,
                    perm: 0,
                    uid: 0,
                    gid: 0,
                    nlink: 0,
                    size: 0,
                    rdev: 0,
                    atime: now,
                    mtime: now,
                    ctime: now,
                };
                reply.entry(&TTL, &self.attr_of(0, &a, 0), Generation(0))
            }
            r => self.entry(reply, r),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        // With a handle this is the kernel asking before a buffered write (or a read past the
        // cached end of file, or lseek to the end): refuse writers when the room is gone.
        if let Some(fh) = fh {
            let free = self.observe_space();
            if self.space.refuse(fh.0, free) {
                return reply.error(Errno::ENOSPC);
            }
        }
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&self.ttl(&a), &self.attr(ino.0, &a)),
            Err(e) => reply.error(err(e)),
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
        ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut mode = mode;
        // With KILLPRIV_V2 the kernel leaves set-id clearing on chown and truncate to us, but
        // fuser does not pass FATTR_KILL_SUIDGID on; apply the kernel's rule: chown of a
        // non-directory always clears, truncate unless the caller is root (CAP_FSETID).
        if self.caching.granted.killpriv && mode.is_none() {
            let chown = uid.is_some() || gid.is_some();
            let trunc = size.is_some() && req.uid() != 0;
            if chown || trunc {
                if let Ok(a) = self.fs.getattr(ino.0) {
                    let caller_gid = if chown { a.gid } else { req.gid() };
                    let perm = killed_suidgid(a.perm, a.gid, caller_gid);
                    if a.kind != Kind::Dir && perm != a.perm {
                        mode = Some(perm);
                    }
                }
            }
        }
        let sa = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: time(atime),
            mtime: time(mtime),
            ctime: ctime.map(requested_time),
        };
        match self.fs.setattr(ino.0, &sa) {
            Ok(a) => reply.attr(&self.ttl(&a), &self.attr(ino.0, &a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(err(e)),
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
        let Some(kind) = Kind::from_mode(mode) else {
            return reply.error(Errno::EINVAL);
        };
        if kind == Kind::Dir || kind == Kind::Symlink {
            return reply.error(Errno::EINVAL);
        }
        let r = self.fs.mknod(
            parent.0,
            name.as_bytes(),
            kind,
            mode,
            rdev,
            b"",
            creator(req, umask),
        );
        self.entry(reply, r);
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
        let r = self.fs.mknod(
            parent.0,
            name.as_bytes(),
            Kind::Dir,
            mode,
            0,
            b"",
            creator(req, umask),
        );
        self.entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.fs.unlink(parent.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.fs.rmdir(parent.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
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
        let r = self.fs.mknod(
            parent.0,
            link_name.as_bytes(),
            Kind::Symlink,
            0o777,
            0,
            target.as_os_str().as_bytes(),
            caller(req),
        );
        self.entry(reply, r);
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
        match self.fs.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.bits(),
        ) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
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
        let r = self
            .fs
            .link(ino.0, newparent.0, newname.as_bytes())
            .map(|a| (ino.0, a));
        self.entry(reply, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.open_handle(ino.0) {
            Ok(_) => {
                // Reads may be served from the page cache without reaching us.
                let mode = flags.0 & libc::O_ACCMODE;
                if mode != libc::O_WRONLY {
                    self.touch(ino.0);
                }
                let (fh, fopen) = self.open_reply(ino.0, flags.0);
                reply.opened(FileHandle(fh), fopen)
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(ino.0, offset, size as usize) {
            Ok(d) => {
                // The writeback cache reads pages to fill partial writes, through handles
                // opened write-only: not an access.
                if flags.0 & libc::O_ACCMODE != libc::O_WRONLY {
                    self.touch(ino.0);
                }
                reply.data(&d)
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let direct = fh.0 == DIRECT_FH && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        // Before the data changes, as the kernel's file_remove_privs does for a write through
        // the cache (mapped pages written back keep coming that way, with FUSE_WRITE_CACHE).
        if direct {
            if let Err(e) = self.drop_capability(ino.0) {
                return reply.error(err(e));
            }
        }
        let mut reply = Some(reply);
        let mut storing = None;
        let r = if self.answers_early(req, ino.0, data.len(), write_flags, flags) {
            self.write_answered(ino.0, offset, data, &mut reply, &mut storing)
        } else if write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
            self.fs.write_back(ino.0, offset, data)
        } else {
            self.fs.write(ino.0, offset, data)
        };
        self.observe_space();
        // The kernel sets the flag on every write of a caller without CAP_FSETID;
        // `kill_suidgid` drops only the bits the file has and the caller must lose. After a
        // write answered early too: a chmod racing it may have set a bit since it was let
        // through.
        if r.is_ok() && write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            self.kill_suidgid(ino.0, req.gid());
        }
        match (reply, r) {
            (Some(rp), Ok(n)) => {
                let owed = if direct {
                    self.direct_written(ino.0, offset, n, flags.0)
                } else {
                    Ok(())
                };
                match owed {
                    Ok(()) => rp.written(n as u32),
                    Err(e) => rp.error(e),
                }
            }
            (Some(rp), Err(e)) => rp.error(err(e)),
            (None, r) => {
                let ok = r.is_ok();
                self.stored(ino.0, offset, storing, r);
                // Answered already: nothing to order before the answer, and fsync or close
                // may be waiting for this write, so no serving thread waits on the kernel.
                if direct && ok {
                    self.drop_cached_later(ino.0, offset, data.len());
                }
            }
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        if self.async_writes {
            // A close of a handle open for writing waits for the writes answered early and
            // reports what failed after an answer (without taking it from the file's fsync);
            // a read-only one has nothing to wait for.
            if fh.0 == READER_FH {
                return reply.ok();
            }
            return match self.settle(ino.0, false) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            };
        }
        // Nothing is buffered here at close (writes reach the engine before they return, and
        // the kernel writes its own dirty pages back before it would send FLUSH), so ENOSYS:
        // the kernel then stops sending FLUSH at all, one round trip less per close(2).
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.handle_closed(ino.0, fh.0);
        match self.fs.release_handle(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.sync_file(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.getattr(ino.0) {
            // An open directory holds its inode like an open file: removed or replaced by a
            // rename, it stays valid (nlink 0) until the last handle closes.
            Ok(a) if a.kind == Kind::Dir => match self.fs.open_handle(ino.0) {
                Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
                Err(e) => reply.error(err(e)),
            },
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(err(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        match self.fs.release_handle(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
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
        match self.fs.readdir(ino.0, offset, 1024) {
            Ok(entries) => {
                if offset == 0 {
                    self.touch(ino.0);
                }
                for (off, child, kind, name) in entries {
                    if reply.add(INodeNo(child), off, ftype(kind), OsStr::from_bytes(&name)) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        match self.fs.readdir(ino.0, offset, 256) {
            Ok(entries) => {
                if offset == 0 {
                    self.touch(ino.0);
                }
                for (off, child, _kind, name) in entries {
                    let Ok(a) = self.fs.getattr(child) else {
                        continue;
                    };
                    if reply.add(
                        INodeNo(child),
                        off,
                        OsStr::from_bytes(&name),
                        &self.ttl(&a),
                        &self.attr(child, &a),
                        Generation(0),
                    ) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.fs.sync() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let st = self.fs.statfs();
        let files = 1u64 << 32;
        reply.statfs(
            st.blocks,
            st.free,
            st.avail,
            files,
            files - st.inodes.min(files),
            4096,
            255,
            4096,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        match self.set_xattr(req, ino.0, name.as_bytes(), value, flags) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let r = self.get_xattr(ino.0, name.as_bytes());
        match r {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(err(e)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(ino.0) {
            Ok(mut names) => {
                // As ext4 and tmpfs: `trusted.*` names are listed only to CAP_SYS_ADMIN (the
                // kernel checks reading them, but leaves the list to the file system).
                if names.iter().any(|n| n.starts_with(b"trusted.")) && !has_sys_admin(req) {
                    names.retain(|n| !n.starts_with(b"trusted."));
                }
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                if size == 0 {
                    reply.size(buf.len() as u32)
                } else if buf.len() > size as usize {
                    reply.error(Errno::ERANGE)
                } else {
                    reply.data(&buf)
                }
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.fs.removexattr(ino.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // With default_permissions the kernel checks mode bits itself; only existence matters.
        match self.fs.getattr(ino.0) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(err(e)),
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
        let kind = Kind::from_mode(mode).unwrap_or(Kind::File);
        let r = self
            .fs
            .mknod(
                parent.0,
                name.as_bytes(),
                kind,
                mode,
                0,
                b"",
                creator(req, umask),
            )
            .and_then(|(ino, _)| self.fs.open_handle(ino).map(|a| (ino, a)));
        match r {
            Ok((ino, a)) => {
                let (fh, fopen) = self.open_reply(ino, flags);
                reply.created(
                    &self.ttl(&a),
                    &self.attr(ino, &a),
                    Generation(0),
                    FileHandle(fh),
                    fopen,
                )
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // The reply carries a 32-bit count; callers loop over larger copies.
        let len = len.min(u32::MAX as u64 & !(nodup_core::BLOCK_SIZE as u64 - 1));
        match self
            .fs
            .copy_range(ino_in.0, offset_in, ino_out.0, offset_out, len)
        {
            Ok(n) => {
                self.data_changed_by(req, ino_out.0);
                reply.written(n as u32)
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        if offset < 0 {
            // As ext4, xfs and tmpfs answer a negative SEEK_DATA / SEEK_HOLE offset.
            return reply.error(Errno::ENXIO);
        }
        match self.fs.seek_data_hole(ino.0, offset as u64, whence) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(err(e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.fs.fallocate(ino.0, offset, length, mode) {
            Ok(()) => {
                self.data_changed_by(req, ino.0);
                reply.ok()
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        if cmd != FITRIM {
            // What a file system without the ioctl answers (the kernel would turn ENOSYS
            // into it too).
            return reply.error(Errno::ENOTTY);
        }
        match self.fitrim(req, in_data, out_size) {
            Ok(out) => reply.ioctl(0, &out),
            Err(e) => reply.error(e),
        }
    }
}
