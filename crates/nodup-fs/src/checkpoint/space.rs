//! Space for metadata: the reserve of blocks that keeps a checkpoint always possible, the
//! check before every operation that a checkpoint and deferred releases are tried before
//! ENOSPC, and room where the image lives for what a clean unmount writes.

use super::build::blocks_for;
use super::DIRTY_LIMIT;
use crate::chain::PAYLOAD;
use crate::error::{errno, Result};
use crate::fs::FileSystem;
use nodup_core::BlockNr;
use std::sync::atomic::Ordering;

impl FileSystem {
    /// Blocks the next checkpoint may need: its units (estimated from what changed), the
    /// manifest, and a margin.
    pub(crate) fn reserve_want(&self) -> usize {
        let units = self.persist.estimate() + self.persist.estimate() / 4 + (64 << 10);
        let segs = self.persist.segs.lock().len() + 2 + units as usize / self.seg_bytes();
        blocks_for(units as usize) + segs + blocks_for(24 * segs + 64) + 4
    }

    /// Keep enough metadata blocks aside for the next checkpoint. Returns whether the reserve
    /// is as large as wanted. The caller must not hold the gate.
    pub(crate) fn top_up_reserve(&self) -> bool {
        let want = self.reserve_want();
        let mut meta = self.meta.lock();
        // Checked under `meta`, which the unmount holds to take the reserve back: a top-up
        // that passed the check before the unmount began (the maintenance thread's) would
        // otherwise allocate after it and leave blocks nothing holds in the engine's counts.
        if self.is_shut_down() {
            return true;
        }
        if meta.reserve.len() < want {
            let got = self.engine.alloc_meta(want - meta.reserve.len());
            // An I/O error is the disk holding the image (no room for the blocks' space),
            // not the image itself.
            let host = matches!(got, Err(nodup_core::Error::Io(_)));
            self.reserve_short_of_host.store(host, Ordering::Relaxed);
            if let Ok(more) = got {
                meta.reserve.extend(more);
            }
        } else if meta.reserve.len() > 2 * want + 64 {
            // A burst of changes wanted a large reserve; give back what the next checkpoint
            // will not need, so it shows as free space again. Still under `meta`, so the
            // unmount's save of the engine cannot come between the drain and the free.
            let excess: Vec<BlockNr> = meta.reserve.drain(want..).collect();
            let _ = self.engine.free_meta(&excess);
            return true;
        }
        let full = meta.reserve.len() >= want;
        if full {
            self.reserve_short_of_host.store(false, Ordering::Relaxed);
        }
        full
    }

    /// Keep room where the image lives for what a clean unmount writes: the engine's save
    /// area ([`nodup_core::Engine::reserve_save_area`], tried again while it is not taken)
    /// and the checkpoint reserve, whose blocks take their space when they are allocated
    /// ([`FileSystem::top_up_reserve`]). A line in the log when the disk holding the image has
    /// no room for either, and when it has again.
    pub(crate) fn keep_unmount_room(&self) {
        if self.read_only {
            return;
        }
        let missing = match self.engine.reserve_save_area() {
            Err(e) => Some(format!("the save area a clean unmount writes ({e})")),
            Ok(()) if self.reserve_short_of_host.load(Ordering::Relaxed) => {
                Some("the blocks the final checkpoint may need".to_string())
            }
            Ok(()) => None,
        };
        match missing {
            None if self.said_unreserved.swap(false, Ordering::Relaxed) => crate::logging::info(
                "the disk holding the image has room again for what a clean unmount writes",
            ),
            Some(what) if !self.said_unreserved.swap(true, Ordering::Relaxed) => {
                crate::logging::warn(&format!(
                    "no room on the disk holding the image for {what}: until there is, an unmount may leave the image to failure recovery at the next mount"
                ))
            }
            _ => {}
        }
    }

    /// Would a checkpoint give blocks back? (log blocks before the end, deferred releases,
    /// segments with garbage).
    fn checkpoint_frees(&self) -> bool {
        if self.log.lock().blocks().len() > 1 || !self.pending.lock().is_empty() {
            return true;
        }
        let (_, bytes, live) = self.persist.seg_totals();
        bytes > live + PAYLOAD as u64
    }

