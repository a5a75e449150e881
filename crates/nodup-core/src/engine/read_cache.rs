//! The dedup-aware read cache (SmartDedup §3.4, the page-cache index): data blocks cached by
//! physical block number, so reading logical blocks of different files that share a physical
//! block costs one media read. Blocks are immutable while allocated (writes are copy-on-write),
//! so an entry stays right until its block is freed: release invalidates it before the block
//! goes back to the allocator, and failure recovery clears the cache.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::{Error, Result, BLOCK_SIZE};

const NIL: u32 = u32::MAX;

struct Inner {
    map: HashMap<u64, u32>,
    /// Per slot: block, LRU neighbours.
    block: Vec<u64>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    data: Vec<u8>,
}

/// An LRU cache of whole blocks.
pub(crate) struct ReadCache {
    inner: Mutex<Inner>,
    slots: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl Inner {
    fn unlink(&mut self, i: u32) {
        let (p, n) = (self.prev[i as usize], self.next[i as usize]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            self.tail = p;
        }
    }
    fn push_front(&mut self, i: u32) {
        self.prev[i as usize] = NIL;
        self.next[i as usize] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = i;
        } else {
            self.tail = i;
        }
        self.head = i;
    }
}

impl ReadCache {
    /// A cache of at most `bytes` (whole blocks and their bookkeeping; at least one block),
    /// reserved at once; [`Error::NoMemory`] when this machine refuses the reservation.
    pub(crate) fn new(bytes: u64) -> Result<ReadCache> {
        // Per slot: the block, three u32/u64 fields and about two map words.
        let per = BLOCK_SIZE + 8 + 8 + 24;
        let slots = usize::try_from(bytes / per as u64)
            .unwrap_or(usize::MAX)
            .max(1);
        let refused = |e: std::collections::TryReserveError| {
            Error::NoMemory(format!(
                "a read cache of {bytes} bytes ({e}); open with a smaller budget"
            ))
        };
        let mut map = HashMap::new();
        map.try_reserve(slots).map_err(refused)?;
        let (mut block, mut prev, mut next) = (Vec::new(), Vec::new(), Vec::new());
        block.try_reserve_exact(slots).map_err(refused)?;
        prev.try_reserve_exact(slots).map_err(refused)?;
        next.try_reserve_exact(slots).map_err(refused)?;
        let mut data = Vec::new();
        // No overflow: `slots` blocks take less than `bytes`.
        data.try_reserve_exact(slots * BLOCK_SIZE)
            .map_err(refused)?;
        Ok(ReadCache {
            inner: Mutex::new(Inner {
                map,
                block,
                prev,
                next,
                head: NIL,
                tail: NIL,
                data,
            }),
            slots,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// Copy block `b` into `buf` when cached.
    pub(crate) fn get(&self, b: u64, buf: &mut [u8]) -> bool {
        let mut g = self.inner.lock();
        let Some(&i) = g.map.get(&b) else {
            drop(g);
            self.misses.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let o = i as usize * BLOCK_SIZE;
        buf.copy_from_slice(&g.data[o..o + BLOCK_SIZE]);
        g.unlink(i);
        g.push_front(i);
        drop(g);
        self.hits.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Cache block `b` holding `data` (evicting the least recently used one when full).
    pub(crate) fn put(&self, b: u64, data: &[u8]) {
        let mut g = self.inner.lock();
        if g.map.contains_key(&b) {
            return;
        }
        let i = if g.block.len() < self.slots {
            g.block.push(b);
            g.prev.push(NIL);
            g.next.push(NIL);
            g.data.extend_from_slice(data);
            (g.block.len() - 1) as u32
        } else {
            let i = g.tail;
            if i == NIL {
                return;
            }
            g.unlink(i);
            let old = g.block[i as usize];
            g.map.remove(&old);
            g.block[i as usize] = b;
            let o = i as usize * BLOCK_SIZE;
            g.data[o..o + BLOCK_SIZE].copy_from_slice(data);
            i
        };
        g.map.insert(b, i);
        g.push_front(i);
    }

    /// Forget block `b` (it is being freed).
    pub(crate) fn invalidate(&self, b: u64) {
        let mut g = self.inner.lock();
        if let Some(i) = g.map.remove(&b) {
            // The slot stays, at the cold end, holding nothing anyone can find.
            g.unlink(i);
            g.block[i as usize] = u64::MAX;
            let t = g.tail;
            g.prev[i as usize] = t;
            g.next[i as usize] = NIL;
            if t != NIL {
                g.next[t as usize] = i;
            } else {
                g.head = i;
            }
            g.tail = i;
        }
    }

    /// Forget everything.
    pub(crate) fn clear(&self) {
        let mut g = self.inner.lock();
        g.map.clear();
        g.block.clear();
        g.prev.clear();
        g.next.clear();
        g.data.clear();
        g.head = NIL;
        g.tail = NIL;
    }

    /// Reads answered from the cache.
    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Heap bytes reserved.
    pub(crate) fn memory_bytes(&self) -> u64 {
        let g = self.inner.lock();
        (g.data.capacity()
            + g.block.capacity() * 8
            + (g.prev.capacity() + g.next.capacity()) * 4
            + g.map.capacity() * 24) as u64
    }

    /// Figures for `nodup stats`.
    pub(crate) fn report(&self) -> serde_json::Value {
        let hits = self.hits();
        serde_json::json!({
            "slots": self.slots,
            "memory_bytes": self.memory_bytes(),
            "hits": hits,
            "misses": self.misses.load(Ordering::Relaxed),
            "media_bytes_saved": hits * BLOCK_SIZE as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blk(x: u8) -> Vec<u8> {
        vec![x; BLOCK_SIZE]
    }

    #[test]
    fn lru_eviction_and_invalidation() {
        let c = ReadCache::new(2 * (BLOCK_SIZE as u64 + 40)).unwrap();
        let mut buf = blk(0);
        c.put(10, &blk(1));
        c.put(11, &blk(2));
        assert!(c.get(10, &mut buf));
        assert_eq!(buf, blk(1));
        // 11 is now the least recently used: 12 takes its slot.
        c.put(12, &blk(3));
        assert!(!c.get(11, &mut buf));
        assert!(c.get(12, &mut buf) && buf == blk(3));
        c.invalidate(10);
        assert!(!c.get(10, &mut buf));
        // The invalidated slot is reused first.
        c.put(13, &blk(4));
        assert!(c.get(12, &mut buf) && c.get(13, &mut buf) && buf == blk(4));
        assert_eq!(c.hits(), 4);
        c.clear();
        assert!(!c.get(12, &mut buf));
    }
}
