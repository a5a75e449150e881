//! Crash tests: random workloads on `CrashSim`, crash states captured at random fences and
//! materialised five ways (drop all pending stores, keep all, random subset, torn at 8 bytes,
//! per-line prefix); each must open as `NeedsRecovery`, recover from the references the caller
//! held after its last completed call, and then agree with that model: every referenced block
//! reads back its content, reference counts match, every live entry is indexed, the metadata
//! audits clean, and the engine keeps working.

use std::collections::BTreeMap;
use std::sync::Arc;

use nodup_core::engine::{FormatOptions, OpenOptions, OpenState};
use nodup_core::media::{CrashMode, CrashSim, Medium, MemMedium};
use nodup_core::meta::MetaLayoutKind;
use nodup_core::policy::PolicyKind;
use nodup_core::{BlockNr, Engine, WriteCtx};
use rand::{Rng, SeedableRng};

const POOL: u64 = 10;
const SLOTS: u64 = 20;

mod common;

fn content(c: u64) -> Vec<u8> {
    common::content_salted(c, 0xD1B5_4A32_D192_ED03, 0x94D0_49BB_1331_11EB, 29)
}

type Model = BTreeMap<u64, (u64, BlockNr)>;
/// References the caller holds, with the content each block must hold (one item per reference).
type Held = Vec<(BlockNr, u64)>;

fn held_of(model: &Model) -> Held {
    model.values().map(|&(c, b)| (b, c)).collect()
}

/// Check a recovered engine against the references held; panics with `what` on a mismatch.
fn check(e: &Engine, held: &Held, what: &str) {
    let count = common::check_held(e, held, content, what);
    let a = e.audit().unwrap();
    assert_eq!(a.fp_mismatches, 0, "{what}");
    // `smart` may hold two entries of one content (its inline lookups see only memory); a
    // recovery indexes one of them. `selective` keeps only hot fingerprints.
    use nodup_core::policy::PolicyKind;
    if !matches!(e.policy_kind(), PolicyKind::Smart | PolicyKind::Selective) {
        assert_eq!(
            a.valid_entries, a.indexed_entries,
            "{what}: live entries missing from the index"
        );
    }
    let s = e.stats();
    assert_eq!(
        s.free_blocks,
        s.total_blocks - count.len() as u64 - e.layout_owned_blocks() - e.store_owned_blocks(),
        "{what}"
    );
}

/// One random step of engine calls; `after_call` sees the references held after each call.
fn step(
    e: &Engine,
    ctx: &mut WriteCtx,
    model: &mut Model,
    rng: &mut rand::rngs::StdRng,
    after_call: &mut dyn FnMut(Held),
) {
    if rng.gen_bool(0.75) || model.is_empty() {
        let n = rng.gen_range(1..8);
        let w: Vec<(u64, u64)> = (0..n)
            .map(|_| (rng.gen_range(0..SLOTS), rng.gen_range(0..POOL)))
            .collect();
        let data: Vec<Vec<u8>> = w.iter().map(|&(_, c)| content(c)).collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let got = e.write(ctx, &refs).unwrap();
        // Until the old blocks are released the caller holds both the old and the new ones.
        let mut held = held_of(model);
        held.extend(w.iter().zip(&got).map(|(&(_, c), &b)| (b, c)));
        after_call(held.clone());
        let mut old = Vec::new();
        for (&(s, c), &b) in w.iter().zip(&got) {
            if let Some((oc, ob)) = model.insert(s, (c, b)) {
                old.push((ob, oc));
            }
        }
        for o in old {
            e.release(o.0).unwrap();
            let i = held
                .iter()
                .position(|&h| h == o)
                .expect("released block was held");
            held.swap_remove(i);
            after_call(held.clone());
        }
    } else {
        let s = rng.gen_range(0..SLOTS);
        if let Some((_, b)) = model.remove(&s) {
            e.release(b).unwrap();
            after_call(held_of(model));
        }
    }
}

