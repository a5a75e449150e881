//! The engine: image geometry, the inline-dedup write path, release, and recovery.
//!
//! This file is the contract between nodup-core and its callers (nodup-fs, trace replay, benches).
//!
//! Image ownership: the engine formats the whole medium. Block 0 is the engine superblock.
//! Blocks `[client_area_start, client_area_start + client_area_blocks)` are reserved for the
//! caller (the file system keeps its own superblock / checkpoint pointers there) and are never
//! touched by the engine. Every other block is managed by the engine's allocator: data blocks
//! (through [`Engine::write`]) and caller metadata blocks (through [`Engine::alloc_meta`]).
//!
//! Persistence contract of [`Engine::write`]: when it returns, every returned block's data is
//! durable and, for dedup blocks, its metadata entry (with the incremented reference count) is
//! durable too. Each returned block carries one reference owned by the caller: the caller
//! commits it into its own metadata (e.g. a file's block map) or gives it back with
//! [`Engine::release`]. The caller is the source of truth after a crash: failure recovery
//! ([`Engine::recover`]) rebuilds reference counts and the allocator from the references the
//! caller reports.

use std::sync::Arc;

use crate::fingerprint::FpKind;
use crate::media::Medium;
use crate::meta::MetaLayoutKind;
use crate::policy::{PolicyKind, PrefetchMode};
use crate::{BlockNr, EngineStats, Result};

/// Options fixed at format (mkfs) time and recorded in the engine superblock.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    pub policy: PolicyKind,
    pub fingerprint: FpKind,
    pub meta_layout: MetaLayoutKind,
    /// Memory budget for policies that have one (`smart`); 0 = unlimited.
    pub mem_budget: u64,
    /// Blocks reserved for the caller right after the engine superblock.
    pub client_area_blocks: u64,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            policy: PolicyKind::Light,
            fingerprint: FpKind::Xxh3,
            meta_layout: MetaLayoutKind::Region,
            mem_budget: 0,
            client_area_blocks: 16,
        }
    }
}

/// Options chosen per open (mount).
#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub prefetch: PrefetchMode,
    /// Concurrent writers at which prefetch-next is switched off (Light-Dedup transition, default 6).
    pub transition_threshold: usize,
    /// Memory budget override for policies that have one; `None` keeps the formatted value.
    pub mem_budget: Option<u64>,
    /// Count metadata accesses at this granularity through the access meter (None = plain byte counts).
    pub meter_granularity: Option<usize>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            prefetch: PrefetchMode::Cbp,
            transition_threshold: 6,
            mem_budget: None,
            meter_granularity: None,
        }
    }
}

/// How the image was found at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenState {
    /// The last shutdown was clean; the index and counters were reloaded (normal recovery).
    Clean,
    /// The image was not shut down cleanly: the caller must call [`Engine::recover`] before writing.
    NeedsRecovery,
}

/// Per-writer state (one per thread or stream): stream trust degree, last entry, allocation pool.
/// Prefetch state never crosses calls to [`Engine::write`]; hint bookkeeping may.
#[derive(Debug, Default)]
pub struct WriteCtx {
    _private: (),
}

/// What a recovery did, for logs and reports.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RecoveryReport {
    pub seconds: f64,
    pub entries_scanned: u64,
    pub entries_invalidated: u64,
    pub refcounts_fixed: u64,
    pub referenced_blocks: u64,
    pub leaked_blocks_freed: u64,
}

/// The inline-dedup engine over one medium.
pub struct Engine {
    _medium: Arc<dyn Medium>,
}

impl Engine {
    /// Format `medium` as a fresh nodup image.
    pub fn format(
        _medium: Arc<dyn Medium>,
        _opts: &FormatOptions,
        _open: &OpenOptions,
    ) -> Result<Engine> {
        unimplemented!("engine format")
    }

    /// Open an existing image, validating the superblock. Performs normal recovery when clean.
    pub fn open(_medium: Arc<dyn Medium>, _opts: &OpenOptions) -> Result<(Engine, OpenState)> {
        unimplemented!("engine open")
    }

    /// Write path: for each 4 KiB block in `blocks`, return the physical block it now maps to
    /// (an existing duplicate or a newly written block), each with one reference for the caller.
    pub fn write(&self, _ctx: &mut WriteCtx, _blocks: &[&[u8]]) -> Result<Vec<BlockNr>> {
        unimplemented!("engine write")
    }

    /// Read one data block.
    pub fn read(&self, _block: BlockNr, _buf: &mut [u8]) -> Result<()> {
        unimplemented!("engine read")
    }

    /// Drop one reference to a data block (overwrite, truncate, punch, unlink); frees it at zero.
    pub fn release(&self, _block: BlockNr) -> Result<()> {
        unimplemented!("engine release")
    }

    /// Allocate `n` blocks for the caller's own metadata (logs, checkpoints); not deduplicated.
    pub fn alloc_meta(&self, _n: usize) -> Result<Vec<BlockNr>> {
        unimplemented!("engine alloc_meta")
    }

    /// Free blocks obtained from [`Engine::alloc_meta`].
    pub fn free_meta(&self, _blocks: &[BlockNr]) -> Result<()> {
        unimplemented!("engine free_meta")
    }

    /// First block and length (in blocks) of the caller's reserved area.
    pub fn client_area(&self) -> (BlockNr, u64) {
        unimplemented!("engine client_area")
    }

    /// The medium, for the caller's own metadata I/O in its blocks.
    pub fn medium(&self) -> &Arc<dyn Medium> {
        &self._medium
    }

    /// Current counters.
    pub fn stats(&self) -> EngineStats {
        unimplemented!("engine stats")
    }

    /// Failure recovery: `data_refs` yields every data block the caller references (once per
    /// reference), `meta_blocks` every block the caller holds from `alloc_meta`. Rebuilds
    /// reference counts, invalidates entries nobody references, rebuilds index, region queue
    /// and allocator.
    pub fn recover(
        &self,
        _data_refs: &mut dyn Iterator<Item = BlockNr>,
        _meta_blocks: &mut dyn Iterator<Item = BlockNr>,
    ) -> Result<RecoveryReport> {
        unimplemented!("engine recover")
    }

    /// Clean shutdown: persist index, valid-entry counters and allocator, set the clean flag.
    pub fn shutdown(&self) -> Result<()> {
        unimplemented!("engine shutdown")
    }
}
