//! Bounded caches of FSDedup's selective deduplication (`../shared/papers/fsdedup-tos24.txt` §3.4,
//! §3.5), shared by everything that deduplicates selectively: the `selective` policy of the engine
//! (4 KiB blocks, values = entry locations) and the `nodup sim` cache-line simulator (64 B lines,
//! values = physical line numbers).
//!
//! - [`lrcu`]: the LRCU fingerprint cache (Algorithms 1 and 2: frequency lists with a
//!   minimum-frequency pointer, least frequent evicted) with the refresh of Algorithm 3 (hotness =
//!   new accesses + half the previous hotness), fired by a time interval and/or an operation count.
//! - [`prefetch`]: the prefetch cache that answers verification reads with content kept after a
//!   duplicate was confirmed (and the other contents seen under the same fingerprint).
//!
//! Both are generic over the unit: keys are 64-bit fingerprints, values and contents are the
//! caller's types, and capacities come from a byte budget with a per-entry size the caller states
//! (the size its hardware or on-media layout would use), so [`lrcu::Lrcu::memory_bytes`] and
//! [`prefetch::PrefetchCache::memory_bytes`] report what the cache costs in that model. Neither
//! locks: a user with threads puts one behind a `Mutex`.

pub mod lrcu;
pub mod prefetch;

pub use lrcu::{Lrcu, LrcuStats, Refresh};
pub use prefetch::{PrefetchCache, PrefetchStats};

/// Hasher of the caches' maps: keys are fingerprints or locations, not attacker-chosen strings.
pub(crate) type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// "No slot" in the caches' index-linked lists.
pub(crate) const NIL: u32 = u32::MAX;
