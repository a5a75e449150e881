//! Policy `smart`: SmartDedup (Yang, Jin, Zhao, ATC'19) — deduplication in a fixed memory
//! budget. Inline dedup looks blocks up in a small in-memory fingerprint store; what it does
//! not match is handed to an out-of-line worker (in the file system, `nodup-fs/src/smart/`)
//! that searches the in-memory and the on-media store and remaps byte-identical blocks through
//! the file system's log. Pieces here: the two-level store (`store.rs`, `tree.rs`, `slab.rs`,
//! `ondisk.rs`) and adaptive selectivity (`select.rs`). See `docs/design/smart.md`.

mod inner;
pub mod ondisk;
pub mod select;
pub mod slab;
pub mod store;
pub mod tree;

use std::sync::Arc;

pub use select::{Resources, Selectivity};
pub use store::{Eviction, SmartCounters, SmartStore};

use super::{Decision, Policy, PolicyKind, PrefetchMode};
use crate::fingerprint::FpKind;
use crate::store::{FpStore, StoreParams};

/// Budget of a `smart` image formatted without `--mem-budget`: the paper's 3.5 MB cap (§4,
/// there a 3 MB fingerprint store and a 0.5 MB skipped buffer; here the read cache and the
/// worker take shares too, so the store keeps 2.4 MiB and its tree 13 prefix bits, not 14).
pub const DEFAULT_BUDGET: u64 = (3 << 20) + (512 << 10);
/// Smallest budget accepted.
pub const MIN_BUDGET: u64 = 64 << 10;
/// Fingerprint-store bytes per prefix-tree leaf: the paper's 14-bit prefix for a 3 MB store
/// and 18 bits for 40 MB both come out of `floor(log2(store / 160))`.
const BYTES_PER_PREFIX: u64 = 160;

/// Per-mount options of `smart` (experiments and operators).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SmartOptions {
    /// Which in-memory fingerprints make room (group LRU by default).
    pub eviction: Eviction,
    /// A fixed inline selectivity in (0, 1] (default 1: every block, as the paper's
    /// experiments outside §4.4); `None` adapts it to the duplication level and resources.
    pub fixed_selectivity: Option<f64>,
    /// Deduplicate only runs of at least this many consecutive duplicate blocks (§4.5; 1 =
    /// every duplicate).
    pub min_run: u32,
    /// Keep the dedup-aware read cache (§3.4).
    pub read_cache: bool,
}

impl Default for SmartOptions {
    fn default() -> Self {
        SmartOptions {
            eviction: Eviction::GroupLru,
            fixed_selectivity: Some(1.0),
            min_run: 1,
            read_cache: true,
        }
    }
}

/// How a budget is shared between the structures `smart` keeps in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BudgetSplit {
    /// The whole budget.
    pub total: u64,
    /// Fingerprint store: prefix tree, in-memory groups, tombstones.
    pub store: u64,
    /// The file system's skipped buffer.
    pub skipped: u64,
    /// The dedup-aware read cache (0 when it is off).
    pub read_cache: u64,
    /// The out-of-line worker's per-step scratch (the blocks of one step and their
    /// candidates), which sets how many blocks a step takes.
    pub worker: u64,
    /// Left unassigned for what the policy's work allocates while it runs, outside its
    /// structures: the store's merge buffers (kept from open, `merge_scratch_bytes` in
    /// stats), lookups' candidates, the blocks read to byte-verify a candidate, and the
    /// allocator's slack around them (measured at 2 GiB with 512 KiB before the merge buffers
    /// were kept: -0.03 to +0.11 MiB beyond the structures' accounting).
    pub transient: u64,
    /// Left unassigned for the worker thread itself, which the file system without dedup does
    /// not have: its stack and the allocator arena glibc gives a new thread (session 20's
    /// `smaps` of a settled daemon: about 150 KiB more in thread stacks and non-FUSE arenas).
    pub worker_thread: u64,
    /// Prefix bits of the tree (from the store's share, as the paper's from its store size).
    pub prefix_bits: u32,
}

/// Prefix bits for a fingerprint store of `store` bytes on a medium of `medium_blocks` blocks
/// (at most one prefix per four blocks, so the saved directory always fits the save area).
pub fn prefix_bits_for(store: u64, medium_blocks: u64) -> u32 {
    let by_store = (store / BYTES_PER_PREFIX).max(1).ilog2();
    let by_medium = (medium_blocks / 4).max(64).ilog2();
    by_store.min(by_medium).clamp(6, 24)
}

/// Most budget bytes the worker's scratch takes (a step of a few hundred blocks; more buys
/// nothing but longer steps).
pub const WORKER_MAX: u64 = 48 << 10;

/// Budget bytes left for the worker thread's own stack and arena (at most a quarter of the
/// budget).
pub const WORKER_THREAD_RESERVE: u64 = 128 << 10;

