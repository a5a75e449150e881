//! End-to-end checks of the engine API on a heap medium: format, dedup, release, clean
//! shutdown + normal recovery, failure recovery, and open-time validation.

use std::sync::Arc;

use nodup_core::engine::{FormatOptions, OpenOptions, OpenState};
use nodup_core::fingerprint::FpKind;
use nodup_core::media::{Medium, MemMedium};
use nodup_core::meta::MetaLayoutKind;
use nodup_core::policy::{PolicyKind, PrefetchMode};
use nodup_core::{Engine, Error, WriteCtx, BLOCK_SIZE};

fn block(seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK_SIZE];
    for (i, c) in v.chunks_mut(8).enumerate() {
        c.copy_from_slice(&(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64).to_le_bytes());
    }
    v
}

fn fmt(m: &Arc<MemMedium>, policy: PolicyKind, layout: MetaLayoutKind) -> Engine {
    let opts = FormatOptions {
        policy,
        meta_layout: layout,
        ..Default::default()
    };
    Engine::format(m.clone(), &opts, &OpenOptions::default()).unwrap()
}

#[test]
fn dedup_release_and_reuse() {
    for layout in [
        MetaLayoutKind::Region,
        MetaLayoutKind::Entry,
        MetaLayoutKind::Hashtable,
    ] {
        let m = Arc::new(MemMedium::new(8 << 20));
        let e = fmt(&m, PolicyKind::Light, layout);
        let mut ctx = WriteCtx::default();
        let a = block(1);
        let b = block(2);
        let r = e.write(&mut ctx, &[&a, &b, &a]).unwrap();
        assert_eq!(r[0], r[2]);
        assert_ne!(r[0], r[1]);
        let r2 = e.write(&mut ctx, &[&b]).unwrap();
        assert_eq!(r2[0], r[1]);
        let s = e.stats();
        assert_eq!(s.blocks_written, 4);
        assert_eq!(s.dedup_hits, 2);
        assert_eq!(s.index_entries, 2);
        assert_eq!(s.physical_bytes, 2 * BLOCK_SIZE as u64);
        let mut buf = vec![0u8; BLOCK_SIZE];
        e.read(r[1], &mut buf).unwrap();
        assert_eq!(buf, b);
        e.release(r[0]).unwrap();
        e.release(r[2]).unwrap();
        assert_eq!(e.stats().index_entries, 1);
        assert!(
            e.release(r[0]).is_err(),
            "{layout:?}: double release must fail"
        );
        e.release(r[1]).unwrap();
        e.release(r2[0]).unwrap();
        let s = e.stats();
        assert_eq!((s.index_entries, s.physical_bytes), (0, 0));
        assert_eq!(s.free_blocks, s.total_blocks - region_blocks(&e));
    }
}

fn region_blocks(e: &Engine) -> u64 {
    // Regions allocated from the data area stay allocated (GC-free); only the region layout has them.
    let s = e.stats();
    if s.meta_layout == "region" {
        s.total_blocks - s.free_blocks
    } else {
        0
    }
}

