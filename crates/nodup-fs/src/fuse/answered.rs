//! Writes answered before they are stored (`nodup mount --async-writes`): which requests
//! qualify, and the errors found after the answer, kept for the file's next fsync or close.
//!
//! A synchronous writer waits for each answer, so the daemon's work on a write adds to the
//! writer's time whole. Answered at once, that work overlaps the writer preparing its next
//! write and the kernel copying it in. The data is then durable at fsync (or close), as on
//! ext4 or ZFS, instead of when the call returns; `FileSystem::write_admitted` keeps the
//! rest: room reserved first, and the inode locked until the write is stored.

use super::{err, Adapter};
use crate::error::FsError;
use fuser::{Errno, OpenFlags, ReplyWrite, WriteFlags};
use parking_lot::Mutex;
use std::collections::HashMap;

/// Smallest write answered before it is stored: below it the hand-over to the next serving
/// thread costs more than the overlap gives (4 KiB writes measured 8-12 % slower).
pub const ASYNC_MIN: usize = 128 << 10;

/// Errors of writes that were already answered, by inode, until fsync or close reports them.
#[derive(Debug, Default)]
pub struct Deferred {
    errors: Mutex<HashMap<u64, FsError>>,
}

impl Deferred {
    /// Keep the first error of `ino` (later ones add nothing a caller could act on).
    fn note(&self, ino: u64, off: u64, e: FsError) {
        crate::logging::error(&format!(
            "write to inode {ino} at byte {off} failed after it was answered ({e}); the file's next fsync or close reports it"
        ));
        self.errors.lock().entry(ino).or_insert(e);
    }

    /// The error to report for `ino`, once.
    fn take(&self, ino: u64) -> Option<FsError> {
        self.errors.lock().remove(&ino)
    }
}

/// Whether a write may be answered before it is stored: a direct write (the writeback cache
/// has answered already), large enough, on a file not opened for synchronous writes, and not
/// one whose answer must follow dropping set-id bits.
pub fn qualifies(len: usize, write_flags: WriteFlags, open_flags: OpenFlags) -> bool {
    len >= ASYNC_MIN
        && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE)
        && !write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
        && open_flags.0 & libc::O_DSYNC == 0
}

impl Adapter {
    /// Store a write that [`qualifies`], answering it as soon as it is admitted.
    pub(super) fn write_answered(&self, ino: u64, off: u64, data: &[u8], reply: ReplyWrite) {
        let mut reply = Some(reply);
        let r = self.fs.write_admitted(ino, off, data, || {
            if let Some(rp) = reply.take() {
                rp.written(data.len() as u32);
            }
        });
        self.observe_space();
        match (reply, r) {
            (Some(rp), Ok(n)) => rp.written(n as u32),
            (Some(rp), Err(e)) => rp.error(err(e)),
            (None, Ok(_)) => {}
            (None, Err(e)) => {
                self.deferred.note(ino, off, e);
                // The kernel keeps the answered data in its page cache; drop it, so reads show
                // what the file holds.
                if let Some(n) = self.notifier.get() {
                    let _ = n.inval_inode(fuser::INodeNo(ino), 0, 0);
                }
            }
        }
    }

    /// Wait for `ino`'s answered writes to be stored; the first error among them, if any.
    pub(super) fn settle(&self, ino: u64) -> Result<(), Errno> {
        if !self.async_writes {
            return Ok(());
        }
        self.fs.wait_writes(ino);
        match self.deferred.take(ino) {
            Some(e) => Err(err(e)),
            None => Ok(()),
        }
    }
}