fn crash_run(seed: u64, policy: PolicyKind, layout: MetaLayoutKind) -> usize {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sim = Arc::new(CrashSim::new(2 << 20));
    let fopts = FormatOptions {
        policy,
        meta_layout: layout,
        client_area_blocks: 2,
        ..Default::default()
    };
    let e = Engine::format(sim.clone(), &fopts, &OpenOptions::default()).unwrap();
    let mut ctx = WriteCtx::default();
    let mut model = Model::new();
    // Warm up without captures, so crash points land in a populated engine.
    for _ in 0..10 {
        step(&e, &mut ctx, &mut model, &mut rng, &mut |_| {});
    }
    let mut frng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5555);
    sim.set_capture_filter(Box::new(move |_| frng.gen_bool(0.2)));
    // (completed fences after the step, model after the step)
    let mut history: Vec<(u64, Held)> = vec![(sim.fence_count(), held_of(&model))];
    for _ in 0..25 {
        step(&e, &mut ctx, &mut model, &mut rng, &mut |h| {
            history.push((sim.fence_count(), h))
        });
    }
    sim.clear_capture_filter();
    let points = sim.take_captures();
    let modes = |s: u64| {
        [
            CrashMode::DropAll,
            CrashMode::KeepAll,
            CrashMode::Random { seed: s },
            CrashMode::Torn { seed: s },
            CrashMode::LinePrefix { seed: s },
        ]
    };
    for (pi, p) in points.iter().enumerate() {
        // The truth: the model after the last step whose fences all completed before the crash.
        let truth = &history
            .iter()
            .rev()
            .find(|(f, _)| *f <= p.fence())
            .expect("warm-up precedes captures")
            .1;
        for mode in modes(seed.wrapping_mul(31).wrapping_add(pi as u64)) {
            let what = format!(
                "seed {seed} {policy:?} {layout:?} point {pi} (fence {}) {mode:?}",
                p.fence()
            );
            let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(p.materialize(&mode)));
            let (e2, st) = Engine::open(m, &OpenOptions::default())
                .unwrap_or_else(|err| panic!("{what}: {err}"));
            assert_eq!(st, OpenState::NeedsRecovery, "{what}");
            // Persistence order: an entry lies in one line and is stored after its data was
            // fenced, its block number last; so no state that cache-line write-back can produce
            // (a prefix of each line's stores: DropAll, KeepAll, LinePrefix) shows an entry
            // without its data. Torn and Random go beyond that (8-byte tearing; any subset of a
            // line's stores) and can expose a half-written entry of the call in flight, whose
            // block nobody references and recovery drops; a referenced block's entry must still
            // match it.
            let refs: Vec<BlockNr> = truth.iter().map(|&(b, _)| b).collect();
            let before = e2.audit().unwrap();
            if matches!(mode, CrashMode::Torn { .. } | CrashMode::Random { .. }) {
                let bad: Vec<_> = before
                    .fp_mismatch_blocks
                    .iter()
                    .filter(|b| refs.contains(b))
                    .collect();
                assert!(bad.is_empty(), "{what}: referenced blocks {bad:?} mismatch");
            } else {
                assert_eq!(
                    before.fp_mismatches, 0,
                    "{what}: entry durable before its data"
                );
            }
            e2.recover(&mut refs.into_iter(), &mut std::iter::empty())
                .unwrap_or_else(|err| panic!("{what}: {err}"));
            check(&e2, truth, &what);
            // The recovered engine keeps working.
            // The recovered engine keeps working (slots model the references held).
            let mut m2: Model = truth
                .iter()
                .enumerate()
                .map(|(i, &(b, c))| (SLOTS + i as u64, (c, b)))
                .collect();
            let mut r2 = rand::rngs::StdRng::seed_from_u64(seed + pi as u64);
            let mut c2 = WriteCtx::default();
            for _ in 0..4 {
                step(&e2, &mut c2, &mut m2, &mut r2, &mut |_| {});
            }
            check(&e2, &held_of(&m2), &format!("{what}, after more writes"));
        }
    }
    points.len()
}

#[test]
fn crash_states_recover_to_the_last_completed_call() {
    let mut total = 0;
    for seed in 0..10u64 {
        for layout in [
            MetaLayoutKind::Region,
            MetaLayoutKind::Entry,
            MetaLayoutKind::Hashtable,
        ] {
            total += crash_run(seed, PolicyKind::Light, layout);
        }
        for policy in [
            PolicyKind::Strong,
            PolicyKind::WeakVerify,
            PolicyKind::None,
            PolicyKind::Smart,
            PolicyKind::Selective,
        ] {
            total += crash_run(seed + 100, policy, MetaLayoutKind::Region);
        }
    }
    assert!(total > 50, "only {total} crash points exercised");
}
