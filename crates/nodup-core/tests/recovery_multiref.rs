//! Failure recovery of a block the caller references several times but that has no dedup
//! entry (torture finding 5): recovery must recreate the entry with the full count, so that
//! releasing one reference keeps the block for the others. Covers every layout, a crash at each
//! fence of the recovery itself (re-run must converge), and a full metadata area.

use std::sync::Arc;

use nodup_core::engine::{FormatOptions, OpenOptions, OpenState};
use nodup_core::media::{CrashMode, CrashSim, Medium, MemMedium};
use nodup_core::meta::MetaLayoutKind;
use nodup_core::{BlockNr, Engine, Error, WriteCtx};

const LAYOUTS: [MetaLayoutKind; 3] = [
    MetaLayoutKind::Region,
    MetaLayoutKind::Entry,
    MetaLayoutKind::Hashtable,
];

mod common;

fn content(c: u64) -> Vec<u8> {
    // Same bytes as before the helper moved to `common` (salt multiplies c + 1; c + 3 here).
    common::content_salted(c + 2, 0x9E37_79B9_7F4A_7C15, 0xBF58_476D_1CE4_E5B9, 31)
}

fn format(m: Arc<dyn Medium>, layout: MetaLayoutKind) -> Engine {
    let f = FormatOptions {
        meta_layout: layout,
        client_area_blocks: 2,
        ..Default::default()
    };
    Engine::format(m, &f, &OpenOptions::default()).unwrap()
}

/// Every held block reads back its content, counts match the references (no entry = one),
/// and the metadata audits clean.
fn check(e: &Engine, held: &[(BlockNr, u64)], what: &str) {
    common::check_held(e, held, content, what);
}

/// Content 1 written twice (one block, two references), content 2 once; then every
/// reference of the shared block is dropped, which clears its entry and frees it, while the
/// caller (after a crash, its metadata is the truth) still holds both references.
fn lose_the_entry(e: &Engine) -> Vec<(BlockNr, u64)> {
    let mut ctx = WriteCtx::default();
    let (c1, c2) = (content(1), content(2));
    let got = e.write(&mut ctx, &[&c1, &c1, &c2]).unwrap();
    assert_eq!(got[0], got[1], "the duplicate was not deduplicated");
    assert_eq!(e.block_refcount(got[0]).unwrap(), Some(2));
    e.release_batch(&[got[0], got[0]]).unwrap();
    assert_eq!(e.block_refcount(got[0]).unwrap(), None);
    vec![(got[0], 1), (got[1], 1), (got[2], 2)]
}

fn recover(e: &Engine, held: &[(BlockNr, u64)]) -> nodup_core::engine::RecoveryReport {
    let refs: Vec<BlockNr> = held.iter().map(|&(b, _)| b).collect();
    e.recover(&mut refs.into_iter(), &mut std::iter::empty())
        .unwrap()
}

#[test]
fn recovery_recreates_the_entry_of_a_shared_block() {
    for layout in LAYOUTS {
        let what = format!("{layout:?}");
        let m: Arc<dyn Medium> = Arc::new(MemMedium::new(2 << 20));
        let e = format(m, layout);
        let held = lose_the_entry(&e);
        let shared = held[0].0;
        let rep = recover(&e, &held);
        assert!(rep.entries_recreated >= 1, "{what}: {rep:?}");
        check(&e, &held, &what);
        assert_eq!(e.block_refcount(shared).unwrap(), Some(2), "{what}");
        let a = e.audit().unwrap();
        assert_eq!(a.valid_entries, a.indexed_entries, "{what}: not indexed");
        // A second recovery finds nothing to fix.
        let rep2 = recover(&e, &held);
        assert_eq!(
            rep2.refcounts_fixed + rep2.entries_recreated,
            0,
            "{what}: {rep2:?}"
        );
        assert_eq!(rep2.entries_invalidated, 0, "{what}: {rep2:?}");
        // Dropping one reference (an unlink) keeps the block for the other one.
        e.release(shared).unwrap();
        let rest = &held[1..];
        check(&e, rest, &format!("{what}, after one release"));
        assert!(e.allocator().is_allocated(shared), "{what}: block freed");
        // The recreated entry is a dedup target again.
        let mut ctx = WriteCtx::default();
        let c1 = content(1);
        let again = e.write(&mut ctx, &[&c1]).unwrap();
        assert_eq!(again[0], shared, "{what}: recreated entry not indexed");
        let mut held2 = rest.to_vec();
        held2.push((shared, 1));
        check(&e, &held2, &format!("{what}, after a duplicate write"));
    }
}

