//! nodup's compact binary trace format, for long traces (no text parsing, no hex).
//!
//! Layout, all integers little endian:
//!   header (16 B): magic b"NDUPTRC\0" (8) | version u16 (= 1) | flags u16 (= 0) | reserved u32 (= 0)
//!   records, each starting with a tag byte:
//!     tag 0x01 = record: ts u64 | pid u32 | lba u64 | sectors u32 | op u8 (0 R, 1 W)
//!                        | unit u8 (0 per 4 KiB, 1 per sector) | major u32 | minor u32
//!                        | name_len u8 | name bytes | digests (16 B each, count implied by unit+sectors)
//!     tag 0xEE = end:    record count u64 | FNV-1a 64 of every record byte (tags included) u64
//! The end record makes truncation detectable; the checksum catches flipped bytes. Every field is
//! validated on read (known tag/op/unit, sectors in range, UTF-8 name), so a corrupt file yields
//! `TraceError::Format`, never a panic or a huge allocation.

use crate::error::{Result, TraceError};
use crate::format::fiu::MAX_SECTORS;
use crate::record::{Digest, DigestUnit, Op, Record, MAX_LBA_END};
use std::io::{Read, Write};

/// File magic of the own format.
pub const MAGIC: &[u8; 8] = b"NDUPTRC\0";
/// Current format version.
pub const VERSION: u16 = 1;
const HEADER_LEN: usize = 16;
const TAG_RECORD: u8 = 0x01;
const TAG_END: u8 = 0xEE;
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// Streaming writer of the own format; call `finish` to write the end record.
pub struct OwnWriter<W: Write> {
    out: W,
    count: u64,
    hash: u64,
    buf: Vec<u8>,
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
        })
    }

    /// Append one record.
    pub fn write(&mut self, r: &Record) -> Result<()> {
        if r.digests.len() != Record::expected_digests(r.unit, r.sectors) {
            return Err(TraceError::Invalid(
                "record digest count does not match its size".into(),
            ));
        }
        let name = r.process.as_bytes();
        let name = &name[..name.len().min(255)];
        let b = &mut self.buf;
        b.clear();
        b.push(TAG_RECORD);
        b.extend_from_slice(&r.ts.to_le_bytes());
        b.extend_from_slice(&r.pid.to_le_bytes());
        b.extend_from_slice(&r.lba.to_le_bytes());
        b.extend_from_slice(&r.sectors.to_le_bytes());
        b.push(match r.op {
            Op::Read => 0,
            Op::Write => 1,
        });
        b.push(match r.unit {
            DigestUnit::Block => 0,
            DigestUnit::Sector => 1,
        });
        b.extend_from_slice(&r.major.to_le_bytes());
        b.extend_from_slice(&r.minor.to_le_bytes());
        b.push(name.len() as u8);
        b.extend_from_slice(name);
        for d in &r.digests {
            b.extend_from_slice(d);
        }
        self.hash = fnv(self.hash, b);
        self.count += 1;
        self.out
            .write_all(b)
            .map_err(|e| TraceError::io("writing own-format record", e))
    }

    /// Write the end record and flush; returns the inner writer.
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

