//! A plain in-DRAM bitmap (one bit per block) with word-at-a-time searches.

/// Bit `i` set means "in use"; the tail bits past `len` are kept set so searches never return them.
#[derive(Debug, Clone)]
pub struct Bitmap {
    words: Vec<u64>,
    len: usize,
}

impl Bitmap {
    /// A bitmap of `len` clear bits.
    pub fn new(len: usize) -> Bitmap {
        let mut b = Bitmap {
            words: vec![0; len.div_ceil(64)],
            len,
        };
        b.seal_tail();
        b
    }

    /// A bitmap rebuilt from saved words (`len` bits); the tail is resealed.
    pub fn from_words(len: usize, words: Vec<u64>) -> Option<Bitmap> {
        if words.len() != len.div_ceil(64) {
            return None;
        }
        let mut b = Bitmap { words, len };
        b.seal_tail();
        Some(b)
    }

    fn seal_tail(&mut self) {
        let rem = self.len % 64;
        if rem != 0 {
            if let Some(last) = self.words.last_mut() {
                *last |= !0u64 << rem;
            }
        }
    }

    /// Number of bits.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the bitmap holds no bits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The raw words (for saving).
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Value of bit `i`.
    pub fn get(&self, i: usize) -> bool {
        debug_assert!(i < self.len);
        self.words[i / 64] & (1 << (i % 64)) != 0
    }

    /// Set bit `i`; returns its previous value.
    pub fn set(&mut self, i: usize) -> bool {
        debug_assert!(i < self.len);
        let w = &mut self.words[i / 64];
        let old = *w & (1 << (i % 64)) != 0;
        *w |= 1 << (i % 64);
        old
    }

    /// Clear bit `i`; returns its previous value.
    pub fn clear(&mut self, i: usize) -> bool {
        debug_assert!(i < self.len);
        let w = &mut self.words[i / 64];
        let old = *w & (1 << (i % 64)) != 0;
        *w &= !(1 << (i % 64));
        old
    }

    /// First clear bit at or after `from`, wrapping around once.
    pub fn find_clear_from(&self, from: usize) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let from = if from >= self.len { 0 } else { from };
        let nw = self.words.len();
        let start_w = from / 64;
        // First word: ignore bits below `from`.
        let first = self.words[start_w] | ((1u64 << (from % 64)) - 1);
        if first != !0 {
            return Some(start_w * 64 + first.trailing_ones() as usize);
        }
        for k in 1..=nw {
            let wi = (start_w + k) % nw;
            let w = self.words[wi];
            if w != !0 {
                return Some(wi * 64 + w.trailing_ones() as usize);
            }
        }
        None
    }

    /// Number of set bits among the first `len` bits.
    pub fn count_ones(&self) -> usize {
        let total: usize = self.words.iter().map(|w| w.count_ones() as usize).sum();
        total - (self.words.len() * 64 - self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_wraps_and_respects_tail() {
        let mut b = Bitmap::new(70);
        for i in 0..70 {
            assert_eq!(b.find_clear_from(0), Some(i));
            b.set(i);
        }
        assert_eq!(b.find_clear_from(5), None);
        b.clear(3);
        assert_eq!(b.find_clear_from(60), Some(3));
        assert_eq!(b.count_ones(), 69);
    }
}
