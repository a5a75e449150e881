//! The on-media groups of `smart`'s fingerprint store (SmartDedup §3.2): for each prefix, a
//! sorted array of `(mixed fingerprint, entry location)` records in a chain of data-area blocks
//! taken from the engine's allocator, grown and shrunk one block at a time. Eviction's
//! read-merge-write streams a group block by block (`ondisk/merge.rs`), so its memory does not
//! grow with the group.
//!
//! The groups are only a finding aid: every candidate they name is confirmed by the engine
//! against the entry on the medium, and after a crash failure recovery discards them (their
//! blocks are not in the rebuilt allocator) and builds them again from the entries. So they are
//! written without ordering fences at run time; a clean shutdown fences once before saving the
//! directory that names them (`store.rs`). Every block a merge or a lookup on an unmapped
//! medium reads is validated whole: a group that fails is dropped (its fingerprints are no
//! longer found; counted in `io_errors`), never trusted.
//!
//! The worker's lookups on a mapped (byte-addressable) medium do not read whole blocks: they
//! check a block's header and binary-search its records in place, loading about ten cache
//! lines instead of 64, and are charged for the lines they load. They cannot check the block's
//! checksum, so they check what they load (header fields, each record's prefix, the block's
//! last record against the previous block's) and yield only candidates, which the engine
//! confirms against the entry on the medium and the worker byte-verifies before it remaps. A
//! damaged block such a lookup passes over costs at most a missed duplicate; the next merge
//! reads it whole, fails its checksum and drops the group.
//!
//! Block format (4096 bytes):
//!
//! | offset | width | field                                                    |
//! |-------:|------:|----------------------------------------------------------|
//! | 0      | 8     | magic `NDSGRP01`                                         |
//! | 8      | 4     | version (1)                                              |
//! | 12     | 4     | prefix                                                   |
//! | 16     | 4     | position of the block in its chain (0, 1, ...)           |
//! | 20     | 4     | records in this block (≤ 253)                            |
//! | 24     | 8     | next block of the chain, 0 for the last                  |
//! | 32     | 8     | xxh3-64 of bytes 0..32 and 40..4096                      |
//! | 40     | 8     | reserved, zero                                           |
//! | 48     | 16·n  | records: mixed fingerprint u64, entry location u64, ascending by fingerprint |

use std::sync::Arc;

mod merge;
mod stream;

pub(crate) use merge::{MergeBuf, MergeError, OldGroup};
pub(crate) use stream::GroupWriter;

use crate::alloc::Allocator;
use crate::codec::{le_u32, le_u64, put_u32, put_u64};
use crate::media::{Medium, CACHE_LINE};
use crate::{BlockNr, Error, Result, BLOCK_SIZE};

/// Group block magic.
pub const GROUP_MAGIC: [u8; 8] = *b"NDSGRP01";
/// Group block format version.
pub const GROUP_VERSION: u32 = 1;

/// Byte offsets in a group block.
mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const PREFIX: usize = 12;
    pub const SEQ: usize = 16;
    pub const COUNT: usize = 20;
    pub const NEXT: usize = 24;
    pub const CHECKSUM: usize = 32;
    pub const RESERVED: usize = 40;
    pub const RECORDS: usize = 48;
}

/// Bytes of one record.
pub const REC_SIZE: usize = 16;
/// Records per block.
pub const PER_BLOCK: usize = (BLOCK_SIZE - off::RECORDS) / REC_SIZE;

const _: () = assert!(off::MAGIC + 8 == off::VERSION && off::VERSION + 4 == off::PREFIX);
const _: () = assert!(off::PREFIX + 4 == off::SEQ && off::SEQ + 4 == off::COUNT);
const _: () = assert!(off::COUNT + 4 == off::NEXT && off::NEXT + 8 == off::CHECKSUM);
const _: () = assert!(off::CHECKSUM + 8 == off::RESERVED && off::RESERVED + 8 == off::RECORDS);
const _: () = assert!(PER_BLOCK == 253);

