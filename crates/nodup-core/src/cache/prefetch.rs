//! FSDedup's prefetch cache (§3.5.1): content kept after a duplicate was confirmed, so later
//! verifications of hot content need no media read.
//!
//! A similarity fingerprint (ECC, CRC) match is only a candidate; confirming it means reading the
//! stored unit and comparing byte by byte. Content locality makes the confirmed units the ones
//! that will be compared again, so once a candidate is confirmed its content goes into this cache,
//! together with every other content met under the same fingerprint (the paper keeps "all similar
//! data that yield the same ECC", since collisions would otherwise still need reads). Items are
//! grouped by fingerprint: [`PrefetchCache::find`] compares an incoming unit with every cached
//! content of its fingerprint and returns the matching location, which can be another location
//! than the one the fingerprint cache remembers. The paper names no replacement policy; items
//! are evicted least recently used. Sizes come from a byte budget (512 KiB in the paper) divided
//! by the caller's per-item size.

use super::{FastMap, NIL};
use std::hash::Hash;

/// Counters of one prefetch cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefetchStats {
    /// Lookups answered from the cache (a match by [`PrefetchCache::find`] or content by
    /// [`PrefetchCache::get`]), i.e. media reads avoided.
    pub hits: u64,
    /// Lookups the cache could not answer.
    pub misses: u64,
    /// Items entered.
    pub inserts: u64,
    /// Items pushed out to make room.
    pub evictions: u64,
    /// Media bytes not read thanks to hits (`hits * unit_bytes`).
    pub bytes_saved: u64,
}

struct Item<L, C> {
    key: u64,
    loc: L,
    content: C,
    prev: u32,
    next: u32,
}

/// Bounded cache of (fingerprint, location, content) items, least recently used evicted.
pub struct PrefetchCache<L, C> {
    groups: FastMap<u64, Vec<u32>>,
    by_loc: FastMap<L, u32>,
    items: Vec<Option<Item<L, C>>>,
    free: Vec<u32>,
    /// Most recently used item; `lru` is the least.
    mru: u32,
    lru: u32,
    capacity: usize,
    item_bytes: usize,
    unit_bytes: u64,
    stats: PrefetchStats,
}

impl<L: Copy + Eq + Hash, C> PrefetchCache<L, C> {
    /// At most `capacity` items; each accounted as `item_bytes`, each hit saving a read of
    /// `unit_bytes` (64 for a cache line, 4096 for a block).
    pub fn new(capacity: usize, item_bytes: usize, unit_bytes: usize) -> Self {
        PrefetchCache {
            groups: FastMap::default(),
            by_loc: FastMap::default(),
            items: Vec::new(),
            free: Vec::new(),
            mru: NIL,
            lru: NIL,
            capacity: capacity.min(u32::MAX as usize - 1),
            item_bytes,
            unit_bytes: unit_bytes as u64,
            stats: PrefetchStats::default(),
        }
    }

    /// As many `item_bytes` items as fit in `budget_bytes`.
    pub fn with_budget(budget_bytes: usize, item_bytes: usize, unit_bytes: usize) -> Self {
        Self::new(budget_bytes / item_bytes.max(1), item_bytes, unit_bytes)
    }

    /// Items cached now.
    pub fn len(&self) -> usize {
        self.by_loc.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.by_loc.is_empty()
    }

    /// Maximum number of items.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Modeled memory of the cached items (`len * item_bytes`).
    pub fn memory_bytes(&self) -> usize {
        self.len() * self.item_bytes
    }

    /// Counters so far.
    pub fn stats(&self) -> PrefetchStats {
        self.stats
    }

    /// Whether the content stored at `loc` is cached (no counters touched).
    pub fn contains_loc(&self, loc: L) -> bool {
        self.by_loc.contains_key(&loc)
    }

    /// Whether some content of fingerprint `key` is cached (no counters touched).
    pub fn contains_key(&self, key: u64) -> bool {
        self.groups.contains_key(&key)
    }

