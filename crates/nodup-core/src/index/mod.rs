//! The complete DRAM fingerprint index: every live entry's fingerprint → entry location, with
//! exact memory accounting. It is the [`FpStore`] of `light`, `strong` and `weak-verify`.
//!
//! The index is split into shards by the low bits of the mixed fingerprint; each shard is a
//! compact open-addressing [`table::Table`] (8 bytes per slot, load kept between 1/3 and 3/4,
//! grown by 1.5x so it is at least 1/2 full right after a resize) behind its own mutex. The
//! shard mutex only guards the table: the engine's entry lock (`engine/locks.rs`) is what
//! serialises the operations on one fingerprint, and it is always taken first.

pub mod table;

use std::sync::Arc;

use parking_lot::Mutex;
use table::{Table, View};

use crate::store::FpStore;

/// Number of shards (a power of two).
pub const SHARDS: usize = 64;

/// Mix a fingerprint into a well-spread 64-bit hash (a bijection, so equal hashes mean equal fps).
#[inline]
pub fn mix(fp: u64) -> u64 {
    let mut h = fp ^ (fp >> 29);
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 32)
}

/// The sharded fingerprint index.
#[derive(Debug)]
pub struct FpIndex {
    shards: Box<[Mutex<Table>]>,
    /// Each shard's slot-array view, for lock-free prefetching.
    views: Box<[Arc<View>]>,
    loc_bits: u32,
}

impl FpIndex {
    /// An empty index for a medium of `medium_len` bytes (entry offsets are below it).
    pub fn new(medium_len: u64) -> FpIndex {
        let max_ent = (medium_len / 32).max(2);
        let loc_bits = (64 - max_ent.leading_zeros()).clamp(8, 56);
        let views: Box<[Arc<View>]> = (0..SHARDS).map(|_| Arc::new(View::default())).collect();
        let shards = views
            .iter()
            .map(|v| Mutex::new(Table::with_view(loc_bits, table::MIN_SLOTS, v.clone())))
            .collect::<Vec<_>>()
            .into_boxed_slice();
        FpIndex {
            shards,
            views,
            loc_bits,
        }
    }

    /// Bits of an entry number.
    pub fn loc_bits(&self) -> u32 {
        self.loc_bits
    }

    /// Shard number of a mixed fingerprint.
    #[inline]
    fn shard(h: u64) -> usize {
        (h as usize) & (SHARDS - 1)
    }
}

impl FpIndex {
    /// Start loading the slot a lookup of `fp` will read first, without taking its lock (a
    /// writer calls this a block ahead, so the lookup does not wait for DRAM).
    #[inline]
    pub fn prefetch_slot(&self, fp: u64) {
        let h = mix(fp);
        self.views[Self::shard(h)].prefetch(h & !((1u64 << self.loc_bits) - 1));
    }

    /// Offer the candidate locations of `fp` to `f` until it returns a value (inlined into the
    /// write path); on a miss insert `spare`, when given. Returns the value and whether
    /// `spare` was inserted.
    ///
    /// Each candidate is copied out under the shard lock and `f` (which reads the medium)
    /// runs after it is released: a store lock is a leaf, and a lock released between the
    /// entry read and the byte comparison that follows it would hold back the comparison's
    /// loads (its release is a full barrier). Copying is safe because the caller holds `fp`'s
    /// entry lock: no entry of `fp` appears or goes meanwhile, and a candidate of another
    /// fingerprint is told apart by `f` on the entry itself. The probe stops at the first
    /// candidate (nearly always the only one); only when `f` refuses it are the others copied
    /// out, in a second probe. With no candidate at all (new content, the common miss) `spare`
    /// is inserted under the same lock hold.
    #[inline]
    pub fn find_map<T>(
        &self,
        fp: u64,
        spare: Option<u64>,
        mut f: impl FnMut(u64) -> Option<T>,
    ) -> (Option<T>, bool) {
        let h = mix(fp);
        let shard = &self.shards[Self::shard(h)];
        let first = {
            let mut t = shard.lock();
            match t.find(h, Some) {
                Some(ent) => ent,
                None => {
                    return match spare {
                        Some(loc) => {
                            t.insert(h, ent_of(loc));
                            (None, true)
                        }
                        None => (None, false),
                    };
                }
            }
        };
        if let Some(r) = f(loc_of(first)) {
            return (Some(r), false);
        }
        self.find_rest(h, first, spare, f)
    }

