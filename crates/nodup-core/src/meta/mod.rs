//! On-media dedup metadata: three layouts behind one trait, plus the reverse map (block → entry).
//!
//! Every layout stores the same 32-byte [`record::DedupEntry`]; they differ only in *where* an
//! entry goes, which is what decides the metadata I/O amplification (Light-Dedup §3.3, §4.4):
//! - [`region`]: the Light-Meta-Table, 4 KiB regions filled almost sequentially (default but
//!   for `smart`, see [`MetaLayoutKind::default_for`]);
//! - [`entry`]: fixed entries handed out by a free list (NV-Dedup / LO-Dedup);
//! - [`hashtable`]: a static open-addressing table on the medium (DeNOVA-style; `smart`'s
//!   default, as it keeps nothing in DRAM).

pub mod entry;
pub mod hashtable;
pub mod io;
pub(crate) mod lazy_words;
pub mod record;
pub mod region;
pub mod revmap;

use crate::alloc::Allocator;
use crate::{BlockNr, Result};
use io::{IoTally, MetaIo};

use serde::{Deserialize, Serialize};

crate::named_enum! {
    /// Metadata layouts selectable at mkfs; the numeric value is stored on the medium.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[repr(u32)]
    pub enum MetaLayoutKind {
        /// Light-Meta-Table: 4 KiB regions of 32-byte entries, region queue, GC-free (default).
        Region = 1 => "region",
        /// Fixed entries allocated through a free list (NV-Dedup / LO-Dedup).
        Entry = 2 => "entry",
        /// Static open-addressing hash table on the medium (DeNOVA-style).
        Hashtable = 3 => "hashtable",
    }
}

impl MetaLayoutKind {
    /// The layout mkfs picks for `policy`: the static hash table for `smart`, whose dedup
    /// memory must stay within its budget however much unique data comes (the region layout
    /// keeps a DRAM counter per region, about 0.13-0.25 B per unique block), else the region
    /// layout.
    pub fn default_for(policy: crate::policy::PolicyKind) -> MetaLayoutKind {
        match policy {
            crate::policy::PolicyKind::Smart => MetaLayoutKind::Hashtable,
            _ => MetaLayoutKind::Region,
        }
    }
}

