//! Chains of metadata blocks: a byte stream laid over blocks from `Engine::alloc_meta`, each block
//! linked to the next. Checkpoints and the operation log are both chains.
//!
//! Chain block layout (one 4 KiB block, little endian):
//! magic 4 ("NDCH") | kind 4 | gen 8 | index 8 | crc32c(0..24) 4 | pad 4 | next 8 | payload 4056
//!
//! The header (first 24 bytes) is written once when the block joins the chain and never changes;
//! `next` is written later, when the chain grows, and is not covered by the checksum: it is
//! trusted only if the block it names carries a valid header with the same kind and generation
//! and index + 1. A torn or stale `next` therefore simply ends the chain.

use crate::error::{FsError, Result};
use nodup_core::media::Medium;
use nodup_core::{BlockNr, BLOCK_SIZE};

/// Magic of a chain block.
pub const CHAIN_MAGIC: u32 = u32::from_le_bytes(*b"NDCH");
/// Offsets inside a chain block.
pub mod off {
    pub const MAGIC: usize = 0;
    pub const KIND: usize = 4;
    pub const GEN: usize = 8;
    pub const INDEX: usize = 16;
    pub const CRC: usize = 24;
    pub const NEXT: usize = 32;
    pub const PAYLOAD: usize = 40;
}
/// Payload bytes per chain block.
pub const PAYLOAD: usize = BLOCK_SIZE - off::PAYLOAD;

/// What a chain holds (recorded in every block so chains cannot be confused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainKind {
    /// A full metadata snapshot.
    Checkpoint = 1,
    /// The operation log since that snapshot.
    Log = 2,
    /// A checkpoint segment: inode units written by one incremental checkpoint.
    Segment = 3,
    /// The checkpoint manifest: the list of live segments.
    Manifest = 4,
}

fn header(kind: ChainKind, gen: u64, index: u64) -> [u8; off::PAYLOAD] {
    let mut h = [0u8; off::PAYLOAD];
    h[off::MAGIC..off::MAGIC + 4].copy_from_slice(&CHAIN_MAGIC.to_le_bytes());
    h[off::KIND..off::KIND + 4].copy_from_slice(&(kind as u32).to_le_bytes());
    h[off::GEN..off::GEN + 8].copy_from_slice(&gen.to_le_bytes());
    h[off::INDEX..off::INDEX + 8].copy_from_slice(&index.to_le_bytes());
    let crc = crc32c::crc32c(&h[..off::CRC]);
    h[off::CRC..off::CRC + 4].copy_from_slice(&crc.to_le_bytes());
    h
}

fn header_ok(h: &[u8], kind: ChainKind, gen: u64, index: u64) -> bool {
    h.len() >= off::PAYLOAD && h[..off::PAYLOAD - 8] == header(kind, gen, index)[..off::PAYLOAD - 8]
}

fn boff(b: BlockNr) -> u64 {
    b * BLOCK_SIZE as u64
}

/// Where a [`ChainWriter`] ended at a moment (see [`ChainWriter::mark`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainMark {
    blocks: usize,
    pos: usize,
    bytes: u64,
}

/// Appends a byte stream to a chain; the caller fences after the writes it wants durable.
pub struct ChainWriter {
    kind: ChainKind,
    gen: u64,
    /// Chain index of `blocks[0]` (a log drops its oldest blocks at each checkpoint).
    first_index: u64,
    blocks: Vec<BlockNr>,
    /// Bytes used in the payload of the last block.
    pos: usize,
    /// Payload bytes appended through this writer (or since [`ChainWriter::resume`]).
    bytes: u64,
    /// Flush every store as it is made (off: the caller flushes the blocks before its fence).
    flush: bool,
}

impl ChainWriter {
    /// Start a chain in `first` (header written and flushed, not fenced).
    pub fn start(m: &dyn Medium, kind: ChainKind, gen: u64, first: BlockNr) -> Result<Self> {
        let mut h = [0u8; off::PAYLOAD];
        h.copy_from_slice(&header(kind, gen, 0));
        m.write(boff(first), &h)?;
        m.flush(boff(first), off::PAYLOAD as u64);
        Ok(ChainWriter {
            kind,
            gen,
            first_index: 0,
            blocks: vec![first],
            pos: 0,
            bytes: 0,
            flush: true,
        })
    }

    /// Leave the flushing of appended bytes to the caller, who flushes every block of
    /// [`ChainWriter::blocks`] before the fence that makes the chain durable (a checkpoint's cut
    /// writes its segments while operations wait, and flushing there would lengthen the wait).
    pub fn defer_flush(mut self) -> Self {
        self.flush = false;
        self
    }

