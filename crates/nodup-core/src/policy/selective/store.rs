//! The `selective` store: the LRCU fingerprint cache (fingerprint -> entry location) and the
//! prefetch cache (block -> content of a confirmed duplicate), behind one mutex.
//!
//! The LRCU holds one location per fingerprint, as FSDedup's EFIT: a new block whose fingerprint
//! is cached but whose content differs (a collision) is stored without an entry by the engine,
//! so it never competes for the slot. Locations are entry locations; the prefetch cache is keyed
//! by data block, with a side map from entry location to block so that freeing an entry drops
//! its cached content before the block can be reused (a stale content answering a verification
//! would lose data).

use super::SelectiveOptions;
use crate::cache::{Lrcu, PrefetchCache, Refresh};
use crate::store::FpStore;
use crate::{Error, Result, BLOCK_SIZE};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::time::Instant;

/// Heap bytes one prefetch item costs besides its block (map slots, list links, side map).
const PREFETCH_ITEM_OVERHEAD: usize = 96;

struct Inner {
    lrcu: Lrcu<u64>,
    prefetch: PrefetchCache<u64, Box<[u8]>>,
    /// Entry location -> block, for the blocks whose content the prefetch cache holds.
    cached_block: FxHashMap<u64, u64>,
    /// Verifications answered from the medium (the prefetch cache could not).
    verify_reads: u64,
}

/// FSDedup's hot-fingerprint cache plus prefetch cache (see the module doc).
pub struct SelectiveStore {
    inner: Mutex<Inner>,
    opts: SelectiveOptions,
    start: Instant,
}

impl SelectiveStore {
    /// An empty store sized by `opts`; [`Error::NoMemory`] when this machine cannot reserve
    /// its fingerprint cache.
    pub fn new(opts: SelectiveOptions) -> Result<Self> {
        Ok(SelectiveStore {
            inner: Mutex::new(Inner::empty(&opts, opts.fp_cache_bytes)?),
            opts,
            start: Instant::now(),
        })
    }

    /// The LRCU's clock: milliseconds since the store was made.
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Run Algorithm 3 now (tests, experiments).
    pub fn refresh_now(&self) {
        let now = self.now();
        self.inner.lock().lrcu.refresh_now(now);
    }

    /// Entries the fingerprint cache can hold.
    pub fn capacity(&self) -> usize {
        self.inner.lock().lrcu.capacity()
    }

    /// Prefetch-cache hits so far (verification reads avoided).
    pub fn prefetch_hits(&self) -> u64 {
        self.inner.lock().prefetch.stats().hits
    }
}

impl Inner {
    /// Both caches empty, sized by `opts`.
    /// Nothing cached, with a fingerprint cache of `cache_bytes` reserved.
    fn empty(opts: &SelectiveOptions, cache_bytes: u64) -> Result<Inner> {
        let refresh = Refresh {
            interval: opts.refresh_ms,
            every_ops: opts.refresh_ops,
        };
        let lrcu = Lrcu::reserved(cache_bytes as usize, refresh).map_err(|e| {
            Error::NoMemory(format!(
                "selective: a fingerprint cache of {cache_bytes} bytes ({e}); use a smaller --fp-cache"
            ))
        })?;
        Ok(Inner {
            lrcu,
            prefetch: PrefetchCache::with_budget(
                opts.prefetch_bytes as usize,
                BLOCK_SIZE + PREFETCH_ITEM_OVERHEAD,
                BLOCK_SIZE,
            ),
            cached_block: FxHashMap::default(),
            verify_reads: 0,
        })
    }

    fn drop_prefetched(&mut self, loc: u64) {
        if let Some(b) = self.cached_block.remove(&loc) {
            self.prefetch.remove_loc(b);
        }
    }
}

impl FpStore for SelectiveStore {
    fn find(&self, fp: u64, check: &mut dyn FnMut(u64) -> bool) -> Option<u64> {
        let now = self.now();
        // Algorithm 1 (a hit raises the entry's frequency); the lock is not held while `check`
        // reads the medium.
        let loc = self.inner.lock().lrcu.get(fp, now).copied()?;
        check(loc).then_some(loc)
    }

