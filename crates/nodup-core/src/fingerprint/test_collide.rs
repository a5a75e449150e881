//! A test-only fingerprint with only 8 distinct values, so that tests can force collisions.

use super::{Fingerprinter, FpKind};

/// Number of distinct values [`TestCollide`] can take.
pub const TEST_COLLIDE_VALUES: u64 = 8;

/// `xxh3_64(block) & 7`: any two random blocks collide with probability 1/8.
pub struct TestCollide;

impl Fingerprinter for TestCollide {
    fn kind(&self) -> FpKind {
        FpKind::TestCollide
    }
    fn fingerprint(&self, block: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64(block) & (TEST_COLLIDE_VALUES - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_eight_values_and_collisions_happen() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..1000u32 {
            let fp = TestCollide.fingerprint(&i.to_le_bytes());
            assert!(fp < TEST_COLLIDE_VALUES);
            seen.insert(fp);
        }
        assert_eq!(seen.len(), 8);
    }
}
