//! Block allocator: persistent free-space tracking with per-thread pools, free, punch hole and aging.
//!
//! The data area is split into equal chunks, one pool per chunk, each with its own bitmap and
//! lock, so two writers that use different pools never wait for each other (they share only
//! the atomic total of free blocks). A writer keeps allocating from
//! "its" pool (next-fit, so the blocks of one write come out contiguous) and moves on to the next
//! pool only when its own is full. Nothing is written to the medium while running (as in NOVA):
//! the bitmap is saved on clean shutdown and reloaded by normal recovery, and failure recovery
//! rebuilds it from the references the caller reports plus the engine's own metadata blocks.

pub mod aging;
pub mod bitmap;
mod give_back;

use crate::{BlockNr, Error, Result};
use bitmap::Bitmap;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Blocks per pool at most; more pools than writers cost nothing but a lock each.
const MAX_POOLS: usize = 16;
/// Pools are never smaller than this (small images get fewer pools).
const MIN_POOL_BLOCKS: u64 = 1024;
/// Blocks per span of the "freed since" marks ([`Allocator::take_freed_runs`]): 2 MiB.
const FREED_SPAN: usize = 512;

/// One pool: a contiguous chunk of the data area.
#[derive(Debug)]
struct Pool {
    /// First block of the chunk.
    base: u64,
    map: Bitmap,
    /// Next-fit cursor (bit index).
    cursor: usize,
    free: u64,
    /// One bit per [`FREED_SPAN`] blocks: a block of the span was freed since the marks were
    /// last taken, so its free runs may hold data the medium's holder still keeps.
    freed: Bitmap,
}

/// Free-space tracking of the data area `[start, start+len)`.
#[derive(Debug)]
pub struct Allocator {
    start: u64,
    len: u64,
    pool_len: u64,
    pools: Vec<Mutex<Pool>>,
    /// Free blocks of all pools, changed with each pool's own count under its lock: every
    /// write asks for it (the space check), and summing sixteen pools meant taking sixteen
    /// locks that the other writers allocate under.
    free: AtomicU64,
    /// Set when blocks may be allocated with nothing holding them (a fingerprint group lost
    /// after an error keeps its blocks, see `policy/smart`); cleared by the rebuild that
    /// frees them ([`Allocator::reset_all_free`]).
    leak_suspected: std::sync::atomic::AtomicBool,
}

