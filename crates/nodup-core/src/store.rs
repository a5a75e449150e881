//! The fingerprint store: where the write path asks "is this content stored, and where".
//!
//! A store belongs to the policy ([`crate::policy::Policy::make_store`]): `light`, `strong` and
//! `weak-verify` keep the complete DRAM index ([`crate::index::FpIndex`]); a budgeted two-level
//! store (`smart`) or a small hot cache with no complete store (`selective`) plug in here too.
//! What a store holds is only a *finding aid*: fingerprint → location of a dedup entry on the
//! medium. The entries themselves — reference counts, the reverse map, recovery — stay the
//! engine's, and every candidate a store names is confirmed against the on-media entry (and the
//! block's bytes when the policy verifies) before it is used. A store may therefore forget any
//! fingerprint at any time: the block is then simply not deduplicated against.
//!
//! Locking: the engine serialises everything about one fingerprint with its *entry lock*
//! (`engine/locks.rs`, striped by fingerprint, which also holds the entries being created by
//! in-flight calls). [`FpStore::find`], [`FpStore::insert`], [`FpStore::remove`] and the
//! notifications for `fp` are called with `fp`'s entry lock held, so a store sees the
//! operations on one fingerprint in order. The store's own storage is synchronised by the
//! store (the complete index has one mutex per shard); its locks are leaves: a store never
//! calls back into the engine while holding them, except through the `check` callback of
//! `find`, which only reads the medium.

/// Parameters a store is built with (from the engine superblock and the open options).
#[derive(Clone, Default)]
pub struct StoreParams {
    /// Length of the medium in bytes (entry locations are below it).
    pub medium_len: u64,
    /// Memory budget in bytes for stores that have one; 0 = the policy's default.
    pub mem_budget: u64,
    /// Where a store may keep fingerprints on the medium (none for an in-memory test engine).
    pub io: Option<StoreIo>,
}

/// The medium and allocator a store with an on-media part uses: blocks it takes from the
/// data area's allocator hold only its own records, are written through the metadata medium,
/// and are given back to the allocator by the store; after a crash the engine's failure
/// recovery rebuilds the allocator without them and the store rebuilds its part ([`FpStore::load`]).
#[derive(Clone)]
pub struct StoreIo {
    /// The metadata medium.
    pub medium: std::sync::Arc<dyn crate::media::Medium>,
    /// The data area's allocator.
    pub alloc: std::sync::Arc<crate::alloc::Allocator>,
}

/// A policy's fingerprint store (see the module doc for the contract).
pub trait FpStore: Send + Sync {
    /// Start loading what a lookup of `fp` will read first (called a block ahead, no lock held;
    /// a hint only).
    fn prefetch(&self, _fp: u64) {}

    /// Offer the candidate entry locations for `fp` to `check`, in the store's order, until it
    /// accepts one; returns the accepted location. `check` reads the on-media entry.
    fn find(&self, fp: u64, check: &mut dyn FnMut(u64) -> bool) -> Option<u64>;

    /// [`FpStore::find`] over everything the store keeps, including what it keeps on the
    /// medium (the out-of-line worker's lookup); with `promote`, a match found on the medium is
    /// brought into memory.
    fn find_deep(
        &self,
        fp: u64,
        check: &mut dyn FnMut(u64) -> bool,
        _promote: bool,
    ) -> Option<u64> {
        self.find(fp, check)
    }

    /// Problems with what the store keeps on the medium, found by reading and validating all
    /// of it without changing anything (fsck, the audit); a store without a medium part has
    /// none.
    fn check_media(&self) -> Vec<String> {
        Vec::new()
    }

    /// True when the store keeps `fp` at `loc` anywhere (memory or medium), changing nothing:
    /// the audit's question. The default asks [`FpStore::find_deep`] without promotion.
    fn holds(&self, fp: u64, loc: u64) -> bool {
        self.find_deep(fp, &mut |l| l == loc, false).is_some()
    }

