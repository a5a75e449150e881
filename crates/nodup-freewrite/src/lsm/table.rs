//! SSTables of the LSM store: sorted records (the record format, bubbles allowed between them),
//! a sparse index and a footer. Written once, whole, then fsynced; validated on open.

use crate::error::{Error, IoContext, Result};
use crate::fsutil::read_exact_at;
use crate::record::{self, records, Entry};
use nodup_core::codec::{le_u32, le_u64, put_u32, put_u64};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

// SSTable layout; every integer little-endian:
//
// | offset     | size         | content                                                   |
// |------------|--------------|-----------------------------------------------------------|
// | 0          | 16           | header: magic b"NDFWSST\0", version u32, crc32c of 0..12  |
// | 16         | data_end-16  | records in key order; bubbles (empty-key records) between |
// | data_end   | index_len    | index: per entry offset u64, key length u16, key          |
// | end - 48   | 48           | footer, below                                             |
//
// The index has one entry for the first record that starts in each 4 KiB block of the file,
// so a lookup reads about one block. Footer fields, at offsets within the footer:
// 0 data_end u64 (= index offset), 8 index_len u64, 16 records u64 (bubbles not counted),
// 24 data_bytes u64 (bytes of those records: the compact size), 32 bubble_bytes u64,
// 40 crc32c of the index u32, 44 crc32c of footer bytes 0..44 u32; then the 8-byte magic.
const MAGIC: &[u8; 8] = b"NDFWSST\0";
const VERSION: u32 = 1;
/// Bytes of the table header: data starts here.
pub const TABLE_HEADER: usize = 16;
const FOOTER: usize = 56;
const F_DATA_END: usize = 0;
const F_INDEX_LEN: usize = 8;
const F_RECORDS: usize = 16;
const F_DATA_BYTES: usize = 24;
const F_BUBBLES: usize = 32;
const F_INDEX_CRC: usize = 40;
const F_CRC: usize = 44;
const F_MAGIC: usize = 48;
const INDEX_BLOCK: u64 = 4096;

/// What the manifest records of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableMeta {
    /// File number (`<number>.sst`).
    pub number: u64,
    /// Bytes of the file.
    pub file_size: u64,
    /// Bytes of its records, bubbles excluded (the size it would have without freewrite).
    pub data_bytes: u64,
    /// Bytes of its bubbles.
    pub bubble_bytes: u64,
    /// Smallest key.
    pub smallest: Vec<u8>,
    /// Largest key.
    pub largest: Vec<u8>,
}

/// File name of table `number`.
pub fn table_name(number: u64) -> String {
    format!("{number:016x}.sst")
}

/// Builds a table in memory from records given in key order.
pub struct TableBuilder {
    buf: Vec<u8>,
    index: Vec<u8>,
    last_block: Option<u64>,
    records: u64,
    data_bytes: u64,
    bubble_bytes: u64,
    smallest: Vec<u8>,
    largest: Vec<u8>,
}

impl Default for TableBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl TableBuilder {
    /// An empty table.
    pub fn new() -> Self {
        let mut buf = Vec::with_capacity(2 << 20);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&VERSION.to_le_bytes());
        let crc = crc32c::crc32c(&buf[..12]);
        buf.extend_from_slice(&crc.to_le_bytes());
        TableBuilder {
            buf,
            index: Vec::new(),
            last_block: None,
            records: 0,
            data_bytes: 0,
            bubble_bytes: 0,
            smallest: Vec::new(),
            largest: Vec::new(),
        }
    }

    /// Offset where the next record goes.
    pub fn offset(&self) -> u64 {
        self.buf.len() as u64
    }

    /// Add a bubble of `len` bytes.
    pub fn bubble(&mut self, len: u64) {
        record::encode_bubble(&mut self.buf, len as usize);
        self.bubble_bytes += len;
    }

    /// Add an encoded record (`raw`) holding `key`, larger than every key added before.
    pub fn add(&mut self, key: &[u8], raw: &[u8]) {
        let off = self.offset();
        let block = off / INDEX_BLOCK;
        if self.last_block != Some(block) {
            self.last_block = Some(block);
            self.index.extend_from_slice(&off.to_le_bytes());
            self.index
                .extend_from_slice(&(key.len() as u16).to_le_bytes());
            self.index.extend_from_slice(key);
        }
        if self.records == 0 {
            self.smallest = key.to_vec();
        }
        self.largest = key.to_vec();
        self.records += 1;
        self.data_bytes += raw.len() as u64;
        self.buf.extend_from_slice(raw);
    }

    /// Records added.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Bytes of records added (bubbles excluded).
    pub fn data_bytes(&self) -> u64 {
        self.data_bytes
    }

    /// Write the table to `path` (a new file) and fsync it; its manifest entry.
    pub fn finish(mut self, path: &Path, number: u64) -> Result<TableMeta> {
        let data_end = self.buf.len() as u64;
        self.buf.extend_from_slice(&self.index);
        let mut f = [0u8; FOOTER];
        put_u64(&mut f, F_DATA_END, data_end);
        put_u64(&mut f, F_INDEX_LEN, self.index.len() as u64);
        put_u64(&mut f, F_RECORDS, self.records);
        put_u64(&mut f, F_DATA_BYTES, self.data_bytes);
        put_u64(&mut f, F_BUBBLES, self.bubble_bytes);
        put_u32(&mut f, F_INDEX_CRC, crc32c::crc32c(&self.index));
        let crc = crc32c::crc32c(&f[..F_CRC]);
        put_u32(&mut f, F_CRC, crc);
        f[F_MAGIC..].copy_from_slice(MAGIC);
        self.buf.extend_from_slice(&f);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .ctx(|| format!("create {}", path.display()))?;
        file.write_all(&self.buf)
            .and_then(|()| file.sync_all())
            .ctx(|| format!("write {}", path.display()))?;
        Ok(TableMeta {
            number,
            file_size: self.buf.len() as u64,
            data_bytes: self.data_bytes,
            bubble_bytes: self.bubble_bytes,
            smallest: self.smallest,
            largest: self.largest,
        })
    }
}

