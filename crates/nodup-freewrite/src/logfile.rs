//! Append-only record files (the FAWN data log and the LSM write-ahead log): a checked header,
//! then records. Appends are buffered and written in whole blocks, so the file system below
//! never has to read-modify-write a block in the middle of a log; [`BlockWriter::sync`] also
//! writes the partial last block and fsyncs. Reading stops at the first record that is short or
//! fails its checksum: the tail torn by a crash, which no acknowledged write reached.

use crate::error::{Error, IoContext, Result};
use crate::fsutil::read_exact_at;
use crate::record::{decode, Decoded, Entry};
use nodup_core::codec::{le_u32, le_u64, put_u32, put_u64};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

// Log file header, `LOG_HEADER` = 32 bytes at offset 0; records follow it:
//
// | offset | size | field                                                  |
// |--------|------|--------------------------------------------------------|
// | 0      | 8    | magic b"NDFWLOG\0"                                     |
// | 8      | 4    | version (1)                                            |
// | 12     | 4    | kind: 1 FAWN data log, 2 LSM write-ahead log           |
// | 16     | 8    | number: a data log's generation, a WAL's file number   |
// | 24     | 4    | reserved, 0                                            |
// | 28     | 4    | crc32c of bytes 0..28                                  |
const MAGIC: &[u8; 8] = b"NDFWLOG\0";
const VERSION: u32 = 1;
const O_VERSION: usize = 8;
const O_KIND: usize = 12;
const O_NUMBER: usize = 16;
const O_RESERVED: usize = 24;
const O_CRC: usize = 28;

/// Bytes of the log header.
pub const LOG_HEADER: usize = 32;
/// Block size the writer keeps its writes aligned to.
pub const WRITE_BLOCK: u64 = 4096;
/// Buffered bytes that trigger a write of the whole blocks among them.
const FLUSH_AT: usize = 1 << 20;

/// What a log file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogKind {
    /// The data log of the FAWN store.
    Data = 1,
    /// A write-ahead log of the LSM store.
    Wal = 2,
}

/// The decoded header of a log file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogHeader {
    /// What the log holds.
    pub kind: LogKind,
    /// Generation (data log) or file number (WAL).
    pub number: u64,
}

impl LogHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; LOG_HEADER] {
        let mut b = [0u8; LOG_HEADER];
        b[..8].copy_from_slice(MAGIC);
        put_u32(&mut b, O_VERSION, VERSION);
        put_u32(&mut b, O_KIND, self.kind as u32);
        put_u64(&mut b, O_NUMBER, self.number);
        put_u32(&mut b, O_RESERVED, 0);
        let crc = crc32c::crc32c(&b[..O_CRC]);
        put_u32(&mut b, O_CRC, crc);
        b
    }

    /// Check and decode the first `LOG_HEADER` bytes of `path`.
    pub fn decode(path: &Path, b: &[u8]) -> Result<Self> {
        if b.len() < LOG_HEADER || &b[..8] != MAGIC {
            return Err(Error::corrupt(
                path,
                "not a nodup-freewrite log (bad magic)",
            ));
        }
        if crc32c::crc32c(&b[..O_CRC]) != le_u32(b, O_CRC) {
            return Err(Error::corrupt(path, "log header checksum mismatch"));
        }
        let version = le_u32(b, O_VERSION);
        if version != VERSION {
            return Err(Error::corrupt(
                path,
                format!("log version {version}, this build reads {VERSION}"),
            ));
        }
        let kind = match le_u32(b, O_KIND) {
            1 => LogKind::Data,
            2 => LogKind::Wal,
            k => return Err(Error::corrupt(path, format!("unknown log kind {k}"))),
        };
        Ok(LogHeader {
            kind,
            number: le_u64(b, O_NUMBER),
        })
    }
}

/// Buffered appender that writes only whole blocks until asked to sync.
pub struct BlockWriter {
    file: File,
    path: PathBuf,
    /// File offset of `buf[0]`; always a multiple of `WRITE_BLOCK`.
    base: u64,
    buf: Vec<u8>,
    /// Leading bytes of `buf` already written to the file.
    written: usize,
    bytes_written: u64,
}

impl BlockWriter {
    /// Append to `file` from offset `end`; the bytes of the partial block before `end` are
    /// read back so that every later write starts on a block boundary.
    pub fn new(file: File, path: PathBuf, end: u64) -> Result<Self> {
        let base = end / WRITE_BLOCK * WRITE_BLOCK;
        let buf = read_exact_at(&file, &path, base, (end - base) as usize)?;
        let written = buf.len();
        Ok(BlockWriter {
            file,
            path,
            base,
            buf,
            written,
            bytes_written: 0,
        })
    }

    /// Create `path` (which must not exist) holding `header`. The file appears with its header
    /// durable or not at all: it is written as `path.tmp`, fsynced and renamed (a crash leaves
    /// at most a `.tmp` file, which the stores remove on open).
    pub fn create(path: PathBuf, header: &LogHeader) -> Result<Self> {
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        crate::fsutil::remove(&tmp)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .ctx(|| format!("create {}", tmp.display()))?;
        let mut w = BlockWriter::new(file, tmp.clone(), 0)?;
        w.append(&header.encode())?;
        w.sync()?;
        if path.exists() {
            return Err(Error::io(
                format!("create {}", path.display()),
                std::io::ErrorKind::AlreadyExists.into(),
            ));
        }
        std::fs::rename(&tmp, &path)
            .ctx(|| format!("rename {} to {}", tmp.display(), path.display()))?;
        if let Some(dir) = path.parent() {
            crate::fsutil::sync_dir(dir)?;
        }
        w.renamed(path);
        Ok(w)
    }

