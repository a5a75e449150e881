//! Dedup policies: each is a module behind one trait, so the write path is never forked per policy.

pub mod baseline;
pub mod light;
pub mod selective;
pub mod smart;

/// Light's prefetch rules, kept reachable under their earlier path.
pub use light::prefetch;

use serde::{Deserialize, Serialize};

use crate::fingerprint::FpKind;
use crate::store::{FpStore, StoreParams};
use crate::Result;

crate::named_enum! {
    /// Policies selectable at mkfs; the numeric value is stored on the medium.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[repr(u32)]
    pub enum PolicyKind {
        /// Light-Dedup: xxh3 + byte comparison + speculative prefetch (default).
        Light = 1 => "light",
        /// No deduplication (NOVA / ext4 role).
        None = 2 => "none",
        /// Cryptographic fingerprint trusted without comparison (NV-Dedup / Dedup_SHA1 role).
        Strong = 3 => "strong",
        /// CRC-32C + comparison, no prefetch (DeWrite / LD-w/o-P role).
        WeakVerify = 4 => "weak-verify",
        /// SmartDedup: dedup in a fixed memory budget (two-level store, inline + out-of-line).
        Smart = 5 => "smart",
        /// FSDedup: similarity fingerprint + verification, hot-fingerprint cache (LRCU with refresh) and prefetch cache, no complete store.
        Selective = 6 => "selective",
    }
}

crate::named_enum! {
    /// Speculative-prefetch variants of Light-Dedup §4.3, selectable per mount for experiments.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
    pub enum PrefetchMode {
        /// LD-w/o-P: no prefetch.
        None = 0 => "none",
        /// Prefetch all 64 cache lines before comparing.
        P64 = 1 => "p64",
        /// In-Block Prefetch: 16 prefetches at 256 B stride, then 64 B stride.
        Ibp = 2 => "ibp",
        /// Prefetch-Current: prefetch the hinted block before fingerprinting.
        Pc = 3 => "pc",
        /// Speculation: follow a trusted hint and skip fingerprint + index.
        Sp = 4 => "sp",
        /// Prefetch-Next: also prefetch the block the next input will likely compare with.
        Pn = 5 => "pn",
        /// Cross-Block Prefetch = PN + transition (default).
        #[default]
        Cbp = 6 => "cbp",
    }
}

/// What a policy wants done with one block (decided before its store is consulted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Write the block as a non-dedup block: no lookup, no entry.
    Skip,
    /// Look the fingerprint up and deduplicate on a match; on a miss write the block without
    /// an entry (e.g. a selectively sampled stream, or a store that is full).
    Lookup,
    /// Look the fingerprint up; on a miss create an entry, so later copies find this block.
    LookupOrInsert,
}

/// A dedup policy: which fingerprint, which fingerprint store, whether to look up and insert,
/// whether to verify a match and how to speculate. The write path is the same for every policy;
/// a policy plugs in through [`Policy::decide`] and its store ([`Policy::make_store`]), which
/// is told about hits, inserts, releases and frees and can keep its own hot-fingerprint state
/// (see `docs/design/engine.md` for a worked example).
pub trait Policy: Send + Sync {
    /// Which policy this is.
    fn kind(&self) -> PolicyKind;
    /// Fingerprint function to record at format time, given what the user asked for.
    fn fingerprint_for(&self, requested: FpKind) -> FpKind {
        requested
    }
    /// Whether a block with fingerprint `fp` goes through dedup at all.
    fn decide(&self, fp: u64) -> Decision;
    /// True when the policy never deduplicates (no fingerprint is computed at all).
    fn never_dedups(&self) -> bool {
        false
    }
    /// True when a fingerprint match must be confirmed byte by byte.
    fn verify(&self) -> bool;
    /// The prefetch variant actually used, given the one asked for at open.
    fn prefetch(&self, asked: PrefetchMode) -> PrefetchMode;
    /// The policy's own fingerprint store; `None` (the default) is the complete DRAM index
    /// ([`crate::index::FpIndex`]), which the engine calls directly rather than through the
    /// trait. An error when the store cannot be had (its budget's memory).
    fn make_store(&self, _params: &StoreParams) -> Result<Option<Box<dyn FpStore>>> {
        Ok(None)
    }
    /// Whether runs of new data are staged (fingerprinted and copied ahead of their lookups).
    fn stages(&self) -> bool {
        true
    }
    /// Whether the policy samples blocks for inline dedup at all ([`Policy::fingerprint_inline`]
    /// is asked per block only then).
    fn samples_inline(&self) -> bool {
        false
    }
    /// Whether the next block is fingerprinted inline at all (selectivity); a block that is not
    /// is stored without an entry and reported as a miss (see [`Policy::reports_misses`]).
    fn fingerprint_inline(&self) -> bool {
        true
    }
    /// Whether the write path lists the blocks it stored as new (`WriteCtx::misses`), for an
    /// out-of-line worker.
    fn reports_misses(&self) -> bool {
        false
    }
    /// One call's inline results: blocks looked up and duplicates found among them (asked only
    /// of policies that sample inline).
    fn after_call(&self, _fingerprinted: u64, _hits: u64) {}
    /// Deduplicate only runs of at least this many consecutive duplicates (1: every one).
    fn min_dup_run(&self) -> usize {
        1
    }
    /// Bytes of the engine's dedup-aware read cache (0: none).
    fn read_cache_bytes(&self) -> u64 {
        0
    }
    /// How the policy shares its memory budget, when it has one.
    fn budget_split(&self) -> Option<smart::BudgetSplit> {
        None
    }
    /// New resource readings (battery, low-power mode, CPU and device load).
    fn set_resources(&self, _r: smart::Resources) {}
    /// The resource readings in force, for policies that adapt to them.
    fn resources(&self) -> Option<smart::Resources> {
        None
    }
    /// The policy's own figures for `nodup stats`.
    fn report(&self) -> Option<serde_json::Value> {
        None
    }
}

/// Per-open options of the policies that have any.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PolicyOptions {
    /// Options of `smart`.
    pub smart: smart::SmartOptions,
    /// Options of `selective`.
    pub selective: selective::SelectiveOptions,
}

/// The policy object for `kind` with its per-open options.
pub fn make_policy(kind: PolicyKind, opts: &PolicyOptions) -> Result<Box<dyn Policy>> {
    match kind {
        PolicyKind::Light => Ok(Box::new(light::Light)),
        PolicyKind::None => Ok(Box::new(baseline::NoDedup)),
        PolicyKind::Strong => Ok(Box::new(baseline::Strong)),
        PolicyKind::WeakVerify => Ok(Box::new(baseline::WeakVerify)),
        PolicyKind::Smart => Ok(Box::new(smart::Smart::new(opts.smart))),
        PolicyKind::Selective => Ok(Box::new(selective::Selective::new(opts.selective))),
    }
}