/// One record read from a table's data.
#[derive(Debug, Clone)]
pub struct TableRecord {
    /// Offset in the file.
    pub off: u64,
    /// Range of the encoded record in the data buffer it was read into.
    pub range: std::ops::Range<usize>,
    /// Range of the key in that buffer.
    pub key: std::ops::Range<usize>,
    /// A DELETE marker.
    pub delete: bool,
}

/// What a table says about a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The key's value.
    Value(Vec<u8>),
    /// The key was deleted.
    Deleted,
    /// The table does not hold the key.
    Absent,
}

/// An open, validated table.
#[derive(Debug)]
pub struct Table {
    /// Its manifest entry.
    pub meta: TableMeta,
    path: PathBuf,
    file: File,
    data_end: u64,
    index: Vec<(Vec<u8>, u64)>,
}

impl Table {
    /// Open `dir/<number>.sst` and check it against its manifest entry.
    pub fn open(dir: &Path, meta: TableMeta) -> Result<Self> {
        Self::open_at(dir.join(table_name(meta.number)), Some(meta))
    }

    /// Open a table file on its own, without a manifest (its entry is taken from the file;
    /// the largest key is left empty).
    pub fn open_file(path: &Path) -> Result<Self> {
        Self::open_at(path.to_path_buf(), None)
    }

