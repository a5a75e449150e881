//! Metadata I/O: every access the engine makes to dedup metadata goes through [`MetaIo`], so it is
//! counted (plainly, or through the media access meter when one is configured).

use std::sync::Arc;

use crate::media::Medium;
use crate::Result;

/// Per-call I/O counters, merged into the engine's atomics once per call (no shared cache line
/// is touched per block).
#[derive(Debug, Default, Clone, Copy)]
pub struct IoTally {
    /// Metadata bytes read (plain counting only).
    pub meta_read: u64,
    /// Metadata bytes written (plain counting only).
    pub meta_written: u64,
    /// Data block bytes read.
    pub data_read: u64,
    /// Data block bytes written.
    pub data_written: u64,
    /// Media errors worked around without failing the call (see `EngineStats`).
    pub errors_absorbed: u64,
}

/// The medium handle used for metadata.
pub struct MetaIo {
    medium: Arc<dyn Medium>,
    /// True when `medium` is an access meter that counts by itself.
    metered: bool,
}

impl MetaIo {
    /// Metadata I/O over `medium`; `metered` says the medium counts its own accesses.
    pub fn new(medium: Arc<dyn Medium>, metered: bool) -> MetaIo {
        MetaIo { medium, metered }
    }

    /// The medium behind (possibly the meter).
    pub fn medium(&self) -> &Arc<dyn Medium> {
        &self.medium
    }

    /// Count `n` metadata bytes read (unless the meter counts them itself).
    #[inline]
    fn count_read(&self, t: &mut IoTally, n: usize) {
        if !self.metered {
            t.meta_read += n as u64;
        }
    }

    /// Count `n` metadata bytes written (unless the meter counts them itself).
    #[inline]
    fn count_written(&self, t: &mut IoTally, n: usize) {
        if !self.metered {
            t.meta_written += n as u64;
        }
    }

    /// Read `buf.len()` bytes at `off`.
    #[inline]
    pub fn read(&self, t: &mut IoTally, off: u64, buf: &mut [u8]) -> Result<()> {
        self.count_read(t, buf.len());
        self.medium.read(off, buf)
    }

    /// Write `data` at `off` (not flushed).
    #[inline]
    pub fn write(&self, t: &mut IoTally, off: u64, data: &[u8]) -> Result<()> {
        self.count_written(t, data.len());
        self.medium.write(off, data)
    }

    /// Read one little-endian u64.
    #[inline]
    pub fn read_u64(&self, t: &mut IoTally, off: u64) -> Result<u64> {
        self.count_read(t, 8);
        self.medium.read_u64(off)
    }

    /// Write one little-endian u64 (not flushed).
    #[inline]
    pub fn write_u64(&self, t: &mut IoTally, off: u64, v: u64) -> Result<()> {
        self.count_written(t, 8);
        self.medium.write_u64(off, v)
    }

    /// Write back the lines of `[off, off+len)`.
    #[inline]
    pub fn flush(&self, off: u64, len: u64) {
        self.medium.flush(off, len)
    }

    /// Order earlier flushes before later stores.
    #[inline]
    pub fn fence(&self) -> Result<()> {
        self.medium.fence()
    }

    /// Read one 32-byte entry.
    #[inline]
    pub fn read_entry(&self, t: &mut IoTally, loc: u64) -> Result<super::record::DedupEntry> {
        self.count_read(t, 32);
        Ok(super::record::DedupEntry::from_bytes(
            &self.medium.read_32(loc)?,
        ))
    }

    /// Write everything of a new entry but its block number (not flushed), into a slot its
    /// writer reserved ([`super::reserve_slot`]). The slot keeps the reserved marker there until
    /// [`MetaIo::publish_blocknr`], so a concurrent reader that reads the block number first
    /// ([`MetaIo::read_entry_ordered`]) never sees a valid block number beside a stale
    /// fingerprint (a reused slot's old one). Two stores of 8 and 16 bytes, which the metadata
    /// access counts of the aging experiment were measured with (a block file gathers whole
    /// runs of entries instead: `Engine::write_entry_runs`).
    #[inline]
    pub fn write_entry_body(
        &self,
        t: &mut IoTally,
        loc: u64,
        e: &super::record::DedupEntry,
    ) -> Result<()> {
        use super::record::{OFF_BLOCKNR, OFF_REFCOUNT};
        let b = e.to_bytes();
        self.write(t, loc, &b[..OFF_BLOCKNR as usize])?;
        self.write(t, loc + OFF_REFCOUNT, &b[OFF_REFCOUNT as usize..])
    }

    /// Store a new entry's block number, the store that makes it valid (not flushed), ordered
    /// after the entry's other stores.
    #[inline]
    pub fn publish_blocknr(&self, t: &mut IoTally, loc: u64, blocknr: u64) -> Result<()> {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        self.write_u64(t, loc + super::record::OFF_BLOCKNR, blocknr)
    }

    /// Read one entry, its block number first: the counterpart of the write order above, for
    /// a reader that holds no lock excluding the entry's writer (it sees a valid block number
    /// only with the fingerprint and count written before it).
    #[inline]
    pub fn read_entry_ordered(
        &self,
        t: &mut IoTally,
        loc: u64,
    ) -> Result<super::record::DedupEntry> {
        let blocknr = self.read_u64(t, loc + super::record::OFF_BLOCKNR)?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let mut e = self.read_entry(t, loc)?;
        e.blocknr = blocknr;
        Ok(e)
    }

    /// Write one 32-byte entry (not flushed).
    #[inline]
    pub fn write_entry(
        &self,
        t: &mut IoTally,
        loc: u64,
        e: &super::record::DedupEntry,
    ) -> Result<()> {
        self.write(t, loc, &e.to_bytes())
    }
}
