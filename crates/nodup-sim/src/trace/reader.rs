//! Streaming reader of the trace format: memory = one chunk + the content window.

use super::*;
use crate::error::{Result, SimError};
use nodup_core::codec::{le_u32, le_u64};
use nodup_trace::format::varint::{get_varint, unzigzag};
use std::io::Read;

/// Reads a trace chunk by chunk, validating everything (see the module doc of `trace`).
pub struct TraceReader<R: Read> {
    input: R,
    name: String,
    flags: u32,
    window: u32,
    payload: Vec<u8>,
    pos: usize,
    left_in_chunk: u32,
    ring: Vec<Line>,
    literals: u64,
    prev_line: u64,
    counts: TraceCounts,
    /// File offset of the current chunk (for error messages) and bytes consumed.
    chunk_offset: u64,
    bytes: u64,
    done: bool,
}

impl TraceReader<std::io::BufReader<std::fs::File>> {
    /// Open and check the header of the trace at `path`.
    pub fn open(path: &std::path::Path) -> Result<Self> {
        let f = std::fs::File::open(path)
            .map_err(|e| SimError::io(format!("opening {}", path.display()), e))?;
        TraceReader::new(
            std::io::BufReader::with_capacity(1 << 20, f),
            &path.display().to_string(),
        )
    }
}

/// Read exactly `buf.len()` bytes; false at a clean end of input before the first byte.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8], what: &str) -> Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(SimError::Format(format!(
                    "{what}: truncated ({got} of {} bytes)",
                    buf.len()
                )))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(SimError::io(what.to_string(), e)),
        }
    }
    Ok(true)
}

impl<R: Read> TraceReader<R> {
    /// Check the header read from `input`; `name` names the trace in errors.
    pub fn new(mut input: R, name: &str) -> Result<Self> {
        let bad = |m: String| SimError::Format(format!("{name}: not a nodup sim trace ({m})"));
        let mut h = [0u8; HEADER_LEN];
        match read_full(&mut input, &mut h, name) {
            Ok(true) => {}
            Ok(false) => return Err(bad("empty file".into())),
            Err(SimError::Format(_)) => return Err(bad("shorter than the header".into())),
            Err(e) => return Err(e),
        }
        if &h[..8] != MAGIC {
            return Err(bad("bad magic".into()));
        }
        if crc32c::crc32c(&h[..28]) != le_u32(&h, 28) {
            return Err(bad("header checksum mismatch".into()));
        }
        let version = u16::from_le_bytes([h[8], h[9]]);
        if version != VERSION {
            return Err(bad(format!(
                "version {version}, this build reads {VERSION}"
            )));
        }
        let line = u16::from_le_bytes([h[10], h[11]]);
        let window = le_u32(&h, 12);
        let flags = le_u32(&h, 16);
        if line as usize != LINE_BYTES
            || !window.is_power_of_two()
            || window > MAX_WINDOW
            || flags & !KNOWN_FLAGS != 0
            || h[20..28].iter().any(|&b| b != 0)
        {
            return Err(bad(format!(
                "line size {line}, window {window}, flags {flags:#x}"
            )));
        }
        Ok(TraceReader {
            input,
            name: name.to_string(),
            flags,
            window,
            payload: Vec::new(),
            pos: 0,
            left_in_chunk: 0,
            ring: vec![ZERO_LINE; window as usize],
            literals: 0,
            prev_line: 0,
            counts: TraceCounts::default(),
            chunk_offset: HEADER_LEN as u64,
            bytes: HEADER_LEN as u64,
            done: false,
        })
    }

    /// Header flags (`FLAG_*`).
    pub fn flags(&self) -> u32 {
        self.flags
    }

