//! Compact open-addressing table: one 8-byte slot per entry, linear probing, backward-shift delete.
//!
//! Slot layout (64 bits): `tag` in the high `64 - loc_bits` bits, the entry number
//! (entry offset / 32) in the low `loc_bits` bits; 0 = empty (entry number 0 is never used
//! because offset 0 is the superblock). The tag is the high part of the mixed fingerprint; the
//! home bucket is computed from the tag alone, so the table can be resized without reading the
//! medium. Tags are filters only: the caller confirms a candidate against the on-media entry.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Smallest table, in slots.
pub const MIN_SLOTS: usize = 16;

/// Where a table's slot array is, readable without the table's lock: writers use it to
/// prefetch the home slot of a fingerprint they will look up next (a stale view only makes the
/// prefetch useless; a prefetch never faults).
#[derive(Debug, Default)]
pub struct View {
    ptr: AtomicUsize,
    len: AtomicUsize,
}

impl View {
    /// Start loading the home slot of `tagbits` (the tag part of a mixed fingerprint).
    #[inline]
    pub fn prefetch(&self, tagbits: u64) {
        let len = self.len.load(Ordering::Relaxed);
        if len == 0 {
            return;
        }
        let addr = self.ptr.load(Ordering::Relaxed) + home_of(tagbits, len) * 8;
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // SAFETY: prefetch is a hint that never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(addr as *const i8) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = addr;
    }
}

/// Home slot of `tagbits` in a table of `len` slots.
#[inline]
fn home_of(tagbits: u64, len: usize) -> usize {
    ((tagbits as u128 * len as u128) >> 64) as usize
}

/// One open-addressing table.
#[derive(Debug)]
pub struct Table {
    slots: Vec<u64>,
    len: usize,
    loc_bits: u32,
    view: Arc<View>,
}

impl Table {
    /// An empty table whose entry numbers need at most `loc_bits` bits.
    pub fn new(loc_bits: u32, cap: usize) -> Table {
        Table::with_view(loc_bits, cap, Arc::new(View::default()))
    }

    /// An empty table that keeps `view` up to date with its slot array.
    pub fn with_view(loc_bits: u32, cap: usize, view: Arc<View>) -> Table {
        let mut t = Table {
            slots: Vec::new(),
            len: 0,
            loc_bits,
            view,
        };
        t.set_slots(vec![0; cap.max(MIN_SLOTS)]);
        t
    }

    /// Replace the slot array, publishing its place to the view; returns the old array.
    fn set_slots(&mut self, slots: Vec<u64>) -> Vec<u64> {
        let old = std::mem::replace(&mut self.slots, slots);
        self.view
            .ptr
            .store(self.slots.as_ptr() as usize, Ordering::Relaxed);
        self.view.len.store(self.slots.len(), Ordering::Relaxed);
        old
    }

    /// Entries stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no entry is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes of the slot array (exact: the vector is allocated at its length).
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<u64>()
    }

    fn tag_mask(&self) -> u64 {
        !((1u64 << self.loc_bits) - 1)
    }

    #[inline]
    fn home(&self, tagbits: u64) -> usize {
        home_of(tagbits, self.slots.len())
    }

    /// Visit every stored entry number whose tag matches `h`, in probe order, until `f` says stop
    /// (returns `Some`).
    #[inline]
    pub fn find<T>(&self, h: u64, mut f: impl FnMut(u64) -> Option<T>) -> Option<T> {
        let tm = self.tag_mask();
        let tagbits = h & tm;
        let n = self.slots.len();
        let mut i = self.home(tagbits);
        loop {
            let s = self.slots[i];
            if s == 0 {
                return None;
            }
            if s & tm == tagbits {
                if let Some(t) = f(s & !tm) {
                    return Some(t);
                }
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
    }

    /// Grow the slot array so `n` entries in total fit without a resize (bulk loads).
    pub fn reserve_total(&mut self, n: usize) {
        // The fill limit is 3/4; aim at 2/3 (12 bytes per entry) so a few inserts after the
        // load do not resize at once.
        let want = (n * 3 / 2 + 1).max(MIN_SLOTS);
        if want > self.slots.len() {
            self.resize(want);
        }
    }

    /// Insert entry number `ent` under hash `h` (duplicates are the caller's business).
    pub fn insert(&mut self, h: u64, ent: u64) {
        debug_assert!(ent != 0 && ent >> self.loc_bits == 0);
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            let newcap = (self.slots.len() * 3 / 2).max(MIN_SLOTS);
            self.resize(newcap);
        }
        let slot = (h & self.tag_mask()) | ent;
        self.put(slot);
        self.len += 1;
    }

    fn put(&mut self, slot: u64) {
        let n = self.slots.len();
        let mut i = self.home(slot & self.tag_mask());
        while self.slots[i] != 0 {
            i += 1;
            if i == n {
                i = 0;
            }
        }
        self.slots[i] = slot;
    }

    fn resize(&mut self, newcap: usize) {
        let old = self.set_slots(vec![0; newcap.max(MIN_SLOTS)]);
        for s in old {
            if s != 0 {
                self.put(s);
            }
        }
    }

    /// Remove the slot holding entry number `ent` under hash `h`; returns whether it was there.
    pub fn remove(&mut self, h: u64, ent: u64) -> bool {
        let tm = self.tag_mask();
        let want = (h & tm) | ent;
        let n = self.slots.len();
        let mut i = self.home(h & tm);
        loop {
            let s = self.slots[i];
            if s == 0 {
                return false;
            }
            if s == want {
                break;
            }
            i = (i + 1) % n;
        }
        // Backward-shift deletion keeps every probe sequence unbroken without tombstones.
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) % n;
            let s = self.slots[j];
            if s == 0 {
                break;
            }
            let home = self.home(s & tm);
            // Move `s` into the hole when its home is not cyclically within (hole, j].
            let dist_home = (j + n - home) % n;
            let dist_hole = (j + n - hole) % n;
            if dist_home >= dist_hole {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = 0;
        self.len -= 1;
        if self.slots.len() > MIN_SLOTS && self.len * 3 < self.slots.len() {
            let newcap = self.slots.len() * 2 / 3;
            self.resize(newcap);
        }
        true
    }

    /// Every stored entry number (for the clean-shutdown save).
    pub fn entries(&self) -> impl Iterator<Item = u64> + '_ {
        let tm = self.tag_mask();
        self.slots.iter().filter(|&&s| s != 0).map(move |s| s & !tm)
    }

    /// Drop everything and shrink to the minimum.
    pub fn clear(&mut self) {
        self.set_slots(vec![0; MIN_SLOTS]);
        self.len = 0;
    }
}