    /// The rest of [`FpIndex::find_map`] after its first candidate was refused (another
    /// fingerprint's entry under the same tag, or a stale one): every other candidate, then
    /// the spare.
    #[cold]
    fn find_rest<T>(
        &self,
        h: u64,
        refused: u64,
        spare: Option<u64>,
        mut f: impl FnMut(u64) -> Option<T>,
    ) -> (Option<T>, bool) {
        let shard = &self.shards[Self::shard(h)];
        let mut rest: Vec<u64> = Vec::new();
        shard.lock().find(h, |ent| {
            if ent != refused {
                rest.push(ent);
            }
            None::<()>
        });
        for ent in rest {
            if let Some(r) = f(loc_of(ent)) {
                return (Some(r), false);
            }
        }
        match spare {
            Some(loc) => {
                shard.lock().insert(h, ent_of(loc));
                (None, true)
            }
            None => (None, false),
        }
    }

    /// [`FpStore::insert`].
    #[inline]
    pub fn insert_loc(&self, fp: u64, loc: u64) {
        let h = mix(fp);
        self.shards[Self::shard(h)].lock().insert(h, ent_of(loc));
    }

    /// [`FpStore::remove`].
    #[inline]
    pub fn remove_loc(&self, fp: u64, loc: u64) {
        let h = mix(fp);
        self.shards[Self::shard(h)].lock().remove(h, ent_of(loc));
    }
}

impl FpStore for FpIndex {
    fn prefetch(&self, fp: u64) {
        self.prefetch_slot(fp)
    }

    fn find(&self, fp: u64, check: &mut dyn FnMut(u64) -> bool) -> Option<u64> {
        self.find_map(fp, None, |loc| check(loc).then_some(loc)).0
    }

    fn insert(&self, fp: u64, loc: u64) {
        self.insert_loc(fp, loc)
    }

    fn remove(&self, fp: u64, loc: u64) {
        self.remove_loc(fp, loc)
    }

    /// Group the pairs by shard (a counting sort), so each shard's table is sized once and
    /// filled while it sits in the cache; two threads fill half the shards each.
    fn load(&self, pairs: &[(u64, u64)]) {
        let mut start = vec![0usize; SHARDS + 1];
        for &(fp, _) in pairs {
            start[Self::shard(mix(fp)) + 1] += 1;
        }
        for i in 0..SHARDS {
            self.shards[i].lock().reserve_total(start[i + 1]);
            start[i + 1] += start[i];
        }
        let mut grouped = vec![(0u64, 0u64); pairs.len()];
        let mut at = start.clone();
        for &(fp, loc) in pairs {
            let h = mix(fp);
            let sh = Self::shard(h);
            grouped[at[sh]] = (h, loc);
            at[sh] += 1;
        }
        let fill = |from: usize, to: usize| {
            for i in from..to {
                let mut t = self.shards[i].lock();
                for &(h, loc) in &grouped[start[i]..start[i + 1]] {
                    t.insert(h, ent_of(loc));
                }
            }
        };
        if grouped.len() < 1 << 16 {
            fill(0, SHARDS);
        } else {
            std::thread::scope(|sc| {
                sc.spawn(|| fill(SHARDS / 2, SHARDS));
                fill(0, SHARDS / 2);
            });
        }
    }

