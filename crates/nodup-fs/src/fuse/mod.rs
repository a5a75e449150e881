//! FUSE adapter: translates kernel requests (served by several threads, fuser's multi-threaded
//! session) into [`FileSystem`] calls, and runs the mount until it is unmounted or signalled.
//!
//! This module holds the adapter itself and what its requests share (attribute replies, the
//! kernel's caches, set-id clearing); the requests are in `ops`, the mount in `session`.

mod answered;
mod caller;
mod direct;
pub mod kernel;
mod ops;
pub mod request_buffer;
mod session;
mod space;
mod trim;
mod xattr;

pub use self::answered::ASYNC_MIN;
use self::caller::killed_suidgid;
pub use self::request_buffer::RequestBufferAlloc;
pub use self::session::{serve, MountOptions};

use self::space::SpaceGuard;
use crate::atime::AtimeMode;
use crate::error::FsError;
use crate::fs::{FileSystem, SetAttr};
use crate::inode::{Attr, Kind, Ts};
use fuser::{
    Errno, FileAttr, FileType, Generation, INodeNo, Notifier, ReplyEntry, Request, TimeOrNow,
};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How long the kernel may cache attributes and entries.
pub const TTL: Duration = Duration::from_secs(1);
/// Largest write request negotiated with the kernel (256 pages).
pub const MAX_WRITE: u32 = 1 << 20;

/// The `fuser::Filesystem` implementation over a [`FileSystem`].
pub struct Adapter {
    fs: Arc<FileSystem>,
    /// The writeback cache or direct writes, and what the kernel agreed to at INIT
    /// (`granted.killpriv`: clearing suid/sgid is our job).
    caching: kernel::Caching,
    /// Cached handles open beside direct ones ([`direct`]).
    cached: direct::CachedOpens,
    /// Threads serving requests.
    threads: usize,
    /// Tells the kernel to drop cached attributes we changed behind its back (set once the
    /// session exists, which is after the adapter is built).
    notifier: Arc<OnceLock<Notifier>>,
    atime: AtimeMode,
    /// Room for the kernel's dirty pages (writeback cache): ENOSPC at write(2).
    space: Arc<SpaceGuard>,
    /// Large direct writes are answered before they are stored ([`answered`]).
    async_writes: bool,
    /// Such writes still being stored, and their errors.
    answered: answered::Answered,
}

fn err(e: FsError) -> Errno {
    if !matches!(e, FsError::Errno(_)) {
        crate::logging::request_error(&e.to_string());
    }
    Errno::from_i32(e.errno())
}

fn ftype(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
        Kind::Socket => FileType::Socket,
    }
}

fn time(t: Option<TimeOrNow>) -> Option<Ts> {
    t.map(|t| match t {
        TimeOrNow::Now => Ts::now(),
        TimeOrNow::SpecificTime(s) => requested_time(s),
    })
}

/// The time a request asked for, from fuser's `SystemTime` of it. fuser 0.18 builds a time
/// before 1970 as the epoch minus (seconds, nanoseconds) of the kernel's timespec, so
/// (-1 s, 250 ms), which is 0.75 s before the epoch, arrives as 1.25 s before it. The
/// timespec is read back here as it was sent (tests/posix.rs holds it on a real mount, so a
/// fuser that fixes this makes that test fail rather than times silently shift).
fn requested_time(s: std::time::SystemTime) -> Ts {
    match std::time::UNIX_EPOCH.duration_since(s) {
        Ok(before) if s != std::time::UNIX_EPOCH => Ts {
            sec: -(before.as_secs() as i64),
            nsec: before.subsec_nanos(),
        },
        _ => Ts::from_system(s),
    }
}

impl Adapter {
    /// An adapter serving `fs` with the caching and answering choices of `opts`.
    pub fn new(fs: Arc<FileSystem>, opts: &MountOptions) -> Adapter {
        Adapter {
            fs,
            caching: kernel::Caching::new(opts.writeback_cache, opts.direct_writes),
            cached: direct::CachedOpens::default(),
            threads: opts.threads.max(1),
            notifier: Arc::new(OnceLock::new()),
            atime: opts.atime,
            space: Arc::new(SpaceGuard::default()),
            async_writes: opts.async_writes,
            answered: answered::Answered::default(),
        }
    }

