//! `light`: Light-Dedup — a fast non-cryptographic fingerprint, byte-by-byte verification and
//! speculative prefetch (the default policy).
//!
//! Its store is the complete DRAM index (the trait's default). What is Light's own: the trust
//! rules and prefetch strides ([`prefetch`]), speculation through entry hints
//! (`speculate.rs`, run by the write path for policies whose prefetch variant speculates), and
//! the per-stream state a writer carries between blocks ([`Stream`]).

pub mod prefetch;
mod speculate;

use super::{Decision, Policy, PolicyKind, PrefetchMode};
use crate::meta::record::Hint;
use crate::BlockNr;
use prefetch::STREAM_TRUST_INIT;

/// The entry the previous block of a stream mapped to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prev {
    pub(crate) loc: u64,
    pub(crate) hint: Hint,
    /// Index into `WriteCtx::created` when the entry was created by the current call.
    pub(crate) created: Option<usize>,
}

/// Light-Dedup's per-stream state, carried in each writer's [`crate::WriteCtx`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stream {
    /// Per-stream trust degree (Light-Dedup §4.3.2).
    pub(crate) trust: u8,
    /// The entry the previous block of this stream mapped to.
    pub(crate) prev: Option<Prev>,
    /// Block already prefetched by prefetch-next for the next input of this call.
    pub(crate) prefetched: Option<BlockNr>,
}

impl Default for Stream {
    fn default() -> Self {
        Stream {
            trust: STREAM_TRUST_INIT,
            prev: None,
            prefetched: None,
        }
    }
}

/// The Light-Dedup policy.
pub struct Light;

impl Policy for Light {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Light
    }
    fn decide(&self, _fp: u64) -> Decision {
        Decision::LookupOrInsert
    }
    fn verify(&self) -> bool {
        true
    }
    fn prefetch(&self, asked: PrefetchMode) -> PrefetchMode {
        asked
    }
}
