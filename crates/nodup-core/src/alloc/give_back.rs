//! Giving free space back to what holds the image: the runs of free blocks a clean shutdown
//! punches out of the image file (those of the 2 MiB spans where something was freed since
//! the open), and those an on-demand trim (`fstrim`) gives back while the engine runs.
//!
//! Every block freed here is free in the durable image too: the engine frees a block only once
//! nothing durable names it (the same rule that lets the allocator hand it out again at once),
//! so a crash after a trim recovers without it.

use super::{Allocator, Pool, FREED_SPAN};
use crate::{BlockNr, Result};

/// Blocks whose runs [`Allocator::trim`] gives back under one hold of their pool's lock
/// (128 MiB, as an ext4 block group), stretched to the end of a run that crosses its end:
/// writers of that pool wait for about this much at a time.
const TRIM_WINDOW: usize = 64 * FREED_SPAN;

impl Pool {
    /// Block `i` of the pool was freed.
    pub(super) fn mark_freed(&mut self, i: usize) {
        self.freed.set(i / FREED_SPAN);
    }

    /// Call `f` for every run of free blocks among bits `[from, to)`, in order.
    fn runs_in(&self, from: usize, to: usize, f: &mut dyn FnMut(BlockNr, u64)) {
        let words = self.map.words();
        let mut run: Option<usize> = None;
        let mut i = from;
        while i < to {
            let w = words[i / 64];
            // Whole words at once where they are all used or all free.
            let (free, step) = if i.is_multiple_of(64) && i + 64 <= to && (w == u64::MAX || w == 0)
            {
                (w == 0, 64)
            } else {
                (w & (1 << (i % 64)) == 0, 1)
            };
            match (free, run) {
                (true, None) => run = Some(i),
                (false, Some(s)) => {
                    f(self.base + s as u64, (i - s) as u64);
                    run = None;
                }
                _ => {}
            }
            i += step;
        }
        if let Some(s) = run {
            f(self.base + s as u64, (to - s) as u64);
        }
    }
}

impl Allocator {
    /// Call `f(start, len)` for every run of free blocks, in address order (runs do not span
    /// pools): the tests' view of what [`Allocator::take_freed_runs`] lists span by span.
    #[cfg(test)]
    fn free_runs(&self, f: &mut dyn FnMut(BlockNr, u64)) {
        for p in &self.pools {
            let p = p.lock();
            p.runs_in(0, p.map.len(), f);
        }
    }

    /// Call `f(start, len)` for every run of free blocks, in address order (runs do not span
    /// pools), in the 2 MiB spans where a block was freed since the last call (or since a
    /// failure-recovery rebuild, which marks every span; a clean open marks none), and clear
    /// the marks: what a clean shutdown gives back to the medium's holder, without asking
    /// again for the runs given back before. Each pool is read under its lock.
    pub fn take_freed_runs(&self, f: &mut dyn FnMut(BlockNr, u64)) {
        for p in &self.pools {
            let mut p = p.lock();
            let (len, spans) = (p.map.len(), p.freed.len());
            let mut c = 0;
            while c < spans {
                if !p.freed.get(c) {
                    c += 1;
                    continue;
                }
                // Marked spans side by side make one range, so a run across them is one.
                let first = c;
                while c < spans && p.freed.get(c) {
                    p.freed.clear(c);
                    c += 1;
                }
                p.runs_in(first * FREED_SPAN, (c * FREED_SPAN).min(len), f);
            }
        }
    }

    /// Allocate up to `n` free blocks of the spans where a block was freed since the open
    /// (those most likely to still hold their space where the image lives: free blocks are
    /// given back at a shutdown or a trim), in address order, each one `take` accepts; at
    /// most `tries` blocks are offered.
    pub fn alloc_freed(
        &self,
        n: usize,
        mut tries: usize,
        take: &mut dyn FnMut(BlockNr) -> bool,
    ) -> Vec<BlockNr> {
        let mut out = Vec::new();
        for p in &self.pools {
            let mut p = p.lock();
            let len = p.map.len();
            for c in 0..p.freed.len() {
                if !p.freed.get(c) {
                    continue;
                }
                for i in c * FREED_SPAN..((c + 1) * FREED_SPAN).min(len) {
                    if out.len() == n || tries == 0 {
                        return out;
                    }
                    if p.map.get(i) {
                        continue;
                    }
                    tries -= 1;
                    let b = p.base + i as u64;
                    if take(b) {
                        p.map.set(i);
                        p.free -= 1;
                        self.took(1);
                        out.push(b);
                    }
                }
            }
        }
        out
    }

