//! An LSM-tree key-value store in the manner of LevelDB (Freewrite §3.1): a memtable with a
//! write-ahead log, SSTables of about 2 MiB in levels whose size limits grow 10× per level, and
//! compactions that merge one table of level k into the overlapping tables of level k+1. With
//! freewrite on, bubbles keep the unchanged runs of the level k+1 tables block aligned in the
//! compaction output (see [`compact`]).
//!
//! Files: `LOCK`, `MANIFEST` (the commit point, [`manifest`]), `<n>.wal` (write-ahead logs,
//! [`crate::logfile`]), `<n>.sst` ([`table`]); `n` is a 16-digit hex file number. Open removes
//! tables the manifest does not list and logs older than its log, and replays the rest.
//!
//! Durability: a put or delete is *acknowledged* when it returns with [`LsmOptions::sync`] set,
//! or once a later [`LsmStore::sync`] returns. Acknowledged writes survive a crash (kill -9)
//! at any point, during a memtable flush or a compaction included.

mod compact;
pub mod manifest;
pub mod table;

use crate::error::{Error, IoContext, Result};
use crate::fawn::CrashHook;
use crate::fsutil::{lock_dir, remove, sync_dir};
use crate::logfile::{scan_log, BlockWriter, LogHeader, LogKind};
use crate::planner::{Caps, PlanStats};
use crate::record::{self, Entry};
use manifest::Manifest;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use table::{Lookup, Table, TableBuilder};

/// Levels of the tree (as LevelDB).
pub const LEVELS: usize = 7;

/// How an LSM store runs; the defaults are LevelDB's and the paper's.
#[derive(Debug, Clone, Copy)]
pub struct LsmOptions {
    /// Bubble caps when compactions use freewrite; `None` writes the compact layout.
    pub freewrite: Option<Caps>,
    /// Fsync the write-ahead log before each put or delete returns.
    pub sync: bool,
    /// Memtable size that triggers a flush to level 0 (4 MiB).
    pub memtable_bytes: u64,
    /// Target size of a compaction output table (2 MiB).
    pub table_bytes: u64,
    /// Level-0 tables that trigger a compaction (4).
    pub l0_trigger: usize,
    /// Size limit of level 1 (10 MiB); level k+1 holds `fanout` times level k.
    pub l1_bytes: u64,
    /// Growth factor between levels (10).
    pub fanout: u64,
}

impl Default for LsmOptions {
    fn default() -> Self {
        LsmOptions {
            freewrite: None,
            sync: false,
            memtable_bytes: 4 << 20,
            table_bytes: 2 << 20,
            l0_trigger: 4,
            l1_bytes: 10 << 20,
            fanout: 10,
        }
    }
}

/// Counters of an LSM store since it was opened.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LsmStats {
    /// Puts and deletes since open.
    pub writes: u64,
    /// Memtable flushes.
    pub flushes: u64,
    /// Compactions that merged and rewrote tables.
    pub compactions: u64,
    /// Compactions that only moved a table down a level.
    pub trivial_moves: u64,
    /// Bytes handed to the file system: logs, tables and manifests.
    pub app_bytes_written: u64,
    /// Of which write-ahead logs.
    pub wal_bytes_written: u64,
    /// Of which tables written by flushes.
    pub flush_bytes_written: u64,
    /// Of which tables written by compactions.
    pub compaction_bytes_written: u64,
    /// Bubble bytes written by compactions.
    pub bubble_bytes_written: u64,
    /// Bubble bytes in the tables now live.
    pub bubble_space: u64,
    /// Bytes of the tables now live.
    pub table_bytes: u64,
    /// Tables per level.
    pub tables_per_level: Vec<usize>,
    /// Torn log tails dropped on open.
    pub torn_tail_bytes: u64,
    /// Planner counts of the compactions since open.
    pub plan: PlanStats,
}

type Memtable = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// An open LSM store.
pub struct LsmStore {
    dir: PathBuf,
    _lock: File,
    opts: LsmOptions,
    mem: Memtable,
    mem_bytes: u64,
    wal: BlockWriter,
    wal_number: u64,
    /// Logs replaced by `wal` but not yet removed.
    old_wals: Vec<u64>,
    levels: Vec<Vec<Table>>,
    pointers: Vec<Vec<u8>>,
    next_file: u64,
    stats: LsmStats,
    closed_wal_bytes: u64,
    scratch: Vec<u8>,
    hook: Option<CrashHook>,
}

fn wal_name(n: u64) -> String {
    format!("{n:016x}.wal")
}

/// File number and kind ("wal", "sst", "tmp"...) of a store file name.
fn parse_name(name: &str) -> Option<(u64, &str)> {
    let (num, ext) = name.split_once('.')?;
    if num.len() != 16 {
        return None;
    }
    Some((u64::from_str_radix(num, 16).ok()?, ext))
}

