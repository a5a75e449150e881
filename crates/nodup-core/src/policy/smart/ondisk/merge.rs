//! The streaming read-merge-write of an on-media group (eviction's merge, SmartDedup §3.2).
//! The old chain is read one block at a time and the merged records are written over it as
//! they fill blocks, so a merge holds a block of the old group, one block being filled and the
//! records it adds, never the whole group: with a fixed budget the groups grow with the data
//! (at 512 KiB, a group passes four blocks at about 4 GiB of unique data), and a merge buffer
//! sized by the largest group would grow with them.
//!
//! Output block `k` is written over old block `k`, so old blocks up to `k` are always read
//! before it is written. Records read ahead and not yet merged wait in a queue; the output can
//! run ahead of the input only by the records added, so the queue holds at most those plus a
//! block. A full output block is written when the next record arrives, so every block's `next`
//! is known when it is written and no block is left empty. Blocks past the old chain come from
//! the allocator, blocks the merged group no longer needs go back to it.
//!
//! Failures (see [`MergeError`]): old blocks already overwritten are lost with the group, as
//! in a whole-group merge whose write fails; nothing of a damaged chain is trusted.

use std::collections::{HashSet, VecDeque};

use super::{off, GroupIo, Rec, PER_BLOCK};
use crate::codec::le_u64;
use crate::{BlockNr, Error};

/// The on-media group a merge starts from, as the store's directory records it (validated
/// against the chain while it is read).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OldGroup {
    pub(crate) head: BlockNr,
    pub(crate) len: u32,
    pub(crate) nblocks: u32,
}

/// The reused buffers of a merge: sized at open, they grow only past an added group larger
/// than a block (the in-memory groups, which the budget bounds), never with the on-media group.
/// (`Default` is empty, for taking the buffers out while they are lent.)
#[derive(Default)]
pub(crate) struct MergeBuf {
    /// Old records read and not yet merged.
    pending: VecDeque<Rec>,
    /// The output block being filled.
    out: Vec<Rec>,
    /// The merged group's chain (on success): 8 bytes per block of the group.
    pub(crate) chain: Vec<BlockNr>,
}

impl MergeBuf {
    /// Buffers for merges that add up to a block of records at a time.
    pub(crate) fn new() -> MergeBuf {
        MergeBuf {
            pending: VecDeque::with_capacity(2 * PER_BLOCK),
            out: Vec::with_capacity(PER_BLOCK),
            chain: Vec::with_capacity(4),
        }
    }

    /// Heap bytes the buffers hold.
    pub(crate) fn bytes(&self) -> u64 {
        ((self.pending.capacity() + self.out.capacity()) * std::mem::size_of::<Rec>()
            + self.chain.capacity() * std::mem::size_of::<BlockNr>()) as u64
    }
}

/// Why a merge failed; either way the group is gone and the caller forgets it.
#[derive(Debug)]
pub(crate) enum MergeError {
    /// The old group failed validation (or could not be read). Its blocks stay allocated (a
    /// damaged chain may name blocks that are not the group's) until failure recovery or
    /// `fsck --repair` rebuilds the allocator; blocks this merge took went back.
    Damaged(Error),
    /// A block could not be taken or written. The group is lost and its blocks went back: the
    /// old blocks read so far, those this merge took, and the old blocks not reached yet as
    /// far as they validate as the group's (one that does not, and any after it, stay
    /// allocated, as for [`MergeError::Damaged`]).
    Failed(Error),
}

/// One merge in progress.
struct Merge<'a> {
    io: &'a mut GroupIo,
    bits: u32,
    prefix: u32,
    old: OldGroup,
    tombs: &'a mut HashSet<Rec>,
    buf: &'a mut MergeBuf,
    /// Next old block to read (0 when the chain has been read to its end).
    next_old: BlockNr,
    /// Old blocks read (`buf.chain[..read]`) and the records they held.
    read: usize,
    read_recs: u64,
    /// Last record read (the next block's records must be above it).
    last_in: Option<Rec>,
    /// Output blocks written and records in them.
    written: usize,
    total: u64,
}

