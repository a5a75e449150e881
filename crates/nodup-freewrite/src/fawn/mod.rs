//! A FAWN-like key-value store (Andersen et al., SOSP'09; Freewrite §3.2): one append-only data
//! log, an in-memory hash index rebuilt from the log on open, DELETE markers, and garbage
//! collection that copies the live records into a new log, with bubbles keeping unchanged runs
//! of the old log block aligned when freewrite is on.
//!
//! Files in the store directory: `LOCK`, and `log.<generation as 16 hex digits>` (a log file,
//! see [`crate::logfile`]). Garbage collection writes `log.<g+1>.tmp`, fsyncs it, renames it
//! to `log.<g+1>` (the commit point) and then removes `log.<g>`; open keeps the highest
//! generation and removes older logs and `.tmp` files.
//!
//! Durability: a put or delete is *acknowledged* when it returns with [`FawnOptions::sync`] set,
//! or once a later [`FawnStore::sync`] (or [`FawnStore::gc`]) returns. An acknowledged write
//! survives a crash (kill -9) at any point, including during garbage collection; writes not yet
//! acknowledged may be lost, never half-applied.

mod gc;
mod index;

pub use gc::GcReport;

use crate::error::{Error, IoContext, Result};
use crate::fsutil::{lock_dir, read_exact_at, remove, sync_dir};
use crate::logfile::{scan_log, BlockWriter, LogHeader, LogKind};
use crate::planner::{Caps, PlanStats};
use crate::record::{self, decode, Decoded, Entry};
use index::{key_hash, Index, Loc};
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// How a FAWN store runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct FawnOptions {
    /// Bubble caps when garbage collection uses freewrite; `None` writes the compact layout.
    pub freewrite: Option<Caps>,
    /// Fsync the log before each put or delete returns.
    pub sync: bool,
}

/// Counters of a FAWN store since it was opened.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FawnStats {
    /// Live keys.
    pub live_keys: u64,
    /// Encoded bytes of their records.
    pub live_bytes: u64,
    /// Bytes of the current log file.
    pub log_bytes: u64,
    /// Bytes of bubbles in the current log.
    pub bubble_space: u64,
    /// Puts and deletes since open.
    pub writes: u64,
    /// Garbage collections since open.
    pub gc_runs: u64,
    /// Bytes the store handed to the file system since open (log appends and GC output).
    pub app_bytes_written: u64,
    /// Bytes of bubbles written by garbage collection since open.
    pub bubble_bytes_written: u64,
    /// Torn tail dropped when the log was opened.
    pub torn_tail_bytes: u64,
    /// Planner counts of the garbage collections since open.
    pub plan: PlanStats,
}

/// Called with the name of each crash point a store passes (tests stop the process there).
pub type CrashHook = Box<dyn FnMut(&str) + Send>;

/// An open FAWN store.
pub struct FawnStore {
    dir: PathBuf,
    _lock: File,
    opts: FawnOptions,
    gen: u64,
    log: BlockWriter,
    index: Index,
    stats: FawnStats,
    /// Bytes written by log writers already closed (old logs).
    closed_bytes: u64,
    scratch: Vec<u8>,
    hook: Option<CrashHook>,
}

fn log_name(gen: u64) -> String {
    format!("log.{gen:016x}")
}

/// The generation of a `log.<g>` name (`None` for anything else, `.tmp` files included).
fn parse_log_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("log.")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// The live record of `key` among the index candidates, read with `read(off, len)`:
/// its location and value.
fn find(
    index: &Index,
    path: &Path,
    key: &[u8],
    h: u64,
    read: impl Fn(u64, usize) -> Result<Vec<u8>>,
) -> Result<Option<(Loc, Vec<u8>)>> {
    for &loc in index.candidates(h) {
        let bytes = read(loc.off, loc.len as usize)?;
        match decode(&bytes) {
            Decoded::Record {
                entry: Entry::Put { key: k, value },
                len,
            } if len == loc.len as usize => {
                if k == key {
                    return Ok(Some((loc, value.to_vec())));
                }
            }
            _ => {
                return Err(Error::corrupt(
                    path,
                    format!("indexed record at {} does not decode", loc.off),
                ))
            }
        }
    }
    Ok(None)
}

