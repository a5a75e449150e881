//! Aging helper for tests and benches: fragment free space the way a long-lived file system does.

use super::Allocator;
use crate::{BlockNr, Result};
use rand::{Rng, SeedableRng};

/// Allocate about `fill` (0..=1) of the free blocks, then free a random `punch` (0..=1) share of
/// them, leaving holes scattered over the data area. Returns the blocks that stay allocated, so
/// the caller can free them later. Deterministic for a given `seed`.
pub fn fragment(alloc: &Allocator, fill: f64, punch: f64, seed: u64) -> Result<Vec<BlockNr>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let target = (alloc.free_blocks() as f64 * fill.clamp(0.0, 1.0)) as u64;
    let mut pool = 0;
    let mut held = Vec::with_capacity(target as usize);
    for _ in 0..target {
        held.push(alloc.alloc(&mut pool)?);
    }
    let mut kept = Vec::with_capacity(held.len());
    for b in held {
        if rng.gen_bool(punch.clamp(0.0, 1.0)) {
            alloc.free(b)?;
        } else {
            kept.push(b);
        }
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragment_leaves_holes() {
        let a = Allocator::new(1, 4096);
        let kept = fragment(&a, 1.0, 0.5, 7).unwrap();
        assert!(kept.len() > 1500 && kept.len() < 2600, "{}", kept.len());
        assert_eq!(a.free_blocks(), 4096 - kept.len() as u64);
    }
}
