//! `selective`: FSDedup's selective deduplication on the file system (`../shared/papers/
//! fsdedup-tos24.txt` §3.3-3.5). A cheap similarity fingerprint (the engine's `ecc` by default,
//! `crc32c` selectable) finds *candidates*, each confirmed byte by byte; only hot fingerprints
//! are remembered, in a fixed-size LRCU cache ordered by reference frequency whose hotness is
//! refreshed periodically (Algorithms 1-3); a prefetch cache keeps the content of confirmed
//! duplicates so later verifications of hot content need no media read. There is no complete
//! fingerprint store: a block whose fingerprint is not cached is written as unique. Reference
//! counts stay exact and persistent (the engine's entries), whatever the cache forgets.
//!
//! Memory: the LRCU's whole heap is reserved at open within `fp_cache_bytes` (512 KiB by
//! default, the paper's EFIT size) and the prefetch cache holds at most `prefetch_bytes` of block
//! contents (512 KiB: 128 blocks); neither grows with the data.

mod store;
#[cfg(test)]
mod tests;

pub use store::SelectiveStore;

use super::{Decision, Policy, PolicyKind, PrefetchMode};
use crate::fingerprint::FpKind;
use crate::store::{FpStore, StoreParams};

/// Default size of the fingerprint (LRCU) cache: the paper's 512 KiB.
pub const DEFAULT_FP_CACHE: u64 = 512 << 10;
/// Default size of the prefetch cache: the paper's 512 KiB.
pub const DEFAULT_PREFETCH: u64 = 512 << 10;
/// Default refresh interval (Algorithm 3): the paper's 10 s.
pub const DEFAULT_REFRESH_MS: u64 = 10_000;

/// Per-open options of `selective`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelectiveOptions {
    /// Bytes of the LRCU fingerprint cache (its whole heap).
    pub fp_cache_bytes: u64,
    /// Bytes of block contents the prefetch cache keeps (0: no prefetch cache, ESD).
    pub prefetch_bytes: u64,
    /// Refresh every this many milliseconds (None: never by time).
    pub refresh_ms: Option<u64>,
    /// Refresh after this many cache operations (tests and experiments; None: never by count).
    pub refresh_ops: Option<u64>,
}

impl Default for SelectiveOptions {
    fn default() -> Self {
        SelectiveOptions {
            fp_cache_bytes: DEFAULT_FP_CACHE,
            prefetch_bytes: DEFAULT_PREFETCH,
            refresh_ms: Some(DEFAULT_REFRESH_MS),
            refresh_ops: None,
        }
    }
}

/// The `selective` policy.
pub struct Selective {
    opts: SelectiveOptions,
}

impl Selective {
    /// The policy with `opts`.
    pub fn new(opts: SelectiveOptions) -> Self {
        Selective { opts }
    }
}

impl Policy for Selective {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Selective
    }
    fn fingerprint_for(&self, requested: FpKind) -> FpKind {
        // A similarity fingerprint: ECC (free in the paper's memory controller) unless CRC-32C
        // was asked for; the CLI refuses the others for this policy.
        match requested {
            FpKind::Crc32c | FpKind::TestCollide => requested,
            _ => FpKind::Ecc,
        }
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
    fn stages(&self) -> bool {
        // Staging copies new-looking runs ahead of their lookup (Light's streaming path); a
        // cache that forgets most fingerprints would make it copy blocks it then finds stored.
        false
    }
    fn make_store(&self, _p: &StoreParams) -> crate::Result<Option<Box<dyn FpStore>>> {
        Ok(Some(Box::new(SelectiveStore::new(self.opts)?)))
    }
}