    /// The location of a cached content of fingerprint `key` that `matches` accepts (compared
    /// in most-recent-first order); a hit refreshes its recency. Counts a hit or a miss.
    pub fn find(&mut self, key: u64, mut matches: impl FnMut(&C) -> bool) -> Option<L> {
        let found = self.groups.get(&key).and_then(|g| {
            g.iter().copied().find(|&id| {
                let it = self.items[id as usize]
                    .as_ref()
                    .expect("grouped item exists");
                matches(&it.content)
            })
        });
        match found {
            Some(id) => {
                self.hit(id);
                Some(self.items[id as usize].as_ref().expect("item").loc)
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// The cached content of `loc` (a verification read answered); counts a hit or a miss.
    pub fn get(&mut self, loc: L) -> Option<&C> {
        match self.by_loc.get(&loc).copied() {
            Some(id) => {
                self.hit(id);
                Some(&self.items[id as usize].as_ref().expect("item").content)
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Cache `content` stored at `loc` under fingerprint `key` (replacing what `loc` held).
    /// Returns the location evicted to make room, if any.
    pub fn insert(&mut self, key: u64, loc: L, content: C) -> Option<L> {
        if self.capacity == 0 {
            return None;
        }
        self.remove_loc(loc);
        let mut evicted = None;
        if self.by_loc.len() >= self.capacity && self.lru != NIL {
            let victim = self.items[self.lru as usize].as_ref().expect("item").loc;
            self.remove_loc(victim);
            self.stats.evictions += 1;
            evicted = Some(victim);
        }
        let it = Item {
            key,
            loc,
            content,
            prev: NIL,
            next: NIL,
        };
        let id = match self.free.pop() {
            Some(i) => {
                self.items[i as usize] = Some(it);
                i
            }
            None => {
                self.items.push(Some(it));
                (self.items.len() - 1) as u32
            }
        };
        self.link_front(id);
        self.groups.entry(key).or_default().insert(0, id);
        self.by_loc.insert(loc, id);
        self.stats.inserts += 1;
        evicted
    }

    /// Drop the item of `loc` (its content was overwritten or freed); true when one was cached.
    pub fn remove_loc(&mut self, loc: L) -> bool {
        let Some(id) = self.by_loc.remove(&loc) else {
            return false;
        };
        self.unlink(id);
        let it = self.items[id as usize].take().expect("item");
        if let Some(g) = self.groups.get_mut(&it.key) {
            g.retain(|&x| x != id);
            if g.is_empty() {
                self.groups.remove(&it.key);
            }
        }
        self.free.push(id);
        true
    }

    fn hit(&mut self, id: u32) {
        self.stats.hits += 1;
        self.stats.bytes_saved += self.unit_bytes;
        self.unlink(id);
        self.link_front(id);
    }

    fn link_front(&mut self, id: u32) {
        let old = self.mru;
        {
            let it = self.items[id as usize].as_mut().expect("item");
            it.prev = NIL;
            it.next = old;
        }
        if old != NIL {
            self.items[old as usize].as_mut().expect("item").prev = id;
        } else {
            self.lru = id;
        }
        self.mru = id;
    }

    fn unlink(&mut self, id: u32) {
        let (p, n) = {
            let it = self.items[id as usize].as_ref().expect("item");
            (it.prev, it.next)
        };
        if p != NIL {
            self.items[p as usize].as_mut().expect("item").next = n;
        } else {
            self.mru = n;
        }
        if n != NIL {
            self.items[n as usize].as_mut().expect("item").prev = p;
        } else {
            self.lru = p;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_verifications_and_finds_collided_contents() {
        let mut p: PrefetchCache<u32, [u8; 4]> = PrefetchCache::new(3, 72, 64);
        assert_eq!(p.find(7, |_| true), None);
        p.insert(7, 100, *b"aaaa");
        // A second content under the same fingerprint (a collision) sits in the same group.
        p.insert(7, 200, *b"bbbb");
        assert_eq!(p.find(7, |c| c == b"aaaa"), Some(100));
        assert_eq!(p.find(7, |c| c == b"bbbb"), Some(200));
        assert_eq!(p.find(7, |c| c == b"cccc"), None);
        assert_eq!(p.get(100), Some(b"aaaa"));
        assert_eq!(p.get(300), None);
        let s = p.stats();
        assert_eq!((s.hits, s.misses, s.bytes_saved), (3, 3, 192));
        assert_eq!(p.memory_bytes(), 2 * 72);
    }

    #[test]
    fn evicts_least_recently_used_and_forgets_freed_locations() {
        let mut p: PrefetchCache<u32, u8> = PrefetchCache::new(2, 72, 64);
        p.insert(1, 10, 1);
        p.insert(2, 20, 2);
        assert_eq!(p.get(10), Some(&1)); // 10 is now the most recent
        assert_eq!(p.insert(3, 30, 3), Some(20));
        assert!(p.contains_loc(10) && p.contains_loc(30) && !p.contains_loc(20));
        assert_eq!(p.find(2, |_| true), None);
        // Location 10 overwritten with other content: the old item goes, the new one is found.
        p.insert(4, 10, 4);
        assert_eq!(p.find(1, |_| true), None);
        assert_eq!(p.find(4, |&c| c == 4), Some(10));
        assert!(p.remove_loc(30));
        assert!(!p.remove_loc(30));
        assert_eq!(p.len(), 1);
        assert_eq!(p.stats().evictions, 1);
        let mut z: PrefetchCache<u32, u8> = PrefetchCache::with_budget(10, 72, 64);
        assert_eq!(z.insert(1, 1, 1), None);
        assert!(z.is_empty());
    }
}
