//! Every scheme against hand-worked traces, and all of them against a model of memory contents.

use super::SchemeKind;
use crate::model::ModelConfig;
use crate::sim::{SchemeResult, Sim};
use crate::trace::{Event, Line};
use nodup_core::fingerprint::ecc::{encode, line_code};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

/// No contention: requests 1 ms apart, so each latency is the sum of its steps.
fn quiet() -> ModelConfig {
    ModelConfig {
        issue_gap_ns: 1_000_000,
        ..ModelConfig::default()
    }
}

fn run(kind: SchemeKind, cfg: &ModelConfig, events: &[Event]) -> (Sim, SchemeResult) {
    let mut s = Sim::new(kind, cfg);
    for e in events {
        s.event(e);
    }
    let r = s.finish();
    (s, r)
}

fn line(b: u8) -> Line {
    let mut l = [b; 64];
    l[0] = 0xA5; // non-zero, distinct per b
    l
}

/// Two different lines with the same ECC fingerprint (the code is linear: add a word whose check
/// byte is zero).
fn ecc_collision() -> (Line, Line) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let w = loop {
        let w: u64 = rng.gen();
        if w != 0 && encode(w) == 0 {
            break w;
        }
    };
    let a = line(1);
    let mut b = a;
    let x = u64::from_le_bytes(a[..8].try_into().unwrap()) ^ w;
    b[..8].copy_from_slice(&x.to_le_bytes());
    assert_ne!(a, b);
    assert_eq!(line_code(&a), line_code(&b));
    (a, b)
}

/// Two different lines with the same CRC-32C (birthday search, ~2^16 tries).
fn crc_collision() -> (Line, Line) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(10);
    let mut seen: HashMap<u32, Line> = HashMap::new();
    loop {
        let mut l = [0u8; 64];
        rng.fill(&mut l[..]);
        let c = crc32c::crc32c(&l);
        if let Some(o) = seen.get(&c) {
            if *o != l {
                return (*o, l);
            }
        }
        seen.insert(c, l);
    }
}

#[test]
fn baseline_writes_everything() {
    let ev = [
        Event::write(0, line(1)),
        Event::write(1, line(1)),
        Event::read(1),
    ];
    let (_, r) = run(SchemeKind::Baseline, &quiet(), &ev);
    assert_eq!((r.writes_eliminated, r.counts.data_writes), (0, 2));
    // Each write: pad 40 + PCM write 150; the read: PCM read 75 with the pad in parallel.
    assert_eq!(r.write_latency_sum_ns, 2 * 190);
    assert_eq!(r.read_latency_sum_ns, 75);
    assert_eq!(r.metadata_bytes, 0);
}

#[test]
fn esd_eliminates_a_duplicate_only_after_verification() {
    let x = line(7);
    let ev = [Event::write(0, x), Event::write(1, x), Event::read(1)];
    let (s, r) = run(SchemeKind::Esd, &quiet(), &ev);
    assert_eq!(r.writes_eliminated, 1);
    assert_eq!(r.counts.data_writes, 1);
    assert_eq!(r.counts.verify_reads, 1);
    assert_eq!(r.dedup.candidates, 1);
    // W1: EFIT 2 + pad 40 + write 150. W2: EFIT 2 + verify read 75 + compare 1 + AMT update 2.
    assert_eq!(r.write_latency_sum_ns, 192 + 80);
    // The read of the remapped line: AMT cache hit 2, then the 75 ns read (pad hidden).
    assert_eq!(r.read_latency_sum_ns, 77);
    // Energy = sum over events: EFIT get x2, EFIT put, AMT update, AMT read = 5 SRAM accesses;
    // pads: write, verify, read = 3; one PCM write; verify + data read = 2 PCM reads; 1 compare.
    let c = quiet().costs;
    let want =
        5.0 * c.meta_nj + 3.0 * c.aes_nj + c.pcm_write_nj + 2.0 * c.pcm_read_nj + c.compare_nj;
    assert!(
        (r.energy_nj - want).abs() < 1e-9,
        "{} vs {want}",
        r.energy_nj
    );
    assert_eq!(s.read_logical(1), x);
}