    fn insert(&self, fp: u64, loc: u64) {
        let now = self.now();
        let mut g = self.inner.lock();
        if g.lrcu.contains(fp) {
            // Another content under a cached fingerprint got an entry (recovery reloading, or
            // the cached one was freed meanwhile): point at the newest, frequency unchanged.
            if let Some(old) = g.lrcu.update(fp, loc) {
                if old != loc {
                    g.drop_prefetched(old);
                }
            }
            return;
        }
        // Algorithm 2: a new fingerprint enters at frequency 1, evicting the least frequent.
        if let Some((_, old)) = g.lrcu.put(fp, loc, now) {
            g.drop_prefetched(old);
        }
    }

    fn remove(&self, fp: u64, loc: u64) {
        let mut g = self.inner.lock();
        if g.lrcu.peek(fp).map(|(&l, _)| l) == Some(loc) {
            g.lrcu.remove(fp);
        }
        g.drop_prefetched(loc);
    }

    fn verify_cached(&self, _fp: u64, block: u64, data: &[u8]) -> Option<bool> {
        let mut g = self.inner.lock();
        let answer = g.prefetch.get(block).map(|c| **c == *data);
        if answer.is_none() {
            g.verify_reads += 1;
        }
        answer
    }

    fn on_verified(&self, fp: u64, loc: u64, block: u64, data: &[u8]) {
        // §3.5.1: a confirmed duplicate's content is kept for the next verification.
        let mut g = self.inner.lock();
        if g.prefetch.capacity() == 0 {
            // No prefetch cache (0, or smaller than one block): the side map must not grow.
            return;
        }
        if let Some(prev) = g.cached_block.insert(loc, block) {
            if prev != block {
                g.prefetch.remove_loc(prev);
            }
        }
        if let Some(evicted) = g.prefetch.insert(fp, block, data.into()) {
            g.cached_block.retain(|_, b| *b != evicted);
        }
    }

    fn locations(&self) -> Vec<u64> {
        let g = self.inner.lock();
        g.lrcu
            .lists()
            .into_iter()
            .flat_map(|(_, keys)| keys)
            .filter_map(|k| g.lrcu.peek(k).map(|(&l, _)| l))
            .collect()
    }

    fn len(&self) -> u64 {
        self.inner.lock().lrcu.len() as u64
    }

    fn memory_bytes(&self) -> u64 {
        let g = self.inner.lock();
        (g.lrcu.heap_bytes() + g.prefetch.memory_bytes()) as u64
    }

    fn budget(&self) -> Option<u64> {
        Some(self.opts.fp_cache_bytes + self.opts.prefetch_bytes)
    }

    fn complete(&self) -> bool {
        false
    }

    fn report(&self) -> Option<serde_json::Value> {
        let g = self.inner.lock();
        let l = g.lrcu.stats();
        let p = g.prefetch.stats();
        Some(serde_json::json!({
            "fp_cache": {
                "budget_bytes": self.opts.fp_cache_bytes,
                "memory_bytes": g.lrcu.heap_bytes(),
                "capacity": g.lrcu.capacity(),
                "entries": g.lrcu.len(),
                "hits": l.hits,
                "misses": l.misses,
                "inserts": l.inserts,
                "evictions": l.evictions,
                "refreshes": l.refreshes,
                "refresh_ms": self.opts.refresh_ms,
                "refresh_ops": self.opts.refresh_ops,
            },
            "prefetch": {
                "budget_bytes": self.opts.prefetch_bytes,
                "memory_bytes": g.prefetch.memory_bytes(),
                "blocks": g.prefetch.len(),
                "hits": p.hits,
                "verify_reads": g.verify_reads,
                "bytes_saved": p.bytes_saved,
            },
        }))
    }

    fn clear(&self) {
        let mut g = self.inner.lock();
        // The counter of medium verifications runs on across a failure recovery.
        let verify_reads = g.verify_reads;
        // The old reservation goes first (the new one is as large). Should the new one be
        // refused even so, the store finds nothing until the next open: a finding aid that
        // misses, never a wrong answer.
        *g = Inner::empty(&self.opts, 0).expect("an empty cache reserves nothing");
        if let Ok(fresh) = Inner::empty(&self.opts, self.opts.fp_cache_bytes) {
            *g = fresh;
        }
        g.verify_reads = verify_reads;
    }
}
