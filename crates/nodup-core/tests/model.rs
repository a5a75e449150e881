//! Property tests: random writes (with heavy duplication), overwrites, deletes, clean remounts
//! and crashes + failure recovery, compared after every step with a plain in-memory model of
//! what each logical slot holds — for every layout, every policy and every prefetch variant,
//! and with the 8-value test fingerprint that makes collisions frequent.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use nodup_core::engine::{FormatOptions, OpenOptions, OpenState};
use nodup_core::fingerprint::FpKind;
use nodup_core::media::pmem::{Pmem, PmemOptions};
use nodup_core::media::{Medium, MemMedium};
use nodup_core::meta::MetaLayoutKind;
use nodup_core::policy::selective::SelectiveOptions;
use nodup_core::policy::{PolicyKind, PolicyOptions, PrefetchMode};
use nodup_core::{BlockNr, Engine, SplitOptions, WriteCtx, BLOCK_SIZE};
use proptest::prelude::*;

/// Distinct contents the workload draws from (small, so duplicates are frequent).
const POOL: u8 = 12;
/// Logical slots (like file blocks).
const SLOTS: u8 = 24;

fn content(c: u8) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK_SIZE];
    let mut x = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(c as u64 + 1);
    for w in v.chunks_mut(8) {
        x ^= x >> 31;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        w.copy_from_slice(&x.to_le_bytes());
    }
    v
}

#[derive(Debug, Clone)]
enum Op {
    /// One write call: (slot, content) per block; each slot's old block is released after.
    Write(Vec<(u8, u8)>),
    Delete(u8),
    Remount,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => proptest::collection::vec((0..SLOTS, 0..POOL), 1..10).prop_map(Op::Write),
        2 => (0..SLOTS).prop_map(Op::Delete),
        1 => Just(Op::Remount),
        1 => Just(Op::Crash),
    ]
}

struct Harness {
    medium: Arc<dyn Medium>,
    /// Keeps a `Pmem` image file alive.
    _dir: Option<tempfile::TempDir>,
    engine: Engine,
    ctx: WriteCtx,
    open: OpenOptions,
    slots: BTreeMap<u8, (u8, BlockNr)>,
    policy: PolicyKind,
    collide: bool,
}

impl Harness {
    fn new(
        policy: PolicyKind,
        layout: MetaLayoutKind,
        prefetch: PrefetchMode,
        collide: bool,
    ) -> Harness {
        Harness::on(policy, layout, prefetch, collide, None, false)
    }