    /// Call `give(start, n)` for every run of at least `min` free blocks inside `[from, to)`,
    /// in address order, with the run's pool locked across the call so that none of its
    /// blocks can be allocated (and written) while it is given back; runs are cut at pool
    /// ends (and at the range's). Stops at the first error or `Ok(false)` (the holder
    /// cannot), which it returns. With `min <= 1`, the freed-since marks of the spans given
    /// back whole are cleared, so a shutdown does not give them back again. A `min` longer
    /// than a pool is invalid: no run could reach it.
    pub fn trim(
        &self,
        from: BlockNr,
        to: BlockNr,
        min: u64,
        give: &mut dyn FnMut(BlockNr, u64) -> Result<bool>,
    ) -> Result<bool> {
        if min > self.pool_len {
            return Err(crate::Error::Invalid(format!(
                "no free run can be {min} blocks long: the allocator's pools have {}",
                self.pool_len
            )));
        }
        for p in &self.pools {
            let (base, len) = {
                let g = p.lock();
                (g.base, g.map.len())
            };
            let lo = from.max(base);
            let hi = to.min(base + len as u64);
            if lo >= hi {
                continue;
            }
            let (mut i, end) = ((lo - base) as usize, (hi - base) as usize);
            while i < end {
                let mut g = p.lock();
                // The window ends at a span's end with no run across it: a run is given back
                // whole (so `min` sees it whole), and a span's mark is cleared by the one
                // window that gave back all of it.
                let mut w_end = ((i / TRIM_WINDOW + 1) * TRIM_WINDOW).min(end);
                while w_end < end && !g.map.get(w_end - 1) && !g.map.get(w_end) {
                    w_end = (w_end + 1).next_multiple_of(FREED_SPAN).min(end);
                }
                let mut res = Ok(true);
                g.runs_in(i, w_end, &mut |s, n| {
                    if n >= min && matches!(res, Ok(true)) {
                        res = give(s, n);
                    }
                });
                if !matches!(res, Ok(true)) {
                    return res;
                }
                if min <= 1 {
                    for c in i.div_ceil(FREED_SPAN)..w_end.div_ceil(FREED_SPAN) {
                        if ((c + 1) * FREED_SPAN).min(len) <= w_end {
                            g.freed.clear(c);
                        }
                    }
                }
                drop(g);
                i = w_end;
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The runs cover exactly the free blocks (against a set of the used ones), in
        /// address order, none empty, and a run ends only at a used block or a pool's end.
        #[test]
        fn free_runs_are_the_free_blocks(
            len in 1u64..9000,
            ops in proptest::collection::vec((proptest::bool::ANY, 0u64..9000), 0..400),
        ) {
            let a = Allocator::new(7, len);
            let mut used = std::collections::BTreeSet::new();
            let mut pool = 0;
            for (take, b) in ops {
                if take {
                    if let Ok(x) = a.alloc(&mut pool) {
                        used.insert(x);
                    }
                } else if let Some(&x) = used.range(7 + b % len..).next() {
                    a.free(x).unwrap();
                    used.remove(&x);
                }
            }
            let pool_ends: std::collections::BTreeSet<u64> =
                (1..=a.npools() as u64).map(|k| (7 + k * a.pool_len).min(7 + len)).collect();
            let mut next = 7;
            let mut free = 0;
            a.free_runs(&mut |s, n| {
                assert!(n > 0 && s >= next, "run {s}+{n} after {next}");
                for b in next..s {
                    assert!(used.contains(&b), "free block {b} left out");
                }
                for b in s..s + n {
                    assert!(!used.contains(&b), "used block {b} in a run");
                }
                let end = s + n;
                assert!(used.contains(&end) || pool_ends.contains(&end), "run {s}+{n} stops early");
                free += n;
                next = end;
            });
            for b in next..7 + len {
                assert!(used.contains(&b), "free block {b} left out");
            }
            proptest::prop_assert_eq!(free, a.free_blocks());
        }
    }

    /// Only the spans where something was freed since the last take are listed, once; a
    /// failure-recovery rebuild marks them all; a clean reload marks none.
    #[test]
    fn freed_runs_are_the_spans_freed_since() {
        let a = Allocator::new(3, 1000);
        let mut pool = 0;
        let got: Vec<u64> = (0..1000).map(|_| a.alloc(&mut pool).unwrap()).collect();
        let runs = |a: &Allocator| {
            let mut v = Vec::new();
            a.take_freed_runs(&mut |s, n| v.push((s, n)));
            v
        };
        assert_eq!(runs(&a), vec![]);
        // Span 0 is blocks 3..515, span 1 is 515..1003; a run across both comes as one.
        for &b in &got[10..20] {
            a.free(b).unwrap();
        }
        for &b in &got[505..530] {
            a.free(b).unwrap();
        }
        assert_eq!(runs(&a), vec![(13, 10), (508, 25)]);
        assert_eq!(runs(&a), vec![], "listed once");
        // A span is listed whole again: its earlier runs too, but not those of span 1.
        a.free(got[100]).unwrap();
        assert_eq!(runs(&a), vec![(13, 10), (103, 1), (508, 7)]);
        let w = a.save_words();
        a.reset_all_free();
        assert_eq!(runs(&a), vec![(3, 1000)]);
        a.load_words(&w).unwrap();
        assert_eq!(runs(&a), vec![]);
    }

    /// Blocks freed since the open are offered in address order, span by span, only those
    /// `take` accepts are allocated, and no more than `tries` are offered; `first_free` lists
    /// what a reloaded allocator hands out first.
    #[test]
    fn alloc_freed_offers_the_free_blocks_of_the_spans_freed_since() {
        let a = Allocator::new(3, 2000);
        let mut pool = 0;
        let got: Vec<u64> = (0..2000).map(|_| a.alloc(&mut pool).unwrap()).collect();
        assert!(
            a.alloc_freed(4, 100, &mut |_| true).is_empty(),
            "nothing freed"
        );
        for &b in got[600..610].iter().chain(&got[1500..1503]) {
            a.free(b).unwrap();
        }
        let mut offered = Vec::new();
        let v = a.alloc_freed(5, 100, &mut |b| {
            offered.push(b);
            b % 2 == 0
        });
        assert_eq!(v, vec![604, 606, 608, 610, 612]);
        assert_eq!(offered, (603..=612).collect::<Vec<_>>());
        assert_eq!(a.free_blocks(), 8);
        assert_eq!(a.alloc_freed(5, 2, &mut |_| true), vec![603, 605], "tries");
        assert_eq!(a.alloc_freed(9, 100, &mut |_| true).len(), 6);
        assert_eq!(a.free_blocks(), 0);
        for &b in &[got[7], got[1999], got[3]] {
            a.free(b).unwrap();
        }
        let w = a.save_words();
        a.load_words(&w).unwrap();
        assert_eq!(a.first_free(2), vec![6, 10]);
        assert_eq!(a.first_free(9), vec![6, 10, 2002]);
        assert_eq!(a.alloc(&mut 0).unwrap(), 6, "the first one handed out");
    }

    /// The runs of a trim: the free blocks of the range, runs of at least `min` only, cut at
    /// the range's ends and pool ends (not at window ends); the marks of spans given back
    /// whole are cleared.
    #[test]
    fn trim_gives_the_free_runs_of_the_range() {
        // Pools longer than a window (which takes 16 of them).
        let n = 17 * TRIM_WINDOW as u64;
        let a = Allocator::new(5, n);
        let pl = a.pool_len;
        assert!(pl > TRIM_WINDOW as u64 + 4);
        let mut pool = 0;
        let got: Vec<u64> = (0..n).map(|_| a.alloc(&mut pool).unwrap()).collect();
        let trim = |a: &Allocator, from: u64, to: u64, min: u64| {
            let mut v = Vec::new();
            let r = a.trim(from, to, min, &mut |s, n| {
                v.push((s, n));
                Ok(true)
            });
            assert!(r.unwrap());
            v
        };
        for &b in &got[10..20] {
            a.free(b).unwrap();
        }
        a.free(got[100]).unwrap();
        // One run across the first window's end, one across the first pool's, one at the
        // end of the area.
        let w = TRIM_WINDOW as u64;
        for &b in &got[(w - 3) as usize..(w + 4) as usize] {
            a.free(b).unwrap();
        }
        for &b in &got[(pl - 2) as usize..(pl + 2) as usize] {
            a.free(b).unwrap();
        }
        for &b in &got[(n - 2) as usize..] {
            a.free(b).unwrap();
        }
        let all = trim(&a, 0, u64::MAX, 1);
        assert_eq!(
            all,
            vec![
                (15, 10),
                (105, 1),
                (5 + w - 3, 7),
                (5 + pl - 2, 2),
                (5 + pl, 2),
                (5 + n - 2, 2)
            ]
        );
        assert_eq!(
            trim(&a, 0, u64::MAX, 1),
            all,
            "a trim lists all free runs every time"
        );
        assert_eq!(
            trim(&a, 18, 106, 1),
            vec![(18, 7), (105, 1)],
            "clipped to the range"
        );
        assert_eq!(trim(&a, 0, u64::MAX, 4), vec![(15, 10), (5 + w - 3, 7)]);
        assert!(a.trim(0, u64::MAX, pl + 1, &mut |_, _| Ok(true)).is_err());
        // Every span was given back whole by the first trim: a shutdown gives back nothing.
        let mut left = Vec::new();
        a.take_freed_runs(&mut |s, n| left.push((s, n)));
        assert_eq!(left, vec![]);
        // A span given back in part, or runs skipped for `min`, keeps its mark.
        a.free(got[200]).unwrap();
        a.free(got[300]).unwrap();
        trim(&a, 0, 5 + 250, 1);
        trim(&a, 0, u64::MAX, 2);
        a.take_freed_runs(&mut |s, n| left.push((s, n)));
        assert_eq!(left, vec![(15, 10), (105, 1), (205, 1), (305, 1)]);
        // The first refusal or error ends the trim and is returned.
        let mut calls = 0;
        let r = a.trim(0, u64::MAX, 1, &mut |_, _| {
            calls += 1;
            Ok(calls < 2)
        });
        assert!(!r.unwrap());
        assert_eq!(calls, 2);
        let r = a.trim(0, u64::MAX, 1, &mut |_, _| Err(crate::Error::NoSpace));
        assert!(r.is_err());
    }

    /// While a run is given back, no block of it is handed out: a writer allocating all the
    /// time never gets a block that a trim is giving back at that moment.
    #[test]
    fn trim_holds_its_runs_against_allocation() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let a = Arc::new(Allocator::new(1, 4096));
        let mut pool = 0;
        let got: Vec<u64> = (0..4096).map(|_| a.alloc(&mut pool).unwrap()).collect();
        for &b in got.iter().step_by(2) {
            a.free(b).unwrap();
        }
        // The run being given back, as (start, len); len 0 when none is.
        let giving = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (a, giving, stop) = (a.clone(), giving.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut pool = 0;
                let mut clashes = 0;
                while !stop.load(Ordering::SeqCst) {
                    let Ok(b) = a.alloc(&mut pool) else { break };
                    let (s, n) = (
                        giving.0.load(Ordering::SeqCst),
                        giving.1.load(Ordering::SeqCst),
                    );
                    if b >= s && b < s + n {
                        clashes += 1;
                    }
                    a.free(b).unwrap();
                }
                clashes
            })
        };
        for _ in 0..20 {
            a.trim(0, u64::MAX, 1, &mut |s, n| {
                giving.0.store(s, Ordering::SeqCst);
                giving.1.store(n, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_micros(50));
                giving.1.store(0, Ordering::SeqCst);
                Ok(true)
            })
            .unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        assert_eq!(
            writer.join().unwrap(),
            0,
            "blocks handed out while given back"
        );
    }
}
