//! Writes answered before they are stored (the mount's `--async-writes`): the room such a
//! write reserves before its answer, so that storing it later does not run out of space.
//!
//! An admitted write holds its inode's lock from before the answer until it is stored, so
//! every later call on that inode (a read, a stat, a truncate) sees it whole. Waiting for the
//! write itself (fsync, close) and its errors are the caller's (the FUSE adapter's
//! `answered`), since the error is known only after the lock is given back.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Result;
use crate::fs::{FileSystem, LOG_HEADROOM};

/// Free blocks kept beyond what admitted writes hold and the log's headroom before a write
/// may be answered early (8 MiB). The reserve is a count that ordinary writes' space check
/// reads, not a hold in the allocator: what other writes already past that check, a
/// checkpoint and the engine's own metadata may still take comes out of this margin. Closer
/// to full, writes are stored before they are answered, and a full image fails `write(2)`.
pub const ADMIT_MARGIN: u64 = 2048;

/// Blocks set aside for one admitted write until its blocks are allocated; released on drop.
pub(crate) struct Admission<'a> {
    reserved: &'a AtomicU64,
    blocks: u64,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.reserved.fetch_sub(self.blocks, Ordering::AcqRel);
    }
}

impl FileSystem {
    /// [`FileSystem::write`] that lets the caller answer before the data is stored. `admitted`
    /// runs once the write can no longer fail for a reason its writer must hear at once: the
    /// inode is a file, the range is within the size limit, and room for every block as new
    /// data is reserved beside what other admitted writes hold. It runs with the inode
    /// locked, so every later call on the inode waits until the write is stored. The result
    /// reports what went wrong after that (a medium error, say); the caller must keep it for
    /// the file's next fsync. When the room cannot be reserved `admitted` does not run and
    /// the write is an ordinary one (ENOSPC is then reported as usual).
    pub fn write_admitted(
        &self,
        ino: u64,
        off: u64,
        data: &[u8],
        admitted: impl FnOnce(),
    ) -> Result<usize> {
        self.write_as(ino, off, data, false, Some(admitted))
    }

    /// Reserve `blocks` for an admitted write, or `None` when the free space does not cover
    /// them beside every other admitted write, the log's headroom and [`ADMIT_MARGIN`].
    pub(crate) fn reserve_admitted(&self, blocks: u64) -> Option<Admission<'_>> {
        let mut held = self.admitted_blocks.load(Ordering::Acquire);
        loop {
            // Free space after the reserve it is compared with: a write that allocates and
            // gives back its reserve in between is then counted at least once.
            let free = self.engine.allocator().free_blocks();
            let total = held.checked_add(blocks)?;
            if free < total.saturating_add(LOG_HEADROOM + ADMIT_MARGIN) {
                return None;
            }
            // Only a reservation that fits is ever counted, so a failed one never makes the
            // room look smaller to others, even for a moment.
            match self.admitted_blocks.compare_exchange_weak(
                held,
                total,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(Admission {
                        reserved: &self.admitted_blocks,
                        blocks,
                    })
                }
                Err(now) => held = now,
            }
        }
    }

    /// Blocks held by admitted writes not yet stored (no other write may count on them).
    pub(crate) fn admitted_reserve(&self) -> u64 {
        self.admitted_blocks.load(Ordering::Acquire)
    }
}