    fn open_at(path: PathBuf, expect: Option<TableMeta>) -> Result<Self> {
        let file = File::open(&path).ctx(|| format!("open {}", path.display()))?;
        let len = file
            .metadata()
            .ctx(|| format!("stat {}", path.display()))?
            .len();
        if len < (TABLE_HEADER + FOOTER) as u64
            || expect.as_ref().is_some_and(|m| m.file_size != len)
        {
            return Err(Error::corrupt(
                &path,
                format!("{len} bytes: too short, or not what the manifest says"),
            ));
        }
        let head = read_exact_at(&file, &path, 0, TABLE_HEADER)?;
        if &head[..8] != MAGIC
            || le_u32(&head, 8) != VERSION
            || crc32c::crc32c(&head[..12]) != le_u32(&head, 12)
        {
            return Err(Error::corrupt(
                &path,
                "bad table header (magic, version or crc)",
            ));
        }
        let f = read_exact_at(&file, &path, len - FOOTER as u64, FOOTER)?;
        if &f[F_MAGIC..] != MAGIC || crc32c::crc32c(&f[..F_CRC]) != le_u32(&f, F_CRC) {
            return Err(Error::corrupt(&path, "bad table footer (magic or crc)"));
        }
        let data_end = le_u64(&f, F_DATA_END);
        let index_len = le_u64(&f, F_INDEX_LEN);
        let fits = data_end >= TABLE_HEADER as u64
            && data_end
                .checked_add(index_len)
                .and_then(|x| x.checked_add(FOOTER as u64))
                == Some(len);
        let data_bytes = le_u64(&f, F_DATA_BYTES);
        let bubble_bytes = le_u64(&f, F_BUBBLES);
        let agrees = expect
            .as_ref()
            .is_none_or(|m| m.data_bytes == data_bytes && m.bubble_bytes == bubble_bytes);
        if !fits || !agrees || data_bytes + bubble_bytes != data_end - TABLE_HEADER as u64 {
            return Err(Error::corrupt(
                &path,
                "footer does not match the file or manifest",
            ));
        }
        let raw = read_exact_at(&file, &path, data_end, index_len as usize)?;
        if crc32c::crc32c(&raw) != le_u32(&f, F_INDEX_CRC) {
            return Err(Error::corrupt(&path, "index checksum mismatch"));
        }
        let index = parse_index(&path, &raw, data_end)?;
        let meta = match expect {
            Some(m) => m,
            None => TableMeta {
                number: 0,
                file_size: len,
                data_bytes,
                bubble_bytes,
                smallest: index.first().map(|e| e.0.clone()).unwrap_or_default(),
                largest: Vec::new(),
            },
        };
        Ok(Table {
            meta,
            path,
            file,
            data_end,
            index,
        })
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read the data area: the buffer and its records (bubbles skipped), in key order.
    pub fn read_all(&self) -> Result<(Vec<u8>, Vec<TableRecord>)> {
        let start = TABLE_HEADER as u64;
        let buf = read_exact_at(
            &self.file,
            &self.path,
            start,
            (self.data_end - start) as usize,
        )?;
        let mut out = Vec::new();
        let mut last: Option<std::ops::Range<usize>> = None;
        for r in records(&buf, start) {
            let (off, len, entry) = r.map_err(|b| {
                Error::corrupt(&self.path, format!("record at {}: {}", b.offset, b.msg))
            })?;
            let (key, delete) = match entry {
                Entry::Put { key, .. } => (key, false),
                Entry::Delete { key } => (key, true),
                Entry::Bubble => continue,
            };
            let at = (off - start) as usize;
            let kr = at + record::HEADER..at + record::HEADER + key.len();
            if last.as_ref().is_some_and(|l| buf[l.clone()] >= *key) {
                return Err(Error::corrupt(
                    &self.path,
                    format!("keys out of order at {off}"),
                ));
            }
            last = Some(kr.clone());
            out.push(TableRecord {
                off,
                range: at..at + len,
                key: kr,
                delete,
            });
        }
        Ok((buf, out))
    }

    /// What the table holds for `key`.
    pub fn get(&self, key: &[u8]) -> Result<Lookup> {
        let i = self.index.partition_point(|(k, _)| k.as_slice() <= key);
        if i == 0 {
            return Ok(Lookup::Absent);
        }
        let from = self.index[i - 1].1;
        let to = self.index.get(i).map_or(self.data_end, |e| e.1);
        let buf = read_exact_at(&self.file, &self.path, from, (to - from) as usize)?;
        for r in records(&buf, from) {
            let (_, _, entry) = r.map_err(|b| {
                Error::corrupt(&self.path, format!("record at {}: {}", b.offset, b.msg))
            })?;
            match entry {
                Entry::Put { key: k, value } if k == key => {
                    return Ok(Lookup::Value(value.to_vec()))
                }
                Entry::Delete { key: k } if k == key => return Ok(Lookup::Deleted),
                e if e.key().is_some_and(|k| k > key) => break,
                _ => {}
            }
        }
        Ok(Lookup::Absent)
    }
}

/// Decode and check the index: offsets inside the data, increasing; keys increasing.
fn parse_index(path: &Path, raw: &[u8], data_end: u64) -> Result<Vec<(Vec<u8>, u64)>> {
    let mut out: Vec<(Vec<u8>, u64)> = Vec::new();
    let mut p = 0usize;
    while p < raw.len() {
        if raw.len() - p < 10 {
            return Err(Error::corrupt(path, "index entry cut short"));
        }
        let off = le_u64(raw, p);
        let klen = u16::from_le_bytes([raw[p + 8], raw[p + 9]]) as usize;
        p += 10;
        if raw.len() - p < klen || klen == 0 {
            return Err(Error::corrupt(path, "index key cut short or empty"));
        }
        let key = raw[p..p + klen].to_vec();
        p += klen;
        let ordered = out.last().is_none_or(|(k, o)| *k < key && *o < off);
        if !ordered || off < TABLE_HEADER as u64 || off >= data_end {
            return Err(Error::corrupt(
                path,
                format!("index entry at offset {off} out of order"),
            ));
        }
        out.push((key, off));
    }
    Ok(out)
}