    /// Bring the entry at `loc` of `fp`, found by [`FpStore::find_deep`], into memory (a
    /// store without a medium part ignores it).
    fn promote(&self, _fp: u64, _loc: u64) {}

    /// Record that the entry at `loc` holds `fp` (a new entry, or one reloaded by recovery).
    fn insert(&self, fp: u64, loc: u64);

    /// Forget the entry at `loc` for `fp`: its block was freed, or its creation rolled back.
    fn remove(&self, fp: u64, loc: u64);

    /// A block was found to duplicate the entry at `loc` (verified, or trusted by the policy).
    fn on_hit(&self, _fp: u64, _loc: u64) {}

    /// True when a duplicate found at `loc` should still be looked at by an out-of-line
    /// worker: the entry was created by an inline miss and not yet checked against what the
    /// store keeps on the medium (an older copy may exist there).
    fn needs_recheck(&self, _fp: u64, _loc: u64) -> bool {
        false
    }

    /// The out-of-line worker found no other copy of the entry at `loc`: it is the one.
    fn confirm(&self, _fp: u64, _loc: u64) {}

    /// One reference to the entry at `loc` was released; `refs` (at least 1) remain.
    fn on_release(&self, _fp: u64, _loc: u64, _refs: u64) {}

    /// Answer the byte comparison of `data` with stored block `block` (fingerprint `fp`) from
    /// the store's own cache: `Some(equal)`, or `None` to read the medium.
    fn verify_cached(&self, _fp: u64, _block: u64, _data: &[u8]) -> Option<bool> {
        None
    }

    /// The medium confirmed that `data` is the content of block `block` of the entry at `loc`
    /// (fingerprint `fp`): a store with a verification cache may keep it.
    fn on_verified(&self, _fp: u64, _loc: u64, _block: u64, _data: &[u8]) {}

    /// Load many `(fp, loc)` pairs at once (normal recovery at open); the default inserts them
    /// one by one.
    fn load(&self, pairs: &[(u64, u64)]) {
        for &(fp, loc) in pairs {
            self.insert(fp, loc);
        }
    }

    /// Every location held (saved at clean shutdown, so the next open reloads them without a
    /// scan of the metadata).
    fn locations(&self) -> Vec<u64>;

    /// A store that saves its own state at clean shutdown returns it here (after making
    /// everything it names durable); `None` saves [`FpStore::locations`] instead.
    fn save_words(&self) -> crate::Result<Option<Vec<u64>>> {
        Ok(None)
    }

    /// Reload what [`FpStore::save_words`] saved (validated: a corrupt save is an error).
    fn restore_words(&self, _words: &[u64]) -> crate::Result<()> {
        Err(crate::Error::Unsupported(
            "this fingerprint store saves locations, not its own words".into(),
        ))
    }

    /// The image is being opened for writing: a store may now rewrite on the medium what a
    /// read-only open had to leave as it was (called once, before the first write).
    fn begin_writes(&self) {}

    /// Fingerprints held.
    fn len(&self) -> u64;

    /// True when the store holds no fingerprint.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes the store uses (what its budget is compared with).
    fn memory_bytes(&self) -> u64;

    /// The memory budget the store keeps to, if it has one.
    fn budget(&self) -> Option<u64> {
        None
    }

    /// True when every live entry is held (the audit then checks that each one is findable).
    fn complete(&self) -> bool {
        true
    }

    /// True when [`FpStore::len`] counts exactly the valid entries held (a store that forgets
    /// freed entries lazily counts stale ones too).
    fn exact_len(&self) -> bool {
        true
    }

    /// Blocks of the data area the store holds for its on-media part.
    fn owned_blocks(&self) -> u64 {
        0
    }

    /// The blocks of [`FpStore::owned_blocks`] one by one, appended to `out`, then
    /// `f(out, unlisted)` called while the store can neither take blocks nor give any back
    /// (fsck's per-block check compares them with the allocator there). `unlisted` counts the
    /// blocks it could not list (a damaged on-media structure is listed up to its damage); the
    /// default lists none of them. `f` must not call back into the store.
    fn list_owned_blocks(&self, out: Vec<u64>, f: &mut dyn FnMut(&[u64], u64)) {
        let unlisted = self.owned_blocks();
        f(&out, unlisted)
    }

