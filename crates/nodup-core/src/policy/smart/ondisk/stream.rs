//! Groups read and written a block at a time, for rebucketing when an image saved with another
//! prefix width (another budget) is opened for writing: the saved groups are read in prefix
//! order, which is fingerprint order for both widths, and their records are appended to the new
//! width's groups as they come, on blocks taken from the allocator (each old group's blocks go
//! back once it has been read, so later groups may reuse them: the image is marked in use
//! first, see `Engine::begin_use`). Memory: a block's records on each side and the chains'
//! block numbers, not a group (groups grow with the data at a fixed budget).

use super::{off, GroupIo, Rec, PER_BLOCK};
use crate::codec::le_u64;
use crate::{BlockNr, Error, Result};

impl GroupIo {
    /// Read the group of `prefix` (`bits`-bit prefixes) from `head`, `nblocks` blocks long,
    /// one validated block at a time, handing each block's records to `each` (which may write
    /// through the same group I/O). Returns the chain read; an error stops the walk (the
    /// records already handed over came from validated blocks).
    pub(crate) fn read_each(
        &mut self,
        bits: u32,
        prefix: u32,
        head: BlockNr,
        nblocks: u32,
        mut each: impl FnMut(&mut GroupIo, &[Rec]),
    ) -> Result<Vec<BlockNr>> {
        let mut chain = Vec::new();
        let mut recs: Vec<Rec> = Vec::with_capacity(PER_BLOCK);
        let mut last = None;
        self.walk(prefix, head, nblocks, |io, b, seq| {
            let n = io.read_block(b, bits, prefix, seq, last)?;
            recs.clear();
            recs.extend((0..n).map(|i| io.record(i)));
            last = recs.last().copied();
            chain.push(b);
            // The records are copied out first: `each` may write blocks through `io.buf`.
            let next = le_u64(&io.buf, off::NEXT);
            each(io, &recs);
            Ok(Some(next))
        })?;
        Ok(chain)
    }
}

/// A new group written record by record (ascending) on blocks taken as it grows; a full block
/// is written when the next record arrives, with the block taken for that one as its `next`.
pub(crate) struct GroupWriter {
    prefix: u32,
    out: Vec<Rec>,
    chain: Vec<BlockNr>,
    /// Blocks written.
    written: usize,
    /// Records appended.
    len: u32,
    /// The first error: the group is lost (its blocks went back) and later records are only
    /// counted.
    failed: Option<Error>,
}

impl GroupWriter {
    /// An empty group of `prefix`.
    pub(crate) fn new(prefix: u32) -> GroupWriter {
        GroupWriter {
            prefix,
            out: Vec::with_capacity(PER_BLOCK),
            chain: Vec::new(),
            written: 0,
            len: 0,
            failed: None,
        }
    }

    /// The prefix of the group.
    pub(crate) fn prefix(&self) -> u32 {
        self.prefix
    }

    /// Append `r` (above every record appended before).
    pub(crate) fn push(&mut self, io: &mut GroupIo, r: Rec) {
        self.len += 1;
        if self.failed.is_some() {
            return;
        }
        if self.out.len() == PER_BLOCK {
            if let Err(e) = self.flush(io, true) {
                self.fail(io, e);
                return;
            }
        }
        self.out.push(r);
    }

    /// Write the last block: the group's chain and record count, or the error that lost it
    /// with the records it held.
    pub(crate) fn finish(
        mut self,
        io: &mut GroupIo,
    ) -> std::result::Result<(Vec<BlockNr>, u32), (Error, u32)> {
        if self.failed.is_none() && !self.out.is_empty() {
            if let Err(e) = self.flush(io, false) {
                self.fail(io, e);
            }
        }
        match self.failed {
            Some(e) => Err((e, self.len)),
            None => Ok((self.chain, self.len)),
        }
    }

    fn fail(&mut self, io: &mut GroupIo, e: Error) {
        io.give_back(&self.chain);
        self.chain.clear();
        self.out.clear();
        self.failed = Some(e);
    }

    fn block(&mut self, io: &mut GroupIo, k: usize) -> Result<BlockNr> {
        if let Some(&b) = self.chain.get(k) {
            return Ok(b);
        }
        let b = io.alloc.alloc(&mut io.pool)?;
        self.chain.push(b);
        Ok(b)
    }

    fn flush(&mut self, io: &mut GroupIo, more: bool) -> Result<()> {
        let k = self.written;
        let at = self.block(io, k)?;
        let next = if more { self.block(io, k + 1)? } else { 0 };
        io.put_block(at, self.prefix, k, next, &self.out)?;
        self.out.clear();
        self.written += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::Group;
    use super::*;
    use crate::alloc::Allocator;
    use crate::media::{Medium, MemMedium};
    use crate::BLOCK_SIZE;

    fn io(blocks: u64) -> GroupIo {
        let m: Arc<dyn Medium> = Arc::new(MemMedium::new(blocks * BLOCK_SIZE as u64));
        GroupIo::new(m, Arc::new(Allocator::new(8, blocks - 8)))
    }

    #[test]
    fn groups_written_record_by_record_read_back_whole() {
        for n in [0u64, 1, 252, 253, 254, 506, 507, 1000] {
            let mut g = io(64);
            let recs: Vec<Rec> = (0..n).map(|i| ((3u64 << 56) | (i * 7), i)).collect();
            let mut w = GroupWriter::new(3);
            for &r in &recs {
                w.push(&mut g, r);
            }
            let (chain, len) = w.finish(&mut g).unwrap();
            assert_eq!(len as u64, n);
            assert_eq!(chain.len(), super::super::blocks_for(n as usize), "{n}");
            assert_eq!(g.alloc.free_blocks(), 56 - chain.len() as u64);
            if n == 0 {
                continue;
            }
            let mut back = Group::default();
            g.read(8, 3, chain[0], len, chain.len() as u32, &mut back)
                .unwrap();
            assert_eq!(back.recs, recs);
            // Read a block at a time: the same records, the same chain.
            let mut got = Vec::new();
            let read = g
                .read_each(8, 3, chain[0], chain.len() as u32, |_, r| {
                    got.extend_from_slice(r)
                })
                .unwrap();
            assert_eq!(got, recs);
            assert_eq!(read, chain);
        }
    }

    #[test]
    fn a_group_the_allocator_cannot_hold_is_lost_whole() {
        let mut g = io(16);
        let mut w = GroupWriter::new(3);
        for i in 0..20 * PER_BLOCK as u64 {
            w.push(&mut g, ((3u64 << 56) | i, i));
        }
        let (_, lost) = w.finish(&mut g).unwrap_err();
        assert_eq!(lost as usize, 20 * PER_BLOCK);
        assert_eq!(g.alloc.free_blocks(), 8);
    }

    #[test]
    fn reading_stops_at_a_damaged_block_after_the_good_ones() {
        let mut g = io(64);
        let recs: Vec<Rec> = (0..600u64).map(|i| ((3u64 << 56) | i, i)).collect();
        let mut chain = Vec::new();
        g.write(3, &mut chain, &recs).unwrap();
        let at = chain[1] * BLOCK_SIZE as u64 + 500;
        g.medium.write(at, &[0xee]).unwrap();
        let mut got = Vec::new();
        assert!(g
            .read_each(8, 3, chain[0], 3, |_, r| got.extend_from_slice(r))
            .is_err());
        assert_eq!(got, &recs[..PER_BLOCK]);
    }
}