    fn locations(&self) -> Vec<u64> {
        let mut v = Vec::new();
        for s in self.shards.iter() {
            v.extend(s.lock().entries().map(loc_of));
        }
        v
    }

    fn len(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().len() as u64).sum()
    }

    /// Exact heap bytes: the shard array plus every slot array.
    fn memory_bytes(&self) -> u64 {
        // Views: the pointer array plus each Arc's allocation (two counters and the view).
        let mut b = std::mem::size_of_val(&*self.shards)
            + self.views.len()
                * (std::mem::size_of::<Arc<View>>() + 16 + std::mem::size_of::<View>());
        for s in self.shards.iter() {
            b += s.lock().heap_bytes();
        }
        b as u64
    }

    fn clear(&self) {
        for s in self.shards.iter() {
            s.lock().clear();
        }
    }
}

/// Heap bytes [`FpIndex::memory_bytes`] reports, on average, after `entries` distinct random
/// fingerprints were inserted one by one into a fresh index.
pub fn memory_for(entries: u64) -> u64 {
    // The slot count a shard ends with depends only on how many entries it got, because a table
    // grows through the fixed sequence MIN_SLOTS, x1.5, x1.5, ... (see `Table::insert`): it is
    // the first size of that sequence whose 3/4 fill limit holds them all.
    fn slots_for(len: u64) -> u64 {
        let mut slots = table::MIN_SLOTS as u64;
        while len * 4 > slots * 3 {
            slots = (slots * 3 / 2).max(table::MIN_SLOTS as u64);
        }
        slots
    }
    // Per-shard counts are binomial around entries / SHARDS: near a growth step some shards end
    // a size larger than others, so the shards are modelled at the quantiles of that spread
    // (normal approximation) rather than all at the mean.
    let shards = SHARDS as f64;
    let mean = entries as f64 / shards;
    let sd = (entries as f64 * (1.0 / shards) * (1.0 - 1.0 / shards)).sqrt();
    let slot_bytes = std::mem::size_of::<u64>() as u64;
    let tables: u64 = (0..SHARDS)
        .map(|k| {
            let z = normal_quantile((k as f64 + 0.5) / shards);
            let n = (mean + sd * z).round().max(0.0) as u64;
            slots_for(n) * slot_bytes
        })
        .sum();
    // Fixed part, as `memory_bytes` counts it: the shard array and the views (pointer plus the
    // Arc allocation: two counters and the view).
    let fixed = SHARDS * std::mem::size_of::<Mutex<Table>>()
        + SHARDS * (std::mem::size_of::<Arc<View>>() + 16 + std::mem::size_of::<View>());
    fixed as u64 + tables
}

/// The standard normal quantile (Abramowitz and Stegun 26.2.23, error below 5e-4).
fn normal_quantile(p: f64) -> f64 {
    let q = if p < 0.5 { p } else { 1.0 - p };
    let t = (-2.0 * q.ln()).sqrt();
    let z = t
        - (2.515517 + 0.802853 * t + 0.010328 * t * t)
            / (1.0 + 1.432788 * t + 0.189269 * t * t + 0.001308 * t * t * t);
    if p < 0.5 {
        -z
    } else {
        z
    }
}

/// Entry number stored in a slot for the entry at byte offset `loc`.
#[inline]
pub fn ent_of(loc: u64) -> u64 {
    loc >> 5
}