impl LsmStore {
    /// Open the store in `dir` (created when missing): check the manifest and every table,
    /// drop what no commit reached, replay the write-ahead logs.
    pub fn open(dir: &Path, opts: LsmOptions) -> Result<Self> {
        if opts.memtable_bytes == 0 || opts.table_bytes == 0 || opts.l0_trigger == 0 {
            return Err(Error::Invalid("LSM sizes must be positive".into()));
        }
        if let Some(c) = opts.freewrite {
            c.check()?;
        }
        let lock = lock_dir(dir)?;
        let mf = Manifest::load(dir)?.unwrap_or_default();
        let mut levels: Vec<Vec<Table>> = (0..LEVELS).map(|_| Vec::new()).collect();
        let mut live = std::collections::HashSet::new();
        if mf.levels.len() > LEVELS {
            return Err(Error::corrupt(
                &dir.join(manifest::MANIFEST),
                "too many levels",
            ));
        }
        for (l, tables) in mf.levels.iter().enumerate() {
            for t in tables {
                live.insert(t.number);
                levels[l].push(Table::open(dir, t.clone())?);
            }
        }
        let mut wals = Vec::new();
        let mut max_seen = 0;
        for e in std::fs::read_dir(dir).ctx(|| format!("list {}", dir.display()))? {
            let e = e.ctx(|| format!("list {}", dir.display()))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((n, ext)) = parse_name(&name) else {
                if name.ends_with(".tmp") {
                    remove(&e.path())?;
                }
                continue;
            };
            max_seen = max_seen.max(n);
            match ext {
                "wal" if n >= mf.wal => wals.push(n),
                "sst" if live.contains(&n) => {}
                // Obsolete logs, tables no commit reached or already replaced, temporaries.
                _ => remove(&e.path())?,
            }
        }
        wals.sort_unstable();
        let mut stats = LsmStats::default();
        let mut mem = Memtable::new();
        let mut mem_bytes = 0;
        for &n in &wals {
            let path = dir.join(wal_name(n));
            let file = File::open(&path).ctx(|| format!("open {}", path.display()))?;
            let end = scan_log(&path, &file, LogKind::Wal, |_, raw, e| {
                mem_bytes += raw.len() as u64;
                match e {
                    Entry::Put { key, value } => mem.insert(key.to_vec(), Some(value.to_vec())),
                    Entry::Delete { key } => mem.insert(key.to_vec(), None),
                    Entry::Bubble => None,
                };
                Ok(())
            })?;
            stats.torn_tail_bytes += end.file_len - end.valid_end;
        }
        let mut next_file = mf.next_file.max(max_seen + 1).max(1);
        let wal_number = next_file;
        next_file += 1;
        let wal = BlockWriter::create(
            dir.join(wal_name(wal_number)),
            &LogHeader {
                kind: LogKind::Wal,
                number: wal_number,
            },
        )?;
        let mut s = LsmStore {
            dir: dir.to_path_buf(),
            _lock: lock,
            opts,
            mem,
            mem_bytes,
            wal,
            wal_number,
            old_wals: wals,
            levels,
            pointers: mf.pointers,
            next_file,
            stats,
            closed_wal_bytes: 0,
            scratch: Vec::new(),
            hook: None,
        };
        s.pointers.resize(LEVELS, Vec::new());
        // The replayed writes go to a level-0 table; the old logs are then obsolete.
        s.flush_memtable()?;
        s.maybe_compact()?;
        Ok(s)
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

    fn write(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        record::check_key(key)?;
        self.scratch.clear();
        match value {
            Some(v) => {
                record::check_value(v)?;
                record::encode_put(&mut self.scratch, key, v);
            }
            None => record::encode_delete(&mut self.scratch, key),
        }
        self.wal.append(&self.scratch)?;
        if self.opts.sync {
            self.wal.sync()?;
        }
        self.mem_bytes += self.scratch.len() as u64;
        self.mem.insert(key.to_vec(), value.map(<[u8]>::to_vec));
        self.stats.writes += 1;
        if self.mem_bytes >= self.opts.memtable_bytes {
            self.flush_memtable()?;
            self.maybe_compact()?;
        }
        Ok(())
    }

    /// Store `value` under `key` (acknowledged on return with `sync`, else at the next sync).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.write(key, Some(value))
    }

