//! nodup's compact binary trace format, for long traces (no text parsing, no hex, ~1/3 the size).
//!
//! Layout; integers are LEB128 varints unless a width is given, "zz" = zigzag-encoded signed:
//!   header (16 B): magic b"NDUPTRC\0" (8) | version u16 LE (= 1) | flags u16 (= 0) | reserved u32 (= 0)
//!   then items, each starting with a tag byte:
//!     0x02 device   : major | minor                  -> gets the next device index (0, 1, ...)
//!     0x03 process  : len | UTF-8 bytes (len <= 255)  -> gets the next process-name index
//!     0x01 record   : flags u8 (bit 0 write, bit 1 one digest per 512 B sector; others 0)
//!                     | zz(ts - previous ts) | pid | zz(lba - previous record's end lba) | sectors
//!                     | device index | process index | digests (16 B each, count implied by flags+sectors)
//!     0xEE end      : record count u64 LE | FNV-1a 64 of all item bytes before the end tag, u64 LE
//! Deltas make sequential traces cost ~10 bytes per record besides the digests. The end item makes
//! truncation detectable and the checksum catches flipped bytes; every field is also validated on
//! read (known tags and flags, indices defined, sizes in range, varints at most 10 bytes), so a
//! corrupt file yields `TraceError::Format`, never a panic or a huge allocation.

use crate::error::{Result, TraceError};
use crate::format::fiu::MAX_SECTORS;
use crate::format::varint::{get_varint, put_varint, unzigzag, zigzag};
use crate::record::{Digest, DigestUnit, Op, Record, MAX_LBA_END};
use std::collections::HashMap;
use std::io::{Read, Write};

/// File magic of the own format.
pub const MAGIC: &[u8; 8] = b"NDUPTRC\0";
/// Current format version.
pub const VERSION: u16 = 1;
const HEADER_LEN: usize = 16;
const TAG_RECORD: u8 = 0x01;
const TAG_DEVICE: u8 = 0x02;
const TAG_PROCESS: u8 = 0x03;
const TAG_END: u8 = 0xEE;
const FLAG_WRITE: u8 = 1;
const FLAG_SECTOR: u8 = 2;
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// Streaming writer of the own format; call `finish` to write the end item.
pub struct OwnWriter<W: Write> {
    out: W,
    count: u64,
    hash: u64,
    buf: Vec<u8>,
    devices: HashMap<(u32, u32), u64>,
    names: HashMap<String, u64>,
    prev_ts: u64,
    prev_end: u64,
}

impl<W: Write> OwnWriter<W> {
    /// Write the header and return the writer.
    pub fn new(mut out: W) -> Result<Self> {
        let mut h = [0u8; HEADER_LEN];
        h[..8].copy_from_slice(MAGIC);
        h[8..10].copy_from_slice(&VERSION.to_le_bytes());
        out.write_all(&h)
            .map_err(|e| TraceError::io("writing own-format header", e))?;
        Ok(OwnWriter {
            out,
            count: 0,
            hash: FNV_OFFSET,
            buf: Vec::with_capacity(256),
            devices: HashMap::new(),
            names: HashMap::new(),
            prev_ts: 0,
            prev_end: 0,
        })
    }

