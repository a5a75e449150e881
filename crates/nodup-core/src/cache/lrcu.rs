//! LRCU: FSDedup's fingerprint cache ordered by reference frequency, with refresh (§3.4, §3.5.2).
//!
//! # Structure (Algorithms 1 and 2)
//!
//! Every cached fingerprint is an entry with a frequency (its hotness). Entries of equal frequency
//! form one list, most recently touched at the front; the lists themselves are linked in ascending
//! frequency order, so the paper's `min_frequency` pointer is the first list. Every operation is
//! O(1):
//! - [`Lrcu::get`] (Algorithm 1): a hit moves the entry from list `f` to the front of list `f + 1`
//!   (created next to `f` when missing), deleting list `f` when it empties; a miss changes nothing.
//! - [`Lrcu::put`] (Algorithm 2): a new key, when the cache is full, first evicts the *last* entry
//!   of the minimum-frequency list (the least recently touched among the least frequent), then
//!   enters at the front of list 1. An existing key is bumped as by `get` (and takes the new value).
//! - [`Lrcu::remove`]: forget a key (its block or line was freed); not in the paper, needed because
//!   a cached location must never outlive its content.
//!
//! # Refresh (Algorithm 3)
//!
//! At the end of every `get` hit and every `put` (where the algorithms call `REFRESH()`), the
//! refresh fires when the interval has elapsed since the last refresh (clock = the `now` the caller
//! passes: wall time in the engine, simulated time in the simulator) or when `every_ops` such calls
//! happened since. Each entry then gets `hotness = last/2 + (freq - last)` (integer halving), i.e.
//! the accesses of the epoch just ended plus half the previous hotness, and that becomes both its
//! frequency and its new `last`. Entries that were hot long ago fade towards 0 and are evicted
//! first, which is the paper's answer to "cache solidification". Two points the pseudo-code leaves
//! open are fixed here: the minimum pointer is recomputed from scratch (Algorithm 3 only ever
//! lowers it), and the rebuilt lists take entries from the old lists in descending old frequency,
//! each old list front to back, so among equal new hotness the formerly hotter stay longest.
//! A refresh is O(n) in the entries, as in the paper.

use super::{FastMap, NIL};

/// When the refresh of Algorithm 3 fires (either condition suffices; both `None` = never).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Refresh {
    /// Refresh when `now - last_refresh >= interval` (units of the caller's clock).
    pub interval: Option<u64>,
    /// Refresh after this many refresh points (get hits + puts) since the last refresh.
    pub every_ops: Option<u64>,
}

impl Refresh {
    /// No refresh: the plain LRCU of ESD.
    pub const NEVER: Refresh = Refresh {
        interval: None,
        every_ops: None,
    };
}

/// Counters of one cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LrcuStats {
    /// `get` calls that found the key.
    pub hits: u64,
    /// `get` calls that did not.
    pub misses: u64,
    /// New keys entered by `put`.
    pub inserts: u64,
    /// Entries pushed out by a `put` into a full cache.
    pub evictions: u64,
    /// Entries dropped by `remove`.
    pub removals: u64,
    /// Refreshes performed.
    pub refreshes: u64,
}

struct Entry<V> {
    key: u64,
    value: Option<V>,
    freq: u64,
    last_refreshed: u64,
    bucket: u32,
    prev: u32,
    next: u32,
}

/// One frequency list.
struct Bucket {
    freq: u64,
    head: u32,
    tail: u32,
    len: u32,
    prev: u32,
    next: u32,
}

/// The LRCU cache: fingerprint -> `V`, at most `capacity` entries.
pub struct Lrcu<V> {
    index: FastMap<u64, u32>,
    entries: Vec<Entry<V>>,
    free_entries: Vec<u32>,
    buckets: Vec<Bucket>,
    free_buckets: Vec<u32>,
    /// The minimum-frequency list (the paper's `min_frequency`); NIL when empty.
    first: u32,
    capacity: usize,
    entry_bytes: usize,
    refresh: Refresh,
    last_refresh: Option<u64>,
    ops_since_refresh: u64,
    stats: LrcuStats,
}

impl<V> Lrcu<V> {
    /// A cache of at most `capacity` entries, each accounted as `entry_bytes` by [`Self::memory_bytes`].
    pub fn new(capacity: usize, entry_bytes: usize, refresh: Refresh) -> Self {
        let cap = capacity.min(u32::MAX as usize - 1);
        Lrcu {
            index: FastMap::default(),
            entries: Vec::new(),
            free_entries: Vec::new(),
            buckets: Vec::new(),
            free_buckets: Vec::new(),
            first: NIL,
            capacity: cap,
            entry_bytes,
            refresh,
            last_refresh: None,
            ops_since_refresh: 0,
            stats: LrcuStats::default(),
        }
    }

