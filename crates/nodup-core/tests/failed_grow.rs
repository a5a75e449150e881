//! A region grow whose link write fails (whole, or after its bytes landed) and whose write
//! ending the chain at the tail again fails too: the block must not stay allocated with
//! nothing holding it while the engine carries on, and the image must open again after the
//! clean shutdown that follows (the chain on the medium may name the block).

use std::sync::Arc;

use nodup_core::engine::{FormatOptions, OpenOptions, OpenState};
use nodup_core::media::{FaultMedium, FaultOp, FaultRule, Medium, MemMedium};
use nodup_core::meta::region::{OFF_MAGIC, OFF_NEXT, REGION_ENTRIES, REGION_MAGIC};
use nodup_core::meta::MetaLayoutKind;
use nodup_core::policy::PolicyKind;
use nodup_core::{Engine, WriteCtx, BLOCK_SIZE};

fn block(seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK_SIZE];
    for (i, c) in v.chunks_mut(8).enumerate() {
        c.copy_from_slice(&(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64).to_le_bytes());
    }
    v
}

#[test]
fn a_grow_whose_link_and_its_undo_fail_leaks_nothing_and_reopens() {
    let bs = BLOCK_SIZE as u64;
    let mut problems = Vec::new();
    for landed in [false, true] {
        let what = format!("link write failing (landed {landed}), then the chain's re-end");
        let mem = Arc::new(MemMedium::new(8 << 20));
        let fm = Arc::new(FaultMedium::new(mem.clone(), 1));
        let opts = FormatOptions {
            policy: PolicyKind::Light,
            meta_layout: MetaLayoutKind::Region,
            ..Default::default()
        };
        let e = Engine::format(fm.clone(), &opts, &OpenOptions::default()).unwrap();
        // The header region (the chain's only block, so its tail) sits before the data area.
        let (data_start, _) = e.data_area();
        let head = (0..data_start)
            .find(|&b| {
                let mut m = [0u8; 8];
                mem.read(b * bs + OFF_MAGIC, &mut m).unwrap();
                u64::from_le_bytes(m) == REGION_MAGIC
            })
            .expect("a header region");
        // Fill it: the next new block needs a new region.
        let mut ctx = WriteCtx::default();
        let mut held = Vec::new();
        for i in 0..REGION_ENTRIES {
            held.extend(e.write(&mut ctx, &[&block(i)]).unwrap());
        }
        assert_eq!(e.layout_owned_blocks(), 0);
        let next_at = head * bs + OFF_NEXT;
        // Added first, checked first: the second write of the tail's link (the re-end) fails.
        fm.add_rule(
            FaultRule::new(FaultOp::Write)
                .range(next_at, 8)
                .nth(2)
                .once(),
        );
        let link = FaultRule::new(FaultOp::Write)
            .range(next_at, 8)
            .nth(1)
            .once();
        fm.add_rule(if landed {
            link.short_write(usize::MAX)
        } else {
            link
        });
        let free = e.stats().free_blocks;
        assert!(e.write(&mut ctx, &[&block(9999)]).is_err(), "{what}");
        assert_eq!(fm.injected(), 2, "{what}: both faults fired");
        fm.clear_rules();
        // Either the block went back, or the engine gave up its live state (failure recovery
        // at the next open rebuilds the allocator and the region list from the medium).
        if e.check_ready().is_ok() && e.stats().free_blocks != free {
            problems.push(format!(
                "{what}: the engine carries on with {} block(s) allocated that nothing holds",
                free - e.stats().free_blocks
            ));
        }
        let _ = e.shutdown();
        drop(e);
        let m: Arc<dyn Medium> = mem.clone();
        let (e2, st) = match Engine::open(m, &OpenOptions::default()) {
            Ok(x) => x,
            Err(err) => {
                problems.push(format!("{what}: the image does not open again: {err}"));
                continue;
            }
        };
        if st == OpenState::NeedsRecovery {
            e2.recover(&mut held.iter().copied(), &mut std::iter::empty())
                .unwrap();
        }
        let s = e2.stats();
        let accounted = held.len() as u64 + e2.layout_owned_blocks() + s.free_blocks;
        if accounted != s.total_blocks {
            problems.push(format!(
                "{what}: after reopening, {} allocated block(s) held by nothing",
                s.total_blocks - accounted
            ));
        }
        let mut ctx = WriteCtx::default();
        e2.write(&mut ctx, &[&block(10_000)]).unwrap();
        let a = e2.audit().unwrap();
        if !a.problems.is_empty() {
            problems.push(format!("{what}: audit: {:?}", a.problems));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}
