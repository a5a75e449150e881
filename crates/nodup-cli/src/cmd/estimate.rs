//! `nodup estimate DIR...`: the savings nodup would reach on existing files, reading only.
//!
//! The model is what nodup stores after `cp -a SRC MOUNT/`: symlinks, devices and fifos store
//! no data blocks, a hard-linked file is stored once (per st_dev/st_ino), a file is a run of
//! 4 KiB blocks with the last one zero-padded, blocks wholly inside a hole (SEEK_DATA /
//! SEEK_HOLE) are not stored, and data blocks that happen to be zero are. Block contents are
//! identified by their 128-bit XXH3 hash. `tests/trace-dedup-ratio.py --files` recomputes the
//! same totals independently.
//!
//! Memory of the estimate itself: a hash map of 32-byte slots (hash → last position; 40 to 75
//! bytes per distinct block with its load factor) plus 4 bytes per block read for the
//! stack-distance tree: about 10 to 20 MiB per GiB of distinct data.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::ProgressBar;
use serde::Serialize;
use xxhash_rust::xxh3::xxh3_128;

use super::bench::progress;
use super::estimate_model::{BlockModel, SMART_ENTRY_BYTES};

const BS: u64 = 4096;
/// Blocks read per pread call.
const CHUNK_BLOCKS: u64 = 256;
/// Share of the duplicate blocks the smart-policy model must find inline.
const SMART_PERCENT: u64 = 95;

/// `nodup estimate`.
#[derive(Args, Debug)]
pub struct EstimateArgs {
    /// Files or directories to examine (walked recursively, symlinks not followed).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// The `--json` object.
#[derive(Debug, Serialize)]
pub struct Estimate {
    /// Regular files read (hard links counted once).
    pub files: u64,
    /// Stored blocks x 4096.
    pub logical_bytes: u64,
    /// Distinct block contents x 4096.
    pub physical_bytes: u64,
    /// logical - physical.
    pub bytes_saved: u64,
    /// 1 - physical / logical (0 when empty), as `nodup stats` reports it.
    pub dedup_ratio: f64,
    /// logical / physical (1 when empty), the ZFS "dedup" factor.
    pub dedup_factor: f64,
    /// Distinct block contents.
    pub unique_blocks: u64,
    /// Heap bytes of the `light` policy's DRAM index for `unique_blocks` fingerprints.
    pub light_index_bytes: u64,
    /// MODEL of `smart`: smallest LRU fingerprint cache finding 95 % of duplicates inline.
    pub smart_model_entries_95: u64,
    /// That cache at 16 bytes per entry (the model's assumption).
    pub smart_model_bytes_95: u64,
    /// Files or directories skipped because they could not be read.
    pub unreadable: u64,
}

/// `nodup estimate`.
pub fn estimate(a: EstimateArgs) -> Result<()> {
    // Check every argument before walking any, so a mistyped one fails at once.
    let mut roots = Vec::with_capacity(a.paths.len());
    for p in &a.paths {
        match p.symlink_metadata() {
            Ok(md) => roots.push((p.clone(), md)),
            Err(e) => bail!("{}: {}", p.display(), super::plain(&e)),
        }
    }
    let mut walk = Walk::default();
    for (p, md) in roots {
        walk.root(p, md);
    }
    let total: u64 = walk.files.iter().map(|f| f.1).sum();
    let pb = progress(total, "reading");
    // Presize by allocated, not apparent, bytes: a huge sparse file must not reserve memory.
    let mut model = BlockModel::new(walk.allocated.div_ceil(BS));
    let (mut files, mut walked) = (0u64, 0u64);
    for (path, size) in &walk.files {
        match read_file(path, &mut model, &pb) {
            Ok(()) => files += 1,
            Err(e) => {
                walk.unreadable += 1;
                pb.suspend(|| warn(path, &e));
            }
        }
        // read_file advances the bar by the bytes it read; holes, skipped files and size
        // changes since the walk are accounted here, so the bar ends exactly at the total.
        walked += size;
        pb.set_position(walked);
    }
    pb.finish_and_clear();
    let e = summarize(files, walk.unreadable, &model);
    if a.json {
        emit(&(serde_json::to_string_pretty(&e)? + "\n"))
    } else {
        emit(&human_report(&e))
    }
}

/// Turn the block model into the reported numbers.
fn summarize(files: u64, unreadable: u64, m: &BlockModel) -> Estimate {
    let (logical, physical) = (m.blocks() * BS, m.unique() * BS);
    let entries = m.min_cache_for(SMART_PERCENT);
    Estimate {
        files,
        logical_bytes: logical,
        physical_bytes: physical,
        bytes_saved: logical - physical,
        dedup_ratio: if logical == 0 {
            0.0
        } else {
            1.0 - physical as f64 / logical as f64
        },
        dedup_factor: if physical == 0 {
            1.0
        } else {
            logical as f64 / physical as f64
        },
        unique_blocks: m.unique(),
        light_index_bytes: nodup_core::index::memory_for(m.unique()),
        smart_model_entries_95: entries,
        smart_model_bytes_95: entries * SMART_ENTRY_BYTES,
        unreadable,
    }
}

/// The summary as text.
fn human_report(e: &Estimate) -> String {
    let mut o = String::new();
    // Writing into a String cannot fail.
    let mut line = |l: String| {
        o.push_str(&l);
        o.push('\n');
    };
    line(format!(
        "nodup estimate: {} file{}, {} logical",
        thousands(e.files),
        if e.files == 1 { "" } else { "s" },
        human(e.logical_bytes)
    ));
    line(format!(
        "  would store      {} physical",
        human(e.physical_bytes)
    ));
    line(format!(
        "  bytes saved      {} (dedup ratio {:.4}, {:.2}x)",
        human(e.bytes_saved),
        e.dedup_ratio,
        e.dedup_factor
    ));
    let per = if e.unique_blocks == 0 {
        String::new()
    } else {
        format!(
            " ({:.1} B per unique block)",
            e.light_index_bytes as f64 / e.unique_blocks as f64
        )
    };
    line(format!(
        "  index memory     light: {}{per}",
        human(e.light_index_bytes)
    ));
    let smart = if e.smart_model_entries_95 == 0 {
        "0 B (no duplicate blocks)".to_string()
    } else {
        format!(
            "{} ({} fingerprints x {SMART_ENTRY_BYTES} B)",
            human(e.smart_model_bytes_95),
            thousands(e.smart_model_entries_95)
        )
    };
    line(format!(
        "                   smart (LRU model, >= {SMART_PERCENT} % of duplicates inline): {smart}"
    ));
    if e.unreadable > 0 {
        line(format!(
            "  unreadable       {} skipped (see the warnings above)",
            thousands(e.unreadable)
        ));
    }
    o
}

/// Write the report to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn emit(text: &str) -> Result<()> {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing to stdout"),
    }
}

