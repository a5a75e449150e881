//! Cache-line traces: the events the simulator replays and their compact binary file format.
//!
//! # File format (version 1; integers little-endian, "varint" = LEB128 of at most 10 bytes)
//!
//! ```text
//! header, 32 bytes
//!   0  magic      8  b"NDSIMTR\0"
//!   8  version    2  1
//!  10  line size  2  64
//!  12  window     4  entries of the content window (power of two, 1 ..= 2^20)
//!  16  flags      4  bit 0 synthetic, bit 1 captured, bit 2 reads synthesized; others 0
//!  20  reserved   8  0
//!  28  crc32c     4  of bytes 0..28
//! chunks, each a 16-byte chunk header then its payload
//!   0  kind       4  1 = events, 2 = end (the last chunk; nothing may follow it)
//!   4  length     4  payload bytes (events: 1 ..= 1 MiB; end: 24)
//!   8  count      4  events in the payload (end: 0)
//!  12  crc32c     4  of the payload
//! event (inside an events payload)
//!   tag u8: 0 read | 1 write of the zero line | 2 write, 64 literal bytes follow the address
//!           | 3 write repeating a recent literal, varint distance 1 ..= window follows the address
//!   varint: zigzag(line number - previous event's line number)
//! end payload: events u64 | writes u64 | reads u64
//! ```
//!
//! Line numbers are byte addresses divided by 64. The content window makes repeated content cheap
//! without unbounded state: the writer and the reader both keep the last `window` literal contents
//! in a ring (literal number n in slot n mod window), so a duplicate of a recent literal costs a
//! few bytes, and reading needs `window * 64` bytes whatever the trace length. Every chunk is
//! checksummed and decoded only after its checksum matched; a missing end chunk means truncation,
//! and the end chunk's counts must match what was read, so a corrupt or cut file is an error.

mod reader;
mod writer;

pub use reader::TraceReader;
pub use writer::TraceWriter;

/// Bytes in a cache line.
pub const LINE_BYTES: usize = 64;
/// One cache line's content.
pub type Line = [u8; LINE_BYTES];
/// The all-zero line.
pub const ZERO_LINE: Line = [0; LINE_BYTES];

/// File magic.
pub const MAGIC: &[u8; 8] = b"NDSIMTR\0";
/// Format version this code reads and writes.
pub const VERSION: u16 = 1;
/// Header size.
pub const HEADER_LEN: usize = 32;
/// Chunk header size.
pub const CHUNK_HEADER_LEN: usize = 16;
/// Largest events payload.
pub const MAX_CHUNK: usize = 1 << 20;
/// Default content window (4 MiB of lines).
pub const DEFAULT_WINDOW: u32 = 1 << 16;
/// Largest content window accepted.
pub const MAX_WINDOW: u32 = 1 << 20;

pub(crate) const KIND_EVENTS: u32 = 1;
pub(crate) const KIND_END: u32 = 2;
pub(crate) const END_LEN: usize = 24;
pub(crate) const TAG_READ: u8 = 0;
pub(crate) const TAG_ZERO: u8 = 1;
pub(crate) const TAG_LITERAL: u8 = 2;
pub(crate) const TAG_REPEAT: u8 = 3;

/// Header flag: made by the generator.
pub const FLAG_SYNTHETIC: u32 = 1;
/// Header flag: captured from a running program.
pub const FLAG_CAPTURED: u32 = 2;
/// Header flag: the reads were synthesized from the write set.
pub const FLAG_READS_SYNTHESIZED: u32 = 4;
const KNOWN_FLAGS: u32 = FLAG_SYNTHETIC | FLAG_CAPTURED | FLAG_READS_SYNTHESIZED;

/// Read or write of one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A line read from memory (a last-level-cache miss).
    Read,
    /// A line written back to memory (a last-level-cache eviction).
    Write,
}

/// One trace event. `data` is meaningful for writes only (zero for reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Read or write.
    pub op: Op,
    /// Line number (byte address / 64).
    pub line: u64,
    /// Content written.
    pub data: Line,
}

impl Event {
    /// A write of `data` to line `line`.
    pub fn write(line: u64, data: Line) -> Self {
        Event {
            op: Op::Write,
            line,
            data,
        }
    }

    /// A read of line `line`.
    pub fn read(line: u64) -> Self {
        Event {
            op: Op::Read,
            line,
            data: ZERO_LINE,
        }
    }
}

/// What a trace holds, from its end chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TraceCounts {
    /// All events.
    pub events: u64,
    /// Write events.
    pub writes: u64,
    /// Read events.
    pub reads: u64,
}

#[cfg(test)]
mod tests;
