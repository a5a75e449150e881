//! Entry locks: the engine's lock for everything about one fingerprint, separate from where the
//! policy's store keeps its fingerprints.
//!
//! Locks are striped by the mixed fingerprint ([`STRIPES`] of them). Under the lock of `fp`'s
//! stripe, and only there, the engine looks `fp` up in the store, creates an entry for it,
//! changes the reference count of an entry holding it, or frees such an entry, so two writers of
//! the same new content cannot both create an entry and a release cannot free an entry a writer
//! is about to reference. The stripe also lists the entries being created by in-flight write
//! calls ("pending": indexed in the store, not durable yet), which only their own call may
//! deduplicate against. Lock order: entry lock, then a store's internal locks; two entry locks
//! only in ascending stripe order ([`EntryLocks::lock_stripe`]).

use parking_lot::{Mutex, MutexGuard};

use crate::index::mix;

/// Number of stripes (a power of two).
pub const STRIPES: usize = 64;

/// An entry created by a write call that has not reached the medium yet.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    /// Entry location (byte offset on the medium).
    pub loc: u64,
    /// The write context that owns it (only the owner may deduplicate against it).
    pub owner: u64,
    /// Index of the owner's in-call record.
    pub slot: usize,
    /// Fingerprint of the entry (its on-media copy is not written yet).
    pub fp: u64,
}

/// What one stripe's lock guards besides the fingerprints that fall into it.
#[derive(Debug, Default)]
pub struct Stripe {
    /// Entries of in-flight write calls.
    pub pending: Vec<Pending>,
}

impl Stripe {
    /// The pending record at `loc`, if any.
    pub fn pending_at(&self, loc: u64) -> Option<Pending> {
        self.pending.iter().copied().find(|p| p.loc == loc)
    }

    /// True when a call other than `me` is creating an entry for `fp`.
    pub fn pending_elsewhere(&self, fp: u64, me: u64) -> bool {
        self.pending.iter().any(|p| p.fp == fp && p.owner != me)
    }

    /// Drop the pending record at `loc`.
    pub fn unpend(&mut self, loc: u64) {
        if let Some(i) = self.pending.iter().position(|p| p.loc == loc) {
            self.pending.swap_remove(i);
        }
    }
}

/// The striped entry locks.
#[derive(Debug)]
pub struct EntryLocks {
    stripes: Box<[Mutex<Stripe>]>,
}

impl Default for EntryLocks {
    fn default() -> Self {
        EntryLocks {
            stripes: (0..STRIPES)
                .map(|_| Mutex::new(Stripe::default()))
                .collect(),
        }
    }
}

impl EntryLocks {
    /// Stripe number of `fp`.
    #[inline]
    pub fn stripe_of(&self, fp: u64) -> usize {
        (mix(fp) as usize) & (STRIPES - 1)
    }

    /// Take the entry lock of `fp`.
    #[inline]
    pub fn lock(&self, fp: u64) -> MutexGuard<'_, Stripe> {
        self.stripes[self.stripe_of(fp)].lock()
    }

    /// Take stripe `i`'s lock (callers holding several take them in ascending order).
    #[inline]
    pub fn lock_stripe(&self, i: usize) -> MutexGuard<'_, Stripe> {
        self.stripes[i].lock()
    }

    /// Heap bytes: the stripe array and the pending lists.
    pub fn memory_bytes(&self) -> u64 {
        let mut b = std::mem::size_of_val(&*self.stripes);
        for s in self.stripes.iter() {
            b += s.lock().pending.capacity() * std::mem::size_of::<Pending>();
        }
        b as u64
    }

    /// Forget every pending record (failure recovery: no call is in flight).
    pub fn clear(&self) {
        for s in self.stripes.iter() {
            s.lock().pending = Vec::new();
        }
    }
}