    /// A cache holding as many `entry_bytes` entries as fit in `budget_bytes` (512 KiB in the paper).
    pub fn with_budget(budget_bytes: usize, entry_bytes: usize, refresh: Refresh) -> Self {
        Self::new(budget_bytes / entry_bytes.max(1), entry_bytes, refresh)
    }

    /// A cache whose whole heap is allocated up front and stays within `budget_bytes` however it
    /// is used (records, index, free lists and, worst case, one frequency list per entry): the
    /// engine's `selective` store, whose memory must not grow with the data. An error when the
    /// system refuses the reservation (a budget beyond this machine), where it would abort.
    pub fn reserved(
        budget_bytes: usize,
        refresh: Refresh,
    ) -> Result<Self, std::collections::TryReserveError> {
        // The largest capacity whose reservation fits (binary search over the exact size).
        let (mut lo, mut hi) = (0usize, budget_bytes / size_of::<Entry<V>>().max(1) + 1);
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            if Self::reserved_bytes(mid) <= budget_bytes {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let cap = lo;
        let mut c = Self::new(cap, Self::reserved_bytes(cap) / cap.max(1), refresh);
        // Twice the keys: a hash map with deleted slots rehashes in place only while it is at
        // most half full, and would otherwise double its table under steady churn.
        c.index.try_reserve(2 * cap)?;
        c.entries.try_reserve_exact(cap)?;
        c.free_entries.try_reserve_exact(cap)?;
        c.buckets.try_reserve_exact(cap + 1)?;
        c.free_buckets.try_reserve_exact(cap + 1)?;
        Ok(c)
    }

    /// Heap bytes [`Lrcu::reserved`] allocates for `cap` entries.
    fn reserved_bytes(cap: usize) -> usize {
        if cap == 0 {
            return 0;
        }
        Self::index_slots(2 * cap) * (size_of::<(u64, u32)>() + 1)
            + cap * (size_of::<Entry<V>>() + size_of::<u32>())
            + (cap + 1) * (size_of::<Bucket>() + size_of::<u32>())
    }

    /// Slots of a hash map sized for `n` keys (seven eighths load, power-of-two table).
    fn index_slots(n: usize) -> usize {
        if n == 0 {
            0
        } else if n < 8 {
            (n + 1).next_power_of_two().max(4)
        } else {
            (n * 8 / 7).next_power_of_two()
        }
    }

    /// Heap bytes allocated now (records, index, lists), whatever the modeled entry size.
    pub fn heap_bytes(&self) -> usize {
        Self::index_slots(self.index.capacity()) * (size_of::<(u64, u32)>() + 1)
            + self.entries.capacity() * size_of::<Entry<V>>()
            + self.free_entries.capacity() * size_of::<u32>()
            + self.buckets.capacity() * size_of::<Bucket>()
            + self.free_buckets.capacity() * size_of::<u32>()
    }

    /// Entries cached now.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Maximum number of entries.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Modeled memory of the cached entries (`len * entry_bytes`), never above the budget.
    pub fn memory_bytes(&self) -> usize {
        self.len() * self.entry_bytes
    }

    /// Counters so far.
    pub fn stats(&self) -> LrcuStats {
        self.stats
    }

    /// The minimum frequency among cached entries (the paper's `min_frequency`).
    pub fn min_frequency(&self) -> Option<u64> {
        (self.first != NIL).then(|| self.buckets[self.first as usize].freq)
    }

    /// Whether `key` is cached, without touching its frequency.
    pub fn contains(&self, key: u64) -> bool {
        self.index.contains_key(&key)
    }

    /// Value and frequency of `key` without touching it.
    pub fn peek(&self, key: u64) -> Option<(&V, u64)> {
        let e = &self.entries[*self.index.get(&key)? as usize];
        Some((e.value.as_ref()?, e.freq))
    }

    /// Algorithm 1: the value of `key`, bumping its frequency; then the refresh check.
    pub fn get(&mut self, key: u64, now: u64) -> Option<&V> {
        let Some(&id) = self.index.get(&key) else {
            self.stats.misses += 1;
            return None;
        };
        self.stats.hits += 1;
        self.bump(id);
        self.refresh_point(now);
        self.entries[id as usize].value.as_ref()
    }

    /// Algorithm 2: cache `key -> value` (a known key is bumped and takes the value); then the
    /// refresh check. Returns the entry evicted to make room, if any.
    pub fn put(&mut self, key: u64, value: V, now: u64) -> Option<(u64, V)> {
        if self.capacity == 0 {
            return None;
        }
        let mut evicted = None;
        if let Some(&id) = self.index.get(&key) {
            self.entries[id as usize].value = Some(value);
            self.bump(id);
        } else {
            if self.index.len() >= self.capacity {
                evicted = self.evict();
            }
            let b = self.bucket_for_one();
            let id = self.alloc_entry(Entry {
                key,
                value: Some(value),
                freq: 1,
                last_refreshed: 0,
                bucket: b,
                prev: NIL,
                next: NIL,
            });
            self.link_front(b, id);
            self.index.insert(key, id);
            self.stats.inserts += 1;
        }
        self.refresh_point(now);
        evicted
    }

    /// Replace the value of a cached `key` without touching its frequency (the content it names
    /// moved); returns the old value, or None when `key` is not cached.
    pub fn update(&mut self, key: u64, value: V) -> Option<V> {
        let id = *self.index.get(&key)?;
        self.entries[id as usize].value.replace(value)
    }

    /// Forget `key` (its content was freed); returns its value.
    pub fn remove(&mut self, key: u64) -> Option<V> {
        let id = self.index.remove(&key)?;
        self.unlink(id);
        self.stats.removals += 1;
        self.free_entries.push(id);
        self.entries[id as usize].value.take()
    }

    /// The frequency lists from the minimum up: `(frequency, keys front to back)`.
    pub fn lists(&self) -> Vec<(u64, Vec<u64>)> {
        let mut out = Vec::new();
        let mut b = self.first;
        while b != NIL {
            let bk = &self.buckets[b as usize];
            let mut keys = Vec::with_capacity(bk.len as usize);
            let mut e = bk.head;
            while e != NIL {
                keys.push(self.entries[e as usize].key);
                e = self.entries[e as usize].next;
            }
            out.push((bk.freq, keys));
            b = bk.next;
        }
        out
    }

    /// Algorithm 3 now, whatever the clock says (tests; `selective`'s explicit trigger).
    pub fn refresh_now(&mut self, now: u64) {
        self.last_refresh = Some(now);
        self.ops_since_refresh = 0;
        self.stats.refreshes += 1;
        // Old lists in descending frequency, each front to back.
        let mut order = Vec::with_capacity(self.index.len());
        let mut groups = Vec::new();
        let mut b = self.first;
        while b != NIL {
            groups.push(b);
            b = self.buckets[b as usize].next;
        }
        for &b in groups.iter().rev() {
            let mut e = self.buckets[b as usize].head;
            while e != NIL {
                order.push(e);
                e = self.entries[e as usize].next;
            }
        }
        self.buckets.clear();
        self.free_buckets.clear();
        self.first = NIL;
        // New hotness per entry; lists rebuilt (appended at the tail to keep the order above).
        let mut by_freq: FastMap<u64, u32> = FastMap::default();
        for &id in &order {
            let e = &mut self.entries[id as usize];
            let hot = e.last_refreshed / 2 + (e.freq - e.last_refreshed);
            e.freq = hot;
            e.last_refreshed = hot;
            let next_bucket = self.buckets.len() as u32;
            let b = *by_freq.entry(hot).or_insert(next_bucket);
            if b == next_bucket {
                self.buckets.push(Bucket {
                    freq: hot,
                    head: NIL,
                    tail: NIL,
                    len: 0,
                    prev: NIL,
                    next: NIL,
                });
            }
            self.link_back(b, id);
        }
        // Link the lists in ascending frequency; the first is the minimum.
        let mut ids: Vec<u32> = (0..self.buckets.len() as u32).collect();
        ids.sort_unstable_by_key(|&b| self.buckets[b as usize].freq);
        for w in ids.windows(2) {
            self.buckets[w[0] as usize].next = w[1];
            self.buckets[w[1] as usize].prev = w[0];
        }
        self.first = ids.first().copied().unwrap_or(NIL);
    }

    /// A `REFRESH()` call site of Algorithms 1 and 2.
    fn refresh_point(&mut self, now: u64) {
        if self.index.is_empty() {
            return;
        }
        let last = *self.last_refresh.get_or_insert(now);
        self.ops_since_refresh += 1;
        let by_time = self
            .refresh
            .interval
            .is_some_and(|i| now.saturating_sub(last) >= i);
        let by_ops = self
            .refresh
            .every_ops
            .is_some_and(|n| self.ops_since_refresh >= n);
        if by_time || by_ops {
            self.refresh_now(now);
        }
    }

    /// Move entry `id` from its list to the front of the next frequency's list.
    fn bump(&mut self, id: u32) {
        let old = self.entries[id as usize].bucket;
        let f = self.buckets[old as usize].freq;
        let nb = self.buckets[old as usize].next;
        let target = if nb != NIL && self.buckets[nb as usize].freq == f + 1 {
            nb
        } else {
            self.new_bucket_after(old, f + 1)
        };
        self.unlink(id);
        self.entries[id as usize].freq = f + 1;
        self.link_front(target, id);
    }

    /// Evict the last entry of the minimum-frequency list.
    fn evict(&mut self) -> Option<(u64, V)> {
        if self.first == NIL {
            return None;
        }
        let id = self.buckets[self.first as usize].tail;
        let key = self.entries[id as usize].key;
        self.index.remove(&key);
        self.unlink(id);
        self.free_entries.push(id);
        self.stats.evictions += 1;
        let v = self.entries[id as usize].value.take()?;
        Some((key, v))
    }

    /// The list of frequency 1, created in ascending position (only frequency 0 can precede it).
    fn bucket_for_one(&mut self) -> u32 {
        let f = self.first;
        if f == NIL || self.buckets[f as usize].freq > 1 {
            return self.new_bucket_after(NIL, 1);
        }
        if self.buckets[f as usize].freq == 1 {
            return f;
        }
        let n = self.buckets[f as usize].next;
        if n != NIL && self.buckets[n as usize].freq == 1 {
            n
        } else {
            self.new_bucket_after(f, 1)
        }
    }

    /// A new empty list of `freq` linked right after `after` (NIL = at the head).
    fn new_bucket_after(&mut self, after: u32, freq: u64) -> u32 {
        let next = if after == NIL {
            self.first
        } else {
            self.buckets[after as usize].next
        };
        let b = Bucket {
            freq,
            head: NIL,
            tail: NIL,
            len: 0,
            prev: after,
            next,
        };
        let id = match self.free_buckets.pop() {
            Some(i) => {
                self.buckets[i as usize] = b;
                i
            }
            None => {
                self.buckets.push(b);
                (self.buckets.len() - 1) as u32
            }
        };
        if next != NIL {
            self.buckets[next as usize].prev = id;
        }
        if after == NIL {
            self.first = id;
        } else {
            self.buckets[after as usize].next = id;
        }
        id
    }

    fn alloc_entry(&mut self, e: Entry<V>) -> u32 {
        match self.free_entries.pop() {
            Some(i) => {
                self.entries[i as usize] = e;
                i
            }
            None => {
                self.entries.push(e);
                (self.entries.len() - 1) as u32
            }
        }
    }

    fn link_front(&mut self, b: u32, id: u32) {
        self.link(b, id, true)
    }

    fn link_back(&mut self, b: u32, id: u32) {
        self.link(b, id, false)
    }

    /// Put entry `id` at the front (most recent) or the back of list `b`.
    fn link(&mut self, b: u32, id: u32, front: bool) {
        let bk = &self.buckets[b as usize];
        let (prev, next) = if front {
            (NIL, bk.head)
        } else {
            (bk.tail, NIL)
        };
        {
            let e = &mut self.entries[id as usize];
            e.bucket = b;
            e.prev = prev;
            e.next = next;
        }
        if next != NIL {
            self.entries[next as usize].prev = id;
        } else {
            self.buckets[b as usize].tail = id;
        }
        if prev != NIL {
            self.entries[prev as usize].next = id;
        } else {
            self.buckets[b as usize].head = id;
        }
        self.buckets[b as usize].len += 1;
    }

    /// Take entry `id` out of its list; an emptied list is deleted (moving the minimum pointer on).
    fn unlink(&mut self, id: u32) {
        let (b, prev, next) = {
            let e = &self.entries[id as usize];
            (e.bucket, e.prev, e.next)
        };
        if prev != NIL {
            self.entries[prev as usize].next = next;
        } else {
            self.buckets[b as usize].head = next;
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        } else {
            self.buckets[b as usize].tail = prev;
        }
        self.buckets[b as usize].len -= 1;
        if self.buckets[b as usize].len == 0 {
            let (bp, bn) = (self.buckets[b as usize].prev, self.buckets[b as usize].next);
            if bp != NIL {
                self.buckets[bp as usize].next = bn;
            } else {
                self.first = bn;
            }
            if bn != NIL {
                self.buckets[bn as usize].prev = bp;
            }
            self.free_buckets.push(b);
        }
    }
}

#[cfg(test)]
#[path = "lrcu_tests.rs"]
mod tests;