/// A record: mixed fingerprint and entry location.
pub type Rec = (u64, u64);

/// Blocks a group of `n` records takes.
pub fn blocks_for(n: usize) -> usize {
    n.div_ceil(PER_BLOCK)
}

fn checksum(b: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&b[..off::CHECKSUM]);
    h.update(&b[off::RESERVED..]);
    h.digest()
}

/// Group I/O: the medium, the allocator the blocks come from, and the I/O counters.
pub(crate) struct GroupIo {
    medium: Arc<dyn Medium>,
    alloc: Arc<Allocator>,
    pool: usize,
    /// Bytes read from group blocks.
    pub(crate) read_bytes: u64,
    /// Bytes written to group blocks.
    pub(crate) written_bytes: u64,
    /// Blocks read that failed validation or could not be read/written.
    pub(crate) errors: u64,
    /// The last of those errors (for the stats: which group, which block, what was wrong).
    pub(crate) last_error: Option<String>,
    /// The medium is mapped: lookups search blocks in place (module doc).
    mapped: bool,
    buf: Vec<u8>,
}

/// A group read whole: its records and the chain of blocks holding them. Only fsck's check
/// and tests read groups whole; merges and rebucketing stream them.
#[derive(Default)]
pub(crate) struct Group {
    pub(crate) recs: Vec<Rec>,
    pub(crate) chain: Vec<BlockNr>,
}

impl GroupIo {
    /// Group I/O over `medium`, taking blocks from `alloc`.
    pub(crate) fn new(medium: Arc<dyn Medium>, alloc: Arc<Allocator>) -> GroupIo {
        let mapped = medium.direct(0, 0).is_some();
        GroupIo {
            medium,
            alloc,
            pool: 0,
            read_bytes: 0,
            written_bytes: 0,
            errors: 0,
            last_error: None,
            mapped,
            buf: vec![0u8; BLOCK_SIZE],
        }
    }

    fn check_block(&self, b: BlockNr) -> Result<()> {
        self.check_block_as(b, true)
    }

    /// [`GroupIo::check_block`]; with `need_allocated` false only the range is checked.
    fn check_block_as(&self, b: BlockNr, need_allocated: bool) -> Result<()> {
        if b < self.alloc.start()
            || b >= self.alloc.start() + self.alloc.len()
            || (need_allocated && !self.alloc.is_allocated(b))
        {
            return Err(Error::Corrupt(format!(
                "fingerprint group names block {b}, not an allocated data-area block"
            )));
        }
        Ok(())
    }

    /// Read chain block `b` (position `seq` of the group of `prefix`) into the buffer and
    /// validate it: header, checksum, and records ascending within the block, above `last`
    /// (the previous block's last record) and of this prefix. Returns its record count.
    fn read_block(
        &mut self,
        b: BlockNr,
        bits: u32,
        prefix: u32,
        seq: usize,
        last: Option<Rec>,
    ) -> Result<usize> {
        self.read_block_as(b, bits, prefix, seq, last, true)
    }

