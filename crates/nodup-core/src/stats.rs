//! Engine counters, exported through `nodup stats --json` (keys are a contract, see DESIGN.md).

use serde::{Deserialize, Serialize};

/// A snapshot of the engine's counters; the file system adds `logical_bytes` and the ratio.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EngineStats {
    /// Policy name (`light`, `none`, `strong`, `weak-verify`, ...).
    pub policy: String,
    /// Fingerprint name recorded at format time.
    pub fingerprint: String,
    /// Metadata layout name recorded at format time.
    pub meta_layout: String,
    /// Block size in bytes (always 4096).
    pub block_size: u64,
    /// Distinct data blocks in use, in bytes.
    pub physical_bytes: u64,
    /// Blocks passed to the write path.
    pub blocks_written: u64,
    /// Blocks that were found to be duplicates and not written.
    pub dedup_hits: u64,
    /// Fingerprint matches whose bytes differed (written as non-dedup blocks).
    pub fp_collisions: u64,
    /// Bytes written to the medium for data blocks.
    pub media_bytes_written: u64,
    /// Bytes read from the medium for data blocks (reads and duplicate comparisons).
    pub media_bytes_read: u64,
    /// Bytes written for dedup metadata (entries, reverse map, regions); metered when asked.
    pub meta_bytes_written: u64,
    /// Bytes read for dedup metadata; metered when asked.
    pub meta_bytes_read: u64,
    /// Entries in the DRAM index.
    pub index_entries: u64,
    /// Exact heap bytes of the DRAM index.
    pub index_memory_bytes: u64,
    /// Block reads answered by the dedup-aware read cache (no media read).
    pub read_cache_hits: u64,
    /// Blocks of the data area.
    pub total_blocks: u64,
    /// Free blocks of the data area.
    pub free_blocks: u64,
    /// Trusted hints that named the entry actually used next.
    pub hint_hits: u64,
    /// Trusted hints that named another entry.
    pub hint_misses: u64,
    /// Media errors the engine worked around without failing the operation (e.g. a claim of
    /// entry slots ahead of need that failed, then a single claim that worked).
    #[serde(default)]
    pub media_errors_absorbed: u64,
    /// Blocks given another reference by a server-side copy (`copy_file_range`) instead of
    /// being written.
    #[serde(default)]
    pub blocks_shared: u64,
}