    /// Offset where the next append goes.
    pub fn end(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file was renamed to `path`.
    pub fn renamed(&mut self, path: PathBuf) {
        self.path = path;
    }

    /// The open file (for positional reads of what was written).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Write everything appended, without fsync (so that a reader of the file sees it all).
    pub fn flush(&mut self) -> Result<()> {
        self.write_out(self.buf.len())
    }

    /// Bytes handed to the file system so far (tails written by a sync and rewritten later
    /// count twice, as they are written twice).
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Append `data`; returns its offset.
    pub fn append(&mut self, data: &[u8]) -> Result<u64> {
        let off = self.end();
        self.buf.extend_from_slice(data);
        if self.buf.len() >= FLUSH_AT {
            let whole = self.buf.len() / WRITE_BLOCK as usize * WRITE_BLOCK as usize;
            self.write_out(whole)?;
            self.buf.drain(..whole);
            self.base += whole as u64;
            self.written = self.written.saturating_sub(whole);
        }
        Ok(off)
    }

    /// Write `buf[..upto]` (re-writing an already written partial tail with it).
    fn write_out(&mut self, upto: usize) -> Result<()> {
        if upto == 0 || upto <= self.written {
            return Ok(());
        }
        // Start at the block holding the first unwritten byte, so the write stays aligned.
        let from = self.written / WRITE_BLOCK as usize * WRITE_BLOCK as usize;
        self.file
            .write_all_at(&self.buf[from..upto], self.base + from as u64)
            .ctx(|| format!("write {}", self.path.display()))?;
        self.bytes_written += (upto - from) as u64;
        self.written = self.written.max(upto);
        Ok(())
    }

    /// Write everything appended and fsync: what was appended before is then durable.
    pub fn sync(&mut self) -> Result<()> {
        self.write_out(self.buf.len())?;
        self.file
            .sync_data()
            .ctx(|| format!("fsync {}", self.path.display()))?;
        let whole = self.buf.len() / WRITE_BLOCK as usize * WRITE_BLOCK as usize;
        self.buf.drain(..whole);
        self.base += whole as u64;
        self.written = self.buf.len();
        Ok(())
    }

    /// `len` bytes at `off`, from the file or from the buffer of bytes not yet written.
    pub fn read_at(&self, off: u64, len: usize) -> Result<Vec<u8>> {
        let end = off + len as u64;
        if end > self.end() {
            return Err(Error::corrupt(
                &self.path,
                format!("read of {len} bytes at {off} past the end {}", self.end()),
            ));
        }
        if off >= self.base {
            let s = (off - self.base) as usize;
            return Ok(self.buf[s..s + len].to_vec());
        }
        let on_file = (self.base.min(end) - off) as usize;
        let mut out = read_exact_at(&self.file, &self.path, off, on_file)?;
        out.extend_from_slice(&self.buf[..len - on_file]);
        Ok(out)
    }
}

/// How a log scan ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEnd {
    /// The header.
    pub header: LogHeader,
    /// Offset just past the last valid record.
    pub valid_end: u64,
    /// Length of the file (beyond `valid_end`: a torn tail).
    pub file_len: u64,
}

impl LogEnd {
    /// Refuse a log that cannot be read to `end` (the end its writer knows it synced).
    pub fn expect_end(&self, path: &Path, end: u64) -> Result<()> {
        if self.valid_end != end {
            return Err(Error::corrupt(
                path,
                format!("log readable to {} of {end}", self.valid_end),
            ));
        }
        Ok(())
    }
}

/// Read the log at `path` from its header on, calling `f(offset, record bytes, entry)` for each
/// valid record up to the first that is short or does not decode; the log must be of `kind`.
pub fn scan_log(
    path: &Path,
    file: &File,
    kind: LogKind,
    mut f: impl FnMut(u64, &[u8], Entry<'_>) -> Result<()>,
) -> Result<LogEnd> {
    let file_len = file
        .metadata()
        .ctx(|| format!("stat {}", path.display()))?
        .len();
    if file_len < LOG_HEADER as u64 {
        return Err(Error::corrupt(path, "shorter than a log header"));
    }
    let header = LogHeader::decode(path, &read_exact_at(file, path, 0, LOG_HEADER)?)?;
    if header.kind != kind {
        return Err(Error::corrupt(
            path,
            format!("a {:?} log, not {kind:?}", header.kind),
        ));
    }
    const CHUNK: usize = 4 << 20;
    let mut buf: Vec<u8> = Vec::with_capacity(CHUNK);
    let mut buf_off = LOG_HEADER as u64; // file offset of buf[0]
    let mut read_to = LOG_HEADER as u64; // file offset just past buf's last byte
    let mut pos = 0usize;
    loop {
        match decode(&buf[pos..]) {
            Decoded::Record { entry, len } => {
                f(buf_off + pos as u64, &buf[pos..pos + len], entry)?;
                pos += len;
            }
            Decoded::Short if read_to < file_len => {
                buf.drain(..pos);
                buf_off += pos as u64;
                pos = 0;
                let n = (file_len - read_to).min(CHUNK as u64) as usize;
                let start = buf.len();
                buf.resize(start + n, 0);
                file.read_exact_at(&mut buf[start..], read_to)
                    .ctx(|| format!("read {}", path.display()))?;
                read_to += n as u64;
            }
            Decoded::Short | Decoded::Bad(_) => {
                return Ok(LogEnd {
                    header,
                    valid_end: buf_off + pos as u64,
                    file_len,
                })
            }
        }
    }
}