/// The split of `budget` (0 = [`DEFAULT_BUDGET`]): an eighth each to the skipped buffer and
/// the read cache (when on), a sixteenth (at most [`WORKER_MAX`]) each to the worker's scratch
/// and to transient use, [`WORKER_THREAD_RESERVE`] (at most a quarter) to the worker thread,
/// the rest to the fingerprint store.
pub fn split(budget: u64, medium_blocks: u64, read_cache: bool) -> BudgetSplit {
    let total = if budget == 0 { DEFAULT_BUDGET } else { budget };
    let skipped = total / 8;
    let rc = if read_cache { total / 8 } else { 0 };
    let worker = (total / 16).min(WORKER_MAX);
    let transient = (total / 16).min(WORKER_MAX);
    let worker_thread = (total / 4).min(WORKER_THREAD_RESERVE);
    let store = total - skipped - rc - worker - transient - worker_thread;
    BudgetSplit {
        total,
        store,
        skipped,
        read_cache: rc,
        worker,
        transient,
        worker_thread,
        // The paper sizes the tree by the fingerprint store's memory (3 MB: 14 bits), not by
        // the whole budget: groups then hold as many records per prefix as the paper's, which
        // is what a group eviction amortizes its read-merge-write over.
        prefix_bits: prefix_bits_for(store, medium_blocks),
    }
}

/// The `smart` policy object.
pub struct Smart {
    opts: SmartOptions,
    select: Selectivity,
    split: std::sync::OnceLock<BudgetSplit>,
}

impl Smart {
    /// `smart` with these options.
    pub fn new(opts: SmartOptions) -> Smart {
        Smart {
            opts,
            select: Selectivity::new(opts.fixed_selectivity),
            split: std::sync::OnceLock::new(),
        }
    }

    /// The options in force.
    pub fn options(&self) -> SmartOptions {
        self.opts
    }

    /// The selectivity controller.
    pub fn selectivity(&self) -> &Selectivity {
        &self.select
    }
}

impl Policy for Smart {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Smart
    }
    fn decide(&self, _fp: u64) -> Decision {
        Decision::LookupOrInsert
    }
    fn verify(&self) -> bool {
        true
    }
    fn prefetch(&self, _asked: PrefetchMode) -> PrefetchMode {
        PrefetchMode::None
    }
    fn fingerprint_for(&self, requested: FpKind) -> FpKind {
        requested
    }
    fn make_store(&self, p: &StoreParams) -> crate::Result<Option<Box<dyn FpStore>>> {
        let s = split(
            p.mem_budget,
            p.medium_len / crate::BLOCK_SIZE as u64,
            self.opts.read_cache,
        );
        let _ = self.split.set(s);
        let io =
            p.io.as_ref()
                .map(|io| ondisk::GroupIo::new(io.medium.clone(), Arc::clone(&io.alloc)));
        Ok(Some(Box::new(SmartStore::new(
            s.store,
            s.prefix_bits,
            self.opts.eviction,
            io,
        )?)))
    }
    fn stages(&self) -> bool {
        false
    }
    fn samples_inline(&self) -> bool {
        true
    }
    fn fingerprint_inline(&self) -> bool {
        self.select.take()
    }
    fn reports_misses(&self) -> bool {
        true
    }
    fn after_call(&self, fingerprinted: u64, hits: u64) {
        self.select.observe(fingerprinted, hits);
    }
    fn min_dup_run(&self) -> usize {
        self.opts.min_run.max(1) as usize
    }
    fn read_cache_bytes(&self) -> u64 {
        self.split.get().map_or(0, |s| s.read_cache)
    }
    fn budget_split(&self) -> Option<BudgetSplit> {
        self.split.get().copied()
    }
    fn set_resources(&self, r: Resources) {
        self.select.set_resources(r)
    }
    fn resources(&self) -> Option<Resources> {
        Some(self.select.resources())
    }
    fn report(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "options": self.opts,
            "budget": self.split.get(),
            "selectivity": self.select.report(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_bits_follow_the_paper() {
        let big = 1 << 30;
        assert_eq!(prefix_bits_for(3_000_000, big), 14);
        assert_eq!(prefix_bits_for(40 << 20, big), 18);
        assert_eq!(prefix_bits_for(512 << 10, big), 11);
        // A tiny image caps the tree.
        assert_eq!(prefix_bits_for(40 << 20, 4096), 10);
        let s = split(3 << 20, big, true);
        assert_eq!(
            s.store + s.skipped + s.read_cache + s.worker + s.transient + s.worker_thread,
            s.total
        );
        assert_eq!(s.worker, WORKER_MAX);
        assert_eq!(s.worker_thread, WORKER_THREAD_RESERVE);
        // The smallest budget still leaves the store more than a third of it.
        let s = split(MIN_BUDGET, big, true);
        assert_eq!(s.worker_thread, MIN_BUDGET / 4);
        assert_eq!(s.store, 24 << 10);
        let s = split(512 << 10, big, true);
        assert_eq!((s.store, s.prefix_bits), (192 << 10, 10));
        // A store of about the paper's 3 MB (2.8 MiB of a 4 MiB budget): 14 bits.
        let s = split(4 << 20, big, true);
        assert_eq!((s.store, s.prefix_bits), (2_916_352, 14));
        let s = split(0, big, true);
        assert_eq!((s.store, s.prefix_bits), (2_523_136, 13));
        assert_eq!(split(512 << 10, big, true).worker, 32 << 10);
        assert_eq!(split(0, big, false).total, DEFAULT_BUDGET);
    }
}

#[cfg(test)]
mod model_tests;
