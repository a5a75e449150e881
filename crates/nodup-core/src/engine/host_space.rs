//! The caller's metadata blocks, and the space they and the save area take where the image
//! lives. A write into a hole of an image file takes space from the disk holding it; when that
//! disk is full, a data write fails with ENOSPC to its writer, which is what a writer expects.
//! The final checkpoint and the engine's save at unmount must not fail that way, or a full disk
//! makes every unmount unclean. So their space is taken ahead ([`Medium::reserve`]): the save
//! area's once the engine takes changes, a metadata block's when the caller is given it, where
//! running out is one more ENOSPC to the operation that asked.
//!
//! [`Medium::reserve`]: crate::media::Medium::reserve

use std::sync::atomic::Ordering;

use super::Engine;
use crate::{BlockNr, Error, Result, BLOCK_SIZE};

/// Free blocks [`Engine::alloc_meta`] offers at most, on a full disk, before it gives up
/// finding ones that still hold their space (16 MiB of them).
const HELD_TRIES: usize = 4096;

impl Engine {
    /// Allocate `n` blocks for the caller's own metadata (logs, checkpoints); not
    /// deduplicated. Their space where the image lives is taken now: on a full disk, blocks
    /// freed since the open (which still hold theirs) are taken instead, and when there are
    /// not enough of them the error (ENOSPC) allocates nothing.
    pub fn alloc_meta(&self, n: usize) -> Result<Vec<BlockNr>> {
        self.check_ready()?;
        let mut pool = 0;
        let mut v = Vec::with_capacity(n);
        let mut got = Ok(());
        for _ in 0..n {
            match self.alloc.alloc(&mut pool) {
                Ok(b) => v.push(b),
                Err(e) => {
                    got = Err(e);
                    break;
                }
            }
        }
        if got.is_ok() {
            got = self.reserve_blocks(&v);
        }
        if let Err(e) = got {
            // Last first, each rewinding the cursor: retries on a full disk do not walk it on.
            for &b in v.iter().rev() {
                self.alloc.unalloc(b)?;
            }
            if !matches!(&e, Error::Io(io) if io.raw_os_error() == Some(libc::ENOSPC)) {
                return Err(e);
            }
            // The disk holding the image is full, and the next free blocks are holes. Blocks
            // freed since the open still hold their space (they are given back at the
            // shutdown): those serve, one by one (a system call each, under their pool's
            // lock: only on a full disk, and at most HELD_TRIES of them).
            let bs = BLOCK_SIZE as u64;
            let held = self.alloc.alloc_freed(n, HELD_TRIES, &mut |b| {
                self.meta_medium.reserve(b * bs, bs).is_ok()
            });
            if held.len() < n {
                for &b in &held {
                    self.alloc.free(b)?;
                }
                return Err(e);
            }
            return Ok(held);
        }
        Ok(v)
    }

    /// Free blocks obtained from [`Engine::alloc_meta`].
    pub fn free_meta(&self, blocks: &[BlockNr]) -> Result<()> {
        self.check_ready()?;
        for &b in blocks {
            if !self.alloc.is_allocated(b) {
                return Err(Error::Invalid(format!("block {b} is not allocated")));
            }
        }
        for &b in blocks {
            self.alloc.free(b)?;
        }
        Ok(())
    }

