//! The policy seams of the write path, driven by a test policy and a test store: `Lookup`
//! decisions never create entries, stores hear about hits, releases and frees, and a store's
//! verify hook answers the comparison.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::engine::{Engine, FormatOptions, OpenOptions, WriteCtx};
use crate::index::FpIndex;
use crate::media::{Medium, MemMedium};
use crate::policy::{Decision, Policy, PolicyKind, PrefetchMode};
use crate::store::{FpStore, StoreHandle, StoreParams};
use crate::BLOCK_SIZE;

#[derive(Default)]
struct Seen {
    hits: AtomicU64,
    inserts: AtomicU64,
    releases: AtomicU64,
    removes: AtomicU64,
    /// When set, the store answers every verification with "different".
    veto: AtomicBool,
    /// When set, the policy asks for `Lookup` instead of `LookupOrInsert`.
    lookup_only: AtomicBool,
}

/// The complete index, counting what it is told.
struct CountingStore(FpIndex, Arc<Seen>);

impl FpStore for CountingStore {
    fn find(&self, fp: u64, check: &mut dyn FnMut(u64) -> bool) -> Option<u64> {
        self.0.find(fp, check)
    }
    fn insert(&self, fp: u64, loc: u64) {
        self.1.inserts.fetch_add(1, Ordering::Relaxed);
        self.0.insert(fp, loc)
    }
    fn remove(&self, fp: u64, loc: u64) {
        self.1.removes.fetch_add(1, Ordering::Relaxed);
        self.0.remove(fp, loc)
    }
    fn on_hit(&self, _fp: u64, _loc: u64) {
        self.1.hits.fetch_add(1, Ordering::Relaxed);
    }
    fn on_release(&self, _fp: u64, _loc: u64, refs: u64) {
        assert!(refs >= 1);
        self.1.releases.fetch_add(1, Ordering::Relaxed);
    }
    fn verify_cached(&self, _fp: u64, _block: u64, _data: &[u8]) -> Option<bool> {
        self.1.veto.load(Ordering::Relaxed).then_some(false)
    }
    fn locations(&self) -> Vec<u64> {
        self.0.locations()
    }
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn memory_bytes(&self) -> u64 {
        self.0.memory_bytes()
    }
    fn clear(&self) {
        self.0.clear()
    }
}

struct TestPolicy(Arc<Seen>);

impl Policy for TestPolicy {
    fn kind(&self) -> PolicyKind {
        PolicyKind::WeakVerify
    }
    fn decide(&self, _fp: u64) -> Decision {
        if self.0.lookup_only.load(Ordering::Relaxed) {
            Decision::Lookup
        } else {
            Decision::LookupOrInsert
        }
    }
    fn verify(&self) -> bool {
        true
    }
    fn prefetch(&self, _asked: PrefetchMode) -> PrefetchMode {
        PrefetchMode::None
    }
    fn make_store(&self, p: &StoreParams) -> crate::Result<Option<Box<dyn FpStore>>> {
        Ok(Some(Box::new(CountingStore(
            FpIndex::new(p.medium_len),
            self.0.clone(),
        ))))
    }
}

fn engine(seen: &Arc<Seen>) -> Engine {
    let m = Arc::new(MemMedium::new(16 << 20));
    let fo = FormatOptions {
        policy: PolicyKind::WeakVerify,
        ..Default::default()
    };
    let mut e = Engine::format(m.clone(), &fo, &OpenOptions::default()).unwrap();
    // Swap in the test policy and its store (the image is empty, so nothing is lost).
    let p = TestPolicy(seen.clone());
    let own = p.make_store(&StoreParams {
        medium_len: m.len(),
        mem_budget: 0,
        io: None,
    });
    let own = own.expect("an in-memory store cannot fail");
    e.store = StoreHandle::Own(own.expect("the test policy brings its own store"));
    e.policy = Box::new(p);
    e
}

fn block(c: u8) -> Vec<u8> {
    vec![c; BLOCK_SIZE]
}

#[test]
fn store_hears_hits_releases_and_frees() {
    let seen = Arc::new(Seen::default());
    let e = engine(&seen);
    let mut ctx = WriteCtx::default();
    let a = block(1);
    let b1 = e.write(&mut ctx, &[&a]).unwrap()[0];
    let b2 = e.write(&mut ctx, &[&a]).unwrap()[0];
    assert_eq!(b1, b2);
    assert_eq!(seen.inserts.load(Ordering::Relaxed), 1);
    assert_eq!(seen.hits.load(Ordering::Relaxed), 1);
    e.release(b1).unwrap();
    assert_eq!(seen.releases.load(Ordering::Relaxed), 1);
    assert_eq!(seen.removes.load(Ordering::Relaxed), 0);
    e.release(b1).unwrap();
    assert_eq!(seen.removes.load(Ordering::Relaxed), 1);
    assert_eq!(e.stats().physical_bytes, 0);
}

#[test]
fn lookup_only_finds_but_never_inserts() {
    let seen = Arc::new(Seen::default());
    let e = engine(&seen);
    let mut ctx = WriteCtx::default();
    let (a, b) = (block(1), block(2));
    let first_a = e.write(&mut ctx, &[&a]).unwrap()[0];
    seen.lookup_only.store(true, Ordering::Relaxed);
    // Known content is still deduplicated...
    assert_eq!(e.write(&mut ctx, &[&a]).unwrap()[0], first_a);
    // ...new content is stored without an entry, so its copies are not.
    let b1 = e.write(&mut ctx, &[&b, &b]).unwrap();
    assert_ne!(b1[0], b1[1]);
    assert_eq!(e.block_refcount(b1[0]).unwrap(), None);
    assert_eq!(seen.inserts.load(Ordering::Relaxed), 1);
    assert_eq!(e.stats().physical_bytes, 3 * BLOCK_SIZE as u64);
    assert!(e.audit().unwrap().problems.is_empty());
}

#[test]
fn the_store_can_answer_the_verification() {
    let seen = Arc::new(Seen::default());
    let e = engine(&seen);
    let mut ctx = WriteCtx::default();
    let a = block(7);
    let first = e.write(&mut ctx, &[&a]).unwrap()[0];
    seen.veto.store(true, Ordering::Relaxed);
    let second = e.write(&mut ctx, &[&a]).unwrap()[0];
    assert_ne!(first, second, "the store's answer overrides the medium's");
    assert_eq!(e.stats().fp_collisions, 1);
}