impl FawnStore {
    /// Open the store in `dir` (created when missing), rebuilding the index from the log.
    pub fn open(dir: &Path, opts: FawnOptions) -> Result<Self> {
        if let Some(c) = opts.freewrite {
            c.check()?;
        }
        let lock = lock_dir(dir)?;
        let mut gens = Vec::new();
        for e in std::fs::read_dir(dir).ctx(|| format!("list {}", dir.display()))? {
            let e = e.ctx(|| format!("list {}", dir.display()))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(g) = parse_log_name(&name) {
                gens.push(g);
            } else if name.starts_with("log.") && name.ends_with(".tmp") {
                // A garbage collection that did not reach its commit point.
                remove(&e.path())?;
            }
        }
        gens.sort_unstable();
        let mut stats = FawnStats::default();
        let Some(&gen) = gens.last() else {
            let path = dir.join(log_name(1));
            let log = BlockWriter::create(
                path,
                &LogHeader {
                    kind: LogKind::Data,
                    number: 1,
                },
            )?;
            stats.log_bytes = log.end();
            return Ok(FawnStore {
                dir: dir.to_path_buf(),
                _lock: lock,
                opts,
                gen: 1,
                closed_bytes: 0,
                log,
                index: Index::default(),
                stats,
                scratch: Vec::new(),
                hook: None,
            });
        };
        for &old in &gens[..gens.len() - 1] {
            // Left by a garbage collection that committed but had not removed its input.
            remove(&dir.join(log_name(old)))?;
        }
        if gens.len() > 1 {
            sync_dir(dir)?;
        }
        let path = dir.join(log_name(gen));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .ctx(|| format!("open {}", path.display()))?;
        let mut index = Index::default();
        let mut bubbles = 0u64;
        let end = scan_log(&path, &file, LogKind::Data, |off, raw, entry| {
            let read = |o, l| read_exact_at(&file, &path, o, l);
            match entry {
                Entry::Put { key, .. } => {
                    let h = key_hash(key);
                    let loc = Loc {
                        off,
                        len: raw.len() as u32,
                    };
                    match find(&index, &path, key, h, read)? {
                        Some((old, _)) => index.replace(h, old, loc),
                        None => index.add(h, loc),
                    }
                }
                Entry::Delete { key } => {
                    let h = key_hash(key);
                    if let Some((old, _)) = find(&index, &path, key, h, read)? {
                        index.remove(h, old);
                    }
                }
                Entry::Bubble => bubbles += raw.len() as u64,
            }
            Ok(())
        })?;
        if end.header.number != gen {
            return Err(Error::corrupt(
                &path,
                format!("header says generation {}", end.header.number),
            ));
        }
        if end.valid_end < end.file_len {
            // The torn tail of a crash: nothing acknowledged is in it (see the module doc).
            file.set_len(end.valid_end)
                .and_then(|()| file.sync_all())
                .ctx(|| format!("truncate the torn tail of {}", path.display()))?;
            stats.torn_tail_bytes = end.file_len - end.valid_end;
        }
        stats.bubble_space = bubbles;
        let log = BlockWriter::new(file, path, end.valid_end)?;
        Ok(FawnStore {
            dir: dir.to_path_buf(),
            _lock: lock,
            opts,
            gen,
            log,
            index,
            stats,
            closed_bytes: 0,
            scratch: Vec::new(),
            hook: None,
        })
    }

    /// Call `hook` at each crash point (tests kill the process there).
    pub fn set_crash_hook(&mut self, hook: CrashHook) {
        self.hook = Some(hook);
    }

    fn crash_point(&mut self, name: &str) {
        if let Some(h) = self.hook.as_mut() {
            h(name);
        }
    }

    fn lookup(&self, key: &[u8]) -> Result<Option<(Loc, Vec<u8>)>> {
        find(&self.index, self.log.path(), key, key_hash(key), |o, l| {
            self.log.read_at(o, l)
        })
    }

    /// Store `value` under `key` (acknowledged on return with `sync`, else at the next sync).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        record::check_key(key)?;
        record::check_value(value)?;
        let old = self.lookup(key)?;
        self.scratch.clear();
        record::encode_put(&mut self.scratch, key, value);
        let off = self.log.append(&self.scratch)?;
        let loc = Loc {
            off,
            len: self.scratch.len() as u32,
        };
        let h = key_hash(key);
        match old {
            Some((o, _)) => self.index.replace(h, o, loc),
            None => self.index.add(h, loc),
        }
        self.stats.writes += 1;
        if self.opts.sync {
            self.log.sync()?;
        }
        Ok(())
    }

    /// Delete `key` with a DELETE marker; false when it was not there (nothing written).
    pub fn delete(&mut self, key: &[u8]) -> Result<bool> {
        record::check_key(key)?;
        let Some((old, _)) = self.lookup(key)? else {
            return Ok(false);
        };
        self.scratch.clear();
        record::encode_delete(&mut self.scratch, key);
        self.log.append(&self.scratch)?;
        self.index.remove(key_hash(key), old);
        self.stats.writes += 1;
        if self.opts.sync {
            self.log.sync()?;
        }
        Ok(true)
    }

    /// The value of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        record::check_key(key)?;
        Ok(self.lookup(key)?.map(|(_, v)| v))
    }

    /// Live pairs with `from <= key < to` (`to` = `None`: no upper bound), sorted by key. FAWN
    /// is a hash store: this reads the whole log.
    pub fn scan(&mut self, from: &[u8], to: Option<&[u8]>) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.log.flush()?;
        let mut out = Vec::new();
        let index = &self.index;
        let end = scan_log(
            self.log.path(),
            self.log.file(),
            LogKind::Data,
            |off, _, e| {
                if let Entry::Put { key, value } = e {
                    if key >= from
                        && to.is_none_or(|t| key < t)
                        && index.contains(key_hash(key), off)
                    {
                        out.push((key.to_vec(), value.to_vec()));
                    }
                }
                Ok(())
            },
        )?;
        end.expect_end(self.log.path(), self.log.end())?;
        out.sort_unstable();
        Ok(out)
    }

    /// Make every put and delete so far durable (acknowledged).
    pub fn sync(&mut self) -> Result<()> {
        self.log.sync()
    }

    /// Bytes of the current log file.
    pub fn log_bytes(&self) -> u64 {
        self.log.end()
    }

    /// Counters since open.
    pub fn stats(&self) -> FawnStats {
        let mut s = self.stats.clone();
        s.live_keys = self.index.keys();
        s.live_bytes = self.index.bytes();
        s.log_bytes = self.log.end();
        s.app_bytes_written = self.closed_bytes + self.log.bytes_written();
        s
    }

    /// Sync and close.
    pub fn close(mut self) -> Result<()> {
        self.sync()
    }
}
