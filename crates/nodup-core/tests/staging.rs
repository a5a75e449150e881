//! Staging on a mapped medium copies a block ahead of its lookup while the stream writes new
//! data. A stream that alternates short new runs with duplicate runs must stop paying those
//! copies for blocks that turn out duplicates (their media writes are wasted), while a stream
//! of new data keeps them (every copy is used).

use std::sync::Arc;

use nodup_core::engine::{FormatOptions, OpenOptions};
use nodup_core::media::pmem::Pmem;
use nodup_core::media::Medium;
use nodup_core::policy::PolicyKind;
use nodup_core::{Engine, WriteCtx, BLOCK_SIZE};

fn block(seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK_SIZE];
    for (i, c) in v.chunks_mut(8).enumerate() {
        c.copy_from_slice(&(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64).to_le_bytes());
    }
    v
}

fn engine(dir: &tempfile::TempDir) -> Engine {
    let p = Pmem::create(dir.path().join("img"), 64 << 20).unwrap();
    let m: Arc<dyn Medium> = Arc::new(p);
    let opts = FormatOptions {
        policy: PolicyKind::Light,
        ..Default::default()
    };
    Engine::format(m, &opts, &OpenOptions::default()).unwrap()
}

/// Media bytes written beyond the new blocks' own, in blocks.
fn wasted(e: &Engine, before: (u64, u64, u64)) -> u64 {
    let s = e.stats();
    let written = s.media_bytes_written - before.0;
    let new = (s.blocks_written - before.1) - (s.dedup_hits - before.2);
    written / BLOCK_SIZE as u64 - new
}

fn mark(e: &Engine) -> (u64, u64, u64) {
    let s = e.stats();
    (s.media_bytes_written, s.blocks_written, s.dedup_hits)
}

#[test]
fn alternating_runs_stop_wasting_staged_copies() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let e = engine(&dir);
    let mut ctx = WriteCtx::default();
    let old: Vec<Vec<u8>> = (0..1024).map(block).collect();
    let refs: Vec<&[u8]> = old.iter().map(|b| b.as_slice()).collect();
    e.write(&mut ctx, &refs).unwrap();
    let m = mark(&e);
    let mut fresh = 1_000_000;
    let mut first = 0;
    for call in 0..64u64 {
        // 6 new blocks, then 26 of the old ones (a run of duplicates).
        let mut data: Vec<Vec<u8>> = (0..6)
            .map(|_| {
                fresh += 1;
                block(fresh)
            })
            .collect();
        let at = (call * 26) % 990;
        data.extend((at..at + 26).map(|k| old[k as usize].clone()));
        let refs: Vec<&[u8]> = data.iter().map(|b| b.as_slice()).collect();
        e.write(&mut ctx, &refs).unwrap();
        if call == 3 {
            first = wasted(&e, m);
        }
    }
    let total = wasted(&e, m);
    let later = total - first;
    eprintln!("wasted copies: {first} in the first 4 calls, {later} in the next 60");
    assert!(
        first > 0,
        "the first transitions stage ahead and waste some copies"
    );
    assert!(
        later <= first,
        "{later} wasted in 60 calls after {first} in 4: staging kept copying ahead"
    );
}

#[test]
fn a_stream_of_new_data_wastes_nothing() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let e = engine(&dir);
    let mut ctx = WriteCtx::default();
    let m = mark(&e);
    for call in 0..32u64 {
        let data: Vec<Vec<u8>> = (0..64).map(|k| block(call * 64 + k)).collect();
        let refs: Vec<&[u8]> = data.iter().map(|b| b.as_slice()).collect();
        e.write(&mut ctx, &refs).unwrap();
    }
    assert_eq!(wasted(&e, m), 0);
}
