//! Writes answered before they are stored (the mount's `--async-writes`): the room such a
//! write reserves before its answer, so that storing it later cannot run out of space, and
//! the wait for writes still being stored.
//!
//! An admitted write holds its inode's lock from before the answer until it is stored, so
//! every later call on that inode (a read, a stat, a truncate, an fsync) sees it whole.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Result;
use crate::fs::{FileSystem, LOG_HEADROOM};

/// Blocks set aside for one admitted write until it is stored; released on drop.
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

    /// Returns once no admitted write of `ino` is still being stored.
    pub fn wait_writes(&self, ino: u64) {
        if let Ok(node) = self.node(ino) {
            drop(node.read());
        }
    }

    /// Reserve `blocks` for an admitted write, or `None` when the free space does not cover
    /// them beside every other admitted write and the log's headroom.
    pub(crate) fn reserve_admitted(&self, blocks: u64) -> Option<Admission<'_>> {
        // Add first, then check the total: two writers admitted at once both see each other.
        let total = self.admitted_blocks.fetch_add(blocks, Ordering::AcqRel) + blocks;
        let guard = Admission {
            reserved: &self.admitted_blocks,
            blocks,
        };
        let free = self.engine.allocator().free_blocks();
        (free >= total.saturating_add(LOG_HEADROOM)).then_some(guard)
    }

    /// Blocks held by admitted writes not yet stored (no other write may count on them).
    pub(crate) fn admitted_reserve(&self) -> u64 {
        self.admitted_blocks.load(Ordering::Acquire)
    }
}