    /// [`GroupIo::read_block`]; with `need_allocated` false a block the allocator counts free
    /// is read and validated too (fsck's listing of the group's blocks).
    fn read_block_as(
        &mut self,
        b: BlockNr,
        bits: u32,
        prefix: u32,
        seq: usize,
        last: Option<Rec>,
        need_allocated: bool,
    ) -> Result<usize> {
        let corrupt = |m: String| Error::Corrupt(format!("fingerprint group {prefix}: {m}"));
        self.check_block_as(b, need_allocated)?;
        let at = b * BLOCK_SIZE as u64;
        if let Err(e) = self.medium.read(at, &mut self.buf) {
            // Once more before the group counts as unreadable: a merge or rebucketing that
            // cannot read its group loses it, and the blocks not read stay allocated until
            // failure recovery (nothing else can find them).
            match e {
                Error::Io(_) => self.medium.read(at, &mut self.buf)?,
                e => return Err(e),
            }
        }
        self.read_bytes += BLOCK_SIZE as u64;
        let x = &self.buf;
        if x[off::MAGIC..off::MAGIC + 8] != GROUP_MAGIC
            || le_u32(x, off::VERSION) != GROUP_VERSION
            || le_u64(x, off::CHECKSUM) != checksum(x)
        {
            return Err(corrupt(format!("block {b} is not a valid group block")));
        }
        let n = le_u32(x, off::COUNT) as usize;
        if le_u32(x, off::PREFIX) != prefix
            || le_u32(x, off::SEQ) as usize != seq
            || n == 0
            || n > PER_BLOCK
        {
            return Err(corrupt(format!(
                "block {b}: wrong prefix, position or count"
            )));
        }
        let mut prev = last;
        for i in 0..n {
            let r = self.record(i);
            if r.0 >> (64 - bits) != prefix as u64 || prev.is_some_and(|l| l > r) {
                return Err(corrupt(format!(
                    "block {b}: records out of order or prefix"
                )));
            }
            prev = Some(r);
        }
        Ok(n)
    }

    /// Record `i` of the block in the buffer.
    fn record(&self, i: usize) -> Rec {
        let o = off::RECORDS + i * REC_SIZE;
        (le_u64(&self.buf, o), le_u64(&self.buf, o + 8))
    }

    /// Read the group of `prefix` (`bits`-bit prefixes) starting at `head`, expected to hold
    /// `len` records in `nblocks` blocks, into `out` (cleared first). Any mismatch is an error (the caller drops the
    /// group), with `out` left partly filled.
    pub(crate) fn read(
        &mut self,
        bits: u32,
        prefix: u32,
        head: BlockNr,
        len: u32,
        nblocks: u32,
        out: &mut Group,
    ) -> Result<()> {
        let Group { recs, chain } = out;
        recs.clear();
        chain.clear();
        // `len` and `nblocks` come from the saved directory: room for one block's worth at
        // first, more only as validated blocks deliver records.
        recs.reserve((len as usize).min(PER_BLOCK));
        chain.reserve((nblocks as usize).min(4));
        self.walk(prefix, head, nblocks, |io, b, seq| {
            let n = io.read_block(b, bits, prefix, seq, recs.last().copied())?;
            recs.extend((0..n).map(|i| io.record(i)));
            chain.push(b);
            Ok(Some(le_u64(&io.buf, off::NEXT)))
        })?;
        if recs.len() != len as usize {
            return Err(Error::Corrupt(format!(
                "fingerprint group {prefix}: {} records, expected {len}",
                recs.len()
            )));
        }
        Ok(())
    }

    /// The blocks of the group of `prefix` (as [`GroupIo::read`]), appended to `out`: each
    /// block whose contents validate as the group's block at its position, whether or not the
    /// allocator counts it in use (fsck asks exactly that), up to the first that does not.
    pub(crate) fn list_chain(
        &mut self,
        bits: u32,
        prefix: u32,
        head: BlockNr,
        nblocks: u32,
        out: &mut Vec<BlockNr>,
    ) {
        let mut last: Option<Rec> = None;
        // An error only ends the listing: what follows the damage is not known.
        let _ = self.walk(prefix, head, nblocks, |io, b, seq| {
            let n = io.read_block_as(b, bits, prefix, seq, last, false)?;
            out.push(b);
            last = Some(io.record(n - 1));
            Ok(Some(le_u64(&io.buf, off::NEXT)))
        });
    }