    /// Delete `key` (a DELETE marker that compactions carry down to the last level).
    pub fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.write(key, None)
    }

    /// The value of `key`: memtable, then level 0 newest first, then one table per level.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        record::check_key(key)?;
        if let Some(v) = self.mem.get(key) {
            return Ok(v.clone());
        }
        for (l, tables) in self.levels.iter().enumerate() {
            let found: Vec<&Table> = if l == 0 {
                tables.iter().rev().collect()
            } else {
                let i = tables.partition_point(|t| t.meta.largest.as_slice() < key);
                tables.get(i).into_iter().collect()
            };
            for t in found {
                if key < t.meta.smallest.as_slice() || key > t.meta.largest.as_slice() {
                    continue;
                }
                match t.get(key)? {
                    Lookup::Value(v) => return Ok(Some(v)),
                    Lookup::Deleted => return Ok(None),
                    Lookup::Absent => {}
                }
            }
        }
        Ok(None)
    }

    /// Live pairs with `from <= key < to` (`to` = `None`: no upper bound), sorted by key.
    pub fn scan(&self, from: &[u8], to: Option<&[u8]>) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let inside = |k: &[u8]| k >= from && to.is_none_or(|t| k < t);
        // Newest source first; the first version seen of a key wins.
        let mut seen: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        for (k, v) in &self.mem {
            if inside(k) {
                seen.insert(k.clone(), v.clone());
            }
        }
        for (l, tables) in self.levels.iter().enumerate() {
            let order: Vec<&Table> = if l == 0 {
                tables.iter().rev().collect()
            } else {
                tables.iter().collect()
            };
            for t in order {
                if t.meta.largest.as_slice() < from
                    || to.is_some_and(|x| t.meta.smallest.as_slice() >= x)
                {
                    continue;
                }
                let (buf, recs) = t.read_all()?;
                for r in recs {
                    let k = &buf[r.key.clone()];
                    if !inside(k) || seen.contains_key(k) {
                        continue;
                    }
                    let v = (!r.delete).then(|| buf[r.key.end..r.range.end].to_vec());
                    seen.insert(k.to_vec(), v);
                }
            }
        }
        Ok(seen
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect())
    }

    /// Make every put and delete so far durable (acknowledged).
    pub fn sync(&mut self) -> Result<()> {
        self.wal.sync()
    }

    /// Counters since open.
    pub fn stats(&self) -> LsmStats {
        let mut s = self.stats.clone();
        s.wal_bytes_written = self.closed_wal_bytes + self.wal.bytes_written();
        s.app_bytes_written += s.wal_bytes_written;
        s.bubble_space = self.tables().map(|t| t.meta.bubble_bytes).sum();
        s.table_bytes = self.tables().map(|t| t.meta.file_size).sum();
        s.tables_per_level = self.levels.iter().map(Vec::len).collect();
        s
    }

    /// Every live table.
    fn tables(&self) -> impl Iterator<Item = &Table> {
        self.levels.iter().flatten()
    }

    /// Manifest entries of the live tables, per level.
    pub fn table_metas(&self) -> Vec<Vec<table::TableMeta>> {
        self.levels
            .iter()
            .map(|l| l.iter().map(|t| t.meta.clone()).collect())
            .collect()
    }

    /// Write the memtable to a level-0 table (and run the compactions that calls for): all
    /// writes so far are then in tables and durable.
    pub fn flush(&mut self) -> Result<()> {
        self.sync()?;
        self.flush_memtable()?;
        self.maybe_compact()
    }

    /// Flush and close (a reopen then replays no log).
    pub fn close(mut self) -> Result<()> {
        self.flush()
    }

    fn new_file_number(&mut self) -> u64 {
        let n = self.next_file;
        self.next_file += 1;
        n
    }

    /// Commit the current state: the manifest names the live tables and the log in use.
    fn commit(&mut self) -> Result<()> {
        let m = Manifest {
            next_file: self.next_file,
            wal: self.wal_number,
            levels: self.table_metas(),
            pointers: self.pointers.clone(),
        };
        self.stats.app_bytes_written += m.store(&self.dir)?;
        Ok(())
    }

    /// Write the memtable to a level-0 table, switch to a new log, commit, drop old logs.
    fn flush_memtable(&mut self) -> Result<()> {
        if !self.mem.is_empty() {
            let number = self.new_file_number();
            let mut b = TableBuilder::new();
            for (k, v) in &self.mem {
                self.scratch.clear();
                match v {
                    Some(v) => record::encode_put(&mut self.scratch, k, v),
                    None => record::encode_delete(&mut self.scratch, k),
                }
                b.add(k, &self.scratch);
            }
            let meta = b.finish(&self.dir.join(table::table_name(number)), number)?;
            self.stats.flush_bytes_written += meta.file_size;
            self.stats.app_bytes_written += meta.file_size;
            self.levels[0].push(Table::open(&self.dir, meta)?);
            self.stats.flushes += 1;
            self.crash_point("flush:table-written");
            let n = self.new_file_number();
            let wal = BlockWriter::create(
                self.dir.join(wal_name(n)),
                &LogHeader {
                    kind: LogKind::Wal,
                    number: n,
                },
            )?;
            let old = std::mem::replace(&mut self.wal, wal);
            self.closed_wal_bytes += old.bytes_written();
            self.old_wals.push(self.wal_number);
            self.wal_number = n;
        }
        self.commit()?;
        self.crash_point("flush:committed");
        self.mem.clear();
        self.mem_bytes = 0;
        for n in std::mem::take(&mut self.old_wals) {
            remove(&self.dir.join(wal_name(n)))?;
        }
        sync_dir(&self.dir)
    }
}
