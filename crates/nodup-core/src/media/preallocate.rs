//! Allocation ahead of `pwrite` for a [`super::blockfile::BlockFile`] over a regular file. A
//! write into a hole of a sparse image takes space from the file system holding it; when that
//! is full, the write fails with ENOSPC partway through whatever the engine was doing (a store,
//! then its undo; a region grow, then its link), and the engine gives up its live state: every
//! writer gets EIO, and failure recovery while mounted, which writes too, fails on the same
//! full disk. So, as the mapped medium does ([`super::backing`]), space for a range not known
//! to be allocated is taken with `fallocate` before the range is written. A full disk is then
//! one failed store with nothing written, ENOSPC to its writer, and once the disk has room
//! again the next write goes through, without a remount.
//!
//! A bit per [`STRETCH`] (aligned) remembers the stretches known to be allocated (none at
//! open: the first write into each stretch of a mounted image asks once, which is cheap where
//! it already is): a stream of new blocks, handed out in address order, asks once per stretch.
//! That takes at most a stretch of holes given back to the holder (free blocks punched out)
//! early, as the mapped medium does on tmpfs. A discard forgets every stretch it touches.
//!
//! On a full disk a stretch can fail where the write itself needs no space (its pages hold
//! data, the rest of the stretch is holes). Then only the written pages are asked for, and
//! a range without a hole, or zeros written into a range that is all hole (the undo of a
//! first write that failed), needs nothing: so overwrites, frees and undos of what already
//! has its space still go through on a full disk.
//!
//! [`Preallocated::reserve`] takes a range's space ahead of its writes the same way
//! ([`super::Medium::reserve`]: the save area, metadata blocks), so they need none later.
//!
//! What this cannot promise: on a copy-on-write holder (btrfs, ZFS) a rewrite of allocated
//! space needs new space at write-back, and a failed write-back fails every later fence.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::AtomicU64;

use parking_lot::RwLock;

use super::backing::{all_set, allocate, allocate_pages, atomic_bits, punch_and_forget, set_bits};
use crate::Result;

/// Bytes per bit, and per `fallocate` of a stretch not known to be allocated.
pub(super) const STRETCH: u64 = 128 << 10;

/// Which stretches of an image file are allocated in the file system holding it.
pub(super) struct Preallocated {
    /// One bit per [`STRETCH`]: allocated whole.
    stretches: Box<[AtomicU64]>,
    /// Bytes in the file.
    len: u64,
    /// Shared from an allocation to its bits being set, held alone by a punch across its hole
    /// and the clearing of its bits: no stretch is marked allocated while a punch left a hole.
    punching: RwLock<()>,
}

impl Preallocated {
    /// Nothing known to be allocated yet, in a file of `len` bytes.
    pub(super) fn new(len: u64) -> Preallocated {
        Preallocated {
            stretches: atomic_bits(len.div_ceil(STRETCH)),
            len,
            punching: RwLock::new(()),
        }
    }

    /// Make sure writing `data` at `off` of `file` takes no space the file system holding it
    /// may lack. `Ok(false)`: nothing needs writing (zeros into a hole). ENOSPC (or another
    /// error of that file system) when space is needed and not there: nothing is written.
    #[inline]
    pub(super) fn ensure(&self, file: &File, off: u64, data: &[u8]) -> Result<bool> {
        let len = data.len() as u64;
        let (s0, s1) = (off / STRETCH, (off + len).div_ceil(STRETCH));
        if len == 0 || all_set(&self.stretches, s0, s1) {
            return Ok(true);
        }
        self.allocate(file, off, data, s0, s1)
    }

    /// Take the space writes of `[off, off+len)` of `file` need ([`super::Medium::reserve`]).
    pub(super) fn reserve(&self, file: &File, off: u64, len: u64) -> Result<()> {
        let (s0, s1) = (off / STRETCH, (off + len).div_ceil(STRETCH));
        if len == 0 || all_set(&self.stretches, s0, s1) {
            return Ok(());
        }
        self.take(file, off, len, s0, s1)
    }

    #[cold]
    #[inline(never)]
    fn allocate(&self, file: &File, off: u64, data: &[u8], s0: u64, s1: u64) -> Result<bool> {
        let len = data.len() as u64;
        match self.take(file, off, len, s0, s1) {
            Err(_)
                if data.iter().all(|&b| b == 0) && super::file_hole(file.as_raw_fd(), off, len) =>
            {
                Ok(false)
            }
            r => r.map(|()| true),
        }
    }

