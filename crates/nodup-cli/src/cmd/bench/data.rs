//! Benchmark input, generated before any timed region.
//!
//! A [`Stream`] is `n` 4 KiB blocks held in one buffer. Each block is, independently with
//! probability `dup_percent / 100` (seeded), a copy of a uniformly chosen earlier *unique* block
//! of the stream, else a new unique block (the shape of fio's `dedupe_percentage`). Unique blocks
//! come from a counter-seeded splitmix64 generator (about a nanosecond per 8 bytes) and start
//! with their own 64-bit id, so no two are equal.

use nodup_core::BLOCK_SIZE;

/// splitmix64 step (also the benches' seeded RNG).
#[inline]
pub fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fill `block` with the content of unique block `id` of stream `seed`.
pub fn fill_unique(block: &mut [u8], seed: u64, id: u64) {
    let mut st = seed.rotate_left(32) ^ id.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    for (k, w) in block.chunks_exact_mut(8).enumerate() {
        let v = if k == 0 {
            id
        } else if k == 1 {
            seed
        } else {
            splitmix(&mut st)
        };
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// Fisher-Yates shuffle driven by splitmix64 from `seed`.
pub fn shuffle<T>(v: &mut [T], seed: u64) {
    let mut st = seed;
    for i in (1..v.len()).rev() {
        let j = (splitmix(&mut st) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

/// A generated sequence of blocks.
pub struct Stream {
    buf: Vec<u8>,
    nblocks: usize,
    unique: usize,
}

impl Stream {
    /// `nblocks` blocks with about `dup_percent` % duplicates, reproducible from `seed`.
    pub fn generate(nblocks: usize, dup_percent: u32, seed: u64) -> Stream {
        let mut buf = vec![0u8; nblocks * BLOCK_SIZE];
        let mut rng = seed ^ 0xA5A5_5A5A_0F0F_F0F0;
        // Positions (block indices) of the unique blocks written so far.
        let mut uniques: Vec<u32> = Vec::with_capacity(nblocks);
        let threshold = (dup_percent.min(100) as u128 * (1u128 << 64) / 100) as u64;
        for i in 0..nblocks {
            let dup = !uniques.is_empty() && (dup_percent >= 100 || splitmix(&mut rng) < threshold);
            if dup {
                let src = uniques[(splitmix(&mut rng) % uniques.len() as u64) as usize] as usize;
                buf.copy_within(src * BLOCK_SIZE..(src + 1) * BLOCK_SIZE, i * BLOCK_SIZE);
            } else {
                let id = uniques.len() as u64;
                fill_unique(&mut buf[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE], seed, id);
                uniques.push(i as u32);
            }
        }
        Stream {
            buf,
            nblocks,
            unique: uniques.len(),
        }
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.nblocks
    }

    /// Number of distinct blocks.
    pub fn unique(&self) -> usize {
        self.unique
    }

    /// Actual duplicate fraction in percent.
    pub fn dup_percent(&self) -> f64 {
        if self.nblocks == 0 {
            return 0.0;
        }
        100.0 * (self.nblocks - self.unique) as f64 / self.nblocks as f64
    }

    /// Block `i`.
    pub fn block(&self, i: usize) -> &[u8] {
        &self.buf[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]
    }

    /// The write calls: consecutive groups of `per_call` blocks (the last may be shorter).
    pub fn calls(&self, per_call: usize) -> Vec<Vec<&[u8]>> {
        self.buf
            .chunks(per_call * BLOCK_SIZE)
            .map(|c| c.chunks_exact(BLOCK_SIZE).collect())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn duplication_ratio_and_uniqueness() {
        for (d, lo, hi) in [
            (0u32, 0.0, 0.0),
            (50, 47.0, 53.0),
            (75, 72.0, 78.0),
            (100, 99.0, 100.0),
        ] {
            let s = Stream::generate(4000, d, 7);
            let distinct: HashSet<&[u8]> = (0..s.len()).map(|i| s.block(i)).collect();
            assert_eq!(distinct.len(), s.unique(), "d={d}");
            assert!(
                (lo..=hi).contains(&s.dup_percent()),
                "d={d}: {}",
                s.dup_percent()
            );
        }
        let a = Stream::generate(100, 50, 1);
        let b = Stream::generate(100, 50, 1);
        assert!((0..100).all(|i| a.block(i) == b.block(i)));
        let c = Stream::generate(100, 0, 2);
        assert!((0..100).all(|i| a.block(i) != c.block(i)));
        let calls = a.calls(32);
        assert_eq!(calls.len(), 4);
        assert_eq!(calls[3].len(), 4);
        assert_eq!(calls[1][0], a.block(32));
    }
}