#[test]
fn an_ecc_collision_with_different_content_is_written() {
    let (a, b) = ecc_collision();
    for kind in [SchemeKind::Esd, SchemeKind::FsDedup] {
        let ev = [Event::write(0, a), Event::write(1, b), Event::write(2, a)];
        let (s, r) = run(kind, &quiet(), &ev);
        assert_eq!(r.dedup.collisions, 1, "{kind:?}");
        assert_eq!(r.counts.data_writes, 2, "{kind:?}");
        assert_eq!(r.writes_eliminated, 1, "{kind:?}");
        assert_eq!(
            (s.read_logical(0), s.read_logical(1), s.read_logical(2)),
            (a, b, a)
        );
    }
}

#[test]
fn dewrite_verifies_crc_candidates_and_writes_collisions() {
    let (a, b) = crc_collision();
    let ev = [
        Event::write(0, a),
        Event::write(1, b),
        Event::write(2, a),
        Event::write(3, b),
    ];
    let (s, r) = run(SchemeKind::DeWrite, &quiet(), &ev);
    // b collides with a's entry: read, compared, written. a again: found and verified.
    // b again: its CRC names a's line (one entry per CRC), compared, differs, written.
    assert_eq!(r.dedup.collisions, 2);
    assert_eq!(r.writes_eliminated, 1);
    assert_eq!(r.counts.verify_reads, 3);
    assert_eq!(r.counts.crc, 4);
    for (i, l) in [a, b, a, b].iter().enumerate() {
        assert_eq!(s.read_logical(i as u64), *l);
    }
    // First write, predicted unique: CRC 15 + cache miss -> PCM lookup 75 (+2 SRAM), the
    // parallel pad (40) is hidden, write 150.
    let (_, one) = run(SchemeKind::DeWrite, &quiet(), &ev[..1]);
    assert_eq!(one.write_latency_sum_ns, 15 + 2 + 75 + 150);
}

#[test]
fn sha1_trusts_its_fingerprint_and_pays_for_it() {
    let x = line(3);
    let ev = [Event::write(0, x), Event::write(1, x)];
    let (_, r) = run(SchemeKind::Sha1, &quiet(), &ev);
    assert_eq!(r.writes_eliminated, 1);
    assert_eq!(r.counts.verify_reads, 0);
    assert_eq!(r.counts.sha1, 2);
    // W1: SHA-1 321 + lookup (SRAM 2, miss: PCM 75) + pad 40 + write 150.
    // W2: SHA-1 321 + lookup (cache hit 2) + AMT update 2.
    assert_eq!(r.write_latency_sum_ns, (321 + 77 + 190) + (321 + 2 + 2));
}

#[test]
fn fsdedup_answers_verifications_from_the_prefetch_cache() {
    let x = line(4);
    let ev: Vec<Event> = (0..4).map(|i| Event::write(i, x)).collect();
    let (s, r) = run(SchemeKind::FsDedup, &quiet(), &ev);
    assert_eq!(r.writes_eliminated, 3);
    assert_eq!(r.counts.verify_reads, 1);
    assert_eq!(r.dedup.prefetch_hits, 2);
    let (_, e) = run(SchemeKind::Esd, &quiet(), &ev);
    assert_eq!(e.counts.verify_reads, 3);
    assert!(r.mean_write_latency_ns < e.mean_write_latency_ns);
    for i in 0..4 {
        assert_eq!(s.read_logical(i), x);
    }
}