    /// Append one record (preceded by device / process definitions seen for the first time).
    pub fn write(&mut self, r: &Record) -> Result<()> {
        if r.digests.len() != Record::expected_digests(r.unit, r.sectors) {
            return Err(TraceError::Invalid(
                "record digest count does not match its size".into(),
            ));
        }
        let mut name = r.process.as_str();
        while name.len() > 255 {
            // Keep a valid UTF-8 prefix of at most 255 bytes.
            let mut cut = 255;
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            name = &name[..cut];
        }
        self.buf.clear();
        let next_dev = self.devices.len() as u64;
        let dev = *self.devices.entry(r.device()).or_insert(next_dev);
        if dev == next_dev {
            self.buf.push(TAG_DEVICE);
            put_varint(&mut self.buf, r.major as u64);
            put_varint(&mut self.buf, r.minor as u64);
        }
        let next_name = self.names.len() as u64;
        let name_idx = *self.names.entry(name.to_string()).or_insert(next_name);
        if name_idx == next_name {
            self.buf.push(TAG_PROCESS);
            put_varint(&mut self.buf, name.len() as u64);
            self.buf.extend_from_slice(name.as_bytes());
        }
        let b = &mut self.buf;
        b.push(TAG_RECORD);
        let mut flags = 0;
        if r.op == Op::Write {
            flags |= FLAG_WRITE;
        }
        if r.unit == DigestUnit::Sector {
            flags |= FLAG_SECTOR;
        }
        b.push(flags);
        put_varint(b, zigzag(r.ts.wrapping_sub(self.prev_ts) as i64));
        put_varint(b, r.pid as u64);
        put_varint(b, zigzag(r.lba.wrapping_sub(self.prev_end) as i64));
        put_varint(b, r.sectors as u64);
        put_varint(b, dev);
        put_varint(b, name_idx);
        for d in &r.digests {
            b.extend_from_slice(d);
        }
        self.prev_ts = r.ts;
        self.prev_end = r.lba + r.sectors as u64;
        self.hash = fnv(self.hash, b);
        self.count += 1;
        self.out
            .write_all(b)
            .map_err(|e| TraceError::io("writing own-format record", e))
    }

    /// Write the end item and flush; returns the inner writer.
    pub fn finish(mut self) -> Result<W> {
        let mut end = [0u8; 17];
        end[0] = TAG_END;
        end[1..9].copy_from_slice(&self.count.to_le_bytes());
        end[9..17].copy_from_slice(&self.hash.to_le_bytes());
        self.out
            .write_all(&end)
            .map_err(|e| TraceError::io("writing own-format end", e))?;
        self.out
            .flush()
            .map_err(|e| TraceError::io("flushing own-format trace", e))?;
        Ok(self.out)
    }
}

/// A format error found after `count` records.
fn corrupt_after(count: u64, what: &str) -> TraceError {
    TraceError::Format(format!("{what} (after record {count})"))
}

/// Streaming reader of the own format: yields `(record number, record)`; any corruption is an error.
pub struct OwnReader<R> {
    inner: R,
    count: u64,
    hash: u64,
    bytes: u64,
    done: bool,
    buf: Vec<u8>,
    devices: Vec<(u32, u32)>,
    names: Vec<String>,
    prev_ts: u64,
    prev_end: u64,
}

impl<R: Read> OwnReader<R> {
    /// Read and validate the header.
    pub fn new(mut inner: R) -> Result<Self> {
        let mut h = [0u8; HEADER_LEN];
        inner
            .read_exact(&mut h)
            .map_err(|_| TraceError::Format("file shorter than the header".into()))?;
        if &h[..8] != MAGIC {
            return Err(TraceError::Format("bad magic (not a nodup trace)".into()));
        }
        let version = u16::from_le_bytes([h[8], h[9]]);
        if version != VERSION {
            return Err(TraceError::Format(format!(
                "unsupported version {version} (this build reads {VERSION})"
            )));
        }
        if h[10..16] != [0u8; 6] {
            return Err(TraceError::Format("unknown flags in header".into()));
        }
        Ok(OwnReader {
            inner,
            count: 0,
            hash: FNV_OFFSET,
            bytes: HEADER_LEN as u64,
            done: false,
            buf: Vec::new(),
            devices: Vec::new(),
            names: Vec::new(),
            prev_ts: 0,
            prev_end: 0,
        })
    }

