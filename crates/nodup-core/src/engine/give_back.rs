//! Giving free blocks back to what holds the medium (holes punched in an image file, a
//! zeroing discard on a device), so a tmpfs or disk gets back the space of deleted data: the
//! spans freed since the open at a clean shutdown, and on demand ([`Engine::trim`], `fstrim`)
//! while the engine runs. Which blocks, and why giving them back is safe, is the allocator's
//! part (`alloc/give_back.rs`).

use super::Engine;
use crate::{BlockNr, Result, BLOCK_SIZE};

impl Engine {
    /// What the clean shutdown gave back to what holds the medium (holes punched in the image
    /// file): the blocks, or the error that stopped it (the shutdown itself succeeded). `None`
    /// before a shutdown.
    pub fn given_back(&self) -> Option<std::result::Result<u64, String>> {
        self.given_back.lock().clone()
    }

    /// Give the free blocks of the data area that lie inside bytes `[off, off+len)` of the
    /// medium, in runs of at least `min` bytes, back to what holds it, while the engine runs
    /// (`fstrim`). Returns the bytes given back, or `None` when the medium cannot give any
    /// back (having given back none). Writers go on meanwhile; one that allocates in a run
    /// being given back waits for it. Spans given back whole are not given back again at
    /// shutdown.
    pub fn trim(&self, off: u64, len: u64, min: u64) -> Result<Option<u64>> {
        let _g = self.admin.lock();
        self.check_ready()?;
        let bs = BLOCK_SIZE as u64;
        let mut done = 0u64;
        let able = self.alloc.trim(
            off.div_ceil(bs),
            off.saturating_add(len) / bs,
            min.div_ceil(bs).max(1),
            &mut |start, n| self.discard_run(start, n, &mut done),
        )?;
        Ok((able || done > 0).then_some(done * bs))
    }

    /// Give blocks `[start, start+n)` back to the medium's holder, adding them to `done` when
    /// it took them; false when it cannot.
    fn discard_run(&self, start: BlockNr, n: u64, done: &mut u64) -> Result<bool> {
        let bs = BLOCK_SIZE as u64;
        let taken = self.medium.discard(start * bs, n * bs)?;
        if taken {
            *done += n;
        }
        Ok(taken)
    }

    /// Give the free blocks of the spans where a block was freed since the open (after
    /// failure recovery, all free blocks) back to the medium's holder
    /// ([`crate::media::Medium::discard`]: holes in an image file, so a tmpfs or disk gets back
    /// the space of deleted data); returns the blocks given back. Runs are asked for in
    /// address order, and the first refusal (a holder that cannot) ends it.
    pub(super) fn discard_free(&self) -> Result<u64> {
        let mut done = 0u64;
        let mut going = Ok(true);
        self.alloc.take_freed_runs(&mut |start, n| {
            if matches!(going, Ok(true)) {
                going = self.discard_run(start, n, &mut done);
            }
        });
        going.map(|_| done)
    }
}