/// One on-media metadata layout: where entries live and how slots are handed out.
///
/// Entry *contents* are read and written by the engine through [`MetaIo`]; a layout only claims
/// slots (writing [`record::RESERVED`] into `blocknr` so no other allocator can pick the slot),
/// takes back slots whose `blocknr` the engine cleared, and rebuilds its DRAM state.
pub trait MetaLayout: Send + Sync {
    /// Which layout this is.
    fn kind(&self) -> MetaLayoutKind;
    /// Initialise the layout's fixed area on a fresh image.
    fn format(&self, io: &MetaIo, t: &mut IoTally) -> Result<()>;
    /// Read the layout's structure from the medium at open (e.g. walk the region chain).
    fn attach(&self, io: &MetaIo, t: &mut IoTally) -> Result<()>;
    /// Claim a free slot for an entry with fingerprint `fp`, for the writer using pool `pool`.
    /// May take blocks from `alloc` (regions); `apool` is the writer's allocation pool.
    fn alloc_entry(
        &self,
        io: &MetaIo,
        t: &mut IoTally,
        fp: u64,
        pool: usize,
        alloc: &Allocator,
        apool: &mut usize,
    ) -> Result<u64>;
    /// Claim up to `n` slots at once for a writer (appended to `out`, each marked like
    /// [`MetaLayout::alloc_entry`]'s); returns how many. Layouts whose slot depends on the
    /// fingerprint claim none (the default), and the engine claims one at a time.
    #[allow(clippy::too_many_arguments)]
    fn alloc_entries(
        &self,
        _io: &MetaIo,
        _t: &mut IoTally,
        _pool: usize,
        _alloc: &Allocator,
        _apool: &mut usize,
        _n: usize,
        _out: &mut std::collections::VecDeque<u64>,
    ) -> Result<usize> {
        Ok(0)
    }
    /// Take back the slot at `loc`, whose `blocknr` the engine has cleared (made durable).
    fn free_entry(&self, loc: u64);
    /// True when `loc` is the first byte of a slot of this layout (validates hints and saves).
    fn is_entry_loc(&self, loc: u64) -> bool;
    /// Visit every slot location (failure recovery scans them all).
    fn for_each_slot(&self, f: &mut dyn FnMut(u64) -> Result<()>) -> Result<()>;
    /// Blocks of the data area the layout owns (regions), for the allocator rebuild.
    fn owned_blocks(&self) -> Vec<BlockNr>;
    /// Rebuild counters, queues and free lists from the sorted list of valid entry locations.
    fn rebuild(&self, valid_sorted: &[u64]) -> Result<()>;
    /// DRAM state to keep across a clean shutdown (valid-entry counters, free lists).
    fn save_state(&self) -> Vec<u64>;
    /// Reload what [`MetaLayout::save_state`] produced.
    fn load_state(&self, words: &[u64]) -> Result<()>;
    /// Upper bound on [`MetaLayout::save_state`]'s length, for sizing the save area.
    fn max_state_words(&self) -> u64;
    /// True when a failed claim left the medium's structure possibly unlike the live state
    /// (a region link that may have landed and could not be undone): the engine then gives up
    /// its live state, and failure recovery reads the structure from the medium again.
    fn unsettled(&self) -> bool {
        false
    }
    /// Compare the DRAM state (counters, free lists) with the sorted valid entry locations;
    /// one message per disagreement.
    fn check(&self, _valid_sorted: &[u64]) -> Vec<String> {
        Vec::new()
    }
}

/// Where a layout's fixed area sits and how large it is (decided at format, kept in the superblock).
#[derive(Debug, Clone, Copy)]
pub struct LayoutGeometry {
    /// First block of the fixed area.
    pub start_block: u64,
    /// Blocks of the fixed area.
    pub blocks: u64,
    /// Slots of the fixed area (entry / hashtable) or 0.
    pub slots: u64,
    /// Blocks of the whole medium.
    pub nblocks: u64,
    /// First block of the data area (regions live at or after it).
    pub data_start: u64,
}

impl MetaLayoutKind {
    /// Fixed-area size for a medium of `nblocks` blocks: (blocks, slots).
    pub fn fixed_area(self, nblocks: u64) -> (u64, u64) {
        match self {
            MetaLayoutKind::Region => (region::HEADER_REGIONS, 0),
            MetaLayoutKind::Entry => {
                let slots = nblocks;
                (slots.div_ceil(entry::SLOTS_PER_BLOCK), slots)
            }
            MetaLayoutKind::Hashtable => {
                let slots = nblocks + nblocks / 4 + 16;
                (slots.div_ceil(hashtable::SLOTS_PER_BLOCK), slots)
            }
        }
    }
}

/// Build the layout of `kind` over `geo`.
pub fn make_layout(kind: MetaLayoutKind, geo: LayoutGeometry) -> Box<dyn MetaLayout> {
    match kind {
        MetaLayoutKind::Region => Box::new(region::RegionLayout::new(geo)),
        MetaLayoutKind::Entry => Box::new(entry::EntryLayout::new(geo)),
        MetaLayoutKind::Hashtable => Box::new(hashtable::HashLayout::new(geo)),
    }
}

/// Mark the slot at `loc` as being created. On a failed store the slot is set back to free, so
/// a fault leaves no half-written marker that would make the slot look taken.
pub(crate) fn reserve_slot(io: &MetaIo, t: &mut IoTally, loc: u64) -> Result<()> {
    let r = io.write_u64(t, loc + record::OFF_BLOCKNR, record::RESERVED);
    if r.is_err() {
        let _ = io.write_u64(t, loc + record::OFF_BLOCKNR, 0);
    }
    r
}