    /// Bytes consumed so far (for progress reporting).
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }

    fn corrupt(&self, what: &str) -> TraceError {
        corrupt_after(self.count, what)
    }

    /// Read exactly `n` bytes into `self.buf`, adding them to the checksum.
    fn take(&mut self, n: usize) -> Result<()> {
        self.buf.resize(n, 0);
        if let Err(e) = self.inner.read_exact(&mut self.buf) {
            return Err(match e.kind() {
                std::io::ErrorKind::UnexpectedEof => self.corrupt("truncated file"),
                _ => TraceError::io("reading own-format trace", e),
            });
        }
        self.bytes += n as u64;
        self.hash = fnv(self.hash, &self.buf);
        Ok(())
    }

    fn byte(&mut self) -> Result<u8> {
        self.take(1)?;
        Ok(self.buf[0])
    }

    fn varint(&mut self) -> Result<u64> {
        let count = self.count;
        get_varint(|| self.byte(), |what| corrupt_after(count, what))
    }

    fn small(&mut self, max: u64, what: &str) -> Result<u64> {
        let v = self.varint()?;
        if v > max {
            return Err(self.corrupt(&format!("{what} {v} out of range")));
        }
        Ok(v)
    }

    fn read_record(&mut self) -> Result<Option<Record>> {
        loop {
            let before = self.hash;
            match self.byte()? {
                TAG_RECORD => break,
                TAG_DEVICE => {
                    let major = self.small(u32::MAX as u64, "major")? as u32;
                    let minor = self.small(u32::MAX as u64, "minor")? as u32;
                    if self.devices.contains(&(major, minor)) {
                        return Err(self.corrupt("device defined twice"));
                    }
                    self.devices.push((major, minor));
                }
                TAG_PROCESS => {
                    let len = self.small(255, "process name length")? as usize;
                    self.take(len)?;
                    let name = String::from_utf8(self.buf.clone())
                        .map_err(|_| self.corrupt("process name is not UTF-8"))?;
                    self.names.push(name);
                }
                TAG_END => {
                    self.take(16)?;
                    let count = u64::from_le_bytes(self.buf[..8].try_into().unwrap_or_default());
                    let hash = u64::from_le_bytes(self.buf[8..16].try_into().unwrap_or_default());
                    if count != self.count {
                        return Err(self.corrupt(&format!("end item says {count} records")));
                    }
                    if hash != before {
                        return Err(self.corrupt("checksum mismatch: the file is corrupt"));
                    }
                    let mut extra = [0u8; 1];
                    if self
                        .inner
                        .read(&mut extra)
                        .map_err(|e| TraceError::io("reading own-format trace", e))?
                        != 0
                    {
                        return Err(self.corrupt("data after the end item"));
                    }
                    return Ok(None);
                }
                other => return Err(self.corrupt(&format!("bad item tag {other:#04x}"))),
            }
        }
        let flags = self.byte()?;
        if flags & !(FLAG_WRITE | FLAG_SECTOR) != 0 {
            return Err(self.corrupt(&format!("unknown record flags {flags:#04x}")));
        }
        let op = if flags & FLAG_WRITE != 0 {
            Op::Write
        } else {
            Op::Read
        };
        let unit = if flags & FLAG_SECTOR != 0 {
            DigestUnit::Sector
        } else {
            DigestUnit::Block
        };
        let ts = self.prev_ts.wrapping_add(unzigzag(self.varint()?) as u64);
        let pid = self.small(u32::MAX as u64, "pid")? as u32;
        let lba = self.prev_end.wrapping_add(unzigzag(self.varint()?) as u64);
        let sectors = self.small(MAX_SECTORS as u64, "size")? as u32;
        if sectors == 0
            || lba
                .checked_add(sectors as u64)
                .is_none_or(|end| end > MAX_LBA_END)
        {
            return Err(self.corrupt(&format!("request lba {lba} size {sectors} out of range")));
        }
        let dev = self.varint()? as usize;
        let &(major, minor) = self
            .devices
            .get(dev)
            .ok_or_else(|| self.corrupt("undefined device index"))?;
        let name = self.varint()? as usize;
        let process = self
            .names
            .get(name)
            .ok_or_else(|| self.corrupt("undefined process index"))?
            .clone();
        let n = Record::expected_digests(unit, sectors);
        self.take(n * 16)?;
        let digests: Vec<Digest> = self
            .buf
            .chunks_exact(16)
            .map(|c| c.try_into().unwrap_or_default())
            .collect();
        self.prev_ts = ts;
        self.prev_end = lba + sectors as u64;
        self.count += 1;
        Ok(Some(Record {
            ts,
            pid,
            process,
            lba,
            sectors,
            op,
            major,
            minor,
            unit,
            digests,
        }))
    }
}