/// The regular files to read, in sorted walk order, each (st_dev, st_ino) once.
#[derive(Default)]
struct Walk {
    files: Vec<(PathBuf, u64)>,
    seen: HashSet<(u64, u64)>,
    /// Sum of the files' allocated bytes (st_blocks), capped at their sizes.
    allocated: u64,
    unreadable: u64,
}

impl Walk {
    /// Walk one command-line argument (`md`: its lstat); errors below it are skipped.
    fn root(&mut self, root: PathBuf, md: std::fs::Metadata) {
        // Depth-first with an explicit stack (deep trees must not overflow ours); children are
        // pushed in reverse name order so they pop in name order.
        let mut stack = vec![(root, md)];
        while let Some((path, md)) = stack.pop() {
            let ft = md.file_type();
            if ft.is_file() {
                if self.seen.insert((md.dev(), md.ino())) {
                    self.allocated += (md.blocks() * 512).min(md.len());
                    self.files.push((path, md.len()));
                }
            } else if ft.is_dir() {
                match self.list_dir(&path) {
                    Ok(mut kids) => {
                        kids.reverse();
                        stack.extend(kids);
                    }
                    Err(e) => {
                        self.unreadable += 1;
                        warn(&path, &e);
                    }
                }
            }
        }
    }

    /// Entries of a directory with their lstat, sorted by name.
    fn list_dir(&mut self, dir: &Path) -> io::Result<Vec<(PathBuf, std::fs::Metadata)>> {
        let mut kids = Vec::new();
        for ent in std::fs::read_dir(dir)? {
            let ent = ent?;
            let path = ent.path();
            // DirEntry::metadata does not follow symlinks. An entry that vanished since the
            // listing is simply no longer there to copy.
            match ent.metadata() {
                Ok(md) => kids.push((path, md)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    self.unreadable += 1;
                    warn(&path, &e);
                }
            }
        }
        kids.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(kids)
    }
}

