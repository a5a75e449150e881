//! The new segments a cut writes: the segment builder (which streams them to fresh blocks as
//! it encodes), the unit locations it changes (for undo), and the working vectors kept from
//! one checkpoint to the next.

use super::SEG_BYTES_MAX;
use crate::chain::{ChainKind, ChainWriter, PAYLOAD};
use crate::error::{FsError, Result};
use crate::fs::FileSystem;
use crate::inode::{Body, Inode};
use crate::persist::unit;
use crate::persist::Loc;
use nodup_core::BlockNr;

/// A unit whose location a checkpoint changed, and what it was before (for undo).
pub(crate) enum Change {
    Head(u64, Option<Loc>),
    Unit(u64, u64, Option<Loc>),
}

/// Encoded bytes a cut stages in memory before writing them to the current segment's chain.
/// A cut streams its segments to the medium as it encodes them, so its memory is this (plus
/// one unit frame) however much changed, instead of every segment of the checkpoint.
pub(super) const STAGE_BYTES: usize = 64 << 10;

/// Working vectors of a cut, kept between checkpoints with their capacity: memory freshly
/// taken from the system under the gate costs page faults, which a VM short of memory serves
/// slowly.
#[derive(Default)]
pub(crate) struct CutScratch {
    pub(super) stage: Vec<u8>,
    pub(super) placed: Vec<(u64, Option<u64>, usize, u32)>,
    pub(super) gone: Vec<(u64, u64)>,
    pub(super) changes: Vec<Change>,
    pub(super) dead: Vec<Loc>,
}

impl CutScratch {
    /// Make room for about `units` units (and the stage) without allocating under the gate.
    pub(super) fn reserve(&mut self, units: usize) {
        self.stage.reserve(2 * STAGE_BYTES);
        self.placed.reserve(units);
        self.changes.reserve(units);
        self.dead.reserve(units);
        self.gone.reserve(units / 8 + 16);
    }
}

/// A segment a cut wrote (or, after a failure, would have written).
pub(super) struct SegOut {
    /// Its chain's generation.
    pub(super) gen: u64,
    /// Its chain (None once writing failed).
    writer: Option<ChainWriter>,
    /// Payload bytes encoded into it.
    pub(super) bytes: usize,
}

impl SegOut {
    /// The blocks it occupies, in chain order.
    pub(super) fn blocks(&self) -> &[BlockNr] {
        self.writer.as_ref().map_or(&[], |w| w.blocks())
    }
}

/// New segments being assembled by a cut, written to fresh blocks as they fill.
pub(super) struct Builder<'a> {
    fs: &'a FileSystem,
    pub(super) seg_bytes: usize,
    /// Encoded bytes of the last segment not yet written.
    stage: Vec<u8>,
    pub(super) segs: Vec<SegOut>,
    /// (inode, unit or None for the head, segment index, frame length) per unit written.
    pub(super) placed: Vec<(u64, Option<u64>, usize, u32)>,
    /// (inode, unit) of units that became empty.
    pub(super) gone: Vec<(u64, u64)>,
    /// The first write that failed: encoding goes on without writing, so the cut completes
    /// and can be undone as a whole.
    pub(super) err: Option<FsError>,
}

impl<'a> Builder<'a> {
    /// A builder for one cut, reusing the stage and vectors kept in `scratch`.
    pub(super) fn new(fs: &'a FileSystem, seg_bytes: usize, scratch: &mut CutScratch) -> Self {
        Builder {
            fs,
            seg_bytes,
            stage: std::mem::take(&mut scratch.stage),
            segs: Vec::new(),
            placed: std::mem::take(&mut scratch.placed),
            gone: std::mem::take(&mut scratch.gone),
            err: None,
        }
    }

    /// The segment the next frame goes to, starting a new one when the last is full.
    fn cur(&mut self) -> (usize, &mut Vec<u8>) {
        if self.segs.last().is_none_or(|s| s.bytes >= self.seg_bytes) {
            self.write_stage();
            let gen = self.fs.take_gen();
            let writer = self.start_chain(gen);
            self.segs.push(SegOut {
                gen,
                writer,
                bytes: 0,
            });
        }
        (self.segs.len() - 1, &mut self.stage)
    }

    /// The chain of a new segment in a fresh block (None once a write failed, or if this one
    /// does: the failure is kept in `err`).
    fn start_chain(&mut self, gen: u64) -> Option<ChainWriter> {
        if self.err.is_some() {
            return None;
        }
        let m = &*self.fs.medium;
        let r = self.fs.take_meta_blocks(1).and_then(|b| {
            ChainWriter::start(m, ChainKind::Segment, gen, b[0])
                .map(ChainWriter::defer_flush)
                .inspect_err(|_| self.fs.give_back(b))
        });
        r.map_err(|e| self.err = Some(e)).ok()
    }

