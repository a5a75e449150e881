//! The `selective` store on its own and through the engine: hot fingerprints kept within the
//! budget, verification answered by the prefetch cache, nothing stale ever confirms a block.

use super::*;
use crate::engine::{FormatOptions, OpenOptions};
use crate::media::mem::MemMedium;
use crate::store::FpStore;
use crate::{Engine, WriteCtx};
use std::sync::Arc;

fn opts(fp_cache: u64, prefetch: u64) -> SelectiveOptions {
    SelectiveOptions {
        fp_cache_bytes: fp_cache,
        prefetch_bytes: prefetch,
        refresh_ms: None,
        refresh_ops: None,
    }
}

#[test]
fn memory_is_reserved_within_the_budget_and_never_grows() {
    for budget in [4 << 10, 64 << 10, 512 << 10] {
        let s = SelectiveStore::new(opts(budget, 0)).unwrap();
        let before = s.memory_bytes();
        assert!(before <= budget, "{before} > {budget}");
        let cap = s.capacity() as u64;
        assert!(cap > budget / 200, "capacity {cap} for {budget} B");
        // Distinct frequencies for every entry: the worst case of the frequency lists.
        for k in 0..cap * 3 {
            s.insert(k, k * 64);
            for _ in 0..(k % 97) {
                s.find(k, &mut |_| true);
            }
        }
        assert_eq!(s.len(), cap);
        assert_eq!(s.memory_bytes(), before, "budget {budget}");
    }
}

#[test]
fn hot_fingerprints_survive_a_stream_of_cold_ones() {
    let s = SelectiveStore::new(opts(8 << 10, 0)).unwrap();
    let cap = s.capacity() as u64;
    for hot in 0..4u64 {
        s.insert(hot, hot * 64);
        for _ in 0..10 {
            assert_eq!(s.find(hot, &mut |_| true), Some(hot * 64));
        }
    }
    for cold in 1000..1000 + 10 * cap {
        s.insert(cold, cold * 64);
    }
    for hot in 0..4u64 {
        assert_eq!(
            s.find(hot, &mut |_| true),
            Some(hot * 64),
            "hot {hot} evicted"
        );
    }
    assert!(s.find(1000, &mut |_| true).is_none());
}

#[test]
fn prefetch_answers_verification_until_the_entry_is_freed() {
    let s = SelectiveStore::new(opts(8 << 10, 16 << 10)).unwrap();
    let a = vec![7u8; crate::BLOCK_SIZE];
    let b = vec![8u8; crate::BLOCK_SIZE];
    s.insert(5, 640);
    assert_eq!(s.verify_cached(5, 100, &a), None);
    s.on_verified(5, 640, 100, &a);
    assert_eq!(s.verify_cached(5, 100, &a), Some(true));
    assert_eq!(s.verify_cached(5, 100, &b), Some(false));
    // The entry goes: block 100 may be reused for other content, so nothing is answered.
    s.remove(5, 640);
    assert_eq!(s.verify_cached(5, 100, &b), None);
    assert!(s.find(5, &mut |_| true).is_none());
}

#[test]
fn eviction_from_the_lrcu_drops_the_prefetched_content() {
    let s = SelectiveStore::new(opts(4 << 10, 64 << 10)).unwrap();
    let cap = s.capacity() as u64;
    let a = vec![1u8; crate::BLOCK_SIZE];
    s.insert(1, 64);
    s.on_verified(1, 64, 9, &a);
    for k in 100..100 + 2 * cap {
        s.insert(k, k * 64);
    }
    assert!(s.find(1, &mut |_| true).is_none());
    // Block 9's entry may still live, but the store no longer vouches for its content.
    assert_eq!(s.verify_cached(1, 9, &a), None);
}

#[test]
fn engine_finds_hot_duplicates_and_reads_less_with_prefetch() {
    let run = |prefetch: u64| {
        let m = Arc::new(MemMedium::new(32 << 20));
        let f = FormatOptions {
            policy: PolicyKind::Selective,
            ..Default::default()
        };
        let o = OpenOptions {
            policy: crate::policy::PolicyOptions {
                selective: opts(64 << 10, prefetch),
                ..Default::default()
            },
            ..OpenOptions::default()
        };
        let e = Engine::format(m, &f, &o).expect("format");
        let mut ctx = WriteCtx::default();
        // Every word varies: ECC fingerprints of sparse blocks collide often (8 check bits per
        // word), which would add verification reads unrelated to the prefetch cache.
        let block = |n: u64| {
            let mut b = vec![0u8; crate::BLOCK_SIZE];
            for (i, w) in b.chunks_exact_mut(8).enumerate() {
                let x = (n * 4099 + i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                w.copy_from_slice(&(x ^ (x >> 29)).to_le_bytes());
            }
            b
        };
        // Four hot contents written over and over among unique ones.
        for round in 0..200u64 {
            let blocks: Vec<Vec<u8>> = (0..8)
                .map(|i| {
                    if i % 2 == 0 {
                        block(i % 4)
                    } else {
                        block(1000 + round * 8 + i)
                    }
                })
                .collect();
            let refs: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
            e.write(&mut ctx, &refs).expect("write");
        }
        let s = e.stats();
        (s.dedup_hits, s.media_bytes_read)
    };
    let (hits_off, read_off) = run(0);
    let (hits_on, read_on) = run(64 << 10);
    assert_eq!(hits_off, hits_on);
    assert!(hits_on >= 4 * 200 - 8, "hits {hits_on}");
    assert!(
        read_on * 10 < read_off,
        "read {read_on} with prefetch, {read_off} without"
    );
}

/// A fingerprint cache this machine cannot reserve is an error, not an abort of the process.
#[test]
fn a_cache_beyond_this_machine_is_an_error_not_an_abort() {
    let err = SelectiveStore::new(opts(1 << 62, 0))
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, crate::Error::NoMemory(_)), "{err}");
    assert!(err.to_string().contains("--fp-cache"), "{err}");
}
