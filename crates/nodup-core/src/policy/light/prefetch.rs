//! Speculative prefetch of Light-Dedup §4.3: in-block prefetch strides, hint trust degrees and
//! the per-stream trust degree (pure functions, so the rules are unit-tested on their own).

use super::PrefetchMode;
use crate::media::Medium;
use crate::meta::record::{Hint, ENTRY_SIZE};
use crate::BLOCK_SIZE;

/// Trust degree a new hint starts with, and the degree from which a hint is followed.
pub const TRUST_THRESHOLD: u8 = 4;
/// Highest trust degree (3 bits).
pub const TRUST_MAX: u8 = 7;
/// Initial per-stream trust degree.
pub const STREAM_TRUST_INIT: u8 = TRUST_THRESHOLD;
/// Stride of the first in-block prefetch pass: one line per 256-byte XPLine.
pub const XPLINE: usize = 256;
/// Cache-line size.
pub const LINE: usize = 64;

/// Degree after a correct prediction (+1, saturating at 7).
pub fn trust_up(t: u8) -> u8 {
    (t + 1).min(TRUST_MAX)
}

/// Degree after a wrong prediction (−2, saturating at 0).
pub fn trust_down(t: u8) -> u8 {
    t.saturating_sub(2)
}

/// True when a hint is trusted enough to be followed.
pub fn trusted(h: Hint) -> bool {
    h.target() != 0 && h.trust() >= TRUST_THRESHOLD
}

/// Outcome of checking a hint against the entry actually used next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HintOutcome {
    /// The entry had no hint: one was created.
    Created,
    /// The hint named the entry used.
    Right,
    /// The hint named another entry.
    Wrong,
}

/// New hint of an entry whose successor turned out to be `next`: +1 when right, −2 when wrong,
/// and when a wrong guess drops the degree below the threshold the hint is redirected to `next`.
pub fn update_hint(h: Hint, next: u64) -> (Hint, HintOutcome) {
    // A hint comes from the medium: a target that is not entry-aligned is damage, not a guess.
    if h.target() == 0 || !h.target().is_multiple_of(ENTRY_SIZE) {
        return (Hint::new(next, TRUST_THRESHOLD), HintOutcome::Created);
    }
    if h.target() == next {
        return (Hint::new(next, trust_up(h.trust())), HintOutcome::Right);
    }
    let t = trust_down(h.trust());
    let target = if t < TRUST_THRESHOLD {
        next
    } else {
        h.target()
    };
    (Hint::new(target, t), HintOutcome::Wrong)
}

/// Stream trust after an outcome (same +1/−2 rule; creations leave it alone).
pub fn update_stream(t: u8, o: HintOutcome) -> u8 {
    match o {
        HintOutcome::Created => t,
        HintOutcome::Right => trust_up(t),
        HintOutcome::Wrong => trust_down(t),
    }
}

/// Issue the prefetches `mode` performs on a block about to be compared.
#[inline]
pub fn before_compare(m: &dyn Medium, mode: PrefetchMode, off: u64) {
    match mode {
        PrefetchMode::None => {}
        PrefetchMode::P64 => m.prefetch(off, BLOCK_SIZE, LINE),
        // In-Block Prefetch: touch one line per XPLine so the whole block streams into the
        // media read buffer in parallel, then pull the rest of the lines into the cache.
        _ => {
            m.prefetch(off, BLOCK_SIZE, XPLINE);
            m.prefetch(off, BLOCK_SIZE, LINE);
        }
    }
}

/// Prefetch the block the next input will probably be compared with, every line (on
/// DRAM-like media only prefetched lines are loaded; on Optane the first line of each XPLine
/// would be enough, and the others then hit the media read buffer).
#[inline]
pub fn next_block(m: &dyn Medium, off: u64) {
    m.prefetch(off, BLOCK_SIZE, LINE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_hint_from_the_medium_is_replaced() {
        // 8-aligned but not entry-aligned, trusted: only a corrupted medium produces this.
        let (h, o) = update_hint(Hint(32 * 10 + 8 + 7), 32 * 3);
        assert_eq!(
            (h.target(), h.trust(), o),
            (32 * 3, 4, HintOutcome::Created)
        );
    }

    #[test]
    fn trust_rules_follow_the_paper() {
        let a = 32 * 10;
        let b = 32 * 11;
        let (h, o) = update_hint(Hint::NONE, a);
        assert_eq!((h.target(), h.trust(), o), (a, 4, HintOutcome::Created));
        assert!(trusted(h));
        let (h, o) = update_hint(h, a);
        assert_eq!((h.trust(), o), (5, HintOutcome::Right));
        let h = (0..5).fold(h, |h, _| update_hint(h, a).0);
        assert_eq!(h.trust(), 7);
        // Wrong from 7 → 5, target kept; again → 3 < 4, redirected to the entry used.
        let (h, o) = update_hint(h, b);
        assert_eq!((h.target(), h.trust(), o), (a, 5, HintOutcome::Wrong));
        let (h, _) = update_hint(h, b);
        assert_eq!((h.target(), h.trust()), (b, 3));
        assert!(!trusted(h));
        let (h, _) = update_hint(h, b);
        assert!(trusted(h));
        assert_eq!(trust_down(1), 0);
        assert_eq!(update_stream(7, HintOutcome::Right), 7);
        assert_eq!(update_stream(7, HintOutcome::Wrong), 5);
    }
}
