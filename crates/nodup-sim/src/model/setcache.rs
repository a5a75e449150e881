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

/// Tags only: which keys are cached, in how many entries.
pub struct SetCache {
    sets: usize,
    tags: Vec<u64>,
    valid: Vec<bool>,
    dirty: Vec<bool>,
    age: Vec<u64>,
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
        let n = sets * WAYS;
        SetCache {
            sets,
            tags: vec![0; n],
            valid: vec![false; n],
            dirty: vec![false; n],
            age: vec![0; n],
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

    /// Look `key` up, installing it on a miss; `write` marks the entry dirty.
    pub fn access(&mut self, key: u64, write: bool) -> Access {
        self.clock += 1;
        let base = (mix(key) % self.sets as u64) as usize * WAYS;
        let mut victim = base;
        for i in base..base + WAYS {
            if self.valid[i] && self.tags[i] == key {
                self.age[i] = self.clock;
                self.dirty[i] |= write;
                return Access {
                    hit: true,
                    evicted_dirty: false,
                };
            }
            if !self.valid[i] {
                if self.valid[victim] {
                    victim = i;
                }
            } else if self.valid[victim] && self.age[i] < self.age[victim] {
                victim = i;
            }
        }
        let evicted_dirty = self.valid[victim] && self.dirty[victim];
        self.tags[victim] = key;
        self.valid[victim] = true;
        self.dirty[victim] = write;
        self.age[victim] = self.clock;
        Access {
            hit: false,
            evicted_dirty,
        }
    }

    /// Drop `key` (its entry no longer exists); no write-back.
    pub fn invalidate(&mut self, key: u64) {
        let base = (mix(key) % self.sets as u64) as usize * WAYS;
        for i in base..base + WAYS {
            if self.valid[i] && self.tags[i] == key {
                self.valid[i] = false;
                self.dirty[i] = false;
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
