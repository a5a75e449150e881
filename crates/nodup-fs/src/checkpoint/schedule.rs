//! When to take a checkpoint: the log limit, and the maintenance tick that checkpoints past it,
//! past the limit of changed metadata, or when the file system is idle with changes.

use super::{DIRTY_LIMIT, IDLE_MS, LOG_LIMIT_MAX, LOG_LIMIT_MIN};
use crate::error::Result;
use crate::fs::FileSystem;

impl FileSystem {
    /// Log bytes (and estimated checkpoint bytes) at which the maintenance tick writes a
    /// checkpoint: a fixed value when the options give one, else 1/256 of the image, between
    /// [`LOG_LIMIT_MIN`] and [`LOG_LIMIT_MAX`], and never more than 1/8 of the free space.
    pub fn log_limit(&self) -> u64 {
        if self.fixed_log_limit != 0 {
            return self.fixed_log_limit;
        }
        let image = self.medium.len();
        let free = self.engine.allocator().free_blocks() * nodup_core::BLOCK_SIZE as u64;
        (image / 256)
            .clamp(LOG_LIMIT_MIN, LOG_LIMIT_MAX)
            .min(free / 8)
            .max(64 << 10)
    }

    /// Periodic work: make BlockFile state durable and hand back deferred releases, checkpoint
    /// when the log or the changed metadata passed the limit or the file system is idle with
    /// changes, keep the checkpoint reserve filled.
    pub fn tick(&self) -> Result<()> {
        crate::logging::flush_repeats(false);
        if self.read_only || self.is_shut_down() {
            return Ok(());
        }
        // Once the engine gave up, failure recovery while mounted, when its wait is over. No
        // checkpoint or sync can succeed (yet) otherwise: say so once, not at every tick.
        if let Err(e) = self.changes_possible_or_rebuilt(false) {
            if !self
                .said_failed
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                crate::logging::error(&format!("{e}; checkpoints stop"));
            }
            return Ok(());
        }
        if !self.durable && !self.pending.lock().is_empty() {
            self.sync()?;
        }
        // Records held back on a block file go to the medium at least this often (where the
        // kernel writes them back as it did when every append wrote its record at once).
        self.write_out_log()?;
        let log_bytes = self.log.lock().bytes();
        let changed = log_bytes > 0 || self.persist.queued() > 0;
        let limit = self.log_limit();
        let idle = self.idle_ms() >= IDLE_MS;
        let dirty = self.persist.estimate() > limit.min(DIRTY_LIMIT);
        if log_bytes > limit || dirty || (idle && changed) {
            self.checkpoint(false)?;
            super::return_free_memory();
        }
        if idle {
            self.rebuild_if_leaked(false);
        }
        self.top_up_reserve();
        self.keep_unmount_room();
        Ok(())
    }
}
