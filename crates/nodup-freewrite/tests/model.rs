//! Every key readable with its latest value after any number of garbage collections,
//! compactions and reopens, with bubbles on and off, checked against a model map.

mod common;

use common::{key, scratch, small_caps, tiny_lsm, value};
use nodup_freewrite::fawn::{FawnOptions, FawnStore};
use nodup_freewrite::lsm::LsmStore;
use nodup_freewrite::Caps;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone)]
enum Op {
    Put(u32, usize, u32),
    Delete(u32),
    /// FAWN: garbage collection; LSM: flush the memtable (compactions follow).
    Maintain,
    Reopen,
    Sync,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0u32..48, 0usize..600, any::<u32>()).prop_map(|(k, l, s)| Op::Put(k, l, s)),
        2 => (0u32..48).prop_map(Op::Delete),
        1 => Just(Op::Maintain),
        1 => Just(Op::Reopen),
        1 => Just(Op::Sync),
    ]
}

fn caps(i: usize) -> Option<Caps> {
    [None, Some(Caps::default()), Some(small_caps())][i]
}

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// The operations a model test drives, for both stores.
trait Kv: Sized {
    fn open(dir: &Path, fw: Option<Caps>) -> Self;
    fn put(&mut self, k: &[u8], v: &[u8]);
    fn delete(&mut self, k: &[u8]);
    fn get(&self, k: &[u8]) -> Option<Vec<u8>>;
    fn scan(&mut self) -> Vec<(Vec<u8>, Vec<u8>)>;
    fn maintain(&mut self);
    fn sync(&mut self);
    fn close(self);
}

impl Kv for FawnStore {
    fn open(dir: &Path, fw: Option<Caps>) -> Self {
        let o = FawnOptions {
            freewrite: fw,
            sync: false,
        };
        FawnStore::open(dir, o).unwrap()
    }
    fn put(&mut self, k: &[u8], v: &[u8]) {
        FawnStore::put(self, k, v).unwrap()
    }
    fn delete(&mut self, k: &[u8]) {
        FawnStore::delete(self, k).unwrap();
    }
    fn get(&self, k: &[u8]) -> Option<Vec<u8>> {
        FawnStore::get(self, k).unwrap()
    }
    fn scan(&mut self) -> Vec<(Vec<u8>, Vec<u8>)> {
        FawnStore::scan(self, &[0], None).unwrap()
    }
    fn maintain(&mut self) {
        self.gc().unwrap();
    }
    fn sync(&mut self) {
        FawnStore::sync(self).unwrap()
    }
    fn close(self) {
        FawnStore::close(self).unwrap()
    }
}

impl Kv for LsmStore {
    fn open(dir: &Path, fw: Option<Caps>) -> Self {
        LsmStore::open(dir, tiny_lsm(fw, false)).unwrap()
    }
    fn put(&mut self, k: &[u8], v: &[u8]) {
        LsmStore::put(self, k, v).unwrap()
    }
    fn delete(&mut self, k: &[u8]) {
        LsmStore::delete(self, k).unwrap()
    }
    fn get(&self, k: &[u8]) -> Option<Vec<u8>> {
        LsmStore::get(self, k).unwrap()
    }
    fn scan(&mut self) -> Vec<(Vec<u8>, Vec<u8>)> {
        LsmStore::scan(self, &[0], None).unwrap()
    }
    fn maintain(&mut self) {
        self.flush().unwrap();
    }
    fn sync(&mut self) {
        LsmStore::sync(self).unwrap()
    }
    fn close(self) {
        LsmStore::close(self).unwrap()
    }
}

fn check<S: Kv>(s: &mut S, model: &Model) -> Result<(), TestCaseError> {
    for i in 0..48 {
        let k = key(i);
        prop_assert_eq!(s.get(&k), model.get(&k).cloned(), "key {}", i);
    }
    let all: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    prop_assert_eq!(s.scan(), all);
    Ok(())
}

fn run<S: Kv>(ops: &[Op], fw: Option<Caps>) -> Result<(), TestCaseError> {
    let dir = scratch();
    let mut s = S::open(dir.path(), fw);
    let mut model = Model::new();
    for (n, op) in ops.iter().enumerate() {
        match *op {
            Op::Put(k, l, seed) => {
                let v = value(l, seed);
                s.put(&key(k), &v);
                model.insert(key(k), v);
            }
            Op::Delete(k) => {
                s.delete(&key(k));
                model.remove(&key(k));
            }
            Op::Maintain => s.maintain(),
            Op::Sync => s.sync(),
            Op::Reopen => {
                s.close();
                s = S::open(dir.path(), fw);
            }
        }
        if n % 16 == 15 {
            check(&mut s, &model)?;
        }
    }
    check(&mut s, &model)?;
    s.close();
    let mut s = S::open(dir.path(), fw);
    check(&mut s, &model)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn fawn_matches_the_model(ops in prop::collection::vec(op(), 1..300), c in 0usize..3) {
        run::<FawnStore>(&ops, caps(c))?;
    }

    #[test]
    fn lsm_matches_the_model(ops in prop::collection::vec(op(), 1..300), c in 0usize..3) {
        run::<LsmStore>(&ops, caps(c))?;
    }
}

/// Overwrites of a quarter of the keys leave runs of untouched records between them: the
/// collection must place bubbles, and everything must still read back, before and after a
/// reopen (which rebuilds the index from a log holding bubbles).
#[test]
fn fawn_gc_places_bubbles_and_reads_back() {
    let dir = scratch();
    let mut s = FawnStore::open(
        dir.path(),
        FawnOptions {
            freewrite: Some(small_caps()),
            sync: false,
        },
    )
    .unwrap();
    let mut model = Model::new();
    for round in 0..3u32 {
        for i in 0..400 {
            if round == 0 || i % 4 == 1 {
                let v = value(40 + (i as usize * 7) % 90, round * 1000 + i);
                s.put(&key(i), &v).unwrap();
                model.insert(key(i), v);
            }
        }
        let r = s.gc().unwrap();
        // The first collection has no garbage to skip: the copy stays aligned by itself.
        assert!(
            round == 0 || r.plan.bubbles > 0,
            "round {round}: {:?}",
            r.plan
        );
        assert!(r.plan.bubble_bytes as f64 <= 0.2 * r.plan.item_bytes as f64);
    }
    s.close().unwrap();
    let s = FawnStore::open(dir.path(), FawnOptions::default()).unwrap();
    for (k, v) in &model {
        assert_eq!(s.get(k).unwrap().as_ref(), Some(v));
    }
    assert!(s.stats().bubble_space > 0);
}

/// Compactions into a level that already holds data place bubbles on its unchanged runs.
#[test]
fn lsm_compactions_place_bubbles_and_read_back() {
    let dir = scratch();
    let mut s = LsmStore::open(dir.path(), tiny_lsm(Some(small_caps()), false)).unwrap();
    let mut model = Model::new();
    for i in 0..3000u32 {
        // Clusters of 20 keys at spread places, so level-k tables insert into long runs.
        let k = key((i / 20) * 1009 % 6007 * 20 + i % 20);
        let v = value(60, i);
        s.put(&k, &v).unwrap();
        model.insert(k, v);
    }
    s.flush().unwrap();
    let st = s.stats();
    assert!(st.compactions > 5 && st.plan.bubbles > 0, "{st:?}");
    s.close().unwrap();
    let s = LsmStore::open(dir.path(), tiny_lsm(None, false)).unwrap();
    assert_eq!(
        s.scan(&[0], None).unwrap(),
        model.into_iter().collect::<Vec<_>>()
    );
}