    /// The locations recorded for mixed fingerprint `h` in the group of `prefix` (as
    /// [`GroupIo::read`]), appended to `out`. Records ascend along the chain, so the read stops
    /// at the first block whose last record is above `h`: a lookup reads the blocks up to the
    /// one that can hold `h`, not the whole group, and copies nothing but the matches.
    pub(crate) fn find(
        &mut self,
        bits: u32,
        prefix: u32,
        head: BlockNr,
        nblocks: u32,
        h: u64,
        out: &mut Vec<u64>,
    ) -> Result<()> {
        let mapped = self.mapped;
        let mut last: Option<Rec> = None;
        self.walk(prefix, head, nblocks, |io, b, seq| {
            let (tail, next) = if mapped {
                io.search_in_place(bits, prefix, b, seq, last, h, out)?
            } else {
                // `read_block` has just walked every record to validate it, so a plain scan
                // costs no more than a search would.
                let n = io.read_block(b, bits, prefix, seq, last)?;
                out.extend(
                    (0..n)
                        .map(|i| io.record(i))
                        .skip_while(|r| r.0 < h)
                        .take_while(|r| r.0 == h)
                        .map(|r| r.1),
                );
                (io.record(n - 1), le_u64(&io.buf, off::NEXT))
            };
            last = Some(tail);
            // Past `h`: the rest of the chain cannot hold it.
            Ok((tail.0 <= h).then_some(next))
        })
    }

    /// Walk the chain of the group of `prefix` from `head`: `visit(self, block, position)`
    /// handles one block and returns the next one to visit, or `None` to stop there. A chain
    /// walked to its end must have exactly `nblocks` blocks.
    fn walk(
        &mut self,
        prefix: u32,
        head: BlockNr,
        nblocks: u32,
        mut visit: impl FnMut(&mut Self, BlockNr, usize) -> Result<Option<BlockNr>>,
    ) -> Result<()> {
        let corrupt = |m: String| Error::Corrupt(format!("fingerprint group {prefix}: {m}"));
        let mut b = head;
        let mut seq = 0usize;
        while b != 0 {
            if seq >= nblocks as usize {
                return Err(corrupt(format!("chain longer than {nblocks} blocks")));
            }
            match visit(self, b, seq)? {
                Some(next) => b = next,
                None => return Ok(()),
            }
            seq += 1;
        }
        if seq != nblocks as usize {
            return Err(corrupt(format!("{seq} blocks, expected {nblocks}")));
        }
        Ok(())
    }