    /// Continue a chain read back by [`ChainReader`]: `blocks` are consecutive chain blocks
    /// starting at chain index `first_index`, and appending resumes at payload offset `pos` of
    /// the last one. The caller has made sure nothing stale follows that point (see
    /// [`cut_tail`]).
    pub fn resume(
        kind: ChainKind,
        gen: u64,
        first_index: u64,
        blocks: Vec<BlockNr>,
        pos: usize,
    ) -> Self {
        ChainWriter {
            kind,
            gen,
            first_index,
            blocks,
            pos: pos.min(PAYLOAD),
            bytes: 0,
            flush: true,
        }
    }

    /// Blocks this chain occupies, in order.
    pub fn blocks(&self) -> &[BlockNr] {
        &self.blocks
    }

    /// Chain index of the first block still held.
    pub fn first_index(&self) -> u64 {
        self.first_index
    }

    /// Where the next byte goes: (block, its chain index, payload offset in it).
    pub fn end(&self) -> (BlockNr, u64, usize) {
        let last = self.blocks.len() - 1;
        (self.blocks[last], self.first_index + last as u64, self.pos)
    }

    /// Forget the blocks with a chain index below `index` (the last block is always kept);
    /// returns them so the caller can free them.
    pub fn drop_before(&mut self, index: u64) -> Vec<BlockNr> {
        let n = (index.saturating_sub(self.first_index) as usize).min(self.blocks.len() - 1);
        self.first_index += n as u64;
        self.blocks.drain(..n).collect()
    }

    /// Where the chain ends now, to [`ChainWriter::rewind`] to after a failed append (a log
    /// appends a record per operation: copying its block list for that grew with the log).
    pub fn mark(&self) -> ChainMark {
        ChainMark {
            blocks: self.blocks.len(),
            pos: self.pos,
            bytes: self.bytes,
        }
    }

    /// Back to `mark`, taken by [`ChainWriter::mark`] with no [`ChainWriter::drop_before`]
    /// since: the blocks linked after it are forgotten (the caller still holds them), and the
    /// next append overwrites what was written past it.
    pub fn rewind(&mut self, mark: ChainMark) {
        self.blocks.truncate(mark.blocks);
        self.pos = mark.pos;
        self.bytes = mark.bytes;
    }

    /// Payload bytes appended so far.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    /// True when nothing was appended.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// New blocks needed to append `n` more bytes.
    pub fn blocks_needed(&self, n: usize) -> usize {
        let free = PAYLOAD - self.pos;
        if n <= free {
            0
        } else {
            (n - free).div_ceil(PAYLOAD)
        }
    }

    /// Append `data`, linking the pre-allocated `fresh` blocks (exactly `blocks_needed(data.len())`
    /// of them) as the stream crosses block ends. Every store is flushed (the payload's only
    /// unless [`ChainWriter::defer_flush`]); nothing is fenced.
    pub fn append(&mut self, m: &dyn Medium, data: &[u8], fresh: &[BlockNr]) -> Result<()> {
        if fresh.len() != self.blocks_needed(data.len()) {
            return Err(FsError::Corrupt(
                "chain append with wrong block count".into(),
            ));
        }
        let mut fresh = fresh.iter();
        let mut rest = data;
        while !rest.is_empty() {
            if self.pos == PAYLOAD {
                let Some(&nb) = fresh.next() else {
                    return Err(FsError::Corrupt("chain append ran out of blocks".into()));
                };
                let idx = self.first_index + self.blocks.len() as u64;
                m.write(boff(nb), &header(self.kind, self.gen, idx))?;
                m.flush(boff(nb), off::PAYLOAD as u64);
                m.write(boff(nb) + off::NEXT as u64, &0u64.to_le_bytes())?;
                let last = *self.blocks.last().unwrap_or(&nb);
                let at = boff(last) + off::NEXT as u64;
                m.write(at, &nb.to_le_bytes())?;
                m.flush(at, 8);
                self.blocks.push(nb);
                self.pos = 0;
            }
            let take = rest.len().min(PAYLOAD - self.pos);
            let last = *self.blocks.last().unwrap_or(&0);
            let at = boff(last) + (off::PAYLOAD + self.pos) as u64;
            m.write(at, &rest[..take])?;
            if self.flush {
                m.flush(at, take as u64);
            }
            self.pos += take;
            self.bytes += take as u64;
            rest = &rest[take..];
        }
        Ok(())
    }
}

/// Reads a chain block by block from any of its blocks, checking each header (kind, generation
/// and consecutive index); stops at the first block that does not match, at `next == 0` or past
/// the end of the medium. Memory use is one block.
pub struct ChainReader<'a> {
    m: &'a dyn Medium,
    kind: ChainKind,
    gen: u64,
    next: BlockNr,
    index: u64,
    total: u64,
    buf: Vec<u8>,
}