    /// Bytes consumed so far (for progress).
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }

    /// Counts of the events returned so far (the whole trace once the end was reached).
    pub fn counts(&self) -> TraceCounts {
        self.counts
    }

    fn corrupt(&self, m: &str) -> SimError {
        SimError::Format(format!(
            "{}: corrupt trace at chunk offset {}: {m}",
            self.name, self.chunk_offset
        ))
    }

    /// Load the next chunk; false after a valid end chunk.
    fn next_chunk(&mut self) -> Result<bool> {
        if self.pos != self.payload.len() || self.left_in_chunk != 0 {
            return Err(self.corrupt("event count does not match the payload"));
        }
        self.chunk_offset = self.bytes;
        let mut h = [0u8; CHUNK_HEADER_LEN];
        let what = format!("{}: chunk at offset {}", self.name, self.chunk_offset);
        if !read_full(&mut self.input, &mut h, &what)? {
            return Err(SimError::Format(format!(
                "{}: truncated trace (no end chunk after {} events)",
                self.name, self.counts.events
            )));
        }
        let (kind, len, count, crc) = (le_u32(&h, 0), le_u32(&h, 4), le_u32(&h, 8), le_u32(&h, 12));
        let len_ok = match kind {
            KIND_EVENTS => (1..=MAX_CHUNK as u32).contains(&len) && count > 0,
            KIND_END => len as usize == END_LEN && count == 0,
            _ => false,
        };
        if !len_ok {
            return Err(self.corrupt(&format!("chunk kind {kind} length {len} count {count}")));
        }
        self.payload.resize(len as usize, 0);
        if !read_full(&mut self.input, &mut self.payload, &what)? {
            return Err(SimError::Format(format!("{what}: truncated (no payload)")));
        }
        self.bytes += (CHUNK_HEADER_LEN + len as usize) as u64;
        if crc32c::crc32c(&self.payload) != crc {
            return Err(self.corrupt("checksum mismatch"));
        }
        self.pos = 0;
        if kind == KIND_END {
            let end = TraceCounts {
                events: le_u64(&self.payload, 0),
                writes: le_u64(&self.payload, 8),
                reads: le_u64(&self.payload, 16),
            };
            if end != self.counts {
                return Err(self.corrupt(&format!(
                    "end chunk says {} events ({} writes, {} reads), read {} ({}, {})",
                    end.events,
                    end.writes,
                    end.reads,
                    self.counts.events,
                    self.counts.writes,
                    self.counts.reads
                )));
            }
            let mut extra = [0u8; 1];
            if read_full(&mut self.input, &mut extra, &self.name)? {
                return Err(self.corrupt("bytes after the end chunk"));
            }
            self.pos = self.payload.len();
            self.done = true;
            return Ok(false);
        }
        self.left_in_chunk = count;
        Ok(true)
    }

    fn varint(&mut self) -> Result<u64> {
        let (payload, pos) = (&self.payload, &mut self.pos);
        get_varint(
            || {
                let b = *payload.get(*pos).ok_or("event runs past the chunk")?;
                *pos += 1;
                Ok(b)
            },
            |what| what,
        )
        .map_err(|what| self.corrupt(what))
    }

    fn decode_one(&mut self) -> Result<Event> {
        let Some(&tag) = self.payload.get(self.pos) else {
            return Err(self.corrupt("event runs past the chunk"));
        };
        self.pos += 1;
        let delta = unzigzag(self.varint()?);
        let line = self.prev_line.wrapping_add(delta as u64);
        self.prev_line = line;
        let e = match tag {
            TAG_READ => Event::read(line),
            TAG_ZERO => Event::write(line, ZERO_LINE),
            TAG_LITERAL => {
                let Some(bytes) = self.payload.get(self.pos..self.pos + LINE_BYTES) else {
                    return Err(self.corrupt("literal runs past the chunk"));
                };
                let mut data = ZERO_LINE;
                data.copy_from_slice(bytes);
                self.pos += LINE_BYTES;
                let slot = (self.literals % self.window as u64) as usize;
                self.ring[slot] = data;
                self.literals += 1;
                Event::write(line, data)
            }
            TAG_REPEAT => {
                let d = self.varint()?;
                if d == 0 || d > self.window as u64 || d > self.literals {
                    return Err(self.corrupt(&format!("repeat distance {d} out of range")));
                }
                let slot = ((self.literals - d) % self.window as u64) as usize;
                Event::write(line, self.ring[slot])
            }
            t => return Err(self.corrupt(&format!("unknown event tag {t}"))),
        };
        match e.op {
            Op::Read => self.counts.reads += 1,
            Op::Write => self.counts.writes += 1,
        }
        self.counts.events += 1;
        Ok(e)
    }

    /// Append up to `max` events to `out`; returns how many (0 only at the verified end).
    pub fn next_batch(&mut self, out: &mut Vec<Event>, max: usize) -> Result<usize> {
        let mut n = 0;
        while n < max && !self.done {
            if self.left_in_chunk == 0 && !self.next_chunk()? {
                break;
            }
            let e = self.decode_one()?;
            self.left_in_chunk -= 1;
            out.push(e);
            n += 1;
        }
        Ok(n)
    }

    /// Read the whole trace into a vector (tests and small traces).
    pub fn read_all(mut self) -> Result<Vec<Event>> {
        let mut v = Vec::new();
        while self.next_batch(&mut v, 1 << 16)? > 0 {}
        Ok(v)
    }
}
