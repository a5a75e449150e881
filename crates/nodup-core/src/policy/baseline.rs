//! Baseline policies the papers compare against: `none`, `strong` and `weak-verify`.

use super::{Decision, Policy, PolicyKind, PrefetchMode};
use crate::fingerprint::FpKind;

/// `none`: no deduplication at all (NOVA / ext4 role).
pub struct NoDedup;

impl Policy for NoDedup {
    fn kind(&self) -> PolicyKind {
        PolicyKind::None
    }
    fn decide(&self, _fp: u64) -> Decision {
        Decision::Skip
    }
    fn never_dedups(&self) -> bool {
        true
    }
    fn verify(&self) -> bool {
        true
    }
    fn prefetch(&self, _asked: PrefetchMode) -> PrefetchMode {
        PrefetchMode::None
    }
}

/// `strong`: a cryptographic fingerprint trusted without comparison (NV-Dedup / Dedup_SHA1 role).
pub struct Strong;

impl Policy for Strong {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Strong
    }
    /// Trusting a match is only sound with a cryptographic function: anything else becomes sha256.
    fn fingerprint_for(&self, requested: FpKind) -> FpKind {
        match requested {
            FpKind::Sha256 | FpKind::Blake3 => requested,
            _ => FpKind::Sha256,
        }
    }
    fn decide(&self, _fp: u64) -> Decision {
        Decision::LookupOrInsert
    }
    fn verify(&self) -> bool {
        false
    }
    fn prefetch(&self, _asked: PrefetchMode) -> PrefetchMode {
        PrefetchMode::None
    }
}

/// `weak-verify`: CRC-32C plus comparison, no prefetch (DeWrite / LD-w/o-P role).
pub struct WeakVerify;

impl Policy for WeakVerify {
    fn kind(&self) -> PolicyKind {
        PolicyKind::WeakVerify
    }
    /// The default fingerprint (xxh3) is replaced by the policy's own, crc32c.
    fn fingerprint_for(&self, requested: FpKind) -> FpKind {
        match requested {
            FpKind::Xxh3 => FpKind::Crc32c,
            other => other,
        }
    }
    fn decide(&self, _fp: u64) -> Decision {
        Decision::LookupOrInsert
    }
    fn verify(&self) -> bool {
        true
    }
    fn prefetch(&self, _asked: PrefetchMode) -> PrefetchMode {
        PrefetchMode::None
    }
}
