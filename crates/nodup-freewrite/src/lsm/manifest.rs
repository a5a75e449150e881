//! The MANIFEST of the LSM store: the tables of each level, the write-ahead log in use, the
//! next file number and the compaction pointers. Small; rewritten whole and atomically
//! (write `MANIFEST.tmp`, fsync, rename) at every flush and compaction: the commit point.

use super::table::TableMeta;
use crate::error::{Error, Result};
use nodup_core::codec::{le_u32, le_u64, put_u32};
use std::path::Path;

// MANIFEST layout, little-endian:
//
// | offset | size | field                              |
// |--------|------|------------------------------------|
// | 0      | 8    | magic b"NDFWMAN\0"                 |
// | 8      | 4    | version (1)                        |
// | 12     | 4    | body length                        |
// | 16     | 4    | crc32c of the body                 |
// | 20     | 4    | crc32c of bytes 0..20              |
// | 24     | ...  | body                               |
//
// Body: next_file u64, wal u64, level count u32, then per level: compaction pointer
// (u16 length + key), table count u32, per table: number u64, file_size u64, data_bytes u64,
// bubble_bytes u64, smallest (u16 length + key), largest (u16 length + key).
const MAGIC: &[u8; 8] = b"NDFWMAN\0";
const VERSION: u32 = 1;
const HEADER: usize = 24;
/// File name of the manifest.
pub const MANIFEST: &str = "MANIFEST";

/// The state the manifest holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Next unused file number.
    pub next_file: u64,
    /// Number of the write-ahead log in use (older ones are obsolete).
    pub wal: u64,
    /// Per level: tables (level 0 oldest first, others by key).
    pub levels: Vec<Vec<TableMeta>>,
    /// Per level: largest key of the last compaction out of it (round-robin picking).
    pub pointers: Vec<Vec<u8>>,
}

fn put_key(b: &mut Vec<u8>, k: &[u8]) {
    b.extend_from_slice(&(k.len() as u16).to_le_bytes());
    b.extend_from_slice(k);
}

impl Manifest {
    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&self.next_file.to_le_bytes());
        body.extend_from_slice(&self.wal.to_le_bytes());
        body.extend_from_slice(&(self.levels.len() as u32).to_le_bytes());
        for (l, tables) in self.levels.iter().enumerate() {
            put_key(&mut body, self.pointers.get(l).map_or(&[][..], |p| p));
            body.extend_from_slice(&(tables.len() as u32).to_le_bytes());
            for t in tables {
                for v in [t.number, t.file_size, t.data_bytes, t.bubble_bytes] {
                    body.extend_from_slice(&v.to_le_bytes());
                }
                put_key(&mut body, &t.smallest);
                put_key(&mut body, &t.largest);
            }
        }
        let mut out = vec![0u8; HEADER];
        out[..8].copy_from_slice(MAGIC);
        put_u32(&mut out, 8, VERSION);
        put_u32(&mut out, 12, body.len() as u32);
        put_u32(&mut out, 16, crc32c::crc32c(&body));
        let crc = crc32c::crc32c(&out[..20]);
        put_u32(&mut out, 20, crc);
        out.extend_from_slice(&body);
        out
    }

    /// Read and check `dir/MANIFEST`; `None` when there is none (a new store).
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(MANIFEST);
        let b = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
        };
        let bad = |m: &str| Error::corrupt(&path, m.to_string());
        if b.len() < HEADER || &b[..8] != MAGIC || crc32c::crc32c(&b[..20]) != le_u32(&b, 20) {
            return Err(bad("bad manifest header (magic or crc)"));
        }
        if le_u32(&b, 8) != VERSION {
            return Err(bad("unsupported manifest version"));
        }
        let body = &b[HEADER..];
        if body.len() != le_u32(&b, 12) as usize || crc32c::crc32c(body) != le_u32(&b, 16) {
            return Err(bad("manifest body length or checksum mismatch"));
        }
        let mut c = Cursor { b: body, p: 0 };
        let short = || bad("manifest body cut short");
        let mut m = Manifest {
            next_file: c.u64().ok_or_else(short)?,
            wal: c.u64().ok_or_else(short)?,
            ..Manifest::default()
        };
        let nlevels = c.u32().ok_or_else(short)? as usize;
        if nlevels > 64 {
            return Err(bad("too many levels"));
        }
        for _ in 0..nlevels {
            m.pointers.push(c.key().ok_or_else(short)?);
            let n = c.u32().ok_or_else(short)? as usize;
            let mut tables = Vec::new();
            for _ in 0..n {
                tables.push(TableMeta {
                    number: c.u64().ok_or_else(short)?,
                    file_size: c.u64().ok_or_else(short)?,
                    data_bytes: c.u64().ok_or_else(short)?,
                    bubble_bytes: c.u64().ok_or_else(short)?,
                    smallest: c.key().ok_or_else(short)?,
                    largest: c.key().ok_or_else(short)?,
                });
            }
            m.levels.push(tables);
        }
        if c.p != body.len() {
            return Err(bad("trailing bytes after the manifest body"));
        }
        Ok(Some(m))
    }

    /// Write it atomically into `dir`; returns the bytes written.
    pub fn store(&self, dir: &Path) -> Result<u64> {
        let b = self.encode();
        crate::fsutil::replace_file(dir, MANIFEST, &b)?;
        Ok(b.len() as u64)
    }
}

/// Bounds-checked reader of the body.
struct Cursor<'a> {
    b: &'a [u8],
    p: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.b.get(self.p..self.p.checked_add(n)?)?;
        self.p += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|s| le_u32(s, 0))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|s| le_u64(s, 0))
    }
    fn key(&mut self) -> Option<Vec<u8>> {
        let n = self.take(2).map(|s| u16::from_le_bytes([s[0], s[1]]))? as usize;
        self.take(n).map(<[u8]>::to_vec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_flip_is_caught() {
        let m = Manifest {
            next_file: 9,
            wal: 7,
            levels: vec![
                vec![TableMeta {
                    number: 3,
                    file_size: 100,
                    data_bytes: 80,
                    bubble_bytes: 4,
                    smallest: b"a".to_vec(),
                    largest: b"k".to_vec(),
                }],
                vec![],
            ],
            pointers: vec![b"k".to_vec(), vec![]],
        };
        let dir = tempfile::tempdir().unwrap();
        m.store(dir.path()).unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), Some(m.clone()));
        let b = m.encode();
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 1;
            std::fs::write(dir.path().join(MANIFEST), &c).unwrap();
            assert!(Manifest::load(dir.path()).is_err(), "flip at {i} accepted");
        }
    }
}
