//! LRCU against hand-computed sequences of Algorithms 1-3 and against a naive model (proptest).

use super::*;
use proptest::prelude::*;

const A: u64 = 0xA;
const B: u64 = 0xB;
const C: u64 = 0xC;
const D: u64 = 0xD;
const E: u64 = 0xE;

fn cache(cap: usize) -> Lrcu<u32> {
    Lrcu::new(cap, 14, Refresh::NEVER)
}

#[test]
fn frequency_lists_follow_algorithms_1_and_2() {
    let mut c = cache(3);
    assert_eq!(c.put(A, 1, 0), None);
    assert_eq!(c.put(B, 2, 0), None);
    assert_eq!(c.put(C, 3, 0), None);
    // New entries enter at the front of list 1.
    assert_eq!(c.lists(), vec![(1, vec![C, B, A])]);
    assert_eq!(c.get(A, 0), Some(&1));
    assert_eq!(c.lists(), vec![(1, vec![C, B]), (2, vec![A])]);
    assert_eq!(c.get(A, 0), Some(&1));
    // List 2 emptied and was deleted; A sits alone in list 3.
    assert_eq!(c.lists(), vec![(1, vec![C, B]), (3, vec![A])]);
    assert_eq!(c.get(B, 0), Some(&2));
    assert_eq!(c.lists(), vec![(1, vec![C]), (2, vec![B]), (3, vec![A])]);
    assert_eq!(c.min_frequency(), Some(1));
    assert_eq!(c.get(0x99, 0), None);
    // Full: D evicts the last entry of the minimum list (C).
    assert_eq!(c.put(D, 4, 0), Some((C, 3)));
    assert_eq!(c.lists(), vec![(1, vec![D]), (2, vec![B]), (3, vec![A])]);
    // C bumped twice would be needed to survive; E evicts D, the newest but least frequent.
    assert_eq!(c.put(E, 5, 0), Some((D, 4)));
    assert_eq!(c.get(B, 0), Some(&2));
    // B joins A's list at the front; list 2 deleted.
    assert_eq!(c.lists(), vec![(1, vec![E]), (3, vec![B, A])]);
    // put of a cached key bumps it and replaces the value (no eviction).
    assert_eq!(c.put(E, 50, 0), None);
    assert_eq!(c.lists(), vec![(2, vec![E]), (3, vec![B, A])]);
    assert_eq!(c.peek(E), Some((&50, 2)));
    // update re-points without a bump; unknown keys are not inserted.
    assert_eq!(c.update(E, 51), Some(50));
    assert_eq!(c.peek(E), Some((&51, 2)));
    assert_eq!(c.update(0x77, 1), None);
    assert!(!c.contains(0x77));
    assert_eq!(c.min_frequency(), Some(2));
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.inserts, s.evictions), (4, 1, 5, 2));
    assert_eq!(c.len(), 3);
    assert_eq!(c.memory_bytes(), 3 * 14);
}

#[test]
fn eviction_order_is_least_frequent_then_least_recent() {
    let mut c = cache(3);
    for k in [A, B, C] {
        c.put(k, k as u32, 0);
    }
    // All at frequency 1: the oldest insert goes first, then the next oldest.
    assert_eq!(c.put(D, 0, 0), Some((A, A as u32)));
    assert_eq!(c.put(E, 0, 0), Some((B, B as u32)));
    // Touch C (now frequency 2): the list-1 entries D and E go before it, oldest first.
    c.get(C, 0);
    assert_eq!(c.put(A, 0, 0), Some((D, 0)));
    assert_eq!(c.put(B, 0, 0), Some((E, 0)));
    assert_eq!(c.put(D, 0, 0), Some((A, 0)));
    assert!(c.contains(C));
    // Removing the only minimum-frequency entry moves the minimum pointer up.
    c.get(C, 0);
    assert_eq!(c.remove(B), Some(0));
    assert_eq!(c.remove(B), None);
    assert_eq!(c.remove(D), Some(0));
    assert_eq!(c.min_frequency(), Some(3));
    assert_eq!(c.lists(), vec![(3, vec![C])]);
}