    /// Write the staged bytes to the current segment's chain (dropped after a failure).
    fn write_stage(&mut self) {
        if self.stage.is_empty() {
            return;
        }
        if self.err.is_none() {
            let m = &*self.fs.medium;
            let w = self.segs.last_mut().and_then(|s| s.writer.as_mut());
            let r = match w {
                Some(w) => {
                    let fs = self.fs;
                    fs.take_meta_blocks(w.blocks_needed(self.stage.len()))
                        .and_then(|mut fresh| {
                            w.append(m, &self.stage, &fresh).inspect_err(|_| {
                                // Blocks the chain linked before failing go back with it.
                                fresh.retain(|b| !w.blocks().contains(b));
                                fs.give_back(fresh);
                            })
                        })
                }
                None => Err(FsError::Corrupt(
                    "checkpoint segment without a chain".into(),
                )),
            };
            if let Err(e) = r {
                self.err = Some(e);
            }
        }
        self.stage.clear();
    }

    /// A frame of `len` bytes went to segment `si`.
    fn placed(&mut self, ino: u64, unit: Option<u64>, si: usize, len: u32) {
        self.placed.push((ino, unit, si, len));
        self.segs[si].bytes += len as usize;
        if self.stage.len() >= STAGE_BYTES {
            self.write_stage();
        }
    }

    /// Copy a unit frame as it is.
    pub(super) fn raw(&mut self, ino: u64, unit: Option<u64>, frame: &[u8]) {
        let (si, buf) = self.cur();
        buf.extend_from_slice(frame);
        self.placed(ino, unit, si, frame.len() as u32);
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
            self.placed(n.ino, None, si, len);
        }
        for u in units.into_iter().filter(|&u| u != 0) {
            // Whether the unit still has a frame is decided before `cur`, which may start a
            // segment: one started for a unit that turned out gone would stay empty, and a
            // manifest naming an empty segment cannot be loaded.
            let present = match &n.body {
                Body::File(m) => m.unit_mapped(u),
                Body::Dir(d) => d.unit_entries(u).next().is_some(),
                _ => false,
            };
            if !present {
                self.gone.push((n.ino, u));
                continue;
            }
            let (si, buf) = self.cur();
            let len = match &n.body {
                Body::Dir(d) => unit::encode_dir_unit(buf, n.ino, u, d),
                Body::File(m) => unit::encode_map_unit(buf, n.ino, u, m),
                // `present` is false for every other body.
                _ => continue,
            };
            self.placed(n.ino, Some(u), si, len);
        }
    }

    /// Write what is still staged; returns the first failure of the cut's writes.
    pub(super) fn finish(&mut self) -> Result<()> {
        self.write_stage();
        match self.err.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every block the new segments occupy.
    pub(super) fn blocks(&self) -> Vec<BlockNr> {
        self.segs
            .iter()
            .flat_map(|s| s.blocks().iter().copied())
            .collect()
    }

    /// Payload bytes of the new segments.
    pub(super) fn bytes(&self) -> usize {
        self.segs.iter().map(|s| s.bytes).sum()
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

    /// Keep the working vectors of a finished cut for the next one.
    pub(super) fn keep_scratch(&self, b: Builder, mut changes: Vec<Change>, mut dead: Vec<Loc>) {
        let (mut stage, mut placed, mut gone) = (b.stage, b.placed, b.gone);
        let used = std::mem::size_of_val(placed.as_slice())
            + std::mem::size_of_val(gone.as_slice())
            + std::mem::size_of_val(changes.as_slice())
            + std::mem::size_of_val(dead.as_slice());
        {
            let mut st = self.ckpt_stats.lock();
            st.scratch_peak_bytes = st.scratch_peak_bytes.max(used as u64);
        }
        stage.clear();
        placed.clear();
        gone.clear();
        changes.clear();
        dead.clear();
        *self.cut_scratch.lock() = CutScratch {
            stage,
            placed,
            gone,
            changes,
            dead,
        };
    }

    /// Blocks for a checkpoint: the reserve first, then the engine.
    pub(super) fn take_meta_blocks(&self, need: usize) -> Result<Vec<BlockNr>> {
        if need == 0 {
            return Ok(Vec::new());
        }
        let mut meta = self.meta.lock();
        let from_reserve = need.min(meta.reserve.len());
        let mut blocks: Vec<BlockNr> = meta.reserve.drain(..from_reserve).collect();
        if blocks.len() < need {
            match self.engine.alloc_meta(need - blocks.len()) {
                Ok(more) => blocks.extend(more),
                Err(e) => {
                    meta.reserve.append(&mut blocks);
                    return Err(e.into());
                }
            }
        }
        Ok(blocks)
    }

    /// A new chain generation (a segment's or a manifest's).
    pub(super) fn take_gen(&self) -> u64 {
        let mut meta = self.meta.lock();
        meta.next_gen += 1;
        meta.next_gen - 1
    }

    /// Blocks a failed checkpoint took go back to the reserve.
    pub(super) fn give_back(&self, blocks: Vec<BlockNr>) {
        self.meta.lock().reserve.extend(blocks);
    }
}
