//! The logging disk: a FUSE file system holding one file, `disk`, whose every write, zeroed
//! range and fsync is appended to a log as it is answered, and a write-only file, `mark`,
//! whose writes go to the log as labels. A loop device over `disk` is a block device whose
//! history can be replayed to any flush, and partly past it: the stand-in for device-mapper's
//! `log-writes` target (this kernel has no device mapper) in power-loss tests of what runs on
//! top (`tests/power_loss/`).
//!
//! The log is a sequence of records, integers little-endian:
//!
//! ```text
//! 'W' (1 byte) | offset: u64 | len: u32 | len bytes     a write of `disk`
//! 'Z' (1 byte) | offset: u64 | len: u64                 a range of `disk` zeroed (fallocate)
//! 'F' (1 byte)                                          an fsync of `disk` (a flush)
//! 'M' (1 byte) | len: u32 | len bytes                   a write to `mark`
//! ```
//!
//! A record is appended, under one lock, before its request is answered, so the log's order
//! is one the disk could have seen: whatever was answered before a flush was sent precedes
//! its 'F'.

use crate::session::{self, TTL};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

const ROOT: u64 = 1;
const DISK: u64 = 2;
const MARK: u64 = 3;

/// The disk's bytes and the open log, changed together.
struct State {
    disk: Vec<u8>,
    log: File,
    /// A record could not be appended whole: the log can no longer be read past it, so every
    /// later request fails (EIO) rather than be logged after a torn record.
    broken: bool,
}

/// The logging disk file system.
pub struct LogDisk {
    state: Mutex<State>,
    /// Owner of the three inodes (the user who mounted it).
    uid: u32,
    gid: u32,
    started: SystemTime,
}

impl LogDisk {
    /// A disk of `len` zero bytes, logging to `log` (created, or truncated).
    pub fn new(log: &Path, len: u64) -> std::io::Result<LogDisk> {
        let len = usize::try_from(len).map_err(|_| std::io::Error::other("size too large"))?;
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Ok(LogDisk {
            state: Mutex::new(State {
                disk: vec![0; len],
                log: File::create(log)?,
                broken: false,
            }),
            uid,
            gid,
            started: SystemTime::now(),
        })
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            ROOT => (FileType::Directory, 0o755, 0, 2),
            DISK => (
                FileType::RegularFile,
                0o600,
                self.state.lock().disk.len() as u64,
                1,
            ),
            MARK => (FileType::RegularFile, 0o200, 0, 1),
            _ => return None,
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    /// Append one record, before the change it logs is made: an error fails the request
    /// (the log must not miss anything) and every later one ([`State::broken`]).
    fn append(s: &mut State, parts: &[&[u8]]) -> Result<(), Errno> {
        if s.broken {
            return Err(Errno::EIO);
        }
        for p in parts {
            if s.log.write_all(p).is_err() {
                s.broken = true;
                return Err(Errno::EIO);
            }
        }
        Ok(())
    }

    /// The byte range `[offset, offset + len)` of a disk of `disk_len` bytes, if inside it.
    fn range(offset: u64, len: u64, disk_len: usize) -> Option<std::ops::Range<usize>> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        (end <= disk_len).then_some(start..end)
    }
}

/// Serve a logging disk of `len` bytes at `mountpoint`, its log in `log`, until unmounted or
/// signalled.
pub fn run(
    log: &Path,
    len: u64,
    mountpoint: &Path,
    opts: &session::Options,
) -> std::io::Result<()> {
    session::serve(LogDisk::new(log, len)?, mountpoint, opts, "nodup-logdisk")
}

impl Filesystem for LogDisk {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Requests as large as nodup's; a kernel that caps them lower only splits writes
        // into more records, which the log replays all the same.
        let _ = config.set_max_write(session::MAX_WRITE);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let ino = match (parent.0, name.as_encoded_bytes()) {
            (ROOT, b"disk") => DISK,
            (ROOT, b"mark") => MARK,
            _ => return reply.error(Errno::ENOENT),
        };
        match self.attr(ino) {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // A disk has a fixed size and owner; a truncation of `mark` (O_TRUNC) changes nothing,
        // and times are accepted and not kept.
        let Some(a) = self.attr(ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if mode.is_some() || uid.is_some() || gid.is_some() || size.is_some_and(|s| s != a.size) {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&TTL, &a)
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match ino.0 {
            // Every read and write reaches the daemon, in the order they are made.
            DISK | MARK => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            _ => reply.error(Errno::EISDIR),
        }
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
        if ino.0 != DISK {
            return reply.data(&[]);
        }
        let s = self.state.lock();
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(s.disk.len());
        let end = start.saturating_add(size as usize).min(s.disk.len());
        reply.data(&s.disk[start..end])
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = self.state.lock();
        let r = match ino.0 {
            DISK => match Self::range(offset, data.len() as u64, s.disk.len()) {
                Some(at) => {
                    let len = (data.len() as u32).to_le_bytes();
                    Self::append(&mut s, &[b"W", &offset.to_le_bytes(), &len, data])
                        .map(|()| s.disk[at].copy_from_slice(data))
                }
                None => Err(Errno::ENOSPC),
            },
            MARK => {
                let len = (data.len() as u32).to_le_bytes();
                Self::append(&mut s, &[b"M", &len, data])
            }
            _ => Err(Errno::EBADF),
        };
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
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
        reply.ok()
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut s = self.state.lock();
        let r = match ino.0 {
            DISK => Self::append(&mut s, &[b"F"]),
            _ => Ok(()),
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
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
        // A loop device turns discards into punched holes and write-zeroes into zeroed ranges;
        // both read back as zeros afterwards. Nothing else is a disk's.
        if ino.0 != DISK || mode & !(KEEP | PUNCH | ZERO) != 0 || mode & (PUNCH | ZERO) == 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let mut s = self.state.lock();
        let r = match Self::range(offset, length, s.disk.len()) {
            Some(at) => Self::append(
                &mut s,
                &[b"Z", &offset.to_le_bytes(), &length.to_le_bytes()],
            )
            .map(|()| s.disk[at].fill(0)),
            None => Err(Errno::EINVAL),
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match ino.0 {
            ROOT => reply.opened(FileHandle(0), FopenFlags::empty()),
            _ => reply.error(Errno::ENOTDIR),
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
        if ino.0 != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
            (DISK, FileType::RegularFile, "disk"),
            (MARK, FileType::RegularFile, "mark"),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok()
    }
}