#[test]
fn a_full_reference_count_stops_deduplication() {
    let cfg = ModelConfig {
        max_refs: 2,
        ..quiet()
    };
    let x = line(5);
    let ev: Vec<Event> = (0..3).map(|i| Event::write(i, x)).collect();
    for kind in [SchemeKind::Esd, SchemeKind::FsDedup] {
        let (_, r) = run(kind, &cfg, &ev);
        assert_eq!(
            (r.writes_eliminated, r.dedup.refcount_full),
            (1, 1),
            "{kind:?}"
        );
    }
}

/// The hot set ({A, B}, then {C, D}) changes halfway, with one new content per round; the EFIT
/// holds 4 entries. Without refresh A and B keep their slots at frequency ~60 and C, D and the
/// new contents evict each other at frequency 1 (C and D never hit); with refresh A and B fade.
#[test]
fn refresh_finds_more_duplicates_when_the_hot_set_changes() {
    let mut ev = Vec::new();
    let mut addr = 0;
    for phase in 0..2u8 {
        for _ in 0..60 {
            for k in 0..2u8 {
                ev.push(Event::write(addr, line(phase * 10 + k)));
                addr += 1;
            }
            // New contents enter between the hot ones and compete for slots.
            ev.push(Event::write(addr, line(100 + (addr % 97) as u8)));
            addr += 1;
        }
    }
    let base = ModelConfig {
        efit_bytes: 4 * 14,
        prefetch_bytes: 0,
        ..quiet()
    };
    let (_, esd) = run(SchemeKind::Esd, &base, &ev);
    let with = ModelConfig {
        refresh_ops: 12,
        refresh_interval_ns: 0,
        ..base
    };
    let (_, fs) = run(SchemeKind::FsDedup, &with, &ev);
    assert!(fs.dedup.efit_refreshes > 0);
    assert!(
        esd.writes_eliminated >= 110 && fs.writes_eliminated > esd.writes_eliminated + 80,
        "refresh {} vs none {}",
        fs.writes_eliminated,
        esd.writes_eliminated
    );
}

/// Random traces with duplicates, overwrites, small caches and a low reference cap: every scheme
/// returns, for every line, what was last written there; latency = service + wait.
#[test]
fn no_scheme_ever_loses_data() {
    for seed in 0..6u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (ca, cb) = ecc_collision();
        let pool: Vec<Line> = (0..20u8).map(line).chain([ca, cb, [0; 64]]).collect();
        let mut model: HashMap<u64, Line> = HashMap::new();
        let mut ev = Vec::new();
        for _ in 0..3000 {
            let a = rng.gen_range(0..200u64);
            if rng.gen_bool(0.3) {
                ev.push(Event::read(a));
                continue;
            }
            let l = if rng.gen_bool(0.7) {
                pool[rng.gen_range(0..pool.len())]
            } else {
                let mut l = [0u8; 64];
                rng.fill(&mut l[..]);
                l
            };
            model.insert(a, l);
            ev.push(Event::write(a, l));
        }
        let cfg = ModelConfig {
            efit_bytes: 8 * 14,
            prefetch_bytes: 6 * 72,
            amt_bytes: 16 * 10,
            fp_cache_bytes: 16 * 26,
            max_refs: 4,
            refresh_ops: 50,
            issue_gap_ns: 5,
            window: 8,
            ..ModelConfig::default()
        };
        for kind in SchemeKind::ALL {
            let (s, r) = run(kind, &cfg, &ev);
            for a in 0..200 {
                let want = model.get(&a).copied().unwrap_or([0; 64]);
                assert_eq!(s.read_logical(a), want, "{kind:?} seed {seed} line {a}");
            }
            assert_eq!(
                r.write_latency_sum_ns,
                r.write_service_sum_ns + r.write_wait_sum_ns
            );
            assert!(r.write_wait_sum_ns > 0, "{kind:?}: no contention at gap 5");
            let by_counts = r.counts.energy_nj(&cfg.costs);
            assert!((r.energy_nj - by_counts).abs() < 1e-6);
            assert_eq!(r.writes, r.writes_eliminated + r.counts.data_writes);
        }
    }
}