#[test]
fn recreated_entry_of_a_duplicate_fingerprint_stays_unindexed() {
    for layout in LAYOUTS {
        let what = format!("{layout:?}");
        let m: Arc<dyn Medium> = Arc::new(MemMedium::new(2 << 20));
        let e = format(m, layout);
        let mut held = lose_the_entry(&e);
        // The same content again, now in a new block with its own (indexed) entry.
        let mut ctx = WriteCtx::default();
        let c1 = content(1);
        let other = e.write(&mut ctx, &[&c1]).unwrap()[0];
        assert_ne!(other, held[0].0, "{what}");
        held.push((other, 1));
        let rep = recover(&e, &held);
        assert!(rep.entries_recreated >= 1, "{what}: {rep:?}");
        check(&e, &held, &what);
        assert_eq!(e.block_refcount(held[0].0).unwrap(), Some(2), "{what}");
        let a = e.audit().unwrap();
        assert_eq!(a.valid_entries, a.indexed_entries + 1, "{what}");
    }
}

#[test]
fn crash_inside_the_recreating_recovery_then_recover_again() {
    let modes = |s: u64| {
        [
            CrashMode::DropAll,
            CrashMode::KeepAll,
            CrashMode::Random { seed: s },
            CrashMode::Torn { seed: s },
            CrashMode::LinePrefix { seed: s },
        ]
    };
    for layout in LAYOUTS {
        let sim = Arc::new(CrashSim::new(2 << 20));
        let e = format(sim.clone(), layout);
        let held = lose_the_entry(&e);
        sim.set_capture_filter(Box::new(|_| true));
        recover(&e, &held);
        sim.clear_capture_filter();
        let points = sim.take_captures();
        assert!(!points.is_empty());
        for (pi, p) in points.iter().enumerate() {
            for mode in modes(pi as u64 * 7 + 1) {
                let what = format!("{layout:?} point {pi} (fence {}) {mode:?}", p.fence());
                let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(p.materialize(&mode)));
                let (e2, st) = Engine::open(m, &OpenOptions::default())
                    .unwrap_or_else(|err| panic!("{what}: {err}"));
                assert_eq!(st, OpenState::NeedsRecovery, "{what}");
                recover(&e2, &held);
                check(&e2, &held, &what);
                assert_eq!(e2.block_refcount(held[0].0).unwrap(), Some(2), "{what}");
                e2.release(held[0].0).unwrap();
                check(&e2, &held[1..], &format!("{what}, after one release"));
            }
        }
    }
}

/// Fill a region-layout image until writes fail, then swap old content for new one block at
/// a time until a new block gets no entry: the freed slots sit in regions that are not
/// allocatable yet, and no block is left for a new region. Returns the held references and
/// the bare one.
fn fill(e: &Engine) -> (Vec<(BlockNr, u64)>, (BlockNr, u64)) {
    let mut ctx = WriteCtx::default();
    let mut held = Vec::new();
    for c in 100.. {
        let d = content(c);
        match e.write(&mut ctx, &[&d]) {
            Ok(v) => held.push((v[0], c)),
            Err(Error::NoSpace) => break,
            Err(x) => panic!("{x}"),
        }
    }
    // Swap old content for new until the current region's free slots are used up too.
    for c in 1..1000 {
        let (b, _) = held.swap_remove(0);
        e.release(b).unwrap();
        let got = e.write(&mut ctx, &[&content(c)]).unwrap()[0];
        held.push((got, c));
        if e.block_refcount(got).unwrap().is_none() {
            return (held, (got, c));
        }
    }
    panic!("the metadata never filled up");
}

#[test]
fn full_metadata_gives_up_single_entries_for_a_shared_block() {
    let m: Arc<dyn Medium> = Arc::new(MemMedium::new(2 << 20));
    let e = format(m, MetaLayoutKind::Region);
    let (mut held, extra) = fill(&e);
    // The caller holds a second reference to a block that has no entry and no room for one.
    held.push(extra);
    let rep = recover(&e, &held);
    assert!(rep.entries_recreated >= 1, "{rep:?}");
    assert!(rep.entries_invalidated >= 1, "no entry given up: {rep:?}");
    check(&e, &held, "full");
    assert_eq!(e.block_refcount(extra.0).unwrap(), Some(2));
    e.release(extra.0).unwrap();
    held.pop();
    check(&e, &held, "full, after one release");
}

#[test]
fn recovery_fails_when_no_entry_can_be_made() {
    let m: Arc<dyn Medium> = Arc::new(MemMedium::new(2 << 20));
    let e = format(m, MetaLayoutKind::Region);
    let (held, _) = fill(&e);
    // Every block referenced twice: more shared blocks than entries can ever hold.
    let twice: Vec<BlockNr> = held.iter().flat_map(|&(b, _)| [b, b]).collect();
    let r = e.recover(&mut twice.into_iter(), &mut std::iter::empty());
    assert!(matches!(r, Err(Error::NoSpace)), "{r:?}");
    // The engine refuses writes until a recovery succeeds; the true references recover it.
    let mut ctx = WriteCtx::default();
    assert!(matches!(
        e.write(&mut ctx, &[&content(1)]),
        Err(Error::NeedsRecovery)
    ));
    recover(&e, &held);
    check(&e, &held, "after the failed recovery");
}