#[test]
fn clean_shutdown_reload_and_failure_recovery() {
    let m = Arc::new(MemMedium::new(8 << 20));
    let e = fmt(&m, PolicyKind::Light, MetaLayoutKind::Region);
    let mut ctx = WriteCtx::default();
    let data: Vec<Vec<u8>> = (0..300).map(|i| block(i % 100)).collect();
    let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    let got = e.write(&mut ctx, &refs).unwrap();
    let meta = e.alloc_meta(3).unwrap();
    let before = e.stats();
    e.shutdown().unwrap();
    assert!(e.write(&mut ctx, &refs[..1]).is_err());
    drop(e);

    let (e, st) = Engine::open(m.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(st, OpenState::Clean);
    let s = e.stats();
    assert_eq!(s.index_entries, before.index_entries);
    assert_eq!(s.free_blocks, before.free_blocks);
    assert_eq!(s.physical_bytes, before.physical_bytes);
    let again = e.write(&mut WriteCtx::default(), &refs[..100]).unwrap();
    assert_eq!(&again[..], &got[..100]);
    drop(e); // no shutdown: a crash

    let (e, st) = Engine::open(m.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(st, OpenState::NeedsRecovery);
    assert!(matches!(
        e.write(&mut WriteCtx::default(), &refs[..1]),
        Err(Error::NeedsRecovery)
    ));
    // The caller only kept the first call's references (the second call's are "lost").
    let rep = e
        .recover(&mut got.iter().copied(), &mut meta.iter().copied())
        .unwrap();
    assert!(rep.refcounts_fixed > 0);
    let s = e.stats();
    assert_eq!(s.index_entries, 100);
    assert_eq!(s.free_blocks, before.free_blocks);
    for (i, &b) in got.iter().enumerate() {
        let mut buf = vec![0u8; BLOCK_SIZE];
        e.read(b, &mut buf).unwrap();
        assert_eq!(buf, data[i]);
    }
    // Releasing every reference frees every data block.
    for &b in &got {
        e.release(b).unwrap();
    }
    assert_eq!(e.stats().physical_bytes, 0);
    assert_eq!(e.stats().index_entries, 0);
}

/// An engine of `policy` on a heap medium with 64 distinct blocks written (their data and
/// where they went) and every other one released again.
fn every_other_released(policy: PolicyKind) -> (Arc<MemMedium>, Engine, Vec<Vec<u8>>, Vec<u64>) {
    let m = Arc::new(MemMedium::new(8 << 20));
    let e = fmt(&m, policy, MetaLayoutKind::Region);
    let data: Vec<Vec<u8>> = (0..64).map(block).collect();
    let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    let got = e.write(&mut WriteCtx::default(), &refs).unwrap();
    for &b in got.iter().step_by(2) {
        e.release(b).unwrap();
    }
    (m, e, data, got)
}

/// A clean shutdown gives the free blocks of the data area back to the medium's holder
/// (`Medium::discard`; a heap medium marks them) and nothing else: the blocks still
/// referenced read back after the next open, also for blocks freed and blocks never used.
#[test]
fn shutdown_discards_the_free_blocks_and_only_them() {
    for policy in [PolicyKind::Light, PolicyKind::Smart] {
        let (m, e, data, got) = every_other_released(policy);
        let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
        e.shutdown().unwrap();
        drop(e);
        let bs = BLOCK_SIZE as u64;
        let mut buf = vec![0u8; BLOCK_SIZE];
        for &b in got.iter().step_by(2) {
            m.read(b * bs, &mut buf).unwrap();
            assert!(
                buf.iter().all(|&x| x == nodup_core::media::DISCARDED),
                "{policy:?}: freed block {b} not discarded"
            );
        }
        let (e, st) = Engine::open(m.clone(), &OpenOptions::default()).unwrap();
        assert_eq!(st, OpenState::Clean);
        // What the engine keeps in data-area blocks (smart's fingerprint groups) is whole.
        assert_eq!(e.store_problems(), Vec::<String>::new(), "{policy:?}");
        for (i, &b) in got.iter().enumerate().skip(1).step_by(2) {
            e.read(b, &mut buf).unwrap();
            assert_eq!(buf, data[i], "{policy:?}: block {b} lost");
        }
        // The freed blocks are taken again and hold what is written to them.
        let again = e.write(&mut WriteCtx::default(), &refs).unwrap();
        for (i, &b) in again.iter().enumerate() {
            e.read(b, &mut buf).unwrap();
            assert_eq!(buf, data[i], "{policy:?}: rewritten block {b}");
        }
    }
}

/// A trim while running (`fstrim`) gives back exactly the free blocks of its range, in runs
/// of its minimum; what is referenced stays, new writes land in what was given back, and a
/// clean shutdown afterwards has nothing left to give back.
#[test]
fn a_trim_while_running_gives_back_the_free_blocks_of_its_range() {
    let bs = BLOCK_SIZE as u64;
    for policy in [PolicyKind::Light, PolicyKind::Smart] {
        let (m, e, data, got) = every_other_released(policy);
        let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
        let discarded = |b: u64| {
            let mut buf = vec![0u8; BLOCK_SIZE];
            m.read(b * bs, &mut buf).unwrap();
            buf.iter().all(|&x| x == nodup_core::media::DISCARDED)
        };
        // One freed block, by its byte range; none of a range that holds no whole block.
        assert_eq!(e.trim(got[0] * bs, bs, 0).unwrap(), Some(bs));
        assert!(discarded(got[0]) && !discarded(got[2]), "{policy:?}");
        assert_eq!(e.trim(got[2] * bs + 1, bs, 0).unwrap(), Some(0));
        // Runs shorter than the minimum stay (the freed blocks lie one apart).
        let long = e.trim(0, u64::MAX, 2 * bs).unwrap().unwrap();
        assert!(long > 0 && !discarded(got[4]), "{policy:?}");
        let free = e.stats().free_blocks;
        let whole = e.trim(0, u64::MAX, 0).unwrap().unwrap();
        assert_eq!(whole, free * bs, "{policy:?}: every free block, once each");
        for (i, &b) in got.iter().enumerate() {
            assert_eq!(discarded(b), i % 2 == 0, "{policy:?}: block {b}");
        }
        let mut buf = vec![0u8; BLOCK_SIZE];
        for (i, &b) in got.iter().enumerate().skip(1).step_by(2) {
            e.read(b, &mut buf).unwrap();
            assert_eq!(buf, data[i], "{policy:?}: block {b} lost");
        }
        let again = e.write(&mut WriteCtx::default(), &refs).unwrap();
        for (i, &b) in again.iter().enumerate() {
            e.read(b, &mut buf).unwrap();
            assert_eq!(buf, data[i], "{policy:?}: rewritten block {b}");
        }
        e.shutdown().unwrap();
        assert_eq!(
            e.given_back().unwrap().unwrap(),
            0,
            "{policy:?}: trimmed already"
        );
        drop(e);
        let (e, st) = Engine::open(m.clone(), &OpenOptions::default()).unwrap();
        assert_eq!(st, OpenState::Clean);
        assert_eq!(e.store_problems(), Vec::<String>::new(), "{policy:?}");
        for (i, &b) in again.iter().enumerate() {
            e.read(b, &mut buf).unwrap();
            assert_eq!(buf, data[i], "{policy:?}: block {b} after the reopen");
        }
    }
}

/// A `smart` budget this machine cannot reserve (asked at open, or recorded by a larger
/// machine) is an error from the engine, not an allocation abort of the embedding process,
/// and leaves the image as it was.
#[test]
fn a_budget_beyond_this_machine_is_an_error_not_an_abort() {
    // Its read cache alone (an eighth) would be 2^59 bytes: more than any address space.
    let huge = 1u64 << 62;
    let m = Arc::new(MemMedium::new(8 << 20));
    let too_big = FormatOptions {
        policy: PolicyKind::Smart,
        mem_budget: huge,
        ..Default::default()
    };
    let err = Engine::format(m.clone(), &too_big, &OpenOptions::default())
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, Error::NoMemory(_)), "{err}");

    let e = fmt(&m, PolicyKind::Smart, MetaLayoutKind::Region);
    let a = block(7);
    let r = e.write(&mut WriteCtx::default(), &[&a, &a]).unwrap();
    e.shutdown().unwrap();
    drop(e);
    let asked = OpenOptions {
        mem_budget: Some(huge),
        ..Default::default()
    };
    let err = Engine::open(m.clone(), &asked).map(|_| ()).unwrap_err();
    assert!(matches!(err, Error::NoMemory(_)), "{err}");
    assert!(err.to_string().contains("smaller budget"), "{err}");

    // Untouched: it opens clean with its own budget and reads back.
    let (e, st) = Engine::open(m.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(st, OpenState::Clean);
    let mut buf = vec![0u8; BLOCK_SIZE];
    e.read(r[1], &mut buf).unwrap();
    assert_eq!(buf, a);
}

#[test]
fn open_rejects_foreign_and_corrupt_images() {
    let m = Arc::new(MemMedium::new(4 << 20));
    assert!(matches!(
        Engine::open(m.clone(), &OpenOptions::default()),
        Err(Error::NotNodup(_))
    ));
    let tiny = Arc::new(MemMedium::new(100));
    assert!(matches!(
        Engine::open(tiny, &OpenOptions::default()),
        Err(Error::NotNodup(_))
    ));
    let e = fmt(&m, PolicyKind::Light, MetaLayoutKind::Region);
    e.shutdown().unwrap();
    m.write(20, &[0xff]).unwrap();
    assert!(matches!(
        Engine::open(m.clone(), &OpenOptions::default()),
        Err(Error::Corrupt(_))
    ));
}

#[test]
fn policies_behave() {
    for policy in [
        PolicyKind::None,
        PolicyKind::Strong,
        PolicyKind::WeakVerify,
        PolicyKind::Light,
        PolicyKind::Smart,
        PolicyKind::Selective,
    ] {
        for pf in PrefetchMode::ALL {
            let m = Arc::new(MemMedium::new(8 << 20));
            let opts = FormatOptions {
                policy,
                // `block()` varies every word by the same seed pattern, so the 64 lines of a
                // block XOR-fold to the same ECC for every seed: selective's default
                // fingerprint would call them all collisions (correctly stored apart).
                fingerprint: if policy == PolicyKind::Selective {
                    FpKind::Crc32c
                } else {
                    FpKind::Xxh3
                },
                ..Default::default()
            };
            let oo = OpenOptions {
                prefetch: pf,
                ..Default::default()
            };
            let e = Engine::format(m.clone(), &opts, &oo).unwrap();
            let mut ctx = WriteCtx::default();
            let data: Vec<Vec<u8>> = (0..64).map(block).collect();
            let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
            let first = e.write(&mut ctx, &refs).unwrap();
            let second = e.write(&mut ctx, &refs).unwrap();
            let third = e.write(&mut ctx, &refs).unwrap();
            if policy == PolicyKind::None {
                assert_eq!(e.stats().dedup_hits, 0);
                assert_ne!(first, second);
            } else {
                assert_eq!(first, second, "{policy:?} {pf:?}");
                assert_eq!(first, third);
                assert_eq!(e.stats().dedup_hits, 128);
                if policy == PolicyKind::Light && pf != PrefetchMode::None {
                    assert!(e.stats().hint_hits > 0, "{pf:?}");
                }
            }
        }
    }
}

#[test]
fn out_of_space_fails_cleanly_and_keeps_invariants() {
    for layout in [
        MetaLayoutKind::Region,
        MetaLayoutKind::Entry,
        MetaLayoutKind::Hashtable,
    ] {
        let m = Arc::new(MemMedium::new(1 << 20));
        let e = fmt(&m, PolicyKind::Light, layout);
        let mut ctx = WriteCtx::default();
        let mut held = Vec::new();
        let mut i = 0u64;
        let err = loop {
            let data: Vec<Vec<u8>> = (0..8).map(|k| block(1000 + i * 8 + k)).collect();
            let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
            match e.write(&mut ctx, &refs) {
                Ok(b) => held.extend(b),
                Err(err) => break err,
            }
            i += 1;
        };
        assert!(matches!(err, Error::NoSpace), "{layout:?}: {err}");
        let a = e.audit().unwrap();
        assert!(a.problems.is_empty(), "{layout:?}: {:?}", a.problems);
        assert_eq!(
            e.stats().physical_bytes,
            held.len() as u64 * BLOCK_SIZE as u64
        );
        // Duplicates of stored data still fit, and freeing makes room again.
        let d = block(1000);
        let again = e.write(&mut ctx, &[&d]).unwrap();
        assert_eq!(again[0], held[0]);
        e.release_batch(&held).unwrap();
        e.release(again[0]).unwrap();
        assert_eq!(e.stats().physical_bytes, 0);
        assert!(e.write(&mut ctx, &[&block(5)]).is_ok());
    }
}

#[test]
fn hints_to_freed_and_reused_entries_never_mislead() {
    // Light-Dedup bug class: an entry being freed stayed reachable through other entries'
    // hints. Build hints A→B→C, free B, reuse its slot for D, then write A, B again.
    // The entry layout's LIFO free list hands B's slot to D, so A's hint names D's entry.
    for (pf, layout) in [
        PrefetchMode::Sp,
        PrefetchMode::Pn,
        PrefetchMode::Cbp,
        PrefetchMode::Pc,
    ]
    .into_iter()
    .flat_map(|p| [(p, MetaLayoutKind::Entry), (p, MetaLayoutKind::Region)])
    {
        let m = Arc::new(MemMedium::new(8 << 20));
        let oo = OpenOptions {
            prefetch: pf,
            ..Default::default()
        };
        let fo = FormatOptions {
            meta_layout: layout,
            ..Default::default()
        };
        let e = Engine::format(m, &fo, &oo).unwrap();
        let mut ctx = WriteCtx::default();
        let (a, b, c, d) = (block(1), block(2), block(3), block(4));
        let first = e.write(&mut ctx, &[&a, &b, &c]).unwrap();
        let second = e.write(&mut ctx, &[&a, &b, &c]).unwrap();
        assert_eq!(first, second);
        e.release_batch(&[first[1], second[1]]).unwrap();
        let dd = e.write(&mut WriteCtx::default(), &[&d]).unwrap();
        let third = e.write(&mut ctx, &[&a, &b, &c, &d]).unwrap();
        assert_eq!(third[0], first[0]);
        assert_eq!(third[2], first[2]);
        assert_eq!(third[3], dd[0]);
        let mut buf = vec![0u8; BLOCK_SIZE];
        for (blk, want) in third.iter().zip([&a, &b, &c, &d]) {
            e.read(*blk, &mut buf).unwrap();
            assert_eq!(&buf, want, "{pf:?}");
        }
        let au = e.audit().unwrap();
        assert!(au.problems.is_empty(), "{pf:?}: {:?}", au.problems);
        assert!(
            e.stats().hint_misses > 0 || layout == MetaLayoutKind::Region,
            "{pf:?}"
        );
    }
}

#[test]
fn normal_recovery_is_reported_and_batches_release() {
    let m = Arc::new(MemMedium::new(8 << 20));
    let e = fmt(&m, PolicyKind::Light, MetaLayoutKind::Region);
    let data: Vec<Vec<u8>> = (0..40).map(|i| block(i % 10)).collect();
    let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    let got = e.write(&mut WriteCtx::default(), &refs).unwrap();
    e.shutdown().unwrap();
    let (e, st) = Engine::open(m.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(st, OpenState::Clean);
    let rep = e.open_report().unwrap();
    assert_eq!(rep.entries_scanned, 10);
    assert!(rep.seconds >= 0.0);
    // Releasing a block once too often in a batch is refused.
    let mut over = got.clone();
    over.push(got[0]);
    assert!(e.release_batch(&over).is_err());
    assert_eq!(e.stats().physical_bytes, 0);
}

/// A media error while `share` writes its reference counts puts them back: the engine keeps
/// serving and the counts stay the caller's (it used to leave them too high and ask for
/// failure recovery, which the fault campaign reported as an unusable file system).
#[test]
fn a_failed_share_leaves_the_counts_as_they_were() {
    use nodup_core::media::{FaultMedium, FaultOp, FaultRule};
    let rules = [
        ("write", FaultRule::new(FaultOp::Write).nth(1).once()),
        (
            "short write",
            FaultRule::new(FaultOp::Write).nth(1).once().short_write(40),
        ),
        ("fence", FaultRule::new(FaultOp::Fence).nth(1).once()),
    ];
    for (nth, rule) in rules {
        let mem: Arc<dyn Medium> = Arc::new(MemMedium::new(16 << 20));
        let fm = Arc::new(FaultMedium::new(mem, 7));
        let e = Engine::format(
            fm.clone(),
            &FormatOptions::default(),
            &OpenOptions::default(),
        )
        .unwrap();
        let mut ctx = WriteCtx::default();
        let data: Vec<Vec<u8>> = (0..8).map(block).collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let got = e.write(&mut ctx, &refs).unwrap();
        fm.add_rule(rule);
        let r = e.share(&got);
        fm.clear_rules();
        assert!(
            r.is_err(),
            "nth {nth}: the injected fault must reach the caller"
        );
        for &b in &got {
            assert_eq!(
                e.block_refcount(b).unwrap(),
                Some(1),
                "nth {nth}: block {b}"
            );
        }
        // Still serving: another share works and counts.
        assert!(e.share(&got).unwrap().iter().all(|&s| s));
        assert_eq!(e.block_refcount(got[0]).unwrap(), Some(2));
        let a = e.audit().unwrap();
        assert!(a.problems.is_empty(), "nth {nth}: {:?}", a.problems);
    }
}
