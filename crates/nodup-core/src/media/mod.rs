//! The persistent medium under the engine.
//!
//! Every medium is a flat byte range addressed by offset. Persistence follows the pmem model:
//! a store becomes durable once the lines it touched were `flush`ed and a `fence` followed
//! (on `BlockFile`, `flush` is a no-op and `fence` is fdatasync). `CrashSim` relies on exactly
//! these calls to decide which stores a simulated crash may lose.

use crate::{Error, Result};

/// A byte-addressable persistent medium.
pub trait Medium: Send + Sync {
    /// Size of the medium in bytes.
    fn len(&self) -> u64;
    /// True when the medium has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Read `buf.len()` bytes at `off`.
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()>;
    /// Write `data` at `off` (volatile until flushed and fenced).
    fn write(&self, off: u64, data: &[u8]) -> Result<()>;
    /// Read the little-endian u64 at `off`. The metadata path's commonest access (refcounts,
    /// hints, block numbers): a mapped medium answers it with one load instead of a copy call.
    fn read_u64(&self, off: u64) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(off, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    /// Write `v` little-endian at `off` (see [`Medium::read_u64`]).
    fn write_u64(&self, off: u64, v: u64) -> Result<()> {
        self.write(off, &v.to_le_bytes())
    }
    /// Read the 32 bytes at `off` (one dedup entry; see [`Medium::read_u64`]).
    fn read_32(&self, off: u64) -> Result<[u8; 32]> {
        let mut b = [0u8; 32];
        self.read(off, &mut b)?;
        Ok(b)
    }
    /// Write back the cache lines of `[off, off+len)` (clwb/clflushopt/clflush; no-op on block files).
    fn flush(&self, off: u64, len: u64);
    /// Order all earlier flushes before later stores (sfence; fdatasync on block files).
    fn fence(&self) -> Result<()>;
    /// Flush everything and make it durable on the backing store (msync / fdatasync).
    fn sync_all(&self) -> Result<()>;
    /// Direct view of `[off, off+len)` when the medium is memory mapped (zero-copy compare).
    fn direct(&self, _off: u64, _len: usize) -> Option<&[u8]> {
        None
    }
    /// Hint that `[off, off+len)` will be read soon (prefetch instructions on mapped media).
    fn prefetch(&self, _off: u64, _len: usize, _stride: usize) {}
    /// Write `data` at `off` so that it is durable after the next `fence` with no `flush`:
    /// non-temporal (streaming) stores that bypass the cache on mapped media, as PMDK's
    /// `pmem_memcpy` and NOVA's data path do for whole blocks; elsewhere write + flush.
    fn write_stream(&self, off: u64, data: &[u8]) -> Result<()> {
        self.write(off, data)?;
        self.flush(off, data.len() as u64);
        Ok(())
    }
    /// True when every write is a system call (a file or block device), so callers gather
    /// stores ([`Medium::write_gather`], longer stores) where they can. False for mapped media
    /// and the wrappers over them (whose stores stay as they were measured).
    fn gathers(&self) -> bool {
        false
    }
    /// Write `pieces` back to back from `off`, as [`Medium::write`] of each in turn would (one
    /// gathered system call where the medium makes one per write: new data blocks of a call
    /// that were given consecutive blocks).
    fn write_gather(&self, off: u64, pieces: &[&[u8]]) -> Result<()> {
        let mut at = off;
        for p in pieces {
            self.write(at, p)?;
            at += p.len() as u64;
        }
        Ok(())
    }
    /// On a memory-mapped medium, let `fill` store `len` bytes at `off` through a pointer into
    /// the mapping and return true; the bytes are then durable after the next `fence`, as with
    /// [`Medium::write_stream`]. [`FillDst::streaming`] says which stores `fill` must use:
    /// non-temporal ones only (the medium then needs no flush), or ordinary ones (the medium
    /// flushes the range after `fill`). This lets a caller copy a block in the same pass that
    /// reads it for something else (the fingerprint). Media that must see every store return
    /// false and call nothing.
    fn fill_with(&self, _off: u64, _len: usize, _fill: &mut dyn FnMut(FillDst)) -> Result<bool> {
        Ok(false)
    }
    /// True when `[off, off+len)` is known to read as zeros without looking at it (a hole of
    /// a sparse image file): formatting skips zeroing it, so a fresh image stays sparse.
    fn known_zero(&self, _off: u64, _len: u64) -> bool {
        false
    }
    /// The first failed write-back of an image held in a file (see `media/write_back.rs`):
    /// from then on no fence of this open succeeds, and callers stop making changes.
    fn write_back_failed(&self) -> Option<String> {
        None
    }
    /// Give `[off, off+len)` back to what holds the medium (a hole in an image file, a discard
    /// on a device): called only for blocks nothing references, whose bytes are garbage from
    /// then on. `Ok(false)` when the medium cannot (the default), so the caller stops asking.
    fn discard(&self, _off: u64, _len: u64) -> Result<bool> {
        Ok(false)
    }
    /// Take the space later writes of `[off, off+len)` need from what holds the medium (an
    /// image file's holes) now, so that what must be writable on a full disk (the save area a
    /// clean unmount writes, metadata blocks the caller holds) is. ENOSPC when the space is
    /// not there. Media whose writes need no new space have nothing to do (the default).
    fn reserve(&self, _off: u64, _len: u64) -> Result<()> {
        Ok(())
    }
    /// Short name for stats and errors (`pmem`, `blockfile`, `crashsim`, ...).
    fn kind(&self) -> &'static str;
}

/// Bytes a discarded range of a test medium reads as: not zeros, so that anything reading a
/// block it was given back shows (a real device's discarded blocks need not read as zeros).
pub const DISCARDED: u8 = 0xdb;

/// `statfs` magics of the file systems the media and their callers tell apart (linux/magic.h).
pub mod fs_magic {
    /// tmpfs (/dev/shm): memory, no disk behind it.
    pub const TMPFS: i64 = 0x0102_1994;
    /// ramfs: memory, no disk behind it.
    pub const RAMFS: i64 = 0x8584_58f6;
    /// btrfs (copy-on-write).
    pub const BTRFS: i64 = 0x9123_683e;
    /// ZFS on Linux (copy-on-write).
    pub const ZFS: i64 = 0x2fc1_2fc1;
    /// bcachefs (copy-on-write).
    pub const BCACHEFS: i64 = 0xca45_1a4e;
}

/// The `statfs` type of the file system holding `file` (see [`fs_magic`]); `None` when
/// `fstatfs` fails.
pub fn file_system_type(file: &std::fs::File) -> Option<i64> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: fstatfs fills the zeroed struct for a descriptor `file` owns.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        (libc::fstatfs(file.as_raw_fd(), &mut st) == 0).then_some(st.f_type as i64)
    }
}