impl<'a> ChainReader<'a> {
    /// Start at block `head`, which must carry chain index `index`.
    pub fn new(
        m: &'a dyn Medium,
        head: BlockNr,
        kind: ChainKind,
        gen: u64,
        index: u64,
    ) -> ChainReader<'a> {
        ChainReader {
            m,
            kind,
            gen,
            next: head,
            index,
            total: m.len() / BLOCK_SIZE as u64,
            buf: vec![0u8; BLOCK_SIZE],
        }
    }

    /// The next block of the chain: (block number, chain index, payload), or `None` at the end.
    pub fn next_block(&mut self) -> Result<Option<(BlockNr, u64, &[u8])>> {
        let cur = self.next;
        if cur == 0 || cur >= self.total {
            return Ok(None);
        }
        self.m.read(boff(cur), &mut self.buf)?;
        if !header_ok(&self.buf, self.kind, self.gen, self.index) {
            self.next = 0;
            return Ok(None);
        }
        let mut n = [0u8; 8];
        n.copy_from_slice(&self.buf[off::NEXT..off::NEXT + 8]);
        self.next = u64::from_le_bytes(n);
        let idx = self.index;
        self.index += 1;
        Ok(Some((cur, idx, &self.buf[off::PAYLOAD..])))
    }
}

/// Read a whole chain from `head` (chain index 0): the blocks in order and the concatenated
/// payload, at most `max_bytes` of it (see [`ChainReader`] for where it stops).
pub fn read_chain(
    m: &dyn Medium,
    head: BlockNr,
    kind: ChainKind,
    gen: u64,
    max_bytes: u64,
) -> Result<(Vec<BlockNr>, Vec<u8>)> {
    let mut r = ChainReader::new(m, head, kind, gen, 0);
    let mut blocks = Vec::new();
    // A caller that knows the length (segments) gets its buffer in one allocation.
    let mut payload = Vec::with_capacity(max_bytes.min(64 << 20) as usize);
    while (payload.len() as u64) < max_bytes {
        let Some((b, _, p)) = r.next_block()? else {
            break;
        };
        blocks.push(b);
        payload.extend_from_slice(p);
    }
    payload.truncate(max_bytes.min(payload.len() as u64) as usize);
    Ok((blocks, payload))
}

/// Make `block` the end of its chain from payload offset `pos` on: zero the rest of its payload
/// and its `next` link, so bytes left there by an interrupted run can never be read as part of
/// the chain once appending resumes at `pos`. Flushed and fenced.
pub fn cut_tail(m: &dyn Medium, block: BlockNr, pos: usize) -> Result<()> {
    let pos = pos.min(PAYLOAD);
    let at = boff(block) + (off::PAYLOAD + pos) as u64;
    m.write(at, &vec![0u8; PAYLOAD - pos])?;
    m.flush(at, (PAYLOAD - pos) as u64);
    let nx = boff(block) + off::NEXT as u64;
    m.write(nx, &0u64.to_le_bytes())?;
    m.flush(nx, 8);
    m.fence()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodup_core::media::MemMedium;

    #[test]
    fn stream_spans_blocks_and_reads_back() {
        let m = MemMedium::new(64 * BLOCK_SIZE as u64);
        let mut w = ChainWriter::start(&m, ChainKind::Log, 5, 10).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut next = 11;
        for piece in data.chunks(777) {
            let n = w.blocks_needed(piece.len());
            let fresh: Vec<u64> = (next..next + n as u64).collect();
            next += n as u64;
            w.append(&m, piece, &fresh).unwrap();
        }
        assert_eq!(w.blocks().len(), 3);
        let (blocks, payload) = read_chain(&m, 10, ChainKind::Log, 5, u64::MAX).unwrap();
        assert_eq!(blocks, vec![10, 11, 12]);
        assert_eq!(&payload[..data.len()], &data[..]);
        // Wrong generation or kind: empty chain.
        assert!(read_chain(&m, 10, ChainKind::Log, 6, u64::MAX)
            .unwrap()
            .0
            .is_empty());
        assert!(read_chain(&m, 10, ChainKind::Checkpoint, 5, u64::MAX)
            .unwrap()
            .0
            .is_empty());
        // A stale `next` pointing at a block of another chain ends the chain.
        let at = 12 * BLOCK_SIZE as u64 + off::NEXT as u64;
        m.write(at, &30u64.to_le_bytes()).unwrap();
        ChainWriter::start(&m, ChainKind::Log, 4, 30).unwrap();
        let (blocks, _) = read_chain(&m, 10, ChainKind::Log, 5, u64::MAX).unwrap();
        assert_eq!(blocks.len(), 3);
    }
}
