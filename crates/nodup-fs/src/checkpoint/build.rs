//! The new segments a cut assembles in memory: the segment builder, the unit locations it
//! changes (for undo), and the buffers and working vectors kept from one checkpoint to the
//! next.

use super::SEG_BYTES_MAX;
use crate::chain::PAYLOAD;
use crate::fs::FileSystem;
use crate::inode::{Body, Inode};
use crate::persist::unit;
use crate::persist::Loc;

/// A unit whose location a checkpoint changed, and what it was before (for undo).
pub(crate) enum Change {
    Head(u64, Option<Loc>),
    Unit(u64, u64, Option<Loc>),
}

/// Segment buffers kept between checkpoints (their capacity, at most this many): a fresh buffer
/// would be fresh memory, and first-touch page faults then made the cut several times longer
/// on a busy VM.
pub(super) const BUF_POOL: usize = 32;

/// Working vectors of a cut, kept between checkpoints with their capacity (see [`BUF_POOL`]:
/// memory freshly taken from the system under the gate costs page faults, which a VM short
/// of memory serves slowly).
#[derive(Default)]
pub(crate) struct CutScratch {
    pub(super) placed: Vec<(u64, Option<u64>, usize, u32)>,
    pub(super) gone: Vec<(u64, u64)>,
    pub(super) changes: Vec<Change>,
    pub(super) dead: Vec<Loc>,
}

impl CutScratch {
    /// Make room for about `units` units without allocating under the gate.
    pub(super) fn reserve(&mut self, units: usize) {
        self.placed.reserve(units);
        self.changes.reserve(units);
        self.dead.reserve(units);
        self.gone.reserve(units / 8 + 16);
    }
}

/// New segments being assembled by a cut.
pub(super) struct Builder {
    pub(super) seg_bytes: usize,
    /// Empty buffers to use before allocating.
    pub(super) pool: Vec<Vec<u8>>,
    pub(super) segs: Vec<Vec<u8>>,
    /// (inode, unit or None for the head, segment index, frame length) per unit written.
    pub(super) placed: Vec<(u64, Option<u64>, usize, u32)>,
    /// (inode, unit) of units that became empty.
    pub(super) gone: Vec<(u64, u64)>,
}

impl Builder {
    fn cur(&mut self) -> (usize, &mut Vec<u8>) {
        if self.segs.last().is_none_or(|s| s.len() >= self.seg_bytes) {
            let cap = self.seg_bytes + (64 << 10);
            let buf = self.pool.pop().unwrap_or_else(|| Vec::with_capacity(cap));
            self.segs.push(buf);
        }
        let i = self.segs.len() - 1;
        (i, &mut self.segs[i])
    }

    /// Copy a unit frame as it is.
    pub(super) fn raw(&mut self, ino: u64, unit: Option<u64>, frame: &[u8]) {
        let (si, buf) = self.cur();
        buf.extend_from_slice(frame);
        self.placed.push((ino, unit, si, frame.len() as u32));
    }

    /// Encode what changed in `n`.
    pub(super) fn take(&mut self, n: &mut Inode) {
        n.ck.queued = false;
        n.ck.est = 0;
        let units = n.unit_dirt_mut().map(|d| d.take()).unwrap_or_default();
        // Unit 0 lives in the head, and a unit that appears or disappears changes the head's list.
        let head = std::mem::take(&mut n.ck.head_dirty) || !units.is_empty();
        if head {
            let (si, buf) = self.cur();
            let len = unit::encode_head(buf, n);
            self.placed.push((n.ino, None, si, len));
        }
        for u in units.into_iter().filter(|&u| u != 0) {
            let (si, buf) = self.cur();
            let len = match &n.body {
                Body::File(m) if m.unit_mapped(u) => Some(unit::encode_map_unit(buf, n.ino, u, m)),
                Body::Dir(d) if d.unit_entries(u).next().is_some() => {
                    Some(unit::encode_dir_unit(buf, n.ino, u, d))
                }
                _ => None,
            };
            match len {
                Some(len) => self.placed.push((n.ino, Some(u), si, len)),
                None => self.gone.push((n.ino, u)),
            }
        }
    }
}

/// Blocks of a chain holding `bytes` payload bytes (at least one).
pub(super) fn blocks_for(bytes: usize) -> usize {
    bytes.div_ceil(PAYLOAD).max(1)
}

impl FileSystem {
    /// Target payload bytes of one segment.
    pub(super) fn seg_bytes(&self) -> usize {
        ((self.medium.len() / 1024) as usize).clamp(4 << 10, SEG_BYTES_MAX)
    }

    /// Keep the segment buffers of a finished cut for the next one.
    pub(super) fn keep_buffers(&self, b: Builder, mut changes: Vec<Change>, mut dead: Vec<Loc>) {
        let mut pool = self.seg_bufs.lock();
        for mut v in b.segs.into_iter().chain(b.pool) {
            if pool.len() < BUF_POOL {
                v.clear();
                pool.push(v);
            }
        }
        let (mut placed, mut gone) = (b.placed, b.gone);
        placed.clear();
        gone.clear();
        changes.clear();
        dead.clear();
        *self.cut_scratch.lock() = CutScratch {
            placed,
            gone,
            changes,
            dead,
        };
    }
}