/// Make the name of a file just created durable: fsync its directory. A file's own fsync
/// does not cover the entry that names it, so a power loss after `mkfs` returned could leave
/// no image under that name (ext4 commits the entry with its next transaction, seconds
/// later). File systems that cannot fsync a directory (EINVAL) have nothing to give.
pub(crate) fn sync_dir_of(path: &std::path::Path) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let named = |e: std::io::Error| {
        Error::Io(std::io::Error::new(
            e.kind(),
            format!(
                "making the new file's name durable (fsync of {}): {e}",
                dir.display()
            ),
        ))
    };
    match std::fs::File::open(dir).and_then(|d| d.sync_all()) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        r => r.map_err(named),
    }
}

/// Punch `[off, off+len)` out of the file (or block device) behind `fd`, keeping its size:
/// [`Medium::discard`] for the media over a file. `Ok(false)` when that file system or device
/// cannot.
pub(crate) fn punch_hole(fd: std::os::unix::io::RawFd, off: u64, len: u64) -> Result<bool> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on a descriptor the caller owns; no memory is involved.
    if unsafe { libc::fallocate(fd, mode, off as libc::off_t, len as libc::off_t) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::ENODEV) => Ok(false),
        _ => Err(Error::Io(e)),
    }
}

/// Where [`Medium::fill_with`] lets its closure store, and how.
#[derive(Debug, Clone, Copy)]
pub struct FillDst {
    /// Start of the range inside the mapping (64-byte aligned when the range is).
    pub ptr: *mut u8,
    /// Non-temporal stores only (true), or ordinary stores (false).
    pub streaming: bool,
}