    /// Take the space of the save area where the image lives, unless done at this open
    /// already, so that a clean shutdown writes only space the image holds. Tried when the
    /// engine starts taking changes; a caller may try again after a failure (a full disk).
    pub fn reserve_save_area(&self) -> Result<()> {
        if self.save_reserved.load(Ordering::Acquire) {
            return Ok(());
        }
        let bs = BLOCK_SIZE as u64;
        self.meta_medium
            .reserve(self.geo.save_start * bs, self.geo.save_blocks * bs)?;
        self.save_reserved.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether the save area's space is taken ([`Engine::reserve_save_area`]).
    pub fn save_area_reserved(&self) -> bool {
        self.save_reserved.load(Ordering::Acquire)
    }

    /// Have the clean shutdown take the space of the first `blocks` free blocks, the ones
    /// the next open's first [`Engine::alloc_meta`] calls get: a mount on a disk that is full
    /// by then still fills the caller's checkpoint reserve (and its unmount can be clean).
    /// They stay free in the image; what holds it keeps their space (`blocks` × 4 KiB).
    pub fn keep_for_next_open(&self, blocks: u64) {
        self.keep_for_next.store(blocks, Ordering::Relaxed);
    }

    /// [`Engine::keep_for_next_open`]'s work, after the shutdown gave back the free blocks
    /// (so those given back are taken again, and the space for them is likely there). A
    /// failure changes nothing the image says: the next open just finds them holes.
    pub(super) fn reserve_for_next_open(&self) {
        let n = self.keep_for_next.load(Ordering::Relaxed) as usize;
        if n != 0 {
            let _ = self.reserve_blocks(&self.alloc.first_free(n));
        }
    }

    /// Take the space of blocks `v`, a run of consecutive ones at a time.
    fn reserve_blocks(&self, v: &[BlockNr]) -> Result<()> {
        let bs = BLOCK_SIZE as u64;
        let mut i = 0;
        while i < v.len() {
            let mut j = i + 1;
            while j < v.len() && v[j] == v[j - 1] + 1 {
                j += 1;
            }
            self.meta_medium.reserve(v[i] * bs, (j - i) as u64 * bs)?;
            i = j;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::media::{FaultMedium, FaultOp, FaultRule, MemMedium};
    use crate::{Engine, Error, FormatOptions, OpenOptions, BLOCK_SIZE};

    fn refused(r: crate::Result<impl std::fmt::Debug>) -> bool {
        matches!(r, Err(Error::Io(e)) if e.raw_os_error() == Some(libc::ENOSPC))
    }

    /// The save area's space is taken when the engine starts taking changes, and once: a
    /// format where it cannot be (a full disk) still formats, and a later try takes it. A
    /// metadata allocation takes its blocks' space, and one that cannot allocates nothing.
    #[test]
    fn the_save_area_and_metadata_blocks_take_their_space_ahead() {
        let fm = Arc::new(FaultMedium::new(Arc::new(MemMedium::new(16 << 20)), 1));
        fm.add_rule(FaultRule::new(FaultOp::Reserve));
        let e = Engine::format(
            fm.clone(),
            &FormatOptions::default(),
            &OpenOptions::default(),
        )
        .unwrap();
        assert!(!e.save_area_reserved());
        assert!(refused(e.reserve_save_area()));
        let free = e.allocator().free_blocks();
        assert!(refused(e.alloc_meta(3)));
        assert_eq!(e.allocator().free_blocks(), free, "nothing kept");
        fm.clear_rules();
        let bs = BLOCK_SIZE as u64;
        let (save, n) = e.save_area();
        let on_save = fm.add_rule(
            FaultRule::new(FaultOp::Reserve)
                .range(save * bs, n * bs)
                .probability(0.0),
        );
        e.reserve_save_area().unwrap();
        e.reserve_save_area().unwrap();
        assert!(e.save_area_reserved());
        assert_eq!(fm.rule(on_save).unwrap().seen(), 1, "taken once");
        let any = fm.add_rule(FaultRule::new(FaultOp::Reserve).probability(0.0));
        let v = e.alloc_meta(3).unwrap();
        assert_eq!(e.allocator().free_blocks(), free - 3);
        // In address order from a fresh allocator: one run, one call.
        assert_eq!(v, vec![v[0], v[0] + 1, v[0] + 2]);
        assert_eq!(fm.rule(any).unwrap().seen(), 1);
        e.free_meta(&v).unwrap();
        e.shutdown().unwrap();
    }

    /// On a full disk (every reservation past the blocks allocated so far fails), blocks
    /// freed since the open serve instead, as far as there are enough of them.
    #[test]
    fn on_a_full_disk_blocks_freed_since_the_open_serve() {
        let fm = Arc::new(FaultMedium::new(Arc::new(MemMedium::new(16 << 20)), 1));
        let e = Engine::format(
            fm.clone(),
            &FormatOptions::default(),
            &OpenOptions::default(),
        )
        .unwrap();
        let v = e.alloc_meta(8).unwrap();
        e.free_meta(&v[2..5]).unwrap();
        let bs = BLOCK_SIZE as u64;
        let past = v[7] + 1;
        fm.add_rule(FaultRule::new(FaultOp::Reserve).range(past * bs, (16 << 20) - past * bs));
        assert_eq!(e.alloc_meta(2).unwrap(), v[2..4].to_vec());
        let free = e.allocator().free_blocks();
        assert!(refused(e.alloc_meta(2)), "one left");
        assert_eq!(e.allocator().free_blocks(), free, "nothing kept");
        assert_eq!(e.alloc_meta(1).unwrap(), vec![v[4]]);
    }
}
