//! The FIU iodedup text format (blkparse-like), both digest variants.
//!
//! One request per line, whitespace separated:
//!   `ts_ns pid process lba size_sectors W|R major minor digests`
//! `digests` is hex: one MD5 (32 hex digits) per 4 KiB of the request (mail, web-vm) or one per
//! 512 B sector (homes), concatenated. The variant is told by the digest count: ceil(size/8)
//! digests means per 4 KiB, `size` digests means per sector. When both fit (a 1-sector request)
//! the variant of the last unambiguous line is kept (4 KiB before any). A process name with
//! spaces is accepted: the fixed fields are taken from both ends of the line.

use crate::error::{Result, TraceError};
use crate::record::{Digest, DigestUnit, Op, Record, MAX_LBA_END, SECTORS_PER_BLOCK};
use std::io::BufRead;

/// Largest request accepted, in sectors (1 GiB): guards allocations against garbage lines.
pub const MAX_SECTORS: u32 = 1 << 21;

/// Parse one FIU line. `sticky` carries the digest variant of the last unambiguous line.
pub fn parse_line(line: &str, sticky: &mut DigestUnit) -> Result<Record, String> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 9 {
        return Err(format!("expected 9 fields, found {}", f.len()));
    }
    let n = f.len();
    let num = |s: &str, what: &str| -> Result<u64, String> {
        s.parse::<u64>()
            .map_err(|_| format!("{what} is not a number: {s:?}"))
    };
    let ts = num(f[0], "timestamp")?;
    let pid = u32::try_from(num(f[1], "pid")?).map_err(|_| "pid out of range".to_string())?;
    let process = f[2..n - 6].join(" ");
    let lba = num(f[n - 6], "lba")?;
    let sectors = num(f[n - 5], "size")?;
    if sectors == 0 || sectors > MAX_SECTORS as u64 {
        return Err(format!(
            "size {sectors} sectors out of range 1..={MAX_SECTORS}"
        ));
    }
    let sectors = sectors as u32;
    if lba
        .checked_add(sectors as u64)
        .is_none_or(|end| end > MAX_LBA_END)
    {
        return Err(format!("lba + size beyond {MAX_LBA_END} sectors"));
    }
    let op = match f[n - 4] {
        "W" | "w" => Op::Write,
        "R" | "r" => Op::Read,
        other => return Err(format!("operation must be W or R, found {other:?}")),
    };
    let major =
        u32::try_from(num(f[n - 3], "major")?).map_err(|_| "major out of range".to_string())?;
    let minor =
        u32::try_from(num(f[n - 2], "minor")?).map_err(|_| "minor out of range".to_string())?;
    let hex = f[n - 1].as_bytes();
    if hex.is_empty() || hex.len() % 32 != 0 {
        return Err(format!(
            "digest field has {} hex digits, not a multiple of 32",
            hex.len()
        ));
    }
    let count = hex.len() / 32;
    let per_block = Record::expected_digests(DigestUnit::Block, sectors);
    let per_sector = Record::expected_digests(DigestUnit::Sector, sectors);
    let unit = if count == per_block && count == per_sector {
        *sticky
    } else if count == per_block {
        DigestUnit::Block
    } else if count == per_sector {
        DigestUnit::Sector
    } else {
        return Err(format!(
            "{count} digests for {sectors} sectors (expected {per_block} per 4 KiB or {per_sector} per sector)"
        ));
    };
    *sticky = unit;
    let mut digests = Vec::with_capacity(count);
    for chunk in hex.chunks(32) {
        digests.push(parse_digest(chunk).ok_or_else(|| "digest is not hexadecimal".to_string())?);
    }
    Ok(Record {
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
    })
}

