//! Handles that bypass the kernel's page cache (`--direct-writes`, [`kernel::is_direct`]):
//! the handle numbers ([`READER_FH`], `space::WRITER_FH` for a writer through the cache,
//! [`DIRECT_FH`]), and what a write through one owes that the kernel's
//! page-cache path did itself:
//!
//! - `security.capability` is removed before the data changes, as the kernel's
//!   `file_remove_privs` does for every write through the cache (set-id bits come flagged,
//!   FUSE_WRITE_KILL_SUIDGID);
//! - an `O_SYNC`/`O_DSYNC` (or `RWF_DSYNC`) write is made durable before its answer (the
//!   kernel sends no FSYNC after a direct write);
//! - the written range is dropped from the page cache while handles that use it are open on
//!   the file: kernels before the end of 2025 drop cached pages only *before* a direct
//!   write, so a reader's readahead racing it could keep the old data for good.

use super::{kernel, Adapter};
use fuser::{Errno, INodeNo};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, OnceLock};

/// Handle number of a read-only open (cached).
pub(super) const READER_FH: u64 = 0;
use super::space::WRITER_FH;
/// Handle number of an open that may write and bypasses the page cache.
pub(super) const DIRECT_FH: u64 = 2;

/// The extended attribute the kernel drops on a write (file capabilities).
const CAPABILITY: &[u8] = b"security.capability";

/// Cached handles open per inode, kept while direct writes are possible, and the thread
/// that drops ranges from the page cache when no serving thread should wait for it.
#[derive(Default)]
pub(super) struct CachedOpens {
    by_ino: Mutex<HashMap<u64, u32>>,
    /// Serving threads inside an invalidation (see [`Adapter::drop_cached`]).
    invalidating: AtomicUsize,
    /// The invalidation thread's queue (started on first use).
    later: OnceLock<Option<mpsc::Sender<(u64, i64, i64)>>>,
}

impl CachedOpens {
    fn opened(&self, ino: u64) {
        *self.by_ino.lock().entry(ino).or_default() += 1;
    }

    fn closed(&self, ino: u64) {
        let mut m = self.by_ino.lock();
        if let Some(n) = m.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                m.remove(&ino);
            }
        }
    }

    fn any(&self, ino: u64) -> bool {
        self.by_ino.lock().contains_key(&ino)
    }
}

impl Adapter {
    /// Whether cached handles are counted: direct handles are possible on this mount.
    fn counts_cached(&self) -> bool {
        self.caching.direct != kernel::DirectWrites::Off && self.caching.granted.direct_io
    }

    /// The handle number and reply flags of a new open of `ino` with open `flags`.
    pub(super) fn open_reply(&self, ino: u64, flags: i32) -> (u64, fuser::FopenFlags) {
        let direct = self.caching.is_direct(flags);
        let fh = if flags & libc::O_ACCMODE == libc::O_RDONLY {
            READER_FH
        } else {
            self.writer_opened(ino);
            if direct {
                DIRECT_FH
            } else {
                WRITER_FH
            }
        };
        if !direct && self.counts_cached() {
            self.cached.opened(ino);
        }
        (fh, kernel::open_flags(direct))
    }

    /// A handle `fh` of `ino` was released.
    pub(super) fn handle_closed(&self, ino: u64, fh: u64) {
        if fh != READER_FH {
            self.space.closed(ino);
        }
        if fh != DIRECT_FH && self.counts_cached() {
            self.cached.closed(ino);
        }
    }

    /// Before a write through a direct handle: remove the file's capability.
    pub(super) fn drop_capability(&self, ino: u64) -> crate::Result<()> {
        if self.fs.getxattr(ino, CAPABILITY).is_err() {
            return Ok(());
        }
        match self.fs.removexattr(ino, CAPABILITY) {
            Ok(()) | Err(crate::FsError::Errno(libc::ENODATA)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Before answering a write of `len` bytes at `off` stored through a direct handle
    /// opened with `open_flags`: drop the range from cached readers' pages, and make an
    /// `O_DSYNC` write durable as the kernel's FSYNC after a cached one would (reporting a
    /// failure of the file's writes answered early too).
    pub(super) fn direct_written(
        &self,
        ino: u64,
        off: u64,
        len: usize,
        open_flags: i32,
    ) -> Result<(), Errno> {
        self.drop_cached(ino, off, len);
        if open_flags & libc::O_DSYNC != 0 {
            self.sync_file(ino)?;
        }
        Ok(())
    }

    /// Drop `len` bytes at `off` of `ino` from the page cache when cached handles are open on
    /// it, before the write is answered. The kernel may need a serving thread for that (a
    /// reader's page waits on a READ, a dirty mapped page is written back), so at most all
    /// serving threads but one do it inline; the rest leave it to the invalidation thread.
    fn drop_cached(&self, ino: u64, off: u64, len: usize) {
        if len == 0 || !self.cached.any(ino) {
            return;
        }
        let Some(n) = self.notifier.get() else {
            return;
        };
        if self.cached.invalidating.fetch_add(1, Ordering::AcqRel) + 1 < self.threads {
            // ENOENT: the kernel no longer caches the inode.
            let _ = n.inval_inode(INodeNo(ino), off as i64, len as i64);
        } else {
            self.drop_cached_later(ino, off, len);
        }
        self.cached.invalidating.fetch_sub(1, Ordering::AcqRel);
    }

    /// [`Adapter::drop_cached`] by the invalidation thread, without waiting for it.
    pub(super) fn drop_cached_later(&self, ino: u64, off: u64, len: usize) {
        if len == 0 || !self.cached.any(ino) {
            return;
        }
        let Some(n) = self.notifier.get().cloned() else {
            return;
        };
        let tx = self.cached.later.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<(u64, i64, i64)>();
            let spawned = std::thread::Builder::new()
                .name("nodup-inval".into())
                .spawn(move || {
                    for (ino, off, len) in rx {
                        let _ = n.inval_inode(INodeNo(ino), off, len);
                    }
                });
            match spawned {
                Ok(_) => Some(tx),
                Err(e) => {
                    crate::logging::error(&format!(
                        "no page-cache invalidation thread ({e}): readers racing direct writes may keep old pages"
                    ));
                    None
                }
            }
        });
        if let Some(tx) = tx {
            let _ = tx.send((ino, off as i64, len as i64));
        }
    }
}
