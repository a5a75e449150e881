//! Words in anonymous mappings, for buffers sized by the medium:
//! - [`LazyWords`]: zeroed atomic words for bitmaps that cover the whole medium but are mostly
//!   zero, where a page is resident only once a bit in it is set. A heap vector would be
//!   cleared word by word when allocated (glibc's `calloc` from a thread's arena clears it), so
//!   it would be resident in full from mount: 32 KiB per GiB of medium for the region bitmap,
//!   on images that may never hold a dedup entry.
//! - [`MappedWords`]: a transient buffer of words read at mount (the save area), given back
//!   to the kernel when dropped; a heap buffer's pages would stay in the opening thread's
//!   malloc arena after it is freed.

use std::sync::atomic::AtomicU64;

/// The words: mapped when the mapping succeeds, else on the heap. The slice is kept as a
/// pointer and a length for either, so reaching a word (the region layout's bitmap, on the
/// write path) is one indexed load, not a match first.
pub(crate) struct LazyWords {
    ptr: *const AtomicU64,
    len: usize,
    /// Owns the words `ptr` points to; never accessed but through `ptr`.
    _backing: Backing,
}

/// What holds a [`LazyWords`]'s words.
enum Backing {
    /// An anonymous mapping (zero until written).
    Mapped(#[allow(dead_code)] memmap2::MmapMut),
    /// The fallback (and the empty case).
    Heap(#[allow(dead_code)] Vec<AtomicU64>),
}

// SAFETY: the words are owned by the value and only accessed as `&[AtomicU64]`, whose
// operations are atomic: sharing and sending it is as safe as for a `Vec<AtomicU64>`.
unsafe impl Send for LazyWords {}
// SAFETY: as above.
unsafe impl Sync for LazyWords {}

const _: () =
    assert!(std::mem::size_of::<AtomicU64>() == 8 && std::mem::align_of::<AtomicU64>() == 8);

impl LazyWords {
    /// `n` zero words.
    pub(crate) fn new(n: usize) -> LazyWords {
        if n > 0 {
            if let Ok(mut map) = memmap2::MmapMut::map_anon(n * 8) {
                let ptr = map.as_mut_ptr().cast::<AtomicU64>().cast_const();
                return LazyWords {
                    ptr,
                    len: n,
                    _backing: Backing::Mapped(map),
                };
            }
        }
        let v: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
        // Moving the vector into the value below does not move its buffer.
        LazyWords {
            ptr: v.as_ptr(),
            len: n,
            _backing: Backing::Heap(v),
        }
    }
}

impl std::ops::Deref for LazyWords {
    type Target = [AtomicU64];

    fn deref(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` points to `len` initialised, 8-aligned words owned by `_backing` (a
        // mapping the kernel zero-filled, or a vector's buffer; dangling but aligned when
        // empty), alive as long as `self`, and written only through these atomics.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// A transient buffer of `len` little-endian words in an anonymous mapping (see the module
/// doc): filled as bytes, then read as words.
pub(crate) struct MappedWords {
    map: memmap2::MmapMut,
    len: usize,
    /// The words were converted to host order (by [`MappedWords::words`]).
    host_order: bool,
}

impl MappedWords {
    /// `len` zero words.
    pub(crate) fn new(len: usize) -> std::io::Result<MappedWords> {
        // A mapping cannot be empty: an empty buffer still maps one word.
        let map = memmap2::MmapMut::map_anon(len.max(1) * 8)?;
        Ok(MappedWords {
            map,
            len,
            host_order: false,
        })
    }

    /// The buffer as bytes, to read into (little-endian words again from here on).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        self.host_order = false;
        &mut self.map[..self.len * 8]
    }

    /// The buffer as bytes (in host order once [`MappedWords::words`] has converted them).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.map[..self.len * 8]
    }

    /// The words, in host order (converted in place from little-endian on the first call
    /// when the host is big-endian; later calls return them as they are).
    pub(crate) fn words(&mut self) -> &[u64] {
        let p = self.map.as_mut_ptr().cast::<u64>();
        // SAFETY: the mapping holds at least `len * 8` bytes, is page-aligned (so 8-aligned),
        // any bit pattern is a valid u64, and the slice borrows `self` mutably, so nothing else
        // touches the bytes while it lives.
        let w = unsafe { std::slice::from_raw_parts_mut(p, self.len) };
        if cfg!(target_endian = "big") && !self.host_order {
            for x in w.iter_mut() {
                *x = u64::from_le(*x);
            }
        }
        self.host_order = true;
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn mapped_words_read_back_little_endian_bytes() {
        for n in [0usize, 1, 1000] {
            let mut m = MappedWords::new(n).unwrap();
            for (i, c) in m.bytes_mut().chunks_exact_mut(8).enumerate() {
                c.copy_from_slice(&(i as u64).wrapping_mul(0x0102_0304_0506_0708).to_le_bytes());
            }
            assert_eq!(m.bytes().len(), n * 8);
            let want: Vec<u64> = (0..n as u64)
                .map(|i| i.wrapping_mul(0x0102_0304_0506_0708))
                .collect();
            assert_eq!(m.words(), &want[..]);
            // A second call returns the same words (no second conversion).
            assert_eq!(m.words(), &want[..]);
        }
    }

    #[test]
    fn words_start_zero_and_keep_what_is_set() {
        for n in [0, 1, 513, 1 << 16] {
            let w = LazyWords::new(n);
            assert_eq!(w.len(), n);
            assert!(w.iter().all(|x| x.load(Ordering::Relaxed) == 0));
            if n > 0 {
                w[n - 1].fetch_or(1 << 63, Ordering::Relaxed);
                w[0].fetch_or(5, Ordering::Relaxed);
                assert_eq!(
                    w[0].load(Ordering::Relaxed),
                    5 | if n == 1 { 1 << 63 } else { 0 }
                );
                assert_eq!(w[n - 1].load(Ordering::Relaxed) >> 63, 1);
            }
        }
    }
}