impl Allocator {
    /// An allocator with every block of `[start, start+len)` free.
    pub fn new(start: u64, len: u64) -> Allocator {
        let npools = ((len / MIN_POOL_BLOCKS) as usize).clamp(1, MAX_POOLS);
        let pool_len = len.div_ceil(npools as u64).max(1);
        let mut pools = Vec::with_capacity(npools);
        let mut base = start;
        while base < start + len {
            let n = pool_len.min(start + len - base);
            pools.push(Mutex::new(Pool {
                base,
                map: Bitmap::new(n as usize),
                cursor: 0,
                freed: Bitmap::new((n as usize).div_ceil(FREED_SPAN)),
                free: n,
            }));
            base += n;
        }
        Allocator {
            start,
            len,
            pool_len,
            pools,
            free: AtomicU64::new(len),
            leak_suspected: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Say that some blocks may now be allocated with nothing holding them (they stay so
    /// until a failure recovery rebuilds the allocator; the file system runs one when idle).
    pub fn suspect_leak(&self) {
        self.leak_suspected.store(true, Ordering::Release);
    }

    /// Whether [`Allocator::suspect_leak`] was called since the last rebuild.
    pub fn leak_suspected(&self) -> bool {
        self.leak_suspected.load(Ordering::Acquire)
    }

    /// First block managed.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Number of blocks managed.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when no block is managed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of pools (writers map onto them round-robin).
    pub fn npools(&self) -> usize {
        self.pools.len()
    }

    fn pool_of(&self, b: BlockNr) -> Result<usize> {
        if b < self.start || b >= self.start + self.len {
            return Err(Error::Invalid(format!(
                "block {b} outside the data area [{}, {})",
                self.start,
                self.start + self.len
            )));
        }
        Ok(((b - self.start) / self.pool_len) as usize)
    }

    /// Allocate one block, preferring pool `*pool`; on success `*pool` names the pool that had space.
    pub fn alloc(&self, pool: &mut usize) -> Result<BlockNr> {
        let n = self.pools.len();
        for k in 0..n {
            let pi = (*pool + k) % n;
            let mut p = self.pools[pi].lock();
            if p.free == 0 {
                continue;
            }
            let Some(i) = p.map.find_clear_from(p.cursor) else {
                continue;
            };
            p.map.set(i);
            p.cursor = i + 1;
            p.free -= 1;
            self.took(1);
            *pool = pi;
            return Ok(p.base + i as u64);
        }
        Err(Error::NoSpace)
    }

    /// Allocate up to `n` blocks into `out` under as few pool locks as possible (read-ahead of
    /// a writer); fewer than `n` only when the data area is full.
    pub fn alloc_batch(
        &self,
        pool: &mut usize,
        n: usize,
        out: &mut std::collections::VecDeque<BlockNr>,
    ) {
        let np = self.pools.len();
        let mut want = n;
        for k in 0..np {
            if want == 0 {
                return;
            }
            let pi = (*pool + k) % np;
            let mut p = self.pools[pi].lock();
            let before = want;
            while want > 0 && p.free > 0 {
                let Some(i) = p.map.find_clear_from(p.cursor) else {
                    break;
                };
                p.map.set(i);
                p.cursor = i + 1;
                p.free -= 1;
                out.push_back(p.base + i as u64);
                want -= 1;
                *pool = pi;
            }
            self.took((before - want) as u64);
        }
    }

    /// The first `n` free blocks (fewer when fewer are free) in the order an allocator just
    /// opened hands them out from pool 0 on: pool by pool, each from its start.
    pub fn first_free(&self, n: usize) -> Vec<BlockNr> {
        let mut out = Vec::with_capacity(n);
        for p in &self.pools {
            let p = p.lock();
            let mut i = 0;
            while out.len() < n && i < p.map.len() {
                match p.map.find_clear_from(i) {
                    Some(f) if f >= i => {
                        out.push(p.base + f as u64);
                        i = f + 1;
                    }
                    // Wrapped around: no free bit at or after `i`.
                    _ => break,
                }
            }
            if out.len() == n {
                break;
            }
        }
        out
    }

    /// Free one allocated block; freeing a free block is an error (it would hide a double free).
    pub fn free(&self, b: BlockNr) -> Result<()> {
        let pi = self.pool_of(b)?;
        let mut p = self.pools[pi].lock();
        let i = (b - p.base) as usize;
        if !p.map.clear(i) {
            return Err(Error::Invalid(format!("block {b} freed twice")));
        }
        p.mark_freed(i);
        p.free += 1;
        self.gave(1);
        Ok(())
    }

    /// Give back a block just taken by [`Allocator::alloc`] and unused, rewinding the cursor so
    /// the next allocation returns it again (no hole is left behind).
    pub fn unalloc(&self, b: BlockNr) -> Result<()> {
        let pi = self.pool_of(b)?;
        let mut p = self.pools[pi].lock();
        let i = (b - p.base) as usize;
        if !p.map.clear(i) {
            return Err(Error::Invalid(format!("block {b} freed twice")));
        }
        p.mark_freed(i);
        p.free += 1;
        self.gave(1);
        if p.cursor == i + 1 {
            p.cursor = i;
        }
        Ok(())
    }

    /// Punch a hole: free every allocated block of `[start, start+len)` (free ones are skipped).
    pub fn free_range(&self, start: BlockNr, len: u64) -> Result<u64> {
        let mut freed = 0;
        for b in start..start.saturating_add(len) {
            let pi = self.pool_of(b)?;
            let mut p = self.pools[pi].lock();
            let i = (b - p.base) as usize;
            if p.map.clear(i) {
                p.mark_freed(i);
                p.free += 1;
                self.gave(1);
                freed += 1;
            }
        }
        Ok(freed)
    }

    /// Mark a block in use (recovery rebuild); returns false when it already was.
    pub fn mark_used(&self, b: BlockNr) -> Result<bool> {
        let pi = self.pool_of(b)?;
        let mut p = self.pools[pi].lock();
        let i = (b - p.base) as usize;
        if p.map.set(i) {
            return Ok(false);
        }
        p.free -= 1;
        self.took(1);
        Ok(true)
    }

    /// True when `b` is inside the data area and allocated.
    pub fn is_allocated(&self, b: BlockNr) -> bool {
        match self.pool_of(b) {
            Ok(pi) => {
                let p = self.pools[pi].lock();
                p.map.get((b - p.base) as usize)
            }
            Err(_) => false,
        }
    }

    /// Number of free blocks.
    pub fn free_blocks(&self) -> u64 {
        self.free.load(Ordering::Relaxed)
    }

    /// `n` blocks of a pool were taken (under that pool's lock).
    fn took(&self, n: u64) {
        self.free.fetch_sub(n, Ordering::Relaxed);
    }

    /// `n` blocks of a pool were given back (under that pool's lock).
    fn gave(&self, n: u64) {
        self.free.fetch_add(n, Ordering::Relaxed);
    }

    /// A pool's free count is set to `now` wholesale (recovery): the total follows by the
    /// difference, so it never passes through more than the blocks there are.
    fn reset_pool_free(&self, p: &mut Pool, now: u64) {
        if now >= p.free {
            self.gave(now - p.free);
        } else {
            self.took(p.free - now);
        }
        p.free = now;
    }

    /// Free everything (start of a failure-recovery rebuild).
    pub fn reset_all_free(&self) {
        self.leak_suspected.store(false, Ordering::Release);
        for p in &self.pools {
            let mut p = p.lock();
            let n = p.map.len();
            p.map = Bitmap::new(n);
            p.cursor = 0;
            // What the crashed run freed is not known: every span may hold some.
            for c in 0..p.freed.len() {
                p.freed.set(c);
            }
            self.reset_pool_free(&mut p, n as u64);
        }
    }

    /// The allocation bitmap of the whole data area, one bit per block, as words (for the save area).
    pub fn save_words(&self) -> Vec<u64> {
        let mut out = vec![0u64; (self.len as usize).div_ceil(64)];
        for p in &self.pools {
            let p = p.lock();
            for i in 0..p.map.len() {
                if p.map.get(i) {
                    let g = (p.base - self.start) as usize + i;
                    out[g / 64] |= 1 << (g % 64);
                }
            }
        }
        out
    }

    /// A copy of the allocation bitmap of the whole data area (bit `b - start` set when block
    /// `b` is in use): fsck reads it at leisure, after the moment that had to be consistent.
    pub fn snapshot(&self) -> Bitmap {
        Bitmap::from_words(self.len as usize, self.save_words())
            .expect("save_words gives one bit per block")
    }

    /// Reload the bitmap saved by [`Allocator::save_words`].
    pub fn load_words(&self, words: &[u64]) -> Result<()> {
        if words.len() != (self.len as usize).div_ceil(64) {
            return Err(Error::Corrupt("allocator bitmap has the wrong size".into()));
        }
        for p in &self.pools {
            let mut p = p.lock();
            let n = p.map.len();
            let mut map = Bitmap::new(n);
            let mut used = 0u64;
            for i in 0..n {
                let g = (p.base - self.start) as usize + i;
                if words[g / 64] & (1 << (g % 64)) != 0 {
                    map.set(i);
                    used += 1;
                }
            }
            p.map = map;
            p.cursor = 0;
            self.reset_pool_free(&mut p, n as u64 - used);
        }
        Ok(())
    }

    /// Number of words [`Allocator::save_words`] produces.
    pub fn save_len_words(len: u64) -> usize {
        (len as usize).div_ceil(64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_roundtrip_and_pools() {
        let a = Allocator::new(10, 5000);
        assert!(a.npools() >= 2);
        let mut pool = 0;
        let b1 = a.alloc(&mut pool).unwrap();
        let b2 = a.alloc(&mut pool).unwrap();
        assert_eq!((b1, b2), (10, 11));
        let mut pool2 = 1;
        let c = a.alloc(&mut pool2).unwrap();
        assert!(c >= 10 + a.pool_len);
        assert_eq!(a.free_blocks(), 4997);
        a.free(b1).unwrap();
        assert!(a.free(b1).is_err());
        assert!(a.free(9).is_err());
        assert_eq!(a.free_range(10, 100).unwrap(), 1);
        let w = a.save_words();
        let a2 = Allocator::new(10, 5000);
        a2.load_words(&w).unwrap();
        assert_eq!(a2.free_blocks(), a.free_blocks());
        assert!(a2.is_allocated(c));
    }

    #[test]
    fn exhausts_then_no_space() {
        let a = Allocator::new(1, 3000);
        let mut pool = 2;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..3000 {
            assert!(seen.insert(a.alloc(&mut pool).unwrap()));
        }
        assert!(matches!(a.alloc(&mut pool), Err(Error::NoSpace)));
    }

    /// What the pools themselves count (the total is kept beside them).
    fn pools_free(a: &Allocator) -> u64 {
        a.pools.iter().map(|p| p.lock().free).sum()
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(usize),
        Batch(usize, usize),
        Free(usize),
        Unalloc,
        FreeRange(u64, u64),
        MarkUsed(u64),
        Save,
        Reload,
        Reset,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0usize..8).prop_map(Op::Alloc),
            2 => (0usize..8, 0usize..300).prop_map(|(p, n)| Op::Batch(p, n)),
            4 => any::<usize>().prop_map(Op::Free),
            1 => Just(Op::Unalloc),
            1 => (0u64..5000, 0u64..200).prop_map(|(s, n)| Op::FreeRange(s, n)),
            1 => (0u64..5000).prop_map(Op::MarkUsed),
            1 => Just(Op::Save),
            1 => Just(Op::Reload),
            1 => Just(Op::Reset),
        ]
    }

    proptest::proptest! {
        /// The free count every write reads equals the pools' own counts and a model's after
        /// any sequence of allocations, frees, recovery marks, reloads and resets.
        #[test]
        fn free_count_follows_every_change(ops in proptest::collection::vec(op(), 1..120)) {
            const START: u64 = 7;
            const LEN: u64 = 4500;
            let a = Allocator::new(START, LEN);
            let mut used = std::collections::BTreeSet::new();
            let mut saved: Option<(Vec<u64>, std::collections::BTreeSet<u64>)> = None;
            let mut last = None;
            for op in ops {
                match op {
                    Op::Alloc(p) => {
                        let mut pool = p % a.npools();
                        if let Ok(b) = a.alloc(&mut pool) {
                            proptest::prop_assert!(used.insert(b));
                            last = Some(b);
                        }
                    }
                    Op::Batch(p, n) => {
                        let mut pool = p % a.npools();
                        let mut out = std::collections::VecDeque::new();
                        a.alloc_batch(&mut pool, n, &mut out);
                        for b in out {
                            proptest::prop_assert!(used.insert(b));
                        }
                        last = None;
                    }
                    Op::Free(k) => {
                        if let Some(&b) = used.iter().nth(k % used.len().max(1)) {
                            a.free(b).unwrap();
                            used.remove(&b);
                        }
                        last = None;
                    }
                    Op::Unalloc => {
                        if let Some(b) = last.take() {
                            a.unalloc(b).unwrap();
                            used.remove(&b);
                        }
                    }
                    Op::FreeRange(s, n) => {
                        let freed = a.free_range(START + s.min(LEN - 1), n.min(LEN - s.min(LEN - 1))).unwrap();
                        let before = used.len();
                        let lo = START + s.min(LEN - 1);
                        let hi = lo + n.min(LEN - s.min(LEN - 1));
                        used.retain(|&b| b < lo || b >= hi);
                        proptest::prop_assert_eq!(freed as usize, before - used.len());
                        last = None;
                    }
                    Op::MarkUsed(b) => {
                        let b = START + b % LEN;
                        proptest::prop_assert_eq!(a.mark_used(b).unwrap(), used.insert(b));
                        last = None;
                    }
                    Op::Save => saved = Some((a.save_words(), used.clone())),
                    Op::Reload => {
                        // Back to the last saved bitmap (each pool's count changes wholesale),
                        // or to the current one when none was saved.
                        let (words, model) =
                            saved.clone().unwrap_or_else(|| (a.save_words(), used.clone()));
                        a.load_words(&words).unwrap();
                        used = model;
                        last = None;
                    }
                    Op::Reset => {
                        a.reset_all_free();
                        used.clear();
                        last = None;
                    }
                }
                proptest::prop_assert_eq!(a.free_blocks(), pools_free(&a));
                proptest::prop_assert_eq!(a.free_blocks(), LEN - used.len() as u64);
            }
        }
    }

    #[test]
    fn free_count_holds_under_concurrent_writers() {
        let a = Allocator::new(0, 64 * 1024);
        std::thread::scope(|s| {
            for t in 0..4usize {
                let a = &a;
                s.spawn(move || {
                    let mut pool = t;
                    let mut held = Vec::new();
                    for i in 0..20_000 {
                        if i % 3 == 2 {
                            if let Some(b) = held.pop() {
                                a.free(b).unwrap();
                            }
                        } else if let Ok(b) = a.alloc(&mut pool) {
                            held.push(b);
                        }
                        // Never more than what is free: a reader between two pools' changes
                        // sees a count some order of the changes gives.
                        assert!(a.free_blocks() <= a.len());
                    }
                });
            }
        });
        assert_eq!(a.free_blocks(), pools_free(&a));
    }
}