    /// As [`Harness::new`]; with `pmem`, on a memory-mapped image, whose data stores are
    /// streaming (`Some(true)`) or ordinary + flush (`Some(false)`): either way the engine then
    /// fingerprints new blocks while copying them straight into the mapping. With `split`,
    /// every call of two blocks or more is cut into up to three parts written by different
    /// threads (`write/split.rs`).
    fn on(
        policy: PolicyKind,
        layout: MetaLayoutKind,
        prefetch: PrefetchMode,
        collide: bool,
        pmem: Option<bool>,
        split: bool,
    ) -> Harness {
        let (medium, dir): (Arc<dyn Medium>, _) = if let Some(stream_data) = pmem {
            let opts = PmemOptions {
                stream_data,
                ..PmemOptions::default()
            };
            let dir = tempfile::tempdir_in("/dev/shm").unwrap();
            let p = Pmem::create_with(dir.path().join("img"), 2 << 20, opts).unwrap();
            assert_eq!(
                p.streams_data(),
                stream_data && cfg!(target_arch = "x86_64")
            );
            (Arc::new(p), Some(dir))
        } else {
            (Arc::new(MemMedium::new(2 << 20)), None)
        };
        let fopts = FormatOptions {
            policy,
            meta_layout: layout,
            fingerprint: if collide {
                FpKind::TestCollide
            } else {
                FpKind::Xxh3
            },
            client_area_blocks: 2,
            ..Default::default()
        };
        let open = OpenOptions {
            prefetch,
            transition_threshold: 6,
            // `smart` with a budget small enough to evict: a few dozen fingerprints in memory.
            mem_budget: (policy == PolicyKind::Smart).then_some(8 << 10),
            // `selective` with caches small enough to evict and refresh all the time.
            policy: PolicyOptions {
                selective: SelectiveOptions {
                    fp_cache_bytes: 4 << 10,
                    prefetch_bytes: 16 << 10,
                    refresh_ms: None,
                    refresh_ops: Some(7),
                },
                ..PolicyOptions::default()
            },
            write_split: if split {
                SplitOptions {
                    parts: 3,
                    min_blocks: 1,
                }
            } else {
                SplitOptions::OFF
            },
            ..Default::default()
        };
        let engine = Engine::format(medium.clone(), &fopts, &open).unwrap();
        Harness {
            medium,
            _dir: dir,
            engine,
            ctx: WriteCtx::default(),
            open,
            slots: BTreeMap::new(),
            policy,
            collide,
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Write(w) => {
                let data: Vec<Vec<u8>> = w.iter().map(|&(_, c)| content(c)).collect();
                let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
                let got = self.engine.write(&mut self.ctx, &refs).unwrap();
                prop_assert_eq!(got.len(), w.len());
                let mut old = Vec::new();
                for (&(slot, c), &b) in w.iter().zip(&got) {
                    if let Some((_, ob)) = self.slots.insert(slot, (c, b)) {
                        old.push(ob);
                    }
                }
                for b in old {
                    self.engine.release(b).unwrap();
                }
            }
            Op::Delete(s) => {
                if let Some((_, b)) = self.slots.remove(s) {
                    self.engine.release(b).unwrap();
                }
            }
            Op::Remount => {
                self.engine.shutdown().unwrap();
                let (e, st) = Engine::open(self.medium.clone(), &self.open).unwrap();
                prop_assert_eq!(st, OpenState::Clean);
                self.engine = e;
                self.ctx = WriteCtx::default();
            }
            Op::Crash => {
                let (e, st) = Engine::open(self.medium.clone(), &self.open).unwrap();
                prop_assert_eq!(st, OpenState::NeedsRecovery);
                let refs: Vec<BlockNr> = self.slots.values().map(|&(_, b)| b).collect();
                e.recover(&mut refs.into_iter(), &mut std::iter::empty())
                    .unwrap();
                self.engine = e;
                self.ctx = WriteCtx::default();
            }
        }
        self.check()
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let e = &self.engine;
        let mut count: HashMap<BlockNr, u64> = HashMap::new();
        let mut buf = vec![0u8; BLOCK_SIZE];
        for &(c, b) in self.slots.values() {
            e.read(b, &mut buf).unwrap();
            prop_assert!(buf == content(c), "block {} does not hold content {}", b, c);
            *count.entry(b).or_default() += 1;
        }
        let mut with_entry = 0;
        for (&b, &n) in &count {
            match e.block_refcount(b).unwrap() {
                Some(rc) => {
                    with_entry += 1;
                    prop_assert_eq!(rc, n, "refcount of block {}", b);
                }
                None => prop_assert_eq!(n, 1, "block {} without entry has {} references", b, n),
            }
        }
        let s = e.stats();
        prop_assert_eq!(s.physical_bytes, count.len() as u64 * BLOCK_SIZE as u64);
        prop_assert_eq!(
            s.free_blocks,
            s.total_blocks - count.len() as u64 - e.layout_owned_blocks() - e.store_owned_blocks()
        );
        let audit = e.audit().unwrap();
        prop_assert!(audit.problems.is_empty(), "{:?}", audit.problems);
        prop_assert_eq!(audit.valid_entries, with_entry);
        // A two-level store also counts records it has not purged yet, and its inline lookups
        // see only memory: equal content may be stored twice (two entries of one fingerprint,
        // one indexed after a recovery) until its worker, the file system's, remaps it.
        // A selective store keeps only hot fingerprints: it holds a subset of the entries, and
        // equal content stored while its fingerprint was not cached stays stored twice.
        if !matches!(self.policy, PolicyKind::Smart | PolicyKind::Selective) {
            prop_assert_eq!(s.index_entries, with_entry);
        }
        match self.policy {
            PolicyKind::Smart | PolicyKind::Selective => {}
            PolicyKind::None => prop_assert_eq!(with_entry, 0),
            _ if !self.collide => {
                // Without collisions, equal content always ends up in one block.
                let mut by_content: HashMap<u8, BlockNr> = HashMap::new();
                for &(c, b) in self.slots.values() {
                    let first = *by_content.entry(c).or_insert(b);
                    prop_assert_eq!(first, b, "content {} stored twice", c);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

fn run(
    policy: PolicyKind,
    layout: MetaLayoutKind,
    prefetch: PrefetchMode,
    collide: bool,
    pmem: Option<bool>,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    run_split(policy, layout, prefetch, collide, pmem, false, ops)
}

/// [`run`], with large calls split across threads or not.
fn run_split(
    policy: PolicyKind,
    layout: MetaLayoutKind,
    prefetch: PrefetchMode,
    collide: bool,
    pmem: Option<bool>,
    split: bool,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut h = Harness::on(policy, layout, prefetch, collide, pmem, split);
    for op in ops {
        h.apply(op)?;
    }
    // Releasing everything leaves no data block and no entry behind.
    let all: Vec<u8> = h.slots.keys().copied().collect();
    for s in all {
        h.apply(&Op::Delete(s))?;
    }
    let st = h.engine.stats();
    prop_assert_eq!(st.physical_bytes, 0);
    if policy != PolicyKind::Smart {
        prop_assert_eq!(st.index_entries, 0);
    }
    Ok(())
}

const LAYOUTS: [MetaLayoutKind; 3] = [
    MetaLayoutKind::Region,
    MetaLayoutKind::Entry,
    MetaLayoutKind::Hashtable,
];

fn layout() -> impl Strategy<Value = MetaLayoutKind> {
    (0..3usize).prop_map(|i| LAYOUTS[i])
}

fn prefetch() -> impl Strategy<Value = PrefetchMode> {
    (0..7usize).prop_map(|i| PrefetchMode::ALL[i])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn light_matches_model(
        l in layout(),
        p in prefetch(),
        pmem in proptest::option::of(any::<bool>()),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        run(PolicyKind::Light, l, p, false, pmem, &ops)?;
    }

    #[test]
    fn baselines_match_model(
        l in layout(),
        pol in prop_oneof![Just(PolicyKind::None), Just(PolicyKind::Strong), Just(PolicyKind::WeakVerify)],
        pmem in proptest::option::of(any::<bool>()),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        run(pol, l, PrefetchMode::Cbp, false, pmem, &ops)?;
    }

    #[test]
    fn smart_matches_model(
        l in layout(),
        collide in any::<bool>(),
        pmem in proptest::option::of(any::<bool>()),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        run(PolicyKind::Smart, l, PrefetchMode::Cbp, collide, pmem, &ops)?;
    }

    #[test]
    fn selective_matches_model(
        l in layout(),
        collide in any::<bool>(),
        pmem in proptest::option::of(any::<bool>()),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        run(PolicyKind::Selective, l, PrefetchMode::Cbp, collide, pmem, &ops)?;
    }

    #[test]
    fn split_calls_match_model(
        l in layout(),
        pol in prop_oneof![
            Just(PolicyKind::Light),
            Just(PolicyKind::None),
            Just(PolicyKind::WeakVerify),
            Just(PolicyKind::Smart),
            Just(PolicyKind::Selective),
        ],
        p in prefetch(),
        collide in any::<bool>(),
        pmem in proptest::option::of(any::<bool>()),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        run_split(pol, l, p, collide, pmem, true, &ops)?;
    }

    #[test]
    fn collisions_never_merge_different_data(
        l in layout(),
        pol in prop_oneof![Just(PolicyKind::Light), Just(PolicyKind::WeakVerify)],
        p in prefetch(),
        pmem in proptest::option::of(any::<bool>()),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        run(pol, l, p, true, pmem, &ops)?;
    }
}

/// With 8 fingerprint values, 16 distinct blocks must collide; each still reads back its own
/// bytes and no collision got an entry.
#[test]
fn forced_collisions_are_written_apart() {
    for policy in [PolicyKind::Light, PolicyKind::WeakVerify] {
        let mut h = Harness::new(policy, MetaLayoutKind::Region, PrefetchMode::Cbp, true);
        let w: Vec<(u8, u8)> = (0..16).map(|i| (i, i)).collect();
        h.apply(&Op::Write(w.clone())).unwrap();
        h.apply(&Op::Write(w.iter().map(|&(s, c)| (s + 16, c)).collect()))
            .unwrap();
        let s = h.engine.stats();
        assert!(s.fp_collisions >= 8, "{} collisions", s.fp_collisions);
        assert!(s.index_entries <= 8);
    }
}