    /// Allocate stretches `[s0, s1)`, which cover `[off, off+len)`, and mark them. On a full
    /// disk, most likely, only the range's pages are asked for (marking nothing, so the next
    /// write into these stretches asks again, and gets them whole once there is room), and a
    /// range without a hole needs nothing; the error of the whole stretches otherwise.
    fn take(&self, file: &File, off: u64, len: u64, s0: u64, s1: u64) -> Result<()> {
        let _no_punch = self.punching.read();
        let at = s0 * STRETCH;
        let whole = allocate(file, at, (s1 * STRETCH).min(self.len) - at);
        if whole.is_ok() {
            set_bits(&self.stretches, s0, s1, true);
            return Ok(());
        }
        if allocate_pages(file, off, len, self.len).is_ok()
            || super::file_data(file.as_raw_fd(), off, len)
        {
            return Ok(());
        }
        whole
    }

    /// Punch `[off, off+len)` with `punch` and forget the allocation of every stretch it
    /// touches (also when the punch fails partway), with no allocation running meanwhile.
    pub(super) fn punch(
        &self,
        off: u64,
        len: u64,
        punch: impl FnOnce() -> Result<bool>,
    ) -> Result<bool> {
        punch_and_forget(&self.punching, len, punch, || {
            set_bits(
                &self.stretches,
                off / STRETCH,
                (off + len).div_ceil(STRETCH),
                false,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use std::os::unix::fs::{FileExt, MetadataExt};

    /// Bytes the file system holds for `f`.
    fn held(f: &File) -> u64 {
        f.metadata().unwrap().blocks() * 512
    }

    fn sparse(dir: &std::path::Path, len: u64) -> File {
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("img"))
            .unwrap();
        f.set_len(len).unwrap();
        f
    }

    #[test]
    fn a_miss_allocates_its_stretch_and_a_punch_forgets() {
        let dir = tempfile::tempdir().unwrap();
        let len = 4 << 20;
        let f = sparse(dir.path(), len);
        let p = Preallocated::new(len);
        assert_eq!(held(&f), 0);
        assert!(p.ensure(&f, 8192, &[1u8; 100]).unwrap());
        // Where fallocate works, the whole stretch is taken now.
        if held(&f) != 0 {
            assert!(held(&f) >= STRETCH, "{}", held(&f));
        }
        assert!(all_set(&p.stretches, 0, 1));
        assert!(!all_set(&p.stretches, 1, 2));
        // A write across two stretches asks for both.
        assert!(p.ensure(&f, 2 * STRETCH - 10, &[1u8; 20]).unwrap());
        assert!(all_set(&p.stretches, 1, 3));
        // The last bytes of the file: nothing past its end.
        assert!(p.ensure(&f, len - 1, &[1]).unwrap());
        assert!(all_set(&p.stretches, len / STRETCH - 1, len / STRETCH));
        let punched = p
            .punch(8192, 4096, || {
                super::super::punch_hole(f.as_raw_fd(), 8192, 4096)
            })
            .unwrap();
        assert!(punched);
        assert!(!all_set(&p.stretches, 0, 1), "forgotten");
        assert!(all_set(&p.stretches, 1, 3));
    }

    /// On a full disk (a 1 MiB tmpfs, root only): a write into pages that hold data, and
    /// zeros into a hole, go through although their stretch cannot be allocated; new data
    /// into a hole gets ENOSPC, unless its space was reserved before the disk filled.
    #[test]
    fn a_full_disk_still_takes_writes_that_need_no_space() {
        let Some(disk) = crate::media::small_disk::SmallDisk::mount("1M") else {
            return;
        };
        let len = 8 << 20;
        let f = sparse(disk.dir.path(), len);
        f.write_all_at(&[7u8; 4096], 0).unwrap();
        let p = Preallocated::new(len);
        let reserved = 2 * STRETCH + 4096;
        p.reserve(&f, reserved, 4096).unwrap();
        disk.fill();
        let no_space =
            |e: Error| matches!(&e, Error::Io(io) if io.raw_os_error() == Some(libc::ENOSPC));
        assert!(p.ensure(&f, 0, &[9u8; 4096]).unwrap(), "a page with data");
        p.reserve(&f, 0, 4096).unwrap();
        assert!(
            !p.ensure(&f, 8192, &[0u8; 4096]).unwrap(),
            "zeros into a hole"
        );
        let e = p.ensure(&f, 8192, &[9u8; 4096]).unwrap_err();
        assert!(no_space(e));
        let e = p.reserve(&f, 8192, 4096).unwrap_err();
        assert!(no_space(e));
        assert!(!all_set(&p.stretches, 0, 1), "nothing marked");
        // What was reserved: written although the disk is full.
        assert!(p.ensure(&f, reserved, &[5u8; 4096]).unwrap());
        f.write_all_at(&[5u8; 4096], reserved).unwrap();
    }
}