impl<R: Read> Iterator for OwnReader<R> {
    type Item = Result<(u64, Record)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.read_record() {
            Ok(Some(r)) => Some(Ok((self.count, r))),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                // A corrupt file cannot be resynchronised: report once, then stop.
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u64) -> Record {
        Record {
            ts: 1_000_000 + i * 10 - (i % 2) * 15, // timestamps that sometimes go backwards
            pid: 42 + (i % 2) as u32,
            process: if i % 3 == 0 {
                "proc".into()
            } else {
                "kworker/0:1 x".into()
            },
            lba: if i == 4 { u64::MAX >> 12 } else { (i * 8) ^ 64 },
            sectors: if i % 4 == 0 { 3 } else { 8 },
            op: if i % 3 == 0 { Op::Read } else { Op::Write },
            major: 6,
            minor: (i % 2) as u32 * 16,
            unit: if i % 4 == 0 {
                DigestUnit::Sector
            } else {
                DigestUnit::Block
            },
            digests: vec![[i as u8; 16]; if i % 4 == 0 { 3 } else { 1 }],
        }
    }

    fn encode(n: u64) -> Vec<u8> {
        let mut w = OwnWriter::new(Vec::new()).unwrap();
        for i in 0..n {
            w.write(&rec(i)).unwrap();
        }
        w.finish().unwrap()
    }

    #[test]
    fn round_trip() {
        let bytes = encode(10);
        let got: Vec<Record> = OwnReader::new(&bytes[..])
            .unwrap()
            .map(|r| r.unwrap().1)
            .collect();
        assert_eq!(got, (0..10).map(rec).collect::<Vec<_>>());
        assert!(zigzag(-1) == 1 && unzigzag(zigzag(i64::MIN)) == i64::MIN);
    }

    #[test]
    fn sequential_records_are_compact() {
        let mut w = OwnWriter::new(Vec::new()).unwrap();
        for i in 0..1000u64 {
            let r = Record {
                ts: 5_000_000 + i * 1000,
                pid: 4000,
                process: "p".into(),
                lba: (1 << 30) + i * 8,
                sectors: 8,
                op: Op::Write,
                major: 8,
                minor: 0,
                unit: DigestUnit::Block,
                digests: vec![[7; 16]],
            };
            w.write(&r).unwrap();
        }
        let len = w.finish().unwrap().len();
        // tag, flags, ts delta (2), pid (2), lba delta, size, device, name: 10 bytes + the digest.
        assert!(len <= 1000 * 26 + 64, "{len} bytes for 1000 records");
    }

    #[test]
    fn corruption_is_an_error_not_a_panic() {
        let good = encode(6);
        // Truncation at every length and a flipped byte at every position must all be rejected.
        for cut in 0..good.len() {
            let res: Result<Vec<_>> = OwnReader::new(&good[..cut]).and_then(|r| r.collect());
            assert!(res.is_err(), "truncated to {cut} bytes accepted");
        }
        for pos in 0..good.len() {
            for mask in [0x01u8, 0x5A, 0x80] {
                let mut bad = good.clone();
                bad[pos] ^= mask;
                let res: Result<Vec<_>> = OwnReader::new(&bad[..]).and_then(|r| r.collect());
                assert!(res.is_err(), "byte {pos} ^ {mask:#x} accepted");
            }
        }
    }
}