impl GroupIo {
    /// Merge `add` (sorted) into the group of `prefix` (`bits`-bit prefixes) that starts as
    /// `old` (none: a new group), dropping the old records found in `tombs` (and taking them
    /// out of it); equal records are kept once. On success `buf.chain` is the new chain (empty
    /// when no record is left) and the result its record count.
    pub(crate) fn merge(
        &mut self,
        bits: u32,
        prefix: u32,
        old: Option<OldGroup>,
        add: &[Rec],
        tombs: &mut HashSet<Rec>,
        buf: &mut MergeBuf,
    ) -> std::result::Result<u32, MergeError> {
        buf.pending.clear();
        buf.out.clear();
        buf.chain.clear();
        let old = old.unwrap_or(OldGroup {
            head: 0,
            len: 0,
            nblocks: 0,
        });
        // A chain is read before any of it is written, except that a directory naming no
        // chain would have block 0 written: refused first.
        if (old.head == 0) != (old.nblocks == 0) || (old.len == 0) != (old.nblocks == 0) {
            return Err(MergeError::Damaged(Error::Corrupt(format!(
                "fingerprint group {prefix}: directory entry {old:?}"
            ))));
        }
        let mut m = Merge {
            io: self,
            bits,
            prefix,
            old,
            tombs,
            buf,
            next_old: old.head,
            read: 0,
            read_recs: 0,
            last_in: None,
            written: 0,
            total: 0,
        };
        let r = m.run(add);
        if let Err(e) = &r {
            // Blocks past the old chain were taken by this merge (they exist only once the
            // whole old chain has been read).
            let known = match e {
                MergeError::Damaged(_) => m.buf.chain.len().min(m.old.nblocks as usize),
                MergeError::Failed(_) => 0,
            };
            let mut chain = std::mem::take(&mut m.buf.chain);
            if matches!(e, MergeError::Failed(_)) {
                // The group is lost: the old blocks not reached yet go back with it, as far
                // as the chain validates (nothing else would ever free them).
                let rest = m.unread_old();
                chain.extend(rest);
            }
            m.io.give_back(&chain[known..]);
            m.buf.chain = chain;
            m.buf.chain.clear();
        }
        r
    }
}

