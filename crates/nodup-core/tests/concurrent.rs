//! Concurrent writers: threads writing the same new content at the same time never create two
//! entries for equal content, every block reads back, and reference counts add up.

use std::collections::HashMap;
use std::sync::Arc;

use nodup_core::engine::{FormatOptions, OpenOptions};
use nodup_core::media::MemMedium;
use nodup_core::meta::MetaLayoutKind;
use nodup_core::{BlockNr, Engine, WriteCtx, BLOCK_SIZE};

fn content(c: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK_SIZE];
    for (i, w) in v.chunks_mut(8).enumerate() {
        w.copy_from_slice(&(c.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64).to_le_bytes());
    }
    v
}

#[test]
fn racing_writers_of_equal_content_keep_one_entry() {
    for layout in [
        MetaLayoutKind::Region,
        MetaLayoutKind::Entry,
        MetaLayoutKind::Hashtable,
    ] {
        let m = Arc::new(MemMedium::new(16 << 20));
        let fopts = FormatOptions {
            meta_layout: layout,
            ..Default::default()
        };
        let oo = OpenOptions {
            transition_threshold: 2,
            ..Default::default()
        };
        let e = Arc::new(Engine::format(m, &fopts, &oo).unwrap());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let e = e.clone();
                std::thread::spawn(move || {
                    let mut ctx = WriteCtx::default();
                    let mut held: Vec<(BlockNr, u64)> = Vec::new();
                    for round in 0..60u64 {
                        // Every thread writes the same contents in the same order (maximal races),
                        // with a per-thread twist so some blocks are private.
                        let ids: Vec<u64> = (0..16)
                            .map(|i| {
                                if i % 5 == 4 {
                                    1000 + t * 100 + round
                                } else {
                                    round * 7 + i
                                }
                            })
                            .collect();
                        let data: Vec<Vec<u8>> = ids.iter().map(|&c| content(c)).collect();
                        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
                        let got = e.write(&mut ctx, &refs).unwrap();
                        held.extend(got.into_iter().zip(ids));
                        if round % 3 == 2 {
                            for (b, _) in held.drain(..held.len() / 2) {
                                e.release(b).unwrap();
                            }
                        }
                    }
                    held
                })
            })
            .collect();
        let mut held = Vec::new();
        for t in threads {
            held.extend(t.join().unwrap());
        }
        let mut count: HashMap<BlockNr, u64> = HashMap::new();
        let mut buf = vec![0u8; BLOCK_SIZE];
        for &(b, c) in &held {
            e.read(b, &mut buf).unwrap();
            assert!(buf == content(c), "{layout:?}: block {b} lost content {c}");
            *count.entry(b).or_default() += 1;
        }
        let mut entry_of_content: HashMap<u64, BlockNr> = HashMap::new();
        for &(b, c) in &held {
            match e.block_refcount(b).unwrap() {
                Some(rc) => {
                    assert_eq!(rc, count[&b], "{layout:?}: refcount of {b}");
                    let first = *entry_of_content.entry(c).or_insert(b);
                    assert_eq!(first, b, "{layout:?}: content {c} has two entries");
                }
                None => assert_eq!(count[&b], 1),
            }
        }
        let a = e.audit().unwrap();
        assert!(a.problems.is_empty(), "{layout:?}: {:?}", a.problems);
        let s = e.stats();
        assert_eq!(s.physical_bytes, count.len() as u64 * BLOCK_SIZE as u64);
        assert!(s.dedup_hits > 0);
        for (b, _) in held {
            e.release(b).unwrap();
        }
        assert_eq!(e.stats().physical_bytes, 0);
        assert_eq!(e.stats().index_entries, 0);
    }
}

/// The hash lock: threads writing the same new data at the same time store it once. Before it,
/// the loser of each race stored a second, entry-less copy (four threads writing the same 16 MiB
/// used 16–23 MiB).
#[test]
fn concurrent_identical_first_writes_store_the_data_once() {
    const BLOCKS: u64 = 2048; // 8 MiB per thread
    const CALL: usize = 64; // 256 KiB calls
    let m = Arc::new(MemMedium::new(64 << 20));
    let e =
        Arc::new(Engine::format(m, &FormatOptions::default(), &OpenOptions::default()).unwrap());
    let barrier = Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (e, barrier) = (e.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut ctx = WriteCtx::default();
                let data: Vec<Vec<u8>> = (0..BLOCKS).map(content).collect();
                barrier.wait();
                let mut got = Vec::new();
                for call in data.chunks(CALL) {
                    let refs: Vec<&[u8]> = call.iter().map(|d| d.as_slice()).collect();
                    got.extend(e.write(&mut ctx, &refs).unwrap());
                }
                got
            })
        })
        .collect();
    let got: Vec<Vec<BlockNr>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let mut buf = vec![0u8; BLOCK_SIZE];
    for g in &got {
        for (c, &b) in g.iter().enumerate() {
            e.read(b, &mut buf).unwrap();
            assert!(buf == content(c as u64), "block {b} lost content {c}");
        }
    }
    let s = e.stats();
    assert_eq!(s.blocks_written, 4 * BLOCKS);
    assert_eq!(
        s.physical_bytes,
        BLOCKS * BLOCK_SIZE as u64,
        "four writers of the same {BLOCKS} blocks"
    );
    assert!(e.audit().unwrap().problems.is_empty());
    for g in got {
        for b in g {
            e.release(b).unwrap();
        }
    }
    assert_eq!(e.stats().physical_bytes, 0);
}
