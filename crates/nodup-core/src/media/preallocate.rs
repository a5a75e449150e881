//! Allocation ahead of `pwrite` for a [`super::blockfile::BlockFile`] over a regular file. A
//! write into a hole of a sparse image takes space from the file system holding it; when that
//! is full, the write fails with ENOSPC partway through whatever the engine was doing (a store,
//! then its undo; a region grow, then its link), and the engine gives up its live state: every
//! writer gets EIO, and failure recovery while mounted, which writes too, fails on the same
//! full disk. So, as the mapped medium does ([`super::backing`]), a range not known to be
//! allocated is allocated with `fallocate` before it is written. A full disk is then one failed
//! store with nothing written, ENOSPC to its writer, and once the disk has room again the next
//! write goes through, without a remount.
//!
//! A bit per page remembers what is known to be allocated (none at open: the first write into
//! each stretch of a mounted image asks once, which is cheap where it already is). A miss
//! allocates [`PAGES_AHEAD`] pages at least, so a stream of new blocks (handed out in address
//! order) asks once per 128 KiB; that takes at most 124 KiB of holes given back to the holder
//! (free blocks punched out) early, as the mapped medium does on tmpfs. A discard forgets the
//! pages it punched.

use std::fs::File;
use std::sync::atomic::AtomicU64;

use parking_lot::RwLock;

use super::backing::{all_set, allocate, atomic_bits, set_bits, PAGES_AHEAD};
use crate::Result;

/// Bytes per bit.
const PAGE: u64 = 4096;

/// Which pages of an image file are allocated in the file system holding it.
pub(super) struct Preallocated {
    /// One bit per page: allocated.
    pages: Box<[AtomicU64]>,
    /// Bytes in the file.
    len: u64,
    /// Shared from an allocation to its bits being set, held alone by a punch across its hole
    /// and the clearing of its bits: no page is marked allocated while a punch left it a hole.
    punching: RwLock<()>,
}

impl Preallocated {
    /// Nothing known to be allocated yet, in a file of `len` bytes.
    pub(super) fn new(len: u64) -> Preallocated {
        Preallocated {
            pages: atomic_bits(len.div_ceil(PAGE)),
            len,
            punching: RwLock::new(()),
        }
    }

    /// Make sure writing `[off, off+len)` of `file` takes no space the file system holding it
    /// may lack. ENOSPC (or another error of that file system) when it cannot: nothing is
    /// written then.
    #[inline]
    pub(super) fn ensure(&self, file: &File, off: u64, len: u64) -> Result<()> {
        let (p0, p1) = (off / PAGE, (off + len).div_ceil(PAGE));
        if len == 0 || all_set(&self.pages, p0, p1) {
            return Ok(());
        }
        self.allocate(file, p0, p1)
    }

    #[cold]
    #[inline(never)]
    fn allocate(&self, file: &File, p0: u64, p1: u64) -> Result<()> {
        let p1 = p1.max(p0 + PAGES_AHEAD).min(self.len.div_ceil(PAGE));
        let _no_punch = self.punching.read();
        let at = p0 * PAGE;
        allocate(file, at, (p1 * PAGE).min(self.len) - at)?;
        set_bits(&self.pages, p0, p1, true);
        Ok(())
    }

    /// Punch `[off, off+len)` with `punch` and forget the allocation of every page it touches
    /// (also when the punch fails partway), with no allocation running meanwhile.
    pub(super) fn punch(
        &self,
        off: u64,
        len: u64,
        punch: impl FnOnce() -> Result<bool>,
    ) -> Result<bool> {
        let _alone = self.punching.write();
        let punched = punch();
        if len != 0 {
            set_bits(&self.pages, off / PAGE, (off + len).div_ceil(PAGE), false);
        }
        punched
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// Bytes the file system holds for `f`.
    fn held(f: &File) -> u64 {
        f.metadata().unwrap().blocks() * 512
    }

    #[test]
    fn a_miss_allocates_ahead_and_a_punch_forgets() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("img"))
            .unwrap();
        let len = 4 << 20;
        f.set_len(len).unwrap();
        let p = Preallocated::new(len);
        assert_eq!(held(&f), 0);
        p.ensure(&f, 8192, 100).unwrap();
        // Where fallocate works, the pages ahead are taken now.
        let ahead = PAGES_AHEAD * PAGE;
        if held(&f) != 0 {
            assert!(held(&f) >= ahead, "{}", held(&f));
        }
        assert!(all_set(&p.pages, 2, 2 + PAGES_AHEAD));
        assert!(!all_set(&p.pages, 2 + PAGES_AHEAD, 3 + PAGES_AHEAD));
        // The last page of the file: nothing past its end.
        p.ensure(&f, len - 1, 1).unwrap();
        assert!(all_set(&p.pages, len / PAGE - 1, len / PAGE));
        let punched = p
            .punch(8192, 4096, || {
                use std::os::unix::io::AsRawFd;
                super::super::punch_hole(f.as_raw_fd(), 8192, 4096)
            })
            .unwrap();
        assert!(punched);
        assert!(!all_set(&p.pages, 2, 3), "forgotten");
        assert!(all_set(&p.pages, 3, 2 + PAGES_AHEAD));
    }
}