/// Open read-only, without following a symlink swapped in since the walk, without blocking on
/// a fifo swapped in, and without updating atime when we may (O_NOATIME needs ownership).
fn open_ro(path: &Path) -> io::Result<File> {
    let base = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    let open = |flags| OpenOptions::new().read(true).custom_flags(flags).open(path);
    match open(base | libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(base),
        r => r,
    }
}

/// lseek(2) with SEEK_DATA / SEEK_HOLE; `Ok(None)` for ENXIO (no data at or after `off`).
fn seek(f: &File, off: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    // SAFETY: lseek on an open descriptor we own has no memory effects.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENXIO) => Ok(None),
        _ => Err(e),
    }
}

/// Feed the stored blocks of one file to the model, advancing the bar by the bytes read.
fn read_file(path: &Path, model: &mut BlockModel, pb: &ProgressBar) -> io::Result<()> {
    let f = open_ro(path)?;
    let md = f.metadata()?;
    if !md.file_type().is_file() {
        // Replaced by something else since the walk: what cp would copy now is not a file.
        return Err(io::Error::other("no longer a regular file"));
    }
    let size = md.len();
    let nblk = size.div_ceil(BS);
    let mut buf = vec![0u8; (CHUNK_BLOCKS * BS) as usize];
    let mut next = 0u64;
    while next < nblk {
        // A filesystem without SEEK_DATA support (EINVAL) is all data.
        let data = match seek(&f, next * BS, libc::SEEK_DATA) {
            Ok(None) => break,
            Ok(Some(d)) => d,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => next * BS,
            Err(e) => return Err(e),
        };
        let hole = match seek(&f, data, libc::SEEK_HOLE) {
            Ok(Some(h)) => h,
            Ok(None) | Err(_) => size,
        };
        // Any block holding data is stored; at least one block per round so it always advances.
        let start = (data / BS).max(next);
        let end = hole.div_ceil(BS).max(start + 1).min(nblk);
        let mut b = start;
        while b < end {
            let n = (end - b).min(CHUNK_BLOCKS);
            let want = (n * BS) as usize;
            let got = read_full(&f, &mut buf[..want], b * BS)?;
            // Short read: the file shrank meanwhile; the partial block is zero-padded as stored.
            buf[got..want].fill(0);
            let full = got.div_ceil(BS as usize);
            for blk in buf[..full * BS as usize].chunks_exact(BS as usize) {
                model.add(xxh3_128(blk));
            }
            pb.inc(got as u64);
            if full < n as usize {
                return Ok(());
            }
            b += n;
        }
        next = end;
    }
    Ok(())
}

/// pread until `buf` is full or end of file; returns the bytes read.
fn read_full(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// One warning line for a skipped path.
fn warn(path: &Path, e: &io::Error) {
    eprintln!(
        "nodup: warning: {}: {} (skipped)",
        path.display(),
        super::plain(e)
    );
}

/// 1234567 → "1,234,567".
fn thousands(n: u64) -> String {
    // Built right to left so groups of three start at the last digit.
    let mut rev = String::new();
    let mut group = 0;
    for c in n.to_string().chars().rev() {
        if group == 3 {
            rev.push(',');
            group = 0;
        }
        rev.push(c);
        group += 1;
    }
    rev.chars().rev().collect()
}

/// Binary-prefixed size: "512 B", "8.40 MiB", "612.3 MiB".
fn human(b: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v >= 10.0 {
        format!("{v:.1} {}", UNITS[u])
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(71234), "71,234");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1288490189), "1.20 GiB");
        assert_eq!(human(642_000_000), "612.3 MiB");
    }

    #[test]
    fn plain_drops_the_code() {
        let e = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(crate::cmd::plain(&e), "No such file or directory");
    }
}
