//! `light`: Light-Dedup — a fast non-cryptographic fingerprint, byte-by-byte verification and
//! speculative prefetch (the default policy).

use super::{Decision, Policy, PolicyKind, PrefetchMode};

/// The Light-Dedup policy.
pub struct Light;

impl Policy for Light {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Light
    }
    fn decide(&self, _fp: u64) -> Decision {
        Decision::Dedup
    }
    fn verify(&self) -> bool {
        true
    }
    fn prefetch(&self, asked: PrefetchMode) -> PrefetchMode {
        asked
    }
}