#[test]
fn refresh_halves_the_previous_hotness_algorithm_3() {
    let mut c = cache(4);
    c.put(A, 0, 0);
    for _ in 0..5 {
        c.get(A, 0);
    }
    c.put(B, 0, 0);
    c.get(B, 0);
    assert_eq!(c.lists(), vec![(2, vec![B]), (6, vec![A])]);
    // First epoch: last = 0, so hotness = accesses so far.
    c.refresh_now(1);
    assert_eq!(c.lists(), vec![(2, vec![B]), (6, vec![A])]);
    for _ in 0..3 {
        c.get(B, 1);
    }
    // A: 6/2 + 0 = 3; B: 2/2 + (5 - 2) = 4.
    c.refresh_now(2);
    assert_eq!(c.lists(), vec![(3, vec![A]), (4, vec![B])]);
    // A: 3/2 = 1; B: 4/2 = 2; then A: 0, B: 1.
    c.refresh_now(3);
    assert_eq!(c.lists(), vec![(1, vec![A]), (2, vec![B])]);
    c.refresh_now(4);
    assert_eq!(c.lists(), vec![(0, vec![A]), (1, vec![B])]);
    assert_eq!(c.min_frequency(), Some(0));
    // A new entry enters list 1, after list 0.
    c.put(C, 0, 4);
    assert_eq!(c.lists(), vec![(0, vec![A]), (1, vec![C, B])]);
    // C: 0/2 + 1 = 1; B: 1/2 + 0 = 0; A stays 0. Old lists descending, front to back: C, B, A.
    c.refresh_now(5);
    assert_eq!(c.lists(), vec![(0, vec![B, A]), (1, vec![C])]);
    // A frequency-0 entry bumps to 1; the minimum is still 0 (B).
    c.get(A, 5);
    assert_eq!(c.lists(), vec![(0, vec![B]), (1, vec![A, C])]);
    c.put(D, 0, 5);
    assert_eq!(c.lists(), vec![(0, vec![B]), (1, vec![D, A, C])]);
    // Full: the hotness-0 entry is evicted first.
    assert_eq!(c.put(E, 0, 5), Some((B, 0)));
    assert_eq!(c.stats().refreshes, 5);
}

#[test]
fn refresh_fires_by_interval_and_by_operation_count() {
    let mut c = Lrcu::new(
        4,
        14,
        Refresh {
            interval: Some(10),
            every_ops: None,
        },
    );
    c.put(A, 0, 100); // the clock starts at the first refresh point
    c.get(A, 105);
    assert_eq!(c.stats().refreshes, 0);
    c.get(A, 110); // 10 units since 100: refresh, A's hotness = 3
    assert_eq!(c.stats().refreshes, 1);
    assert_eq!(c.peek(A), Some((&0, 3)));
    c.get(A, 112);
    c.get(A, 120); // bump to 5, then 3/2 + (5 - 3) = 3
    assert_eq!(c.stats().refreshes, 2);
    assert_eq!(c.peek(A), Some((&0, 3)));
    // A miss is no refresh point (Algorithm 1 returns before REFRESH()).
    assert_eq!(c.get(B, 500), None);
    assert_eq!(c.stats().refreshes, 2);

    let mut c = Lrcu::new(
        4,
        14,
        Refresh {
            interval: None,
            every_ops: Some(3),
        },
    );
    c.put(A, 0, 0);
    c.get(A, 0);
    assert_eq!(c.stats().refreshes, 0);
    c.get(A, 0); // third refresh point
    assert_eq!(c.stats().refreshes, 1);
    assert_eq!(c.peek(A), Some((&0, 3)));
    c.get(A, 0);
    c.get(A, 0);
    c.get(A, 0); // 3/2 + 3 = 4
    assert_eq!(c.peek(A), Some((&0, 4)));
}

/// Without refresh an old hot entry holds its slot forever ("cache solidification"); with refresh
/// it fades and the new hot pair becomes resident.
#[test]
fn refresh_ends_cache_solidification() {
    let run = |refresh: Refresh| {
        let mut c = Lrcu::new(3, 14, refresh);
        c.put(A, 0, 0);
        for _ in 0..100 {
            c.get(A, 0);
        }
        c.put(B, 0, 0);
        for _ in 0..100 {
            c.get(B, 0);
        }
        let mut hits = 0;
        for _ in 0..200 {
            for k in [C, D] {
                if c.get(k, 0).is_some() {
                    hits += 1;
                } else {
                    c.put(k, 0, 0);
                }
            }
        }
        hits
    };
    assert_eq!(run(Refresh::NEVER), 0);
    let with = run(Refresh {
        interval: None,
        every_ops: Some(20),
    });
    assert!(with > 300, "hits with refresh: {with}");
}

#[test]
fn budget_sets_the_capacity_and_zero_capacity_caches_nothing() {
    let c: Lrcu<u64> = Lrcu::with_budget(512 * 1024, 14, Refresh::NEVER);
    assert_eq!(c.capacity(), 512 * 1024 / 14);
    let mut z: Lrcu<u64> = Lrcu::new(0, 14, Refresh::NEVER);
    assert_eq!(z.put(A, 1, 0), None);
    assert!(z.is_empty());
    assert_eq!(z.get(A, 0), None);
}

