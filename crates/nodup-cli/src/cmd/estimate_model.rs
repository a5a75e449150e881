//! The numbers behind `nodup estimate`: distinct block contents and an LRU model of a
//! fixed-size fingerprint cache.
//!
//! Every stored block is fed in read order to [`BlockModel::add`]. Besides counting distinct
//! contents it measures each duplicate's LRU stack depth (how many distinct contents were seen
//! since that content last appeared, plus one) with a Fenwick tree over the positions of the
//! last access of every content: a content's mark moves to the newest position at each access,
//! so the marks strictly between its previous and its current position count exactly the
//! distinct contents accessed in between. An LRU cache of C fingerprints finds a duplicate inline
//! iff its depth is at most C, so the histogram of depths gives the hit count of every C at once.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Fingerprint bytes per entry the smart-policy model assumes (a 128-bit content hash, no
/// per-entry overhead): a model constant, not a measured figure.
pub const SMART_ENTRY_BYTES: u64 = 16;

/// Hasher for keys that already are uniform 128-bit hashes: uses their low 64 bits as is.
#[derive(Default)]
pub struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only reached for key types other than u128; fold them in so it stays a valid hasher.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

/// Fenwick tree of 0/1 marks over stream positions 1..=len, grown by doubling.
#[derive(Debug)]
pub struct Fenwick {
    // tree[0] is unused; tree.len() - 1 is a power of two, which makes doubling O(n) (see grow).
    tree: Vec<u32>,
}

impl Fenwick {
    /// A tree able to hold at least `hint` positions before it grows.
    pub fn new(hint: u64) -> Fenwick {
        let n = hint.clamp(1, 1 << 40).next_power_of_two() as usize;
        Fenwick {
            tree: vec![0; n + 1],
        }
    }

    fn len(&self) -> usize {
        self.tree.len() - 1
    }

    /// Double the capacity. With n a power of two, every new node i in (n, 2n) covers only new
    /// (zero) positions, and node 2n covers all of them, i.e. the old total held by node n.
    fn grow(&mut self) {
        let n = self.len();
        let total = self.tree[n];
        self.tree.resize(2 * n + 1, 0);
        self.tree[2 * n] = total;
    }

    /// Add `d` (+1 or -1) at position `i` (1-based), growing as needed.
    pub fn add(&mut self, mut i: usize, d: i32) {
        while i > self.len() {
            self.grow();
        }
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].wrapping_add_signed(d);
            i += i & i.wrapping_neg();
        }
    }

    /// Sum of positions 1..=i.
    pub fn prefix(&self, i: usize) -> u64 {
        let mut i = i.min(self.len());
        let mut s = 0u64;
        while i > 0 {
            s += u64::from(self.tree[i]);
            i &= i - 1;
        }
        s
    }
}

/// Distinct-content counter plus LRU stack-depth histogram of a block stream.
pub struct BlockModel {
    /// Content hash → stream position (1-based) of its latest occurrence.
    last: HashMap<u128, u64, BuildHasherDefault<PreHashed>>,
    marks: Fenwick,
    /// depth_hist[d] = duplicates whose LRU stack depth is d (index 0 unused).
    depth_hist: Vec<u64>,
    blocks: u64,
    duplicates: u64,
}

impl BlockModel {
    /// An empty model; `hint` is the expected number of blocks (only presizes; it grows).
    pub fn new(hint: u64) -> BlockModel {
        BlockModel {
            last: HashMap::default(),
            marks: Fenwick::new(hint),
            depth_hist: Vec::new(),
            blocks: 0,
            duplicates: 0,
        }
    }

    /// Feed the next block's content hash; returns its LRU stack depth if it is a duplicate.
    pub fn add(&mut self, hash: u128) -> Option<u64> {
        self.blocks += 1;
        let t = self.blocks;
        let prev = self.last.insert(hash, t);
        let depth = prev.map(|p| {
            // Distinct contents accessed strictly between p and t, then this content itself.
            let between = self.marks.prefix(t as usize - 1) - self.marks.prefix(p as usize);
            self.marks.add(p as usize, -1);
            between + 1
        });
        self.marks.add(t as usize, 1);
        if let Some(d) = depth {
            self.duplicates += 1;
            let d = d as usize;
            if d >= self.depth_hist.len() {
                self.depth_hist.resize(d + 1, 0);
            }
            self.depth_hist[d] += 1;
        }
        depth
    }

