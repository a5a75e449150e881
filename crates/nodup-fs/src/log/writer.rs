//! Appending records to the log chain, with a small pool of pre-allocated metadata blocks so
//! most appends do not call the engine's allocator.
//!
//! The log is one chain for the life of a mount. A checkpoint does not start a new log: it
//! records a cut ([`LogPos`]) in the superblock, replay starts there, and the blocks before the
//! cut's block are given back once the superblock names the new cut.

use crate::chain::{cut_tail, ChainKind, ChainWriter};
use crate::error::Result;
use crate::log::held::{HeldBack, HELD_LIMIT};
use crate::log::record::Record;
use nodup_core::media::Medium;
use nodup_core::BlockNr;

/// Metadata blocks fetched from the engine at a time for the log.
pub const LOG_REFILL: usize = 32;

/// A position in the log: where replay starts (a checkpoint's cut) or where appending resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogPos {
    /// The block holding the position.
    pub block: BlockNr,
    /// That block's index in the chain.
    pub index: u64,
    /// Payload offset inside the block (`PAYLOAD` = at the start of the next block).
    pub off: usize,
    /// Sequence number of the record that starts there.
    pub seq: u64,
}

/// The log being appended to.
pub struct LogWriter {
    chain: ChainWriter,
    gen: u64,
    /// Sequence number of the next record.
    pub next_seq: u64,
    /// Pre-allocated blocks not yet linked into the chain (freed at clean shutdown, reclaimed by
    /// failure recovery otherwise, since nothing on the medium references them).
    pub spare: Vec<BlockNr>,
    /// Records appended since the last cut.
    pub records: u64,
    /// Payload bytes appended since the last cut.
    cut_bytes: u64,
    /// A failed append may have left a valid frame past the end: its stores can land though
    /// its fence fails, and a crash, or a reopen after a clean unmount, would replay it.
    unsure: bool,
    /// Blocks at the front of `spare` a failed append may have written into (its frame went
    /// on past the end's block).
    unsure_spare: usize,
    /// References named by records whose append failed, kept while such a frame may be there
    /// (see [`LogWriter::settled`]): given back at once, they could be reused or trimmed
    /// under a record that replays.
    held: Vec<BlockNr>,
    /// On a block file, appended records not yet written to the medium (`log/held.rs`).
    held_back: Option<HeldBack>,
}

impl LogWriter {
    /// A fresh log in block `first` (header flushed, not fenced).
    pub fn start(m: &dyn Medium, gen: u64, first: BlockNr, next_seq: u64) -> Result<LogWriter> {
        Ok(LogWriter {
            chain: ChainWriter::start(m, ChainKind::Log, gen, first)?,
            gen,
            next_seq,
            spare: Vec::new(),
            records: 0,
            cut_bytes: 0,
            unsure: false,
            unsure_spare: 0,
            held: Vec::new(),
            held_back: None,
        })
    }

    /// Continue an existing log after replay: `blocks` from the replay start on (chain index
    /// `first_index`), appending at `end`; `records`/`bytes` were replayed since the cut.
    pub fn resume(
        gen: u64,
        first_index: u64,
        blocks: Vec<BlockNr>,
        end: LogPos,
        records: u64,
        bytes: u64,
    ) -> LogWriter {
        LogWriter {
            chain: ChainWriter::resume(ChainKind::Log, gen, first_index, blocks, end.off),
            gen,
            next_seq: end.seq,
            spare: Vec::new(),
            records,
            cut_bytes: bytes,
            unsure: false,
            unsure_spare: 0,
            held: Vec::new(),
            held_back: None,
        }
    }

    /// Hold appended records back until [`LogWriter::write_out`] (a block-file image, whose
    /// engine leaves the data the records name unfenced; `log/held.rs`).
    pub fn hold_back_records(&mut self) {
        self.held_back.get_or_insert_with(HeldBack::default);
    }

    /// Write every record held back (nothing when none is), after a fence when `fence` is set;
    /// see [`HeldBack::write_out`].
    pub fn write_out(&mut self, m: &dyn Medium, fence: bool) -> Result<()> {
        match &mut self.held_back {
            Some(h) => h.write_out(m, fence),
            None => Ok(()),
        }
    }

