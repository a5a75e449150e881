//! The logging disk's log read back (its format: `src/logdisk.rs`), and disk states rebuilt
//! from it.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// One record of the logging disk's log (its format: `src/logdisk.rs`).
pub enum Record {
    /// Bytes written at an offset.
    Write(u64, Vec<u8>),
    /// A range (offset, length) zeroed.
    Zero(u64, u64),
    /// An fsync of the disk.
    Flush,
    /// A label written to `mark`.
    Mark(String),
}

/// The records of a log, in order.
pub fn parse_log(bytes: &[u8]) -> Vec<Record> {
    let mut out = Vec::new();
    let mut i = 0;
    // A record cut short (the logging disk died mid-append) is named, not a bare index panic.
    let take = |at: usize, n: usize| -> &[u8] {
        bytes
            .get(at..at + n)
            .unwrap_or_else(|| panic!("the log ends inside a record at byte {at} ({n} bytes)"))
    };
    let u64_at = |i: usize| u64::from_le_bytes(take(i, 8).try_into().unwrap());
    let u32_at = |i: usize| u32::from_le_bytes(take(i, 4).try_into().unwrap()) as usize;
    while i < bytes.len() {
        let tag = bytes[i];
        i += 1;
        match tag {
            b'W' => {
                let (off, len) = (u64_at(i), u32_at(i + 8));
                out.push(Record::Write(off, take(i + 12, len).to_vec()));
                i += 12 + len;
            }
            b'Z' => {
                out.push(Record::Zero(u64_at(i), u64_at(i + 8)));
                i += 16;
            }
            b'F' => out.push(Record::Flush),
            b'M' => {
                let len = u32_at(i);
                let text = String::from_utf8(take(i + 4, len).to_vec()).unwrap();
                out.push(Record::Mark(text));
                i += 4 + len;
            }
            t => panic!("log record tag {t} at byte {}", i - 1),
        }
    }
    out
}

/// The disk as the log rebuilds it: its bytes, and which 64 KiB pieces were ever written.
pub struct Disk {
    /// The whole disk.
    bytes: Vec<u8>,
    /// Indexes of the `PIECE`-sized pieces written at least once.
    written: BTreeSet<usize>,
}

const PIECE: usize = 64 << 10;

impl Disk {
    /// A disk of `len` zero bytes.
    pub fn new(len: usize) -> Disk {
        Disk {
            bytes: vec![0; len],
            written: BTreeSet::new(),
        }
    }

    /// Apply a write or zeroed range of the log.
    pub fn apply(&mut self, r: &Record) {
        let (off, len) = match r {
            Record::Write(off, data) => {
                let off = *off as usize;
                self.bytes[off..off + data.len()].copy_from_slice(data);
                (off, data.len())
            }
            Record::Zero(off, len) => {
                let (off, len) = (*off as usize, *len as usize);
                self.bytes[off..off + len].fill(0);
                (off, len)
            }
            Record::Flush | Record::Mark(_) => return,
        };
        self.written
            .extend(off / PIECE..(off + len).div_ceil(PIECE));
    }

    /// Write the disk to a new sparse file at `path` (the pieces ever written).
    pub fn save(&self, path: &Path) -> fs::File {
        let _ = fs::remove_file(path);
        let f = fs::File::create(path).unwrap();
        f.set_len(self.bytes.len() as u64).unwrap();
        for &i in &self.written {
            let end = ((i + 1) * PIECE).min(self.bytes.len());
            f.write_all_at(&self.bytes[i * PIECE..end], (i * PIECE) as u64)
                .unwrap();
        }
        f
    }
}

/// Apply a write or zeroed range of the log to a saved disk.
pub fn apply_to_file(f: &fs::File, r: &Record) {
    match r {
        Record::Write(off, data) => f.write_all_at(data, *off).unwrap(),
        Record::Zero(off, len) => {
            // In pieces: a discard may span the whole disk.
            let zeros = [0u8; PIECE];
            let (mut at, end) = (*off, off + len);
            while at < end {
                let n = (end - at).min(PIECE as u64) as usize;
                f.write_all_at(&zeros[..n], at).unwrap();
                at += n as u64;
            }
        }
        Record::Flush | Record::Mark(_) => {}
    }
}