    /// Clear the set-id bits of `ino` after a modification by `gid` (what the kernel does on
    /// local file systems), and make the kernel forget the mode it cached.
    fn kill_suidgid(&self, ino: u64, gid: u32) {
        let Ok(a) = self.fs.getattr(ino) else {
            return;
        };
        let perm = killed_suidgid(a.perm, a.gid, gid);
        if perm == a.perm {
            return;
        }
        let req = SetAttr {
            mode: Some(perm),
            ..Default::default()
        };
        if self.fs.setattr(ino, &req).is_ok() {
            self.forget_attr(ino);
        }
    }

    /// A handle that may write was opened on `ino`: its writes are checked against the free
    /// space when it is short, and an open now must not rely on attributes cached before.
    fn writer_opened(&self, ino: u64) {
        self.space.opened(ino);
        if self.space.is_tight() {
            self.forget_attr(ino);
        }
    }

    /// Note an access to `ino` (a read, an open for reading, a listing) under the atime mode.
    fn touch(&self, ino: u64) {
        // A failed atime update (a full device) must not fail the read.
        if let Ok(true) = self.fs.accessed(ino, self.atime) {
            self.forget_attr(ino);
        }
    }

    /// How long the kernel may cache `a`: not at all for files while the mount is tight, so
    /// every buffered write asks first (see [`space`]).
    fn ttl(&self, a: &Attr) -> Duration {
        if a.kind == Kind::File && self.space.is_tight() {
            Duration::ZERO
        } else {
            TTL
        }
    }

    /// Note the free space after a change; when the mount becomes tight, writers' cached
    /// attributes are dropped so that their next write asks. Returns the free bytes.
    fn observe_space(&self) -> u64 {
        if self.space.window() == 0 {
            return u64::MAX;
        }
        let free = self.fs.free_data_bytes();
        for ino in self.space.observe(free) {
            self.forget_attr(ino);
        }
        free
    }

    /// `req` changed the data of `ino` without a write (punch, zero range, server-side copy):
    /// like a write, that drops the set-id bits unless the caller may keep them (CAP_FSETID,
    /// taken to be root here). Writes get the kernel's flag for this instead.
    fn data_changed_by(&self, req: &Request, ino: u64) {
        if self.caching.granted.killpriv && req.uid() != 0 {
            self.kill_suidgid(ino, req.gid());
        }
    }

    /// Drop the kernel's cached attributes of `ino` (negative offset: attributes only, the
    /// page cache stays). Without this a stat would show the old mode for up to TTL.
    fn forget_attr(&self, ino: u64) {
        if let Some(n) = self.notifier.get() {
            // ENOENT just means the kernel no longer caches the inode: nothing to forget.
            let _ = n.inval_inode(INodeNo(ino), -1, 0);
        }
    }

    fn attr(&self, ino: u64, a: &Attr) -> FileAttr {
        let sectors = if a.kind == Kind::File {
            self.fs.sectors(ino)
        } else {
            0
        };
        self.attr_of(ino, a, sectors)
    }

    fn attr_of(&self, ino: u64, a: &Attr, sectors: u64) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size: if a.kind == Kind::Dir { 4096 } else { a.size },
            blocks: sectors,
            atime: a.atime.to_system(),
            mtime: a.mtime.to_system(),
            ctime: a.ctime.to_system(),
            crtime: a.ctime.to_system(),
            kind: ftype(a.kind),
            perm: (a.perm & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            blksize: 4096,
            flags: 0,
        }
    }

    fn entry(&self, reply: ReplyEntry, r: crate::Result<(u64, Attr)>) {
        match r {
            Ok((ino, a)) => reply.entry(&self.ttl(&a), &self.attr(ino, &a), Generation(0)),
            Err(e) => reply.error(err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn requested_times_before_1970_keep_their_nanoseconds() {
        // What fuser 0.18 hands over for the kernel's timespec (sec, nsec), sec < 0.
        let fuser = |sec: u64, nsec: u32| UNIX_EPOCH - Duration::new(sec, nsec);
        let ts = |sec, nsec| Ts { sec, nsec };
        assert_eq!(requested_time(fuser(1, 250_000_000)), ts(-1, 250_000_000));
        assert_eq!(requested_time(fuser(1000, 5)), ts(-1000, 5));
        assert_eq!(requested_time(fuser(7, 0)), ts(-7, 0));
        assert_eq!(requested_time(UNIX_EPOCH), ts(0, 0));
        let after = UNIX_EPOCH + Duration::new(1_700_000_000, 42);
        assert_eq!(requested_time(after), ts(1_700_000_000, 42));
    }
}