    /// True when records are held back, waiting for [`LogWriter::write_out`].
    pub fn holds_records(&self) -> bool {
        self.held_back.as_ref().is_some_and(|h| !h.is_empty())
    }

    /// Generation of the log chain.
    pub fn gen(&self) -> u64 {
        self.gen
    }

    /// Blocks of the log chain still held (from the block of the last cut on).
    pub fn blocks(&self) -> &[BlockNr] {
        self.chain.blocks()
    }

    /// Payload bytes appended since the last cut.
    pub fn bytes(&self) -> u64 {
        self.cut_bytes
    }

    /// The current end of the log: where the next record goes, and where a cut taken now puts
    /// the start of replay.
    pub fn position(&self) -> LogPos {
        let (block, index, off) = self.chain.end();
        LogPos {
            block,
            index,
            off,
            seq: self.next_seq,
        }
    }

    /// A checkpoint took a cut at the current end: count from zero again. Returns the counts
    /// before, for [`LogWriter::unmark_cut`].
    pub fn mark_cut(&mut self) -> (u64, u64) {
        let old = (self.records, self.cut_bytes);
        self.records = 0;
        self.cut_bytes = 0;
        old
    }

    /// The checkpoint that took the cut failed: the old cut stays in force.
    pub fn unmark_cut(&mut self, old: (u64, u64)) {
        self.records += old.0;
        self.cut_bytes += old.1;
    }

    /// Hand back the blocks before the block of `cut` (the superblock names `cut` now).
    pub fn drop_before(&mut self, cut: &LogPos) -> Vec<BlockNr> {
        self.chain.drop_before(cut.index)
    }

    /// Keep `blocks`, named by a record whose append failed, until a scrub has erased what
    /// that append may have left (see [`LogWriter::settled`]).
    pub fn hold(&mut self, blocks: &[BlockNr]) {
        self.held.extend_from_slice(blocks);
    }

    /// True while a failed append may have left a valid frame past the end.
    pub fn unsure(&self) -> bool {
        self.unsure
    }

    /// References held for failed appends (see [`LogWriter::hold`]).
    pub fn held(&self) -> &[BlockNr] {
        &self.held
    }

    /// The held references nothing on the medium can name any more, for the caller to give
    /// back: all of them once a scrub (the next append's, or a checkpoint's) has erased what
    /// a failed append may have left; none while such a frame may still be there.
    pub fn settled(&mut self) -> Vec<BlockNr> {
        if self.unsure {
            return Vec::new();
        }
        std::mem::take(&mut self.held)
    }

    /// Erase what a failed append may have left past the end (zeros over the rest of the last
    /// block and its link, and over the spare blocks its frame went on into; fenced), so that
    /// no replay can read it. The next append does this first: a shorter record would
    /// otherwise leave the failed frame's tail after it, where replay looks for the next one
    /// (and a record's bytes can be a user's, an xattr value). A checkpoint does it before its
    /// cut, which starts replay at the end.
    pub fn scrub(&mut self, m: &dyn Medium) -> Result<()> {
        if self.unsure {
            let zeros = [0u8; nodup_core::BLOCK_SIZE];
            for &b in &self.spare[..self.unsure_spare.min(self.spare.len())] {
                let at = b * nodup_core::BLOCK_SIZE as u64;
                m.write(at, &zeros)?;
                m.flush(at, zeros.len() as u64);
            }
            let (block, _, off) = self.chain.end();
            cut_tail(m, block, off)?;
            self.unsure = false;
            self.unsure_spare = 0;
        }
        Ok(())
    }

    /// New blocks an append of `bytes` more payload needs beyond the spare pool.
    pub fn blocks_short(&self, bytes: usize) -> usize {
        self.chain
            .blocks_needed(bytes)
            .saturating_sub(self.spare.len())
    }