/// Byte offset of entry number `ent`.
#[inline]
pub fn loc_of(ent: u64) -> u64 {
    ent << 5
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn find(t: &Table, fp: u64, model: &HashMap<u64, u64>) -> Option<u64> {
        // The model plays the medium: a candidate is confirmed when its entry holds `fp`.
        t.find(mix(fp), |ent| {
            let loc = loc_of(ent);
            (model.get(&fp) == Some(&loc)).then_some(loc)
        })
    }

    proptest! {
        #[test]
        fn table_matches_hashmap(ops in proptest::collection::vec((0u8..3, 0u64..300), 1..600)) {
            let mut t = Table::new(20, 16);
            let mut model: HashMap<u64, u64> = HashMap::new();
            let mut next = 1u64;
            for (op, key) in ops {
                let fp = key.wrapping_mul(0x1234_5678_9abc_def1);
                match op {
                    0 if !model.contains_key(&fp) => {
                        let loc = loc_of(next);
                        next += 1;
                        t.insert(mix(fp), ent_of(loc));
                        model.insert(fp, loc);
                    }
                    1 => {
                        if let Some(loc) = model.remove(&fp) {
                            prop_assert!(t.remove(mix(fp), ent_of(loc)));
                        }
                    }
                    _ => {}
                }
                prop_assert_eq!(t.len(), model.len());
                for (&k, &v) in &model {
                    prop_assert_eq!(find(&t, k, &model), Some(v));
                }
                prop_assert_eq!(find(&t, fp, &model), model.get(&fp).copied());
            }
        }
    }

    /// A fresh index filled with `n` pseudo-random distinct fingerprints.
    fn filled(n: u64) -> FpIndex {
        let idx = FpIndex::new(64 << 30);
        let mut x = 0x0123_4567_89ab_cdefu64;
        for i in 1..=n {
            // SplitMix64: a bijection of the counter, so every fingerprint is distinct.
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            let fp = z ^ (z >> 31);
            idx.insert(fp, loc_of(i));
        }
        idx
    }

    #[test]
    fn find_map_offers_every_candidate_and_inserts_the_spare_on_a_miss() {
        let idx = FpIndex::new(64 << 20);
        let fp = 0xABCD_u64;
        // Six entries under one fingerprint (a damaged index or colliding test fingerprints):
        // the first offered is refused, so the others come from the second probe.
        for k in 1..=6 {
            idx.insert_loc(fp, loc_of(k));
        }
        let mut seen = Vec::new();
        let (hit, ins) = idx.find_map(fp, None, |loc| {
            seen.push(loc);
            (loc == loc_of(6)).then_some(loc)
        });
        assert_eq!((hit, ins), (Some(loc_of(6)), false));
        assert_eq!(seen.len(), 6);
        // Every candidate refused: the spare goes in, after the candidates were looked at.
        let (hit, ins) = idx.find_map(fp, Some(loc_of(7)), |_| None::<u64>);
        assert_eq!((hit, ins), (None, true));
        assert_eq!(idx.len(), 7);
        // No candidate at all: inserted under the same lock hold.
        let (hit, ins) = idx.find_map(0x1234, Some(loc_of(8)), |_| None::<u64>);
        assert_eq!((hit, ins), (None, true));
        assert_eq!(idx.find_map(0x1234, None, Some).0, Some(loc_of(8)));
    }

    #[test]
    fn memory_for_matches_a_filled_index() {
        assert_eq!(memory_for(0), FpIndex::new(64 << 30).memory_bytes());
        // Inside growth steps and at them (44k, 100k, 221k, 500k put shards on either side of a
        // step), where a model of evenly spread shards was off by up to 18 %.
        for n in [
            44_000u64, 50_000, 100_000, 200_000, 221_000, 500_000, 1_000_000,
        ] {
            let real = filled(n).memory_bytes() as f64;
            let model = memory_for(n) as f64;
            let err = (model - real).abs() / real;
            assert!(err <= 0.05, "n={n}: model {model} real {real} ({err:.4})");
        }
    }

    #[test]
    fn memory_stays_under_16_bytes_per_entry() {
        let idx = FpIndex::new(64 << 30);
        let n = 200_000u64;
        for i in 1..=n {
            let fp = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            idx.insert(fp, loc_of(i));
        }
        assert_eq!(idx.len(), n);
        let per = idx.memory_bytes() as f64 / n as f64;
        assert!(per <= 16.0, "{per} bytes per entry");
        assert!(per >= 8.0);
    }
}