/// The naive model: the same rules on plain vectors.
#[derive(Default)]
struct Model {
    lists: Vec<(u64, Vec<u64>)>,
    values: std::collections::HashMap<u64, (u32, u64)>,
    cap: usize,
    every: Option<u64>,
    ops: u64,
}

impl Model {
    fn find(&self, k: u64) -> Option<(usize, usize)> {
        for (i, (_, l)) in self.lists.iter().enumerate() {
            if let Some(j) = l.iter().position(|&x| x == k) {
                return Some((i, j));
            }
        }
        None
    }
    fn take(&mut self, k: u64) -> u64 {
        let (i, j) = self.find(k).expect("present");
        let f = self.lists[i].0;
        self.lists[i].1.remove(j);
        if self.lists[i].1.is_empty() {
            self.lists.remove(i);
        }
        f
    }
    fn push_front(&mut self, k: u64, f: u64) {
        match self.lists.iter().position(|(g, _)| *g >= f) {
            Some(i) if self.lists[i].0 == f => self.lists[i].1.insert(0, k),
            Some(i) => self.lists.insert(i, (f, vec![k])),
            None => self.lists.push((f, vec![k])),
        }
    }
    fn bump(&mut self, k: u64) {
        let f = self.take(k);
        self.push_front(k, f + 1);
    }
    fn point(&mut self) {
        if self.values.is_empty() {
            return;
        }
        self.ops += 1;
        if self.every.is_some_and(|n| self.ops >= n) {
            self.ops = 0;
            let order: Vec<(u64, u64)> = self
                .lists
                .iter()
                .rev()
                .flat_map(|(f, l)| l.iter().map(move |&k| (k, *f)))
                .collect();
            self.lists.clear();
            for (k, f) in order {
                let last = self.values[&k].1;
                let hot = last / 2 + (f - last);
                self.values.get_mut(&k).expect("present").1 = hot;
                match self.lists.iter().position(|(g, _)| *g >= hot) {
                    Some(i) if self.lists[i].0 == hot => self.lists[i].1.push(k),
                    Some(i) => self.lists.insert(i, (hot, vec![k])),
                    None => self.lists.push((hot, vec![k])),
                }
            }
        }
    }
    fn get(&mut self, k: u64) -> Option<u32> {
        let v = self.values.get(&k)?.0;
        self.bump(k);
        self.point();
        Some(v)
    }
    fn put(&mut self, k: u64, v: u32) -> Option<(u64, u32)> {
        if self.cap == 0 {
            return None;
        }
        let mut ev = None;
        if self.values.contains_key(&k) {
            self.values.get_mut(&k).expect("present").0 = v;
            self.bump(k);
        } else {
            if self.values.len() >= self.cap {
                let victim = *self.lists[0].1.last().expect("non-empty list");
                self.take(victim);
                ev = Some((victim, self.values.remove(&victim).expect("present").0));
            }
            self.values.insert(k, (v, 0));
            self.push_front(k, 1);
        }
        self.point();
        ev
    }
    fn remove(&mut self, k: u64) -> Option<u32> {
        let (v, _) = self.values.remove(&k)?;
        self.take(k);
        Some(v)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Get(u64),
    Put(u64, u32),
    Remove(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..8).prop_map(Op::Get),
        4 => (0u64..8, any::<u32>()).prop_map(|(k, v)| Op::Put(k, v)),
        1 => (0u64..8).prop_map(Op::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn lrcu_matches_the_naive_model(
        cap in 0usize..6,
        every in prop::option::of(1u64..8),
        ops in prop::collection::vec(op(), 0..200),
    ) {
        let mut c: Lrcu<u32> = Lrcu::new(cap, 14, Refresh { interval: None, every_ops: every });
        let mut m = Model { cap, every, ..Model::default() };
        for o in ops {
            match o {
                Op::Get(k) => prop_assert_eq!(c.get(k, 0).copied(), m.get(k)),
                Op::Put(k, v) => prop_assert_eq!(c.put(k, v, 0), m.put(k, v)),
                Op::Remove(k) => prop_assert_eq!(c.remove(k), m.remove(k)),
            }
            prop_assert_eq!(c.lists(), m.lists.clone());
            prop_assert!(c.len() <= cap);
            prop_assert_eq!(c.min_frequency(), m.lists.first().map(|l| l.0));
        }
    }
}