    /// Append `rec`; `alloc` supplies metadata blocks when the spare pool runs dry. Flushes the
    /// stores and, when `fence` is set, makes the record durable before returning.
    pub fn append(
        &mut self,
        m: &dyn Medium,
        rec: &Record,
        fence: bool,
        alloc: &mut dyn FnMut(usize) -> Result<Vec<BlockNr>>,
    ) -> Result<()> {
        debug_assert!(
            !(fence && self.held_back.is_some()),
            "held-back records are not fenced"
        );
        if let Some(h) = &mut self.held_back {
            // Written out first when a scrub is due, so its zeros come after what is held.
            if self.unsure || h.bytes() >= HELD_LIMIT {
                // Fenced: the caller's note of unfenced data is not at hand here (rare).
                h.write_out(m, true)?;
            }
        }
        self.scrub(m)?;
        let frame = rec.frame(self.next_seq);
        let need = self.chain.blocks_needed(frame.len());
        if self.spare.len() < need {
            let want = (need - self.spare.len()).max(LOG_REFILL);
            match alloc(want) {
                Ok(more) => self.spare.extend(more),
                // The pool refill is a convenience: take exactly what this frame needs.
                Err(_) => self.spare.extend(alloc(need - self.spare.len())?),
            }
        }
        let fresh: Vec<BlockNr> = self.spare.drain(..need).collect();
        let saved = self.chain.mark();
        let chain = &mut self.chain;
        let appended = match &mut self.held_back {
            Some(h) => h.hold(m, |o| chain.append(o, &frame, &fresh)),
            None => chain.append(m, &frame, &fresh),
        };
        if let Err(e) = appended {
            // A partial frame fails its checksum: roll the position back so the next record
            // (same sequence number) overwrites it, and keep the blocks for later.
            self.chain.rewind(saved);
            self.unsure_spare = self.unsure_spare.max(fresh.len());
            self.spare.splice(0..0, fresh);
            // A write reported failed may still have landed whole.
            self.unsure = true;
            return Err(e);
        }
        if fence {
            if let Err(e) = m.fence() {
                // Not committed: the DRAM state does not include it. Roll back so the next
                // record (same sequence number) overwrites this frame; a crash before that can
                // at most show the failed operation as done, and so the caller holds the
                // blocks it names until then.
                self.chain.rewind(saved);
                self.unsure_spare = self.unsure_spare.max(fresh.len());
                self.spare.splice(0..0, fresh);
                self.unsure = true;
                return Err(e.into());
            }
        }
        self.next_seq += 1;
        self.records += 1;
        self.cut_bytes += frame.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inode::Ts;
    use crate::log::replay::replay;
    use nodup_core::media::{FaultMedium, FaultOp, FaultRule, MemMedium};
    use nodup_core::BLOCK_SIZE;
    use std::sync::Arc;

    fn rec(i: u64) -> Record {
        Record::SetXattr {
            ino: i,
            name: b"user.x".to_vec(),
            value: vec![i as u8; 500 + (i as usize * 53) % 700],
            now: Ts { sec: 1, nsec: 0 },
        }
    }

    /// The inodes of the SetXattr records a log of generation 3 starting in block 10 at
    /// sequence 100 replays, in order.
    fn replayed(m: &dyn Medium) -> Vec<u64> {
        let start = LogPos {
            block: 10,
            index: 0,
            off: 0,
            seq: 100,
        };
        let mut seen = Vec::new();
        replay(m, start, 3, &mut |_, r| {
            if let Record::SetXattr { ino, .. } = r {
                seen.push(ino);
            }
            Ok(true)
        })
        .unwrap();
        seen
    }

    /// An append that fails after linking a new block, or whose fence fails, leaves the writer
    /// where it was: the retried record lands in sequence, and the log replays without a gap
    /// or a repeat.
    #[test]
    fn failed_append_rewinds_to_where_it_started() {
        let m = Arc::new(MemMedium::new(256 * BLOCK_SIZE as u64));
        let fm = FaultMedium::new(m.clone(), 1);
        let mut w = LogWriter::start(&fm, 3, 10, 100).unwrap();
        // Blocks are handed out in order from 11: `11..next` is everything handed out so far.
        let next = std::cell::Cell::new(11u64);
        let mut alloc = |n: usize| -> Result<Vec<BlockNr>> {
            let v: Vec<BlockNr> = (next.get()..next.get() + n as u64).collect();
            next.set(next.get() + n as u64);
            Ok(v)
        };
        // Every block handed out is in the chain or kept spare, once.
        let accounted = |w: &LogWriter, next: u64| {
            let mut held: Vec<BlockNr> = w.blocks()[1..].to_vec();
            held.extend(&w.spare);
            held.sort_unstable();
            assert_eq!(held, (11..next).collect::<Vec<_>>());
        };
        let (mut failed, mut fence_failed) = (0, 0);
        for i in 0..60u64 {
            let r = rec(i);
            let crosses = w.chain.blocks_needed(r.frame(0).len()) > 0;
            let rule = if crosses && !w.spare.is_empty() && failed < 3 {
                // The new block's header and link are written, then its payload fails.
                failed += 1;
                Some(
                    FaultRule::new(FaultOp::Write)
                        .range(w.spare[0] * BLOCK_SIZE as u64, BLOCK_SIZE as u64)
                        .nth(3)
                        .once(),
                )
            } else if i % 10 == 5 {
                // The record is written whole but its fence fails: not committed either.
                fence_failed += 1;
                Some(FaultRule::new(FaultOp::Fence).once())
            } else {
                None
            };
            if let Some(rule) = rule {
                fm.add_rule(rule);
                let (blocks, seq) = (w.blocks().to_vec(), w.next_seq);
                let pos = w.position();
                assert!(w.append(&fm, &r, true, &mut alloc).is_err());
                // Where it was; blocks taken for the record are kept spare for the retry.
                assert_eq!((w.blocks(), w.next_seq), (&blocks[..], seq));
                assert_eq!(w.position(), pos);
                accounted(&w, next.get());
                fm.clear_rules();
            }
            w.append(&fm, &r, true, &mut alloc).unwrap();
        }
        assert_eq!((failed, fence_failed), (3, 6));
        assert_eq!(replayed(&*m), (0..60).collect::<Vec<_>>());
    }

    /// A failed append's frame can land though its fence fails. The next record goes where it
    /// was; when that one is shorter, replay looks for a third record in what is left of the
    /// failed one, whose bytes can be a user's (an xattr value). A forged frame there, with
    /// the next sequence number, must not replay: in the end's block, and in the spare
    /// block the failed frame went on into.
    #[test]
    fn a_shorter_record_after_a_failed_one_leaves_nothing_to_replay() {
        for spanning in [false, true] {
            let m = Arc::new(MemMedium::new(256 * BLOCK_SIZE as u64));
            let fm = FaultMedium::new(m.clone(), 1);
            let mut w = LogWriter::start(&fm, 3, 10, 100).unwrap();
            let mut next = 11u64;
            let mut alloc = |n: usize| -> Result<Vec<BlockNr>> {
                let v: Vec<BlockNr> = (next..next + n as u64).collect();
                next += n as u64;
                Ok(v)
            };
            let xattr = |ino: u64, value: Vec<u8>| Record::SetXattr {
                ino,
                name: b"user.x".to_vec(),
                value,
                now: Ts { sec: 1, nsec: 0 },
            };
            if spanning {
                // Fill the first block to 100 bytes short of its end, so both records below
                // cross into the next block and the short one ends inside it.
                let fixed = xattr(1, Vec::new()).frame(0).len();
                let fill = crate::chain::PAYLOAD - 100 - fixed;
                w.append(&fm, &xattr(1, vec![7; fill]), true, &mut alloc)
                    .unwrap();
                assert_eq!(w.position().off, crate::chain::PAYLOAD - 100);
            }
            let seq = w.next_seq;
            let short = xattr(2, vec![1; 200]);
            let at = short.frame(seq).len();
            let forged = xattr(666, b"forged".to_vec()).frame(seq + 1);
            // The failed record's value is placed so the forged frame starts where the short
            // record ends.
            let marker = vec![0xA5u8; 1000];
            let probe = xattr(2, marker.clone()).frame(seq);
            let vo = probe.windows(8).position(|x| x == [0xA5; 8]).unwrap();
            let mut value = marker;
            value[at - vo..at - vo + forged.len()].copy_from_slice(&forged);
            fm.add_rule(FaultRule::new(FaultOp::Fence).once());
            assert!(w.append(&fm, &xattr(2, value), true, &mut alloc).is_err());
            fm.clear_rules();
            w.append(&fm, &short, true, &mut alloc).unwrap();
            let want = if spanning { vec![1, 2] } else { vec![2] };
            assert_eq!(replayed(&*m), want, "spanning {spanning}");
        }
    }
}