/// Size of a CPU cache line, the unit of `flush` and of `CrashSim`'s persistence tracking.
pub const CACHE_LINE: u64 = 64;

/// True when the file behind `fd` has no data in `[off, off+len)` (lseek SEEK_DATA finds none).
pub(crate) fn file_hole(fd: std::os::unix::io::RawFd, off: u64, len: u64) -> bool {
    // SAFETY: lseek on a descriptor the caller owns; no memory is involved.
    let r = unsafe { libc::lseek(fd, off as libc::off_t, libc::SEEK_DATA) };
    if r < 0 {
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
    }
    r as u64 >= off.saturating_add(len)
}

/// Whether `[off, off+len)` of the file behind `fd` holds no hole (SEEK_HOLE finds none
/// before its end): [`file_hole`]'s opposite, false when unsure.
pub(crate) fn file_data(fd: std::os::unix::io::RawFd, off: u64, len: u64) -> bool {
    // SAFETY: lseek on a descriptor the caller owns; no memory is involved.
    let r = unsafe { libc::lseek(fd, off as libc::off_t, libc::SEEK_HOLE) };
    r >= 0 && r as u64 >= off.saturating_add(len)
}

/// Check that `[off, off+len)` lies inside a medium of `total` bytes and return it as a `usize`
/// range. Out-of-range (or overflowing) accesses are an [`Error::Invalid`], never a panic.
pub(crate) fn check_range(off: u64, len: usize, total: u64) -> Result<std::ops::Range<usize>> {
    let end = off.checked_add(len as u64).filter(|&e| e <= total);
    match end {
        Some(end) => Ok(off as usize..end as usize),
        None => Err(Error::Invalid(format!(
            "access {off}+{len} beyond medium end {total}"
        ))),
    }
}

mod backing;
pub mod blockfile;
mod cacheline;
pub mod crashsim;
pub mod crypt;
pub mod fault;
pub mod mem;
pub mod meter;
pub mod pmem;
mod preallocate;
#[cfg(test)]
pub(crate) mod small_disk;
mod write_back;
#[cfg(target_arch = "x86_64")]
mod xts_ni;
pub use blockfile::{BlockFile, BlockFileOptions};
pub use crashsim::{CrashMode, CrashPoint, CrashSim, PendingStore};
pub use fault::{FaultEffect, FaultMedium, FaultOp, FaultRule};
pub use mem::MemMedium;
pub use meter::{AccessMeter, BufferModel, MeterConfig, MeterCounters};
pub use pmem::{FlushInstr, Pmem, PmemOptions};

/// Copy `src` to `dst` with non-temporal stores (cache bypassing; ordered by the next sfence).
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes, not overlap `src`, and be 16-byte
/// aligned; `src.len()` must be a multiple of 16.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn stream_copy(src: &[u8], dst: *mut u8) {
    use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    debug_assert!((dst as usize).is_multiple_of(16) && src.len().is_multiple_of(16));
    let n = src.len() / 16;
    let s = src.as_ptr() as *const __m128i;
    let d = dst as *mut __m128i;
    for k in 0..n {
        // SAFETY: `k < n` chunks of 16 bytes lie inside both buffers (caller's contract).
        unsafe { _mm_stream_si128(d.add(k), _mm_loadu_si128(s.add(k))) };
    }
}
