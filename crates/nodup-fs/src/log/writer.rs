//! Appending records to the log chain, with a small pool of pre-allocated metadata blocks so
//! most appends do not call the engine's allocator.

use crate::chain::{ChainKind, ChainWriter};
use crate::error::Result;
use crate::log::record::Record;
use nodup_core::media::Medium;
use nodup_core::BlockNr;

/// Metadata blocks fetched from the engine at a time for the log.
pub const LOG_REFILL: usize = 32;

/// The log being appended to.
pub struct LogWriter {
    chain: ChainWriter,
    /// Sequence number of the next record.
    pub next_seq: u64,
    /// Pre-allocated blocks not yet linked into the chain (freed at clean shutdown, reclaimed by
    /// failure recovery otherwise, since nothing on the medium references them).
    pub spare: Vec<BlockNr>,
    /// Records appended since the log started.
    pub records: u64,
}

impl LogWriter {
    /// A fresh log in block `first` (header flushed, not fenced).
    pub fn start(m: &dyn Medium, gen: u64, first: BlockNr, next_seq: u64) -> Result<LogWriter> {
        Ok(LogWriter {
            chain: ChainWriter::start(m, ChainKind::Log, gen, first)?,
            next_seq,
            spare: Vec::new(),
            records: 0,
        })
    }

    /// Continue an existing log after replay.
    pub fn resume(
        gen: u64,
        blocks: Vec<BlockNr>,
        used: u64,
        next_seq: u64,
        records: u64,
    ) -> LogWriter {
        LogWriter {
            chain: ChainWriter::resume(ChainKind::Log, gen, blocks, used),
            next_seq,
            spare: Vec::new(),
            records,
        }
    }

    /// Blocks of the log chain.
    pub fn blocks(&self) -> &[BlockNr] {
        self.chain.blocks()
    }

    /// Payload bytes in the log.
    pub fn bytes(&self) -> u64 {
        self.chain.len()
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
        let frame = rec.frame(self.next_seq);
        let need = self.chain.blocks_needed(frame.len());
        if self.spare.len() < need {
            let more = alloc(need.max(LOG_REFILL))?;
            self.spare.extend(more);
        }
        let fresh: Vec<BlockNr> = self.spare.drain(..need).collect();
        let saved = self.chain.clone();
        if let Err(e) = self.chain.append(m, &frame, &fresh) {
            // A partial frame fails its checksum: roll the position back so the next record
            // (same sequence number) overwrites it, and keep the blocks for later.
            self.chain = saved;
            self.spare.splice(0..0, fresh);
            return Err(e);
        }
        if fence {
            if let Err(e) = m.fence() {
                // Not committed: the DRAM state does not include it. Roll back so the next
                // record (same sequence number) overwrites this frame; a crash before that can
                // at most show the failed operation as done.
                self.chain = saved;
                self.spare.splice(0..0, fresh);
                return Err(e.into());
            }
        }
        self.next_seq += 1;
        self.records += 1;
        Ok(())
    }
}
