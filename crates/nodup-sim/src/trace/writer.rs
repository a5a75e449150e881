//! Streaming writer of the trace format (see the module doc of `trace`).

use super::*;
use crate::error::{Result, SimError};
use nodup_core::codec::{put_u32, put_u64};
use nodup_trace::format::varint::{put_varint, zigzag};
use rustc_hash::FxHashMap;
use std::io::Write;

/// Writes events into chunks; [`TraceWriter::finish`] writes the end chunk.
pub struct TraceWriter<W: Write> {
    out: W,
    payload: Vec<u8>,
    chunk_events: u32,
    counts: TraceCounts,
    prev_line: u64,
    window: u32,
    /// Content -> literal number, for the literals still in the window.
    recent: FxHashMap<Line, u64>,
    /// Ring of the window's literals (to drop a content from `recent` when its slot is reused).
    ring: Vec<Line>,
    literals: u64,
    bytes: u64,
}

impl TraceWriter<std::io::BufWriter<std::fs::File>> {
    /// Create `path` (replacing it) with the given header flags.
    pub fn create(path: &std::path::Path, flags: u32) -> Result<Self> {
        let f = std::fs::File::create(path)
            .map_err(|e| SimError::io(format!("creating {}", path.display()), e))?;
        TraceWriter::new(
            std::io::BufWriter::with_capacity(1 << 20, f),
            flags,
            DEFAULT_WINDOW,
        )
    }
}

impl<W: Write> TraceWriter<W> {
    /// Write the header to `out`; `window` is the content window (power of two, <= 2^20).
    pub fn new(mut out: W, flags: u32, window: u32) -> Result<Self> {
        if !window.is_power_of_two() || window > MAX_WINDOW || flags & !KNOWN_FLAGS != 0 {
            return Err(SimError::Invalid(format!(
                "trace writer: bad window {window} or flags {flags:#x}"
            )));
        }
        let mut h = [0u8; HEADER_LEN];
        h[..8].copy_from_slice(MAGIC);
        h[8..10].copy_from_slice(&VERSION.to_le_bytes());
        h[10..12].copy_from_slice(&(LINE_BYTES as u16).to_le_bytes());
        put_u32(&mut h, 12, window);
        put_u32(&mut h, 16, flags);
        let crc = crc32c::crc32c(&h[..28]);
        put_u32(&mut h, 28, crc);
        out.write_all(&h)
            .map_err(|e| SimError::io("writing trace header", e))?;
        Ok(TraceWriter {
            out,
            payload: Vec::with_capacity(MAX_CHUNK + 128),
            chunk_events: 0,
            counts: TraceCounts::default(),
            prev_line: 0,
            window,
            recent: FxHashMap::default(),
            ring: vec![ZERO_LINE; window as usize],
            literals: 0,
            bytes: HEADER_LEN as u64,
        })
    }

    /// Append one event.
    pub fn write(&mut self, e: &Event) -> Result<()> {
        let tag_at = self.payload.len();
        self.payload.push(TAG_READ);
        let delta = e.line.wrapping_sub(self.prev_line) as i64;
        put_varint(&mut self.payload, zigzag(delta));
        self.prev_line = e.line;
        match e.op {
            Op::Read => self.counts.reads += 1,
            Op::Write => {
                self.counts.writes += 1;
                if e.data == ZERO_LINE {
                    self.payload[tag_at] = TAG_ZERO;
                } else if let Some(&n) = self.recent.get(&e.data) {
                    self.payload[tag_at] = TAG_REPEAT;
                    put_varint(&mut self.payload, self.literals - n);
                } else {
                    self.payload[tag_at] = TAG_LITERAL;
                    self.payload.extend_from_slice(&e.data);
                    let slot = (self.literals % self.window as u64) as usize;
                    if self.literals >= self.window as u64 {
                        let old = self.ring[slot];
                        if self.recent.get(&old) == Some(&(self.literals - self.window as u64)) {
                            self.recent.remove(&old);
                        }
                    }
                    self.ring[slot] = e.data;
                    self.recent.insert(e.data, self.literals);
                    self.literals += 1;
                }
            }
        }
        self.counts.events += 1;
        self.chunk_events += 1;
        if self.payload.len() >= MAX_CHUNK - 100 {
            self.flush_chunk()?;
        }
        Ok(())
    }

    /// Events written so far.
    pub fn counts(&self) -> TraceCounts {
        self.counts
    }

    /// Bytes written so far (header and flushed chunks).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn chunk(&mut self, kind: u32, count: u32, payload: &[u8]) -> Result<()> {
        let mut h = [0u8; CHUNK_HEADER_LEN];
        put_u32(&mut h, 0, kind);
        put_u32(&mut h, 4, payload.len() as u32);
        put_u32(&mut h, 8, count);
        put_u32(&mut h, 12, crc32c::crc32c(payload));
        self.out
            .write_all(&h)
            .and_then(|()| self.out.write_all(payload))
            .map_err(|e| SimError::io("writing trace", e))?;
        self.bytes += (CHUNK_HEADER_LEN + payload.len()) as u64;
        Ok(())
    }

    fn flush_chunk(&mut self) -> Result<()> {
        if self.chunk_events == 0 {
            return Ok(());
        }
        let payload = std::mem::take(&mut self.payload);
        self.chunk(KIND_EVENTS, self.chunk_events, &payload)?;
        self.payload = payload;
        self.payload.clear();
        self.chunk_events = 0;
        Ok(())
    }

    /// Write the last events chunk and the end chunk, flush, and return the counts.
    pub fn finish(mut self) -> Result<TraceCounts> {
        self.flush_chunk()?;
        let mut end = [0u8; END_LEN];
        put_u64(&mut end, 0, self.counts.events);
        put_u64(&mut end, 8, self.counts.writes);
        put_u64(&mut end, 16, self.counts.reads);
        self.chunk(KIND_END, 0, &end)?;
        self.out
            .flush()
            .map_err(|e| SimError::io("writing trace", e))?;
        Ok(self.counts)
    }
}
