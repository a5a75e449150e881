//! Reverse map: 8 bytes per block of the medium, block → offset of its dedup entry (0 = none).
//!
//! On-media layout: a fixed array of little-endian u64 starting at `start` (byte offset),
//! indexed by absolute block number. Used by release (Light-Dedup §4.2 "Deletion Logic").

use super::io::{IoTally, MetaIo};
use crate::{BlockNr, Result};

/// The reverse-map area.
#[derive(Debug, Clone, Copy)]
pub struct RevMap {
    /// Byte offset of slot 0.
    pub start: u64,
    /// Number of slots (blocks of the medium).
    pub nblocks: u64,
}

/// Bytes per slot.
pub const SLOT: u64 = 8;

impl RevMap {
    /// Byte offset of the slot of `b`.
    #[inline]
    pub fn slot_off(&self, b: BlockNr) -> u64 {
        self.start + b * SLOT
    }

    /// Entry offset recorded for `b` (0 = none).
    #[inline]
    pub fn get(&self, io: &MetaIo, t: &mut IoTally, b: BlockNr) -> Result<u64> {
        io.read_u64(t, self.slot_off(b))
    }

    /// Record `loc` for `b` and flush the slot's line (the caller fences).
    #[inline]
    pub fn set(&self, io: &MetaIo, t: &mut IoTally, b: BlockNr, loc: u64) -> Result<()> {
        let off = self.slot_off(b);
        io.write_u64(t, off, loc)?;
        io.flush(off, SLOT);
        Ok(())
    }
}