impl Merge<'_> {
    fn run(&mut self, add: &[Rec]) -> std::result::Result<u32, MergeError> {
        let mut ai = 0;
        let mut last: Option<Rec> = None;
        loop {
            while self.buf.pending.is_empty() && self.next_old != 0 {
                self.read_old()?;
            }
            let r = match (self.buf.pending.front().copied(), add.get(ai).copied()) {
                (None, None) => break,
                (Some(x), Some(y)) if y < x => {
                    ai += 1;
                    y
                }
                (Some(x), _) => {
                    self.buf.pending.pop_front();
                    x
                }
                (None, Some(y)) => {
                    ai += 1;
                    y
                }
            };
            if last == Some(r) {
                continue;
            }
            last = Some(r);
            if self.buf.out.len() == PER_BLOCK {
                self.flush(true)?;
            }
            self.buf.out.push(r);
        }
        if !self.buf.out.is_empty() {
            self.flush(false)?;
        }
        // The loop ran until the old chain was read to its end (`read_old` checked its length).
        if self.read_recs != self.old.len as u64 {
            return Err(MergeError::Damaged(self.corrupt(format!(
                "{} records, expected {}",
                self.read_recs, self.old.len
            ))));
        }
        let tail = self.buf.chain.split_off(self.written);
        self.io.give_back(&tail);
        Ok(self.total as u32)
    }

    fn corrupt(&self, m: String) -> Error {
        Error::Corrupt(format!("fingerprint group {}: {m}", self.prefix))
    }

    /// Read the next old block, queueing its records that are not tombstoned.
    fn read_old(&mut self) -> std::result::Result<(), MergeError> {
        if self.read >= self.old.nblocks as usize {
            let e = self.corrupt(format!("chain longer than {} blocks", self.old.nblocks));
            return Err(MergeError::Damaged(e));
        }
        let (b, n) = self.step_old().map_err(MergeError::Damaged)?;
        for i in 0..n {
            let r = self.io.record(i);
            if !self.tombs.remove(&r) {
                self.buf.pending.push_back(r);
            }
        }
        self.read_recs += n as u64;
        self.buf.chain.push(b);
        if self.next_old == 0 && self.read != self.old.nblocks as usize {
            let e = self.corrupt(format!(
                "{} blocks, expected {}",
                self.read, self.old.nblocks
            ));
            return Err(MergeError::Damaged(e));
        }
        Ok(())
    }

    /// Read and validate the next old block (`next_old`, at position `read`) into the group
    /// I/O's buffer, where its records stay for the caller, and move past it. Returns the block
    /// and its record count.
    fn step_old(&mut self) -> crate::Result<(BlockNr, usize)> {
        let b = self.next_old;
        let n = self
            .io
            .read_block(b, self.bits, self.prefix, self.read, self.last_in)?;
        self.last_in = Some(self.io.record(n - 1));
        self.read += 1;
        self.next_old = le_u64(&self.io.buf, off::NEXT);
        Ok((b, n))
    }

    /// After a failed write: the old blocks not read yet, following the chain from
    /// `next_old` while each block validates as the group's block at its position (a block
    /// that does not ends the walk; it and any after it stay allocated, as for damage).
    fn unread_old(&mut self) -> Vec<BlockNr> {
        let mut out = Vec::new();
        while self.next_old != 0 && self.read < self.old.nblocks as usize {
            let b = self.next_old;
            if self.buf.chain.contains(&b) || out.contains(&b) {
                break;
            }
            match self.step_old() {
                Ok(_) => out.push(b),
                Err(_) => break,
            }
        }
        out
    }

    /// The block at position `k` of the new chain: an old block (already read, or the next
    /// one to read), or past the old chain a block taken now.
    fn block_at(&mut self, k: usize) -> std::result::Result<BlockNr, MergeError> {
        if let Some(&b) = self.buf.chain.get(k) {
            return Ok(b);
        }
        if k < self.old.nblocks as usize {
            // Only ever the block right after those read (the caller read up to `k - 1`).
            debug_assert_eq!(k, self.read);
            return Ok(self.next_old);
        }
        let b = self
            .io
            .alloc
            .alloc(&mut self.io.pool)
            .map_err(MergeError::Failed)?;
        self.buf.chain.push(b);
        Ok(b)
    }

    /// Write the output block (position `written`); `more` when another block follows.
    fn flush(&mut self, more: bool) -> std::result::Result<(), MergeError> {
        let k = self.written;
        // Old block `k` is about to be overwritten: its records must be queued first.
        while self.read <= k && self.next_old != 0 {
            self.read_old()?;
        }
        let at = self.block_at(k)?;
        let next = if more { self.block_at(k + 1)? } else { 0 };
        let out = std::mem::take(&mut self.buf.out);
        let r = self.io.put_block(at, self.prefix, k, next, &out);
        self.buf.out = out;
        r.map_err(MergeError::Failed)?;
        self.total += self.buf.out.len() as u64;
        self.buf.out.clear();
        self.written += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::alloc::Allocator;
    use crate::media::{Medium, MemMedium};
    use crate::BLOCK_SIZE;

    const BLOCKS: u64 = 64;

    fn io() -> GroupIo {
        let m: Arc<dyn Medium> = Arc::new(MemMedium::new(BLOCKS * BLOCK_SIZE as u64));
        GroupIo::new(m, Arc::new(Allocator::new(8, BLOCKS - 8)))
    }

    const P: u32 = 0x5a;

    fn rec(k: u64) -> Rec {
        ((P as u64) << 56 | k, k * 2 + 1)
    }

    /// Write `recs` as a fresh group; its directory entry.
    fn fresh(g: &mut GroupIo, recs: &[Rec]) -> Option<OldGroup> {
        let mut chain = Vec::new();
        g.write(P, &mut chain, recs).unwrap();
        chain.first().map(|&head| OldGroup {
            head,
            len: recs.len() as u32,
            nblocks: chain.len() as u32,
        })
    }

    /// Read the group named by `chain` back whole.
    fn back(g: &mut GroupIo, chain: &[BlockNr], len: u32) -> Vec<Rec> {
        if chain.is_empty() {
            return Vec::new();
        }
        let mut out = super::super::Group::default();
        g.read(8, P, chain[0], len, chain.len() as u32, &mut out)
            .unwrap();
        assert_eq!(out.chain, chain);
        out.recs
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Any old group, additions and tombstones: the merged group is the model's set, its
        /// blocks are exactly the allocator's taken blocks, and the queue stays within the
        /// added records plus a block.
        #[test]
        fn merges_match_the_model(
            old in prop::collection::btree_set(0u64..3000, 0..900),
            add in prop::collection::btree_set(0u64..3000, 0..600),
            dead in prop::collection::btree_set(0u64..3000, 0..400),
        ) {
            let mut g = io();
            let old: Vec<Rec> = old.into_iter().map(rec).collect();
            let add: Vec<Rec> = add.into_iter().map(rec).collect();
            let mut tombs: HashSet<Rec> = dead.iter().map(|&k| rec(k)).collect();
            let dir = fresh(&mut g, &old);
            let mut want: std::collections::BTreeSet<Rec> =
                old.iter().filter(|r| !tombs.contains(r)).copied().collect();
            want.extend(add.iter().copied());
            let applied: usize = old.iter().filter(|r| tombs.contains(r)).count();
            let before = tombs.len();
            let io_before = (g.read_bytes, g.written_bytes);
            let mut buf = MergeBuf::new();
            let n = g.merge(8, P, dir, &add, &mut tombs, &mut buf).unwrap();
            // The same I/O as a whole-group merge: every old block read, every new one written.
            let blk = BLOCK_SIZE as u64;
            prop_assert_eq!(g.read_bytes - io_before.0, dir.map_or(0, |d| d.nblocks as u64) * blk);
            prop_assert_eq!(g.written_bytes - io_before.1, buf.chain.len() as u64 * blk);
            prop_assert_eq!(n as usize, want.len());
            prop_assert_eq!(tombs.len(), before - applied);
            prop_assert_eq!(buf.chain.len(), super::super::blocks_for(want.len()));
            prop_assert_eq!(g.alloc.free_blocks(), BLOCKS - 8 - buf.chain.len() as u64);
            let got = back(&mut g, &buf.chain, n);
            prop_assert_eq!(got, want.into_iter().collect::<Vec<_>>());
            prop_assert!(buf.pending.capacity() <= (2 * PER_BLOCK).max(add.len() + PER_BLOCK) * 2);
            // Old blocks are reused in place, from the head.
            if let (Some(d), Some(&h)) = (dir, buf.chain.first()) {
                prop_assert_eq!(h, d.head);
            }
        }

        /// A damaged old block (any byte of any block) fails the merge as damaged: the group
        /// is not trusted, its blocks stay allocated, nothing the merge took stays taken.
        #[test]
        fn a_damaged_old_group_fails_and_keeps_its_blocks(
            len in 1u64..900,
            add in prop::collection::btree_set(0u64..3000, 0..600),
            which in any::<prop::sample::Index>(),
            byte in 0usize..BLOCK_SIZE,
        ) {
            let mut g = io();
            let old: Vec<Rec> = (0..len).map(|k| rec(k * 3)).collect();
            let add: Vec<Rec> = add.into_iter().map(rec).collect();
            let dir = fresh(&mut g, &old).unwrap();
            let mut chain = super::super::Group::default();
            g.read(8, P, dir.head, dir.len, dir.nblocks, &mut chain).unwrap();
            let b = chain.chain[which.index(chain.chain.len())];
            let at = b * BLOCK_SIZE as u64 + byte as u64;
            let mut x = [0u8; 1];
            g.medium.read(at, &mut x).unwrap();
            g.medium.write(at, &[x[0] ^ 0x10]).unwrap();
            let free = g.alloc.free_blocks();
            let mut buf = MergeBuf::new();
            let r = g.merge(8, P, Some(dir), &add, &mut HashSet::new(), &mut buf);
            // A flip in the reserved or unused bytes is caught by the checksum too.
            prop_assert!(matches!(r, Err(MergeError::Damaged(_))), "{:?}", r);
            prop_assert!(buf.chain.is_empty());
            prop_assert_eq!(g.alloc.free_blocks(), free);
        }
    }

    #[test]
    fn a_wrong_directory_is_damage() {
        let mut g = io();
        let old: Vec<Rec> = (0..600).map(rec).collect();
        let dir = fresh(&mut g, &old).unwrap();
        let free = g.alloc.free_blocks();
        let add: Vec<Rec> = (600..1400).map(rec).collect();
        for bad in [
            OldGroup { len: 599, ..dir },
            OldGroup { len: 601, ..dir },
            OldGroup { nblocks: 2, ..dir },
            OldGroup { nblocks: 4, ..dir },
            OldGroup { nblocks: 0, ..dir },
            OldGroup { head: 0, ..dir },
            OldGroup { len: 0, ..dir },
        ] {
            let mut buf = MergeBuf::new();
            let r = g.merge(8, P, Some(bad), &add, &mut HashSet::new(), &mut buf);
            assert!(matches!(r, Err(MergeError::Damaged(_))), "{bad:?}");
            assert_eq!(g.alloc.free_blocks(), free, "{bad:?}");
        }
    }

    #[test]
    fn a_merge_the_allocator_cannot_hold_gives_back_what_it_knows() {
        let mut g = io();
        let old: Vec<Rec> = (0..2 * PER_BLOCK as u64).map(|k| rec(k * 100)).collect();
        let dir = fresh(&mut g, &old).unwrap();
        assert_eq!(g.alloc.free_blocks(), BLOCKS - 8 - 2);
        // 60 blocks' worth from an allocator of 56.
        let add: Vec<Rec> = (0..60 * PER_BLOCK as u64)
            .map(|k| rec(k * 100 + 1))
            .collect();
        let mut buf = MergeBuf::new();
        let r = g.merge(8, P, Some(dir), &add, &mut HashSet::new(), &mut buf);
        assert!(matches!(r, Err(MergeError::Failed(_))));
        assert!(buf.chain.is_empty());
        assert_eq!(g.alloc.free_blocks(), BLOCKS - 8);
    }

    /// A merge whose write of an output block fails (whole, or after its bytes landed) loses
    /// the group, and gives every block of it back: the old blocks it had not read yet too
    /// (the caller forgets the group, so nothing else ever frees them).
    #[test]
    fn a_merge_whose_write_fails_gives_every_block_of_the_group_back() {
        use crate::media::{FaultMedium, FaultOp, FaultRule};
        for landed in [false, true] {
            for nth in 1..=4u64 {
                let mem: Arc<dyn Medium> = Arc::new(MemMedium::new(BLOCKS * BLOCK_SIZE as u64));
                let fm = Arc::new(FaultMedium::new(mem, 1));
                let mut g = GroupIo::new(fm.clone(), Arc::new(Allocator::new(8, BLOCKS - 8)));
                // Three full blocks; one record added makes the merged group four.
                let old: Vec<Rec> = (0..3 * PER_BLOCK as u64).map(|k| rec(k * 2)).collect();
                let dir = fresh(&mut g, &old).unwrap();
                assert_eq!(g.alloc.free_blocks(), BLOCKS - 8 - 3);
                let rule = FaultRule::new(FaultOp::Write).nth(nth).once();
                fm.add_rule(if landed {
                    rule.short_write(usize::MAX)
                } else {
                    rule
                });
                let mut buf = MergeBuf::new();
                let r = g.merge(8, P, Some(dir), &[rec(1)], &mut HashSet::new(), &mut buf);
                fm.clear_rules();
                assert!(
                    matches!(r, Err(MergeError::Failed(_))),
                    "write {nth} failing (landed {landed}): {r:?}"
                );
                assert!(buf.chain.is_empty());
                assert_eq!(
                    g.alloc.free_blocks(),
                    BLOCKS - 8,
                    "write {nth} failing (landed {landed}): blocks of the lost group stay allocated"
                );
            }
        }
    }

    /// A read of the old group that fails once (a transient error) is tried again: the merge
    /// goes through instead of losing the group with its unread blocks still allocated.
    #[test]
    fn a_read_that_fails_once_does_not_lose_the_group() {
        use crate::media::{FaultMedium, FaultOp, FaultRule};
        for nth in 1..=3u64 {
            let mem: Arc<dyn Medium> = Arc::new(MemMedium::new(BLOCKS * BLOCK_SIZE as u64));
            let fm = Arc::new(FaultMedium::new(mem, 1));
            let mut g = GroupIo::new(fm.clone(), Arc::new(Allocator::new(8, BLOCKS - 8)));
            let old: Vec<Rec> = (0..3 * PER_BLOCK as u64).map(|k| rec(k * 2)).collect();
            let dir = fresh(&mut g, &old).unwrap();
            fm.add_rule(FaultRule::new(FaultOp::Read).nth(nth).once());
            let mut buf = MergeBuf::new();
            let r = g.merge(8, P, Some(dir), &[rec(1)], &mut HashSet::new(), &mut buf);
            assert_eq!(fm.injected(), 1, "read {nth}");
            assert_eq!(r.ok(), Some(3 * PER_BLOCK as u32 + 1), "read {nth} failing");
            assert_eq!(g.alloc.free_blocks(), BLOCKS - 8 - 4, "read {nth} failing");
        }
    }

    #[test]
    fn the_queue_does_not_grow_with_the_group() {
        // A 50-block group (any budget, enough data) merged with a hundred records at a time:
        // the queue and the output block keep their size at open (the chain list holds 8
        // bytes per block).
        let m: Arc<dyn Medium> = Arc::new(MemMedium::new(256 * BLOCK_SIZE as u64));
        let mut g = GroupIo::new(m, Arc::new(Allocator::new(8, 248)));
        let old: Vec<Rec> = (0..50 * PER_BLOCK as u64).map(|k| rec(k * 4)).collect();
        let mut chain = Vec::new();
        g.write(P, &mut chain, &old).unwrap();
        let mut dir = OldGroup {
            head: chain[0],
            len: old.len() as u32,
            nblocks: 50,
        };
        let mut buf = MergeBuf::new();
        let at_open = (buf.pending.capacity(), buf.out.capacity());
        let mut tombs = HashSet::new();
        for round in 0..20u64 {
            // Records spread over the whole group, and tombstones for some old ones.
            let add: Vec<Rec> = (0..100).map(|k| rec(k * 500 + round % 4 + 1)).collect();
            tombs.extend((0..30).map(|k| rec(k * 400 + round * 8)));
            let n = g
                .merge(8, P, Some(dir), &add, &mut tombs, &mut buf)
                .unwrap();
            dir = OldGroup {
                head: buf.chain[0],
                len: n,
                nblocks: buf.chain.len() as u32,
            };
            assert_eq!(
                (buf.pending.capacity(), buf.out.capacity()),
                at_open,
                "round {round}"
            );
        }
        assert!(dir.nblocks >= 45, "{dir:?}");
    }
}