/// Streaming reader of the own format: yields `(record number, record)`; any corruption is an error.
pub struct OwnReader<R> {
    inner: R,
    count: u64,
    hash: u64,
    bytes: u64,
    done: bool,
    buf: Vec<u8>,
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
        })
    }

    /// Bytes consumed so far (for progress reporting).
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }

    fn take(&mut self, n: usize) -> Result<&[u8]> {
        self.buf.resize(n, 0);
        self.inner
            .read_exact(&mut self.buf)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => {
                    TraceError::Format(format!("truncated after record {}", self.count))
                }
                _ => TraceError::io("reading own-format trace", e),
            })?;
        self.bytes += n as u64;
        Ok(&self.buf)
    }

    fn read_record(&mut self) -> Result<Option<Record>> {
        let tag = self.take(1)?[0];
        match tag {
            TAG_RECORD => {}
            TAG_END => {
                let t = self.take(16)?;
                let count = u64::from_le_bytes(t[..8].try_into().unwrap_or_default());
                let hash = u64::from_le_bytes(t[8..].try_into().unwrap_or_default());
                if count != self.count {
                    return Err(TraceError::Format(format!(
                        "end record says {count} records, read {}",
                        self.count
                    )));
                }
                if hash != self.hash {
                    return Err(TraceError::Format(
                        "checksum mismatch: the file is corrupt".into(),
                    ));
                }
                let mut extra = [0u8; 1];
                if self
                    .inner
                    .read(&mut extra)
                    .map_err(|e| TraceError::io("reading own-format trace", e))?
                    != 0
                {
                    return Err(TraceError::Format("data after the end record".into()));
                }
                return Ok(None);
            }
            other => {
                return Err(TraceError::Format(format!(
                    "bad record tag {other:#04x} at record {}",
                    self.count
                )))
            }
        }
        self.hash = fnv(self.hash, &[tag]);
        const FIXED: usize = 8 + 4 + 8 + 4 + 1 + 1 + 4 + 4 + 1;
        let f = self.take(FIXED)?.to_vec();
        self.hash = fnv(self.hash, &f);
        let u64at = |o: usize| u64::from_le_bytes(f[o..o + 8].try_into().unwrap_or_default());
        let u32at = |o: usize| u32::from_le_bytes(f[o..o + 4].try_into().unwrap_or_default());
        let (ts, pid, lba, sectors) = (u64at(0), u32at(8), u64at(12), u32at(20));
        let op = match f[24] {
            0 => Op::Read,
            1 => Op::Write,
            x => {
                return Err(TraceError::Format(format!(
                    "bad op {x} in record {}",
                    self.count
                )))
            }
        };
        let unit = match f[25] {
            0 => DigestUnit::Block,
            1 => DigestUnit::Sector,
            x => {
                return Err(TraceError::Format(format!(
                    "bad digest unit {x} in record {}",
                    self.count
                )))
            }
        };
        let (major, minor, name_len) = (u32at(26), u32at(30), f[34] as usize);
        if sectors == 0 || sectors > MAX_SECTORS {
            return Err(TraceError::Format(format!(
                "size {sectors} out of range in record {}",
                self.count
            )));
        }
        if lba
            .checked_add(sectors as u64)
            .is_none_or(|end| end > MAX_LBA_END)
        {
            return Err(TraceError::Format(format!(
                "lba {lba} out of range in record {}",
                self.count
            )));
        }
        let name = self.take(name_len)?.to_vec();
        self.hash = fnv(self.hash, &name);
        let process = String::from_utf8(name).map_err(|_| {
            TraceError::Format(format!(
                "process name is not UTF-8 in record {}",
                self.count
            ))
        })?;
        let n = Record::expected_digests(unit, sectors);
        let raw = self.take(n * 16)?.to_vec();
        self.hash = fnv(self.hash, &raw);
        let digests: Vec<Digest> = raw
            .chunks_exact(16)
            .map(|c| c.try_into().unwrap_or_default())
            .collect();
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
            ts: i * 10,
            pid: 42,
            process: "proc".into(),
            lba: i * 8,
            sectors: 8,
            op: if i % 3 == 0 { Op::Read } else { Op::Write },
            major: 6,
            minor: 0,
            unit: DigestUnit::Block,
            digests: vec![[i as u8; 16]],
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
    }

    #[test]
    fn corruption_is_an_error_not_a_panic() {
        let good = encode(5);
        // Truncation at every length and a flipped byte at every position must all be rejected.
        for cut in 0..good.len() {
            let res: Result<Vec<_>> = OwnReader::new(&good[..cut]).and_then(|r| r.collect());
            assert!(res.is_err(), "truncated to {cut} bytes accepted");
        }
        for pos in 0..good.len() {
            let mut bad = good.clone();
            bad[pos] ^= 0x5A;
            let res: Result<Vec<_>> = OwnReader::new(&bad[..]).and_then(|r| r.collect());
            assert!(res.is_err(), "flipped byte {pos} accepted");
        }
    }
}