    /// Blocks fed so far.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Distinct contents seen so far.
    pub fn unique(&self) -> u64 {
        self.last.len() as u64
    }

    /// Smallest LRU cache (entries) that finds at least `percent` % of the duplicate blocks
    /// inline; 0 when there are none.
    pub fn min_cache_for(&self, percent: u64) -> u64 {
        // Integer ceiling, so "95 %" of 7 duplicates asks for 7, never for 6.65 rounded down.
        let need = (self.duplicates * percent).div_ceil(100);
        if need == 0 {
            return 0;
        }
        let mut hits = 0u64;
        for (depth, &n) in self.depth_hist.iter().enumerate() {
            hits += n;
            if hits >= need {
                return depth as u64;
            }
        }
        // Unreachable: the histogram sums to `duplicates` >= need.
        self.depth_hist.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Naive LRU stack: depth of each access (None for a first occurrence).
    fn naive_depths(stream: &[u128]) -> Vec<Option<u64>> {
        let mut stack: Vec<u128> = Vec::new(); // most recent first
        stream
            .iter()
            .map(|&x| {
                let pos = stack.iter().position(|&y| y == x);
                if let Some(p) = pos {
                    stack.remove(p);
                }
                stack.insert(0, x);
                pos.map(|p| p as u64 + 1)
            })
            .collect()
    }

    /// Hits of a real LRU cache of `cap` entries (inserting on miss, evicting the oldest).
    fn naive_hits(stream: &[u128], cap: usize) -> u64 {
        let mut cache: Vec<u128> = Vec::new(); // most recent first
        let mut hits = 0;
        for &x in stream {
            if let Some(p) = cache.iter().position(|&y| y == x) {
                hits += 1;
                cache.remove(p);
            } else if cache.len() == cap {
                cache.pop();
            }
            cache.insert(0, x);
        }
        hits
    }

    proptest! {
        #[test]
        fn depths_match_naive_lru(stream in proptest::collection::vec(0u128..40, 0..400),
                                  hint in 0u64..8) {
            // A tiny hint forces several Fenwick doublings on the way.
            let mut m = BlockModel::new(hint);
            let fast: Vec<_> = stream.iter().map(|&x| m.add(x)).collect();
            prop_assert_eq!(&fast, &naive_depths(&stream));
            prop_assert_eq!(m.blocks(), stream.len() as u64);

            let dups = naive_hits(&stream, usize::MAX);
            for pct in [50u64, 95, 100] {
                let c = m.min_cache_for(pct);
                let need = (dups * pct).div_ceil(100);
                if need == 0 {
                    prop_assert_eq!(c, 0);
                    continue;
                }
                prop_assert!(naive_hits(&stream, c as usize) >= need);
                prop_assert!(c == 1 || naive_hits(&stream, c as usize - 1) < need);
            }
        }
    }

    #[test]
    fn fenwick_growth_keeps_sums() {
        let mut f = Fenwick::new(0);
        for i in 1..=5000usize {
            f.add(i, 1);
            if i % 3 == 0 {
                f.add(i - 1, -1);
            }
        }
        let naive = |k: usize| (1..=k).filter(|i| i % 3 != 2 || i + 1 > 5000).count() as u64;
        for k in [0, 1, 2, 1023, 1024, 1025, 4096, 5000] {
            assert_eq!(f.prefix(k), naive(k), "prefix {k}");
        }
    }

    #[test]
    fn no_duplicates_needs_no_cache() {
        let mut m = BlockModel::new(4);
        for x in 0..100u128 {
            assert_eq!(m.add(x), None);
        }
        assert_eq!(m.unique(), 100);
        assert_eq!(m.min_cache_for(95), 0);
    }
}
