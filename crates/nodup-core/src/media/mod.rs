//! The persistent medium under the engine.
//!
//! Every medium is a flat byte range addressed by offset. Persistence follows the pmem model:
//! a store becomes durable once the lines it touched were `flush`ed and a `fence` followed
//! (on `BlockFile`, `flush` is a no-op and `fence` is fdatasync). `CrashSim` relies on exactly
//! these calls to decide which stores a simulated crash may lose.

use crate::Result;

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
    /// Short name for stats and errors (`pmem`, `blockfile`, `crashsim`, ...).
    fn kind(&self) -> &'static str;
}

pub mod mem;
pub use mem::MemMedium;
