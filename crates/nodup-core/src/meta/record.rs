//! The 32-byte dedup metadata entry shared by every layout, and its hint encoding.
//!
//! On-media layout of one entry (little endian, 32 bytes, 32-byte aligned):
//!
//! | offset | width | field      | meaning                                              |
//! |-------:|------:|------------|------------------------------------------------------|
//! | 0      | 8     | `fp`       | fingerprint of the block                             |
//! | 8      | 8     | `blocknr`  | data block; 0 = free slot, `RESERVED` = being created|
//! | 16     | 8     | `refcount` | references the caller holds                          |
//! | 24     | 8     | `hint`     | bits 63..3: next entry's offset (32-aligned, so bits 4..3 are 0), bits 2..0: trust degree |
//!
//! `blocknr` is the commit field: an entry is valid only when it holds a real block number. The
//! write path stores a whole entry (one store, one cache line) only after its data block is
//! durable; while a write call is in flight the slot holds `RESERVED`, which no recovery trusts.

use crate::codec::le_u64;

/// Size of one entry.
pub const ENTRY_SIZE: u64 = 32;
/// Offset of `fp` within an entry.
pub const OFF_FP: u64 = 0;
/// Offset of `blocknr` within an entry.
pub const OFF_BLOCKNR: u64 = 8;
/// Offset of `refcount` within an entry.
pub const OFF_REFCOUNT: u64 = 16;
/// Offset of `hint` within an entry.
pub const OFF_HINT: u64 = 24;
/// `blocknr` value of a slot claimed by an in-flight write (never a valid entry after a crash).
pub const RESERVED: u64 = u64::MAX;

/// One dedup metadata entry, as stored.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DedupEntry {
    /// Fingerprint.
    pub fp: u64,
    /// Data block (0 = free, `RESERVED` = being created).
    pub blocknr: u64,
    /// Reference count.
    pub refcount: u64,
    /// Packed hint (see [`Hint`]).
    pub hint: u64,
}

const _: () = assert!(std::mem::size_of::<DedupEntry>() == ENTRY_SIZE as usize);

impl DedupEntry {
    /// Decode from 32 bytes.
    pub fn from_bytes(b: &[u8; 32]) -> DedupEntry {
        let f = |o: u64| le_u64(b, o as usize);
        DedupEntry {
            fp: f(OFF_FP),
            blocknr: f(OFF_BLOCKNR),
            refcount: f(OFF_REFCOUNT),
            hint: f(OFF_HINT),
        }
    }

    /// Encode to 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&self.fp.to_le_bytes());
        b[8..16].copy_from_slice(&self.blocknr.to_le_bytes());
        b[16..24].copy_from_slice(&self.refcount.to_le_bytes());
        b[24..32].copy_from_slice(&self.hint.to_le_bytes());
        b
    }

    /// True when the slot holds a committed entry.
    pub fn is_valid(&self) -> bool {
        self.blocknr != 0 && self.blocknr != RESERVED
    }
}

/// A packed hint: where the next entry was last time, and how much that prediction is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hint(pub u64);

impl Hint {
    /// No hint recorded.
    pub const NONE: Hint = Hint(0);

    /// A hint to the entry at `loc` with trust degree `trust` (0..=7).
    pub fn new(loc: u64, trust: u8) -> Hint {
        debug_assert!(loc.is_multiple_of(ENTRY_SIZE));
        Hint((loc & !7) | (trust as u64 & 7))
    }

    /// Offset of the predicted entry (0 = none).
    pub fn target(self) -> u64 {
        self.0 & !7
    }

    /// Trust degree, 0..=7.
    pub fn trust(self) -> u8 {
        (self.0 & 7) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_roundtrip_and_hint_packing() {
        let e = DedupEntry {
            fp: 1,
            blocknr: 2,
            refcount: 3,
            hint: Hint::new(4096 + 64, 5).0,
        };
        assert_eq!(DedupEntry::from_bytes(&e.to_bytes()), e);
        let h = Hint(e.hint);
        assert_eq!((h.target(), h.trust()), (4160, 5));
        assert!(!DedupEntry {
            blocknr: RESERVED,
            ..e
        }
        .is_valid());
    }
}