fn parse_digest(hex: &[u8]) -> Option<Digest> {
    let mut d = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        d[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(d)
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Format a record as one FIU line (without the newline); `parse_line` reads it back unchanged.
pub fn format_line(r: &Record) -> String {
    let mut hex = String::with_capacity(r.digests.len() * 32);
    for d in &r.digests {
        for b in d {
            hex.push(char::from(b"0123456789abcdef"[(b >> 4) as usize]));
            hex.push(char::from(b"0123456789abcdef"[(b & 15) as usize]));
        }
    }
    let op = match r.op {
        Op::Write => 'W',
        Op::Read => 'R',
    };
    let process = if r.process.is_empty() {
        "-"
    } else {
        r.process.as_str()
    };
    format!(
        "{} {} {} {} {} {} {} {} {}",
        r.ts, r.pid, process, r.lba, r.sectors, op, r.major, r.minor, hex
    )
}

/// Streaming reader of an FIU file: yields `(line number, record)` or a `Parse` error per bad line.
pub struct FiuReader<R> {
    inner: R,
    buf: Vec<u8>,
    line: u64,
    bytes: u64,
    sticky: DigestUnit,
}

impl<R: BufRead> FiuReader<R> {
    /// Wrap a buffered reader.
    pub fn new(inner: R) -> Self {
        FiuReader {
            inner,
            buf: Vec::with_capacity(512),
            line: 0,
            bytes: 0,
            sticky: DigestUnit::Block,
        }
    }

    /// Bytes consumed so far (for progress reporting).
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }
}

impl<R: BufRead> Iterator for FiuReader<R> {
    type Item = Result<(u64, Record)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buf.clear();
            let n = match self.inner.read_until(b'\n', &mut self.buf) {
                Ok(0) => return None,
                Ok(n) => n,
                Err(e) => {
                    return Some(Err(TraceError::io(
                        format!("reading line {}", self.line + 1),
                        e,
                    )))
                }
            };
            self.bytes += n as u64;
            self.line += 1;
            let text = match std::str::from_utf8(&self.buf) {
                Ok(t) => t.trim(),
                Err(_) => {
                    return Some(Err(TraceError::Parse {
                        line: self.line,
                        msg: "not UTF-8 text".into(),
                    }))
                }
            };
            // Blank lines and comments carry no request; they are neither records nor errors.
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            return Some(
                parse_line(text, &mut self.sticky)
                    .map(|r| (self.line, r))
                    .map_err(|msg| TraceError::Parse {
                        line: self.line,
                        msg,
                    }),
            );
        }
    }
}

/// Whether `sectors` starting at `lba` are 4 KiB aligned (for statistics).
pub fn is_aligned(lba: u64, sectors: u32) -> bool {
    lba % SECTORS_PER_BLOCK == 0 && sectors as u64 % SECTORS_PER_BLOCK == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_mail_line() {
        let mut s = DigestUnit::Block;
        let r = parse_line(
            "89966527996712 4253 nfsd 508516680 8 W 6 0 b5e9f4e5ab62a4fff5313a606b0ad4e3",
            &mut s,
        )
        .unwrap();
        assert_eq!(r.ts, 89966527996712);
        assert_eq!(r.pid, 4253);
        assert_eq!(r.process, "nfsd");
        assert_eq!(r.lba, 508516680);
        assert_eq!(r.sectors, 8);
        assert_eq!(r.op, Op::Write);
        assert_eq!((r.major, r.minor), (6, 0));
        assert_eq!(r.unit, DigestUnit::Block);
        assert_eq!(r.digests[0][0], 0xb5);
        assert_eq!(r.digests[0][15], 0xe3);
    }

    #[test]
    fn detects_sector_digests_and_round_trips() {
        let hex: String = (0..8).map(|i| format!("{:032x}", i + 1)).collect();
        let line = format!("5 7 my proc 16 8 R 8 16 {hex}");
        let mut s = DigestUnit::Block;
        let r = parse_line(&line, &mut s).unwrap();
        assert_eq!(r.unit, DigestUnit::Sector);
        assert_eq!(r.digests.len(), 8);
        assert_eq!(r.process, "my proc");
        assert_eq!(format_line(&r), line);
        // A 1-sector line now inherits the sector variant.
        let r1 = parse_line(&format!("6 7 p 3 1 W 8 16 {:032x}", 9), &mut s).unwrap();
        assert_eq!(r1.unit, DigestUnit::Sector);
    }

    #[test]
    fn rejects_bad_lines() {
        let mut s = DigestUnit::Block;
        for bad in [
            "",
            "1 2 p 3 8 W 6 0",
            "x 2 p 3 8 W 6 0 b5e9f4e5ab62a4fff5313a606b0ad4e3",
            "1 2 p 3 8 Q 6 0 b5e9f4e5ab62a4fff5313a606b0ad4e3",
            "1 2 p 3 0 W 6 0 b5e9f4e5ab62a4fff5313a606b0ad4e3",
            "1 2 p 3 8 W 6 0 b5e9f4e5ab62a4fff5313a606b0ad4e",
            "1 2 p 3 8 W 6 0 z5e9f4e5ab62a4fff5313a606b0ad4e3",
            "1 2 p 3 16 W 6 0 b5e9f4e5ab62a4fff5313a606b0ad4e3b5e9f4e5ab62a4fff5313a606b0ad4e3b5e9f4e5ab62a4fff5313a606b0ad4e3",
        ] {
            assert!(parse_line(bad, &mut s).is_err(), "accepted {bad:?}");
        }
    }
}