    /// The store's own figures for `nodup stats` (memory per structure, I/O).
    fn report(&self) -> Option<serde_json::Value> {
        None
    }

    /// Forget everything (failure recovery rebuilds the store from the medium).
    fn clear(&self);
}

/// The engine's handle on a policy's store: the complete index is called directly, so its
/// lookups inline into the write path (it is the store of every default policy); any other
/// store goes through the trait.
pub(crate) enum StoreHandle {
    /// The complete DRAM index.
    Complete(crate::index::FpIndex),
    /// A policy's own store.
    Own(Box<dyn FpStore>),
}

impl StoreHandle {
    #[inline]
    pub(crate) fn prefetch(&self, fp: u64) {
        match self {
            StoreHandle::Complete(i) => i.prefetch_slot(fp),
            StoreHandle::Own(s) => s.prefetch(fp),
        }
    }
    /// Offer the candidates of `fp` to `f` until it returns a value; on a miss insert `spare`
    /// (when given) in the same store operation. Returns the value and whether `spare` was
    /// inserted.
    #[inline]
    pub(crate) fn find_map<T>(
        &self,
        fp: u64,
        spare: Option<u64>,
        mut f: impl FnMut(u64) -> Option<T>,
    ) -> (Option<T>, bool) {
        match self {
            StoreHandle::Complete(i) => i.find_map(fp, spare, f),
            StoreHandle::Own(s) => {
                let mut out = None;
                s.find(fp, &mut |loc| {
                    out = f(loc);
                    out.is_some()
                });
                match (out, spare) {
                    (None, Some(loc)) => {
                        s.insert(fp, loc);
                        (None, true)
                    }
                    (out, _) => (out, false),
                }
            }
        }
    }
    #[inline]
    pub(crate) fn insert(&self, fp: u64, loc: u64) {
        match self {
            StoreHandle::Complete(i) => i.insert_loc(fp, loc),
            StoreHandle::Own(s) => s.insert(fp, loc),
        }
    }
    #[inline]
    pub(crate) fn remove(&self, fp: u64, loc: u64) {
        match self {
            StoreHandle::Complete(i) => i.remove_loc(fp, loc),
            StoreHandle::Own(s) => s.remove(fp, loc),
        }
    }
    #[inline]
    pub(crate) fn on_hit(&self, fp: u64, loc: u64) {
        if let StoreHandle::Own(s) = self {
            s.on_hit(fp, loc)
        }
    }
    #[inline]
    pub(crate) fn needs_recheck(&self, fp: u64, loc: u64) -> bool {
        match self {
            StoreHandle::Complete(_) => false,
            StoreHandle::Own(s) => s.needs_recheck(fp, loc),
        }
    }
    #[inline]
    pub(crate) fn on_release(&self, fp: u64, loc: u64, refs: u64) {
        if let StoreHandle::Own(s) = self {
            s.on_release(fp, loc, refs)
        }
    }
    #[inline]
    pub(crate) fn verify_cached(&self, fp: u64, block: u64, data: &[u8]) -> Option<bool> {
        match self {
            StoreHandle::Complete(_) => None,
            StoreHandle::Own(s) => s.verify_cached(fp, block, data),
        }
    }
    #[inline]
    pub(crate) fn on_verified(&self, fp: u64, loc: u64, block: u64, data: &[u8]) {
        if let StoreHandle::Own(s) = self {
            s.on_verified(fp, loc, block, data);
        }
    }
    /// The store as the trait (for the calls off the hot path).
    pub(crate) fn dyn_store(&self) -> &dyn FpStore {
        match self {
            StoreHandle::Complete(i) => i,
            StoreHandle::Own(s) => &**s,
        }
    }
}