    /// One block of [`GroupIo::find`] on a mapped medium: its header line is copied and
    /// checked, its records binary-searched in place for `h` (module doc), the matches appended
    /// to `out`; `read_bytes` grows by the cache lines loaded. Returns the block's last record
    /// and the next block of the chain.
    #[allow(clippy::too_many_arguments)]
    fn search_in_place(
        &mut self,
        bits: u32,
        prefix: u32,
        b: BlockNr,
        seq: usize,
        last: Option<Rec>,
        h: u64,
        out: &mut Vec<u64>,
    ) -> Result<(Rec, BlockNr)> {
        let corrupt = |m: String| Error::Corrupt(format!("fingerprint group {prefix}: {m}"));
        self.check_block(b)?;
        let base = b * BLOCK_SIZE as u64;
        // The header line is copied and checked before anything in the block is viewed in
        // place, as a whole-block read would be: a damaged pointer may name any allocated
        // block, one another thread is writing included.
        let mut x = [0u8; CACHE_LINE as usize];
        self.medium.read(base, &mut x)?;
        self.read_bytes += CACHE_LINE;
        let n = le_u32(&x, off::COUNT) as usize;
        if x[off::MAGIC..off::MAGIC + 8] != GROUP_MAGIC
            || le_u32(&x, off::VERSION) != GROUP_VERSION
            || le_u32(&x, off::PREFIX) != prefix
            || le_u32(&x, off::SEQ) as usize != seq
            || n == 0
            || n > PER_BLOCK
        {
            return Err(corrupt(format!("block {b}: bad header")));
        }
        let next = le_u64(&x, off::NEXT);
        // One bit per cache line of the block loaded beyond the header line.
        let mut lines = 0u64;
        let medium = &self.medium;
        let mut rec = |i: usize| -> Result<Rec> {
            let o = off::RECORDS + i * REC_SIZE;
            let r = if o + REC_SIZE <= CACHE_LINE as usize {
                (le_u64(&x, o), le_u64(&x, o + 8))
            } else {
                lines |= 1 << (o as u64 / CACHE_LINE);
                // Copied where the medium lends no view (a range that may hold a hole of
                // the image file, see `media/backing.rs`).
                let mut copy = [0u8; REC_SIZE];
                let at = base + o as u64;
                let y = match medium.direct(at, REC_SIZE) {
                    Some(y) => y,
                    None => {
                        medium.read(at, &mut copy)?;
                        &copy[..]
                    }
                };
                (le_u64(y, 0), le_u64(y, 8))
            };
            if r.0 >> (64 - bits) != prefix as u64 {
                return Err(corrupt(format!("block {b}: record of another prefix")));
            }
            Ok(r)
        };
        let result = (|| {
            let tail = rec(n - 1)?;
            if last.is_some_and(|l| l > tail) {
                return Err(corrupt(format!("block {b}: records out of order")));
            }
            if tail.0 >= h {
                // First record at or above `h`: it exists, since the tail is.
                let (mut lo, mut hi) = (0, n - 1);
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    if rec(mid)?.0 < h {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                for i in lo..n {
                    let r = rec(i)?;
                    if r.0 != h {
                        break;
                    }
                    out.push(r.1);
                }
            }
            Ok(tail)
        })();
        self.read_bytes += lines.count_ones() as u64 * CACHE_LINE;
        Ok((result?, next))
    }

    /// Write `recs` (sorted) as the group of `prefix` into `chain` (its current blocks, reused
    /// in order), taking or giving back blocks at the tail as the size needs; `chain` becomes
    /// the new chain (empty for no records). On an error the group is lost: every block of the
    /// old and new chain goes back to the allocator, `chain` is emptied and the error returned.
    pub(crate) fn write(
        &mut self,
        prefix: u32,
        chain: &mut Vec<BlockNr>,
        recs: &[Rec],
    ) -> Result<()> {
        let want = blocks_for(recs.len());
        while chain.len() < want {
            match self.alloc.alloc(&mut self.pool) {
                Ok(b) => chain.push(b),
                Err(e) => {
                    self.give_back(chain);
                    chain.clear();
                    return Err(e);
                }
            }
        }
        if chain.len() > want {
            self.give_back(&chain[want..]);
            chain.truncate(want);
        }
        for (k, part) in recs.chunks(PER_BLOCK).enumerate() {
            let next = chain.get(k + 1).copied().unwrap_or(0);
            if let Err(e) = self.put_block(chain[k], prefix, k, next, part) {
                self.give_back(chain);
                chain.clear();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Write `recs` (at most a block's) as block `at`, position `seq` of the group of
    /// `prefix`, followed by `next` (0 for the last).
    fn put_block(
        &mut self,
        at: BlockNr,
        prefix: u32,
        seq: usize,
        next: BlockNr,
        recs: &[Rec],
    ) -> Result<()> {
        let x = &mut self.buf;
        x.fill(0);
        x[off::MAGIC..off::MAGIC + 8].copy_from_slice(&GROUP_MAGIC);
        put_u32(x, off::VERSION, GROUP_VERSION);
        put_u32(x, off::PREFIX, prefix);
        put_u32(x, off::SEQ, seq as u32);
        put_u32(x, off::COUNT, recs.len() as u32);
        put_u64(x, off::NEXT, next);
        for (i, &(h, loc)) in recs.iter().enumerate() {
            let o = off::RECORDS + i * REC_SIZE;
            put_u64(x, o, h);
            put_u64(x, o + 8, loc);
        }
        let c = checksum(x);
        put_u64(x, off::CHECKSUM, c);
        let at = at * BLOCK_SIZE as u64;
        self.medium.write(at, x)?;
        self.medium.flush(at, BLOCK_SIZE as u64);
        self.written_bytes += BLOCK_SIZE as u64;
        Ok(())
    }

    /// Count a failed group read or write and keep its message.
    pub(crate) fn note(&mut self, e: &Error) {
        self.errors += 1;
        self.last_error = Some(e.to_string());
        // The group it came from is dropped or cut short, and the blocks of it not read or
        // not trusted stay allocated: a rebuild frees them.
        self.alloc.suspect_leak();
    }

    /// Return group blocks to the allocator.
    pub(crate) fn give_back(&mut self, blocks: &[BlockNr]) {
        for &b in blocks {
            if self.alloc.free(b).is_err() {
                self.errors += 1;
            }
        }
    }

    /// Make every group write durable (before the directory naming them is saved).
    pub(crate) fn fence(&self) -> Result<()> {
        self.medium.fence()
    }

    /// True when `b` is an allocated block of the data area (directory validation).
    pub(crate) fn valid_block(&self, b: BlockNr) -> bool {
        self.check_block(b).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::MemMedium;

    fn io() -> GroupIo {
        let m: Arc<dyn Medium> = Arc::new(MemMedium::new(64 * BLOCK_SIZE as u64));
        GroupIo::new(m, Arc::new(Allocator::new(8, 56)))
    }

    /// [`io`] on a mapped (pmem) image in `dir`: lookups take the in-place path.
    fn mapped_io(dir: &tempfile::TempDir) -> GroupIo {
        let pm = crate::media::Pmem::create(dir.path().join("img"), 64 * BLOCK_SIZE as u64);
        let m: Arc<dyn Medium> = Arc::new(pm.unwrap());
        GroupIo::new(m, Arc::new(Allocator::new(8, 56)))
    }

    /// Write `recs` as the group of `p` over `chain`; the new chain.
    fn rewrite(g: &mut GroupIo, p: u32, mut chain: Vec<BlockNr>, recs: &[Rec]) -> Vec<BlockNr> {
        g.write(p, &mut chain, recs).unwrap();
        chain
    }

    /// Read a group into a fresh buffer.
    fn get(g: &mut GroupIo, bits: u32, p: u32, head: BlockNr, len: u32, nb: u32) -> Result<Group> {
        let mut out = Group::default();
        g.read(bits, p, head, len, nb, &mut out)?;
        Ok(out)
    }

    #[test]
    fn groups_round_trip_grow_and_shrink() {
        let mut g = io();
        let bits = 8;
        let p = 0x5a;
        let recs: Vec<Rec> = (0..600u64)
            .map(|i| ((p as u64) << 56 | i, i * 32))
            .collect();
        let chain = rewrite(&mut g, p, Vec::new(), &recs);
        assert_eq!(chain.len(), 3);
        let got = get(&mut g, bits, p, chain[0], 600, 3).unwrap();
        assert_eq!(got.recs, recs);
        assert_eq!(got.chain, chain);
        // Shrink to one block: two blocks go back.
        let free0 = g.alloc.free_blocks();
        let chain2 = rewrite(&mut g, p, chain.clone(), &recs[..10]);
        assert_eq!(chain2, vec![chain[0]]);
        assert_eq!(g.alloc.free_blocks(), free0 + 2);
        assert_eq!(
            get(&mut g, bits, p, chain2[0], 10, 1).unwrap().recs,
            &recs[..10]
        );
        // Empty: every block goes back.
        assert!(rewrite(&mut g, p, chain2, &[]).is_empty());
        assert_eq!(g.alloc.free_blocks(), 56);
    }

    #[test]
    fn a_write_the_allocator_cannot_hold_gives_every_block_back() {
        let mut g = io();
        let p = 0x5a;
        let recs: Vec<Rec> = (0..60 * PER_BLOCK as u64)
            .map(|i| ((p as u64) << 56 | i, i))
            .collect();
        // 60 blocks from an allocator of 56: nothing taken stays taken.
        let mut chain = Vec::new();
        assert!(g.write(p, &mut chain, &recs).is_err());
        assert!(chain.is_empty());
        assert_eq!(g.alloc.free_blocks(), 56);
        // Growing an existing group past it loses the group: its blocks go back too.
        let mut chain = rewrite(&mut g, p, Vec::new(), &recs[..2 * PER_BLOCK]);
        assert_eq!(g.alloc.free_blocks(), 54);
        assert!(g.write(p, &mut chain, &recs).is_err());
        assert!(chain.is_empty());
        assert_eq!(g.alloc.free_blocks(), 56);
    }

    #[test]
    fn find_reads_only_as_far_as_the_fingerprint_can_be() {
        let mut g = io();
        let p = 0x5a;
        let key = |i: u64| ((p as u64) << 56) | (i * 2);
        // 600 records in three blocks; record 252 (the last of block 0) repeats as the first
        // of block 1 with another location, so its matches span a block boundary.
        let mut recs: Vec<Rec> = (0..600u64).map(|i| (key(i), i)).collect();
        recs[253] = (key(252), 9999);
        recs.sort_unstable();
        let chain = rewrite(&mut g, p, Vec::new(), &recs);
        let found = |g: &mut GroupIo, h: u64| {
            let before = g.read_bytes;
            let mut out = Vec::new();
            g.find(8, p, chain[0], 3, h, &mut out).unwrap();
            (out, (g.read_bytes - before) / BLOCK_SIZE as u64)
        };
        assert_eq!(found(&mut g, key(3)), (vec![3], 1));
        assert_eq!(found(&mut g, key(3) + 1), (vec![], 1));
        assert_eq!(found(&mut g, key(252)), (vec![252, 9999], 2));
        assert_eq!(found(&mut g, key(599)), (vec![599], 3));
        assert_eq!(found(&mut g, key(700)), (vec![], 3));
        // The chain must be as long as the directory says when it is read to its end.
        assert!(g
            .find(8, p, chain[0], 2, key(599), &mut Vec::new())
            .is_err());
        assert!(g
            .find(8, p, chain[0], 4, key(599), &mut Vec::new())
            .is_err());
        // A damaged block on the way is an error; one past the fingerprint is not read.
        let at = chain[1] * BLOCK_SIZE as u64 + 100;
        g.medium.write(at, &[0xff]).unwrap();
        assert!(g
            .find(8, p, chain[0], 3, key(599), &mut Vec::new())
            .is_err());
        assert_eq!(found(&mut g, key(3)), (vec![3], 1));
    }

    #[test]
    fn mapped_lookups_search_in_place_and_agree_with_whole_reads() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let mut mapped = mapped_io(&dir);
        let mut whole = io();
        let p = 0x5a;
        let key = |i: u64| ((p as u64) << 56) | (i * 4);
        // 600 records in three blocks, with runs of one fingerprint across both boundaries.
        let mut recs: Vec<Rec> = (0..600u64).map(|i| (key(i), i)).collect();
        recs[253] = (key(252), 9999);
        recs[506] = (key(505), 7777);
        recs[507] = (key(505), 7778);
        recs.sort_unstable();
        let chain = rewrite(&mut mapped, p, Vec::new(), &recs);
        assert_eq!(rewrite(&mut whole, p, Vec::new(), &recs), chain);
        for i in 0..610u64 {
            for h in [key(i), key(i) + 1, key(i) - 1] {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                let before = mapped.read_bytes;
                mapped.find(8, p, chain[0], 3, h, &mut a).unwrap();
                whole.find(8, p, chain[0], 3, h, &mut b).unwrap();
                assert_eq!(a, b, "fingerprint {h:#x}");
                // At most a header, a tail and a search's worth of lines in each of three blocks.
                assert!(mapped.read_bytes - before <= 3 * 14 * CACHE_LINE);
            }
        }
        assert!(mapped.read_bytes < whole.read_bytes / 4);
        // Wrong chain lengths and damaged headers or records are errors, never a panic.
        assert!(mapped
            .find(8, p, chain[0], 2, key(599), &mut Vec::new())
            .is_err());
        assert!(mapped
            .find(8, p, chain[0], 4, key(599), &mut Vec::new())
            .is_err());
        let at = chain[1] * BLOCK_SIZE as u64 + off::RECORDS as u64 + 252 * REC_SIZE as u64;
        mapped.medium.write(at + 7, &[0x00]).unwrap();
        assert!(mapped
            .find(8, p, chain[0], 3, key(400), &mut Vec::new())
            .is_err());
        mapped
            .medium
            .write(chain[2] * BLOCK_SIZE as u64, b"garbage!")
            .unwrap();
        assert!(mapped
            .find(8, p, chain[0], 3, key(599), &mut Vec::new())
            .is_err());
        // A lookup that stops before the damage still works; a whole read sees the damage.
        let mut a = Vec::new();
        mapped.find(8, p, chain[0], 3, key(3), &mut a).unwrap();
        assert_eq!(a, vec![3]);
        assert!(get(&mut mapped, 8, p, chain[0], 600, 3).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// In-place lookups find exactly what whole-block lookups find, over chains of one to
        /// four blocks with runs of equal fingerprints; after random damage they may miss or
        /// fail but never panic.
        #[test]
        fn mapped_lookups_match_whole_reads(
            keys in proptest::collection::vec((0u64..400, 0u64..1000), 1..900),
            probes in proptest::collection::vec(0u64..420, 1..40),
            damage in proptest::collection::vec((0usize..4, 0usize..BLOCK_SIZE, proptest::prelude::any::<u8>()), 0..6),
        ) {
            let p = 0x5a;
            let key = |i: u64| ((p as u64) << 56) | (i * 3);
            let mut recs: Vec<Rec> = keys.iter().map(|&(k, l)| (key(k), l)).collect();
            recs.sort_unstable();
            let dir = tempfile::tempdir_in("/dev/shm").unwrap();
            let mut mapped = mapped_io(&dir);
            let mut whole = io();
            let chain = rewrite(&mut mapped, p, Vec::new(), &recs);
            proptest::prop_assert_eq!(rewrite(&mut whole, p, Vec::new(), &recs), chain.clone());
            let nb = chain.len() as u32;
            for &k in &probes {
                for h in [key(k), key(k) + 1] {
                    let (mut a, mut b) = (Vec::new(), Vec::new());
                    mapped.find(8, p, chain[0], nb, h, &mut a).unwrap();
                    whole.find(8, p, chain[0], nb, h, &mut b).unwrap();
                    proptest::prop_assert_eq!(a, b);
                }
            }
            for &(blk, at, v) in &damage {
                let b = chain[blk % chain.len()];
                mapped.medium.write(b * BLOCK_SIZE as u64 + at as u64, &[v]).unwrap();
            }
            for &k in &probes {
                let _ = mapped.find(8, p, chain[0], nb, key(k), &mut Vec::new());
            }
        }
    }

    #[test]
    fn damaged_groups_are_refused() {
        let mut g = io();
        let p = 3;
        let recs: Vec<Rec> = (0..5u64).map(|i| (3u64 << 56 | i, 64 + i)).collect();
        let chain = rewrite(&mut g, p, Vec::new(), &recs);
        // Wrong expectations.
        assert!(get(&mut g, 8, p, chain[0], 4, 1).is_err());
        assert!(get(&mut g, 8, p + 1, chain[0], 5, 1).is_err());
        // A flipped byte fails the checksum.
        let at = chain[0] * BLOCK_SIZE as u64 + 100;
        let mut x = [0u8; 1];
        g.medium.read(at, &mut x).unwrap();
        g.medium.write(at, &[x[0] ^ 1]).unwrap();
        assert!(get(&mut g, 8, p, chain[0], 5, 1).is_err());
        // A block outside the data area or free is refused before it is read.
        assert!(get(&mut g, 8, p, 2, 5, 1).is_err());
        assert!(get(&mut g, 8, p, 60, 5, 1).is_err());
    }
}
