//! Incremental checkpoints: what changed since the last checkpoint, where each piece of the
//! metadata lives on the medium, and which checkpoint segments still hold live pieces.
//!
//! The metadata is persisted as **units** ([`unit`](mod@unit)): an inode's head (attributes, xattrs, its
//! first map or directory unit, the list of its other units) and its further units of
//! [`crate::blockmap::CHUNK`] file blocks or [`crate::dir::UNIT_COOKIES`] directory entries.
//! A checkpoint writes only the units that changed since the previous one, as a new
//! **segment** (a chain of metadata blocks), and then a new **manifest** ([`manifest`]) that
//! lists every segment still needed. Loading ([`load`]) reads the segments newest first and
//! keeps, per unit, the newest copy; an inode is part of the file system when a directory entry
//! reaches it, so deleted inodes need no tombstone. Older copies are garbage: each segment's
//! live bytes are tracked here, and a checkpoint rewrites the live units of the emptiest
//! segments (cleaning) so the segments stay within a small factor of the live metadata.

#[cfg(test)]
mod forged;
pub mod load;
pub mod manifest;
pub mod unit;

use nodup_core::BlockNr;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

/// Checkpoint units of one inode that changed; equality ignores it (runtime state).
#[derive(Debug, Clone, Default)]
pub struct ChunkSet(BTreeSet<u64>);

impl PartialEq for ChunkSet {
    fn eq(&self, _: &ChunkSet) -> bool {
        true
    }
}
impl Eq for ChunkSet {}

impl ChunkSet {
    /// Add unit `u`.
    pub fn insert(&mut self, u: u64) {
        self.0.insert(u);
    }
    /// True when unit `u` is in the set.
    pub fn contains(&self, u: u64) -> bool {
        self.0.contains(&u)
    }
    /// Take every unit, ascending.
    pub fn take(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.0).into_iter().collect()
    }
    /// Number of units.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// True when no unit is marked.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Where the current copy of a unit is: its segment (by chain generation) and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    pub gen: u64,
    pub bytes: u32,
}

/// Estimated bytes of one entry of [`CkState::units`]: a `BTreeMap<u64, Loc>` leaf is a
/// 288-byte allocation holding 5 to 11 entries (about 7 when filled in ascending order), and
/// the internal nodes above the leaves add about 8 bytes an entry.
pub const UNIT_INDEX_BYTES: u64 = 48;

/// Checkpoint state of an inode (runtime only; equality ignores it).
#[derive(Debug, Clone, Default)]
pub struct CkState {
    /// The inode is in the dirty queue.
    pub queued: bool,
    /// The head unit changed since the last checkpoint.
    pub head_dirty: bool,
    /// Where the head unit is persisted.
    pub head: Option<Loc>,
    /// Where each further unit (index >= 1) is persisted.
    pub units: BTreeMap<u64, Loc>,
    /// What this inode added to [`Persist::estimate`] since the last checkpoint.
    pub est: u64,
}

impl PartialEq for CkState {
    fn eq(&self, _: &CkState) -> bool {
        true
    }
}
impl Eq for CkState {}

impl CkState {
    /// Every persisted copy of this inode's units.
    pub fn locs(&self) -> impl Iterator<Item = Loc> + '_ {
        self.head
            .iter()
            .copied()
            .chain(self.units.values().copied())
    }
}

/// One checkpoint segment.
#[derive(Debug, Clone)]
pub struct SegInfo {
    /// Its blocks, in chain order (the first is the head).
    pub blocks: Vec<BlockNr>,
    /// Payload bytes written.
    pub bytes: u32,
    /// Bytes of units that are still the current copy.
    pub live: u64,
}

/// Segments by generation (ascending = oldest first).
pub type SegTable = BTreeMap<u64, SegInfo>;

/// Bytes a newly changed unit is assumed to need in the next checkpoint, for the reserve of
/// blocks kept so that a checkpoint can always be written: a head the size it had (at least
/// this), a file-map unit its largest size, a directory unit a typical one.
pub const EST_HEAD: u64 = 256;
/// See [`EST_HEAD`].
pub const EST_MAP_UNIT: u64 = 4200;
/// See [`EST_HEAD`].
pub const EST_DIR_UNIT: u64 = 2048;

/// Shared checkpoint bookkeeping of a file system: the queue of changed inodes, an estimate of
/// the next checkpoint's size and the segment table.
#[derive(Debug, Default)]
pub struct Persist {
    queue: Mutex<Vec<u64>>,
    est: AtomicU64,
    /// The segments of the checkpoint in force (plus, during a checkpoint, the ones being written).
    pub segs: Mutex<SegTable>,
}

impl Persist {
    /// Record that inode `n` changed: its head, plus `new_units` units newly marked in its map
    /// or directory. Queues the inode when it was clean.
    pub fn touch(&self, n: &mut crate::inode::Inode, new_units: usize) {
        let mut add = 0;
        if !n.ck.head_dirty {
            n.ck.head_dirty = true;
            add +=
                n.ck.head
                    .map_or(EST_HEAD, |l| (l.bytes as u64).max(EST_HEAD));
        }
        let per = if n.dir().is_some() {
            EST_DIR_UNIT
        } else {
            EST_MAP_UNIT
        };
        add += new_units as u64 * per;
        if add != 0 {
            n.ck.est += add;
            self.est.fetch_add(add, Ordering::Relaxed);
        }
        if !n.ck.queued {
            n.ck.queued = true;
            self.queue.lock().push(n.ino);
        }
    }

    /// Record that every unit of `n` must be written again (it has no persisted copy).
    pub fn touch_all(&self, n: &mut crate::inode::Inode) {
        n.ck = CkState::default();
        let units = n.units();
        if let Some(d) = n.unit_dirt_mut() {
            for u in units {
                d.insert(u);
            }
        }
        let k = n.unit_dirt().map_or(0, |d| d.len());
        self.touch(n, k);
    }

    /// Take the queue of changed inodes (at a checkpoint's cut) and reset the estimate.
    pub fn take_queue(&self) -> Vec<u64> {
        self.est.store(0, Ordering::Relaxed);
        std::mem::take(&mut *self.queue.lock())
    }

    /// Estimated payload bytes of the next checkpoint's units.
    pub fn estimate(&self) -> u64 {
        self.est.load(Ordering::Relaxed)
    }

    /// Inodes waiting for the next checkpoint.
    pub fn queued(&self) -> usize {
        self.queue.lock().len()
    }

    /// Inode `n` leaves the file system: its units are garbage and need not be written.
    pub fn remove(&self, n: &crate::inode::Inode) {
        self.forget(n.ck.locs());
        if n.ck.est != 0 {
            let _ = self
                .est
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |e| {
                    Some(e.saturating_sub(n.ck.est))
                });
        }
    }

    /// The persisted units at `locs` stopped being current (inode deleted or unit rewritten).
    pub fn forget(&self, locs: impl Iterator<Item = Loc>) {
        let mut segs = self.segs.lock();
        for l in locs {
            if let Some(s) = segs.get_mut(&l.gen) {
                s.live = s.live.saturating_sub(l.bytes as u64);
            }
        }
    }

    /// (segments, their payload bytes, live bytes) of the checkpoint in force.
    pub fn seg_totals(&self) -> (usize, u64, u64) {
        let segs = self.segs.lock();
        let bytes = segs.values().map(|s| s.bytes as u64).sum();
        let live = segs.values().map(|s| s.live).sum();
        (segs.len(), bytes, live)
    }
}
