//! The hash lock (dm-vdo's name for it): a writer whose block meets another call's pending entry
//! for the same fingerprint does not store a second copy; it waits until that entry is published
//! (or rolled back) and then deduplicates against it.
//!
//! Deadlock freedom: a writer only waits after its own call has published every entry it
//! created, so it never holds a pending entry while waiting, and a call that holds pending
//! entries (phase 1 and 2) never waits. The wait is bounded all the same ([`JOIN_WAIT`]): a
//! writer that cannot join in time stores its block as before, without an entry.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::engine::Engine;

/// Longest a writer waits for another call's pending entry before storing its block alone.
pub(crate) const JOIN_WAIT: Duration = Duration::from_secs(2);

/// Rounds of waiting and rewriting a call does before it stops deferring blocks (a third writer
/// can create a new pending entry for the same content after the first one was released).
pub(super) const JOIN_ROUNDS: usize = 4;

/// Writers waiting for pending entries, and the condition they wait on.
#[derive(Debug, Default)]
pub(crate) struct JoinWait {
    waiters: AtomicUsize,
    mx: Mutex<()>,
    cv: Condvar,
}

impl JoinWait {
    /// Wake the waiters after pending entries were published or rolled back (a single load when
    /// nobody waits, which is the common case).
    #[inline]
    pub(crate) fn wake(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.mx.lock();
            self.cv.notify_all();
        }
    }
}

impl Engine {
    /// Wait until no call other than `me` holds a pending entry for `fp`; false on timeout.
    pub(super) fn wait_unpended(&self, fp: u64, me: u64, deadline: Instant) -> bool {
        let j = &self.join;
        j.waiters.fetch_add(1, Ordering::SeqCst);
        let mut g = j.mx.lock();
        let done = loop {
            let busy = { self.locks.lock(fp).pending_elsewhere(fp, me) };
            if !busy {
                break true;
            }
            if Instant::now() >= deadline {
                break false;
            }
            // The short timeout covers a wake that raced with the check above.
            j.cv.wait_for(&mut g, Duration::from_millis(1));
        };
        drop(g);
        j.waiters.fetch_sub(1, Ordering::SeqCst);
        done
    }
}