    /// Before an operation that takes `data_blocks` new data blocks and appends up to
    /// `log_bytes` to the log: the checkpoint reserve must cover what changed, data must leave
    /// some blocks free for log appends, and the log must have room. When that fails, a
    /// checkpoint (which gives back the log before its cut and cleaned segments) and deferred
    /// releases are tried first: ENOSPC only when the space is really used. The caller must
    /// not hold the gate, nor any lock failure recovery while mounted takes (it may run one).
    ///
    /// `grows` is set for operations that add metadata (data writes, new inodes): they need the
    /// full reserve. Others (unlink, rename, attribute changes) may borrow from it.
    pub(crate) fn ensure_space(
        &self,
        data_blocks: u64,
        grows: bool,
        log_bytes: usize,
    ) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        // Not a full device: no checkpoint can be written any more. Unless only the engine
        // gave up its live state: then it is rebuilt here (at most once a second, see
        // `live_recovery.rs`), so this change waits for that instead of failing.
        self.changes_possible_or_rebuilt(true)?;
        // Past a limit, the maintenance thread is woken to checkpoint now. Far past it (no
        // maintenance thread, or one that cannot keep up) the operation does it itself.
        let logged = self.log.lock().bytes();
        let est = self.persist.estimate();
        let limit = self.log_limit();
        if logged > limit || est > DIRTY_LIMIT {
            self.wake_maintenance();
        }
        if logged > 8 * limit || est > 8 * DIRTY_LIMIT {
            match self.checkpoint(false) {
                Ok(()) => {}
                Err(e) if e.errno() == libc::ENOSPC => {}
                Err(e) => return Err(e),
            }
        }
        for attempt in 0..2 {
            let reserve_ok = !grows || self.top_up_reserve();
            // Blocks reserved by writes already answered are as good as used.
            let free = self
                .engine
                .allocator()
                .free_blocks()
                .saturating_sub(self.admitted_reserve());
            let data_ok =
                data_blocks == 0 || free >= data_blocks.saturating_add(crate::fs::LOG_HEADROOM);
            if reserve_ok && data_ok && self.log_room(log_bytes) {
                return Ok(());
            }
            if attempt == 1 {
                break;
            }
            if !self.durable && !self.pending.lock().is_empty() {
                self.sync()?;
                continue;
            }
            if !self.checkpoint_frees() {
                break;
            }
            match self.checkpoint(false) {
                Ok(()) => {}
                Err(e) if e.errno() == libc::ENOSPC => break,
                Err(e) => return Err(e),
            }
        }
        if !grows && self.lend_reserve(log_bytes) {
            return Ok(());
        }
        errno(libc::ENOSPC)
    }

    /// Make sure the log can take `bytes` more without asking the allocator for blocks it
    /// does not have (pre-fills the spare pool).
    fn log_room(&self, bytes: usize) -> bool {
        // Allocated under `log`, as an append's own blocks are: between the allocation and
        // the spare list, failure recovery while mounted would count the blocks free.
        let mut log = self.log.lock();
        let short = log.blocks_short(bytes);
        if short == 0 {
            return true;
        }
        let want = short.max(crate::log::writer::LOG_REFILL);
        let got = self
            .engine
            .alloc_meta(want)
            .or_else(|_| self.engine.alloc_meta(short));
        match got {
            Ok(b) => {
                log.spare.extend(b);
                true
            }
            Err(_) => false,
        }
    }

    /// On a full device, lend the log blocks from the checkpoint reserve so that removing
    /// files (which frees space) still works; the reserve is topped up again later.
    fn lend_reserve(&self, bytes: usize) -> bool {
        // Both held across the move (`meta` first, as failure recovery while mounted takes
        // them): in neither list, the blocks would count as free to it.
        let mut meta = self.meta.lock();
        let mut log = self.log.lock();
        let short = log.blocks_short(bytes);
        if meta.reserve.len() < short {
            return false;
        }
        log.spare.extend(meta.reserve.drain(..short));
        true
    }
}
