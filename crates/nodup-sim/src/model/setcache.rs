//! Set-associative on-chip metadata cache (8 ways, LRU within a set) of the AMT and of the
//! fingerprint stores of Dedup_SHA1 and DeWrite: a hit costs an SRAM access, a miss a PCM read,
//! and a dirty entry evicted is written back to PCM in the background.

const WAYS: usize = 8;

/// Outcome of one access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// The key was cached.
    pub hit: bool,
    /// Installing it evicted a dirty entry (a PCM write-back).
    pub evicted_dirty: bool,
}

/// One way: the key and its state (bit 0 valid, bit 1 dirty, the rest the last-use stamp).
#[derive(Clone, Copy, Default)]
struct Way {
    tag: u64,
    state: u64,
}

const VALID: u64 = 1;
const DIRTY: u64 = 2;

/// Tags only: which keys are cached, in how many entries.
pub struct SetCache {
    sets: usize,
    ways: Vec<Way>,
    clock: u64,
    entry_bytes: usize,
}

fn mix(k: u64) -> u64 {
    let z = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z ^ (z >> 29)
}

impl SetCache {
    /// A cache of `budget_bytes / entry_bytes` entries (at least one set).
    pub fn new(budget_bytes: usize, entry_bytes: usize) -> Self {
        let entries = budget_bytes / entry_bytes.max(1);
        let sets = (entries / WAYS).max(1);
        SetCache {
            sets,
            ways: vec![Way::default(); sets * WAYS],
            clock: 0,
            entry_bytes,
        }
    }

    /// Entries the cache holds at most.
    pub fn capacity(&self) -> usize {
        self.sets * WAYS
    }

    /// Modeled size (capacity x entry size).
    pub fn budget_bytes(&self) -> usize {
        self.capacity() * self.entry_bytes
    }

    fn set(&self, key: u64) -> usize {
        (mix(key) % self.sets as u64) as usize * WAYS
    }

    /// Look `key` up, installing it on a miss; `write` marks the entry dirty.
    pub fn access(&mut self, key: u64, write: bool) -> Access {
        self.clock += 4;
        let base = self.set(key);
        let set = &mut self.ways[base..base + WAYS];
        let dirty = if write { DIRTY } else { 0 };
        for w in set.iter_mut() {
            if w.state & VALID != 0 && w.tag == key {
                w.state = self.clock | (w.state & DIRTY) | dirty | VALID;
                return Access {
                    hit: true,
                    evicted_dirty: false,
                };
            }
        }
        // Victim: an invalid way (state 0 sorts first), else the oldest stamp.
        let victim = (0..WAYS).min_by_key(|&i| set[i].state).unwrap_or(0);
        let v = &mut set[victim];
        let evicted_dirty = v.state & (VALID | DIRTY) == VALID | DIRTY;
        *v = Way {
            tag: key,
            state: self.clock | dirty | VALID,
        };
        Access {
            hit: false,
            evicted_dirty,
        }
    }

    /// Drop `key` (its entry no longer exists); no write-back.
    pub fn invalidate(&mut self, key: u64) {
        let base = self.set(key);
        for w in &mut self.ways[base..base + WAYS] {
            if w.state & VALID != 0 && w.tag == key {
                *w = Way::default();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_within_a_set_and_dirty_write_back() {
        // One set of 8 ways.
        let mut c = SetCache::new(8 * 10, 10);
        assert_eq!(c.capacity(), 8);
        for k in 0..8 {
            assert!(!c.access(k, k == 0).hit);
        }
        assert!(c.access(3, false).hit);
        // 0 is the least recently used (and dirty): the ninth key evicts it with a write-back.
        let a = c.access(100, false);
        assert_eq!((a.hit, a.evicted_dirty), (false, true));
        assert!(!c.access(0, false).hit); // evicts 1 (clean)
        assert!(c.access(3, false).hit);
        c.invalidate(3);
        assert!(!c.access(3, false).hit);
    }
}
