//! The reference model: what the file system must hold after a sequence of operations, and a
//! canonical snapshot (paths, link groups, sizes, content hashes) to compare a real file system
//! (fresh or recovered) against it.
//!
//! The namespace is two directories, the root and `d`, so renames and links cross directories.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use nodup_core::BLOCK_SIZE;
use nodup_fs::fs::falloc;
use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::remap::RemapOutcome;
use nodup_fs::{Caller, FileSystem, FsError};

const BS: u64 = BLOCK_SIZE as u64;

/// Name of the subdirectory every workload creates first.
pub const SUBDIR: &str = "d";

/// A file path in the two-directory namespace: (in subdirectory?, name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FPath {
    /// True for `d/name`, false for `/name`.
    pub sub: bool,
    /// Entry name.
    pub name: String,
}

impl FPath {
    /// The path as text (`d/f3` or `f3`).
    pub fn text(&self) -> String {
        if self.sub {
            format!("{SUBDIR}/{}", self.name)
        } else {
            self.name.clone()
        }
    }
}

/// Remap operations that moved a block, over the whole process (tests check that a
/// workload meant to exercise the remap contract did).
pub static REMAPS_DONE: AtomicU64 = AtomicU64::new(0);

/// Blocks `smart`'s worker looked at in [`Op::SmartStep`]s, over the whole process.
pub static SMART_BLOCKS_DONE: AtomicU64 = AtomicU64::new(0);

/// One file-system operation of a workload (the data of writes is carried along).
#[derive(Debug, Clone)]
pub enum Op {
    /// Create an empty regular file.
    Create(FPath),
    /// Write `data` at `off`.
    Write(FPath, u64, Vec<u8>),
    /// Set the size.
    Truncate(FPath, u64),
    /// Punch a hole (KEEP_SIZE) over `[off, off+len)`.
    Punch(FPath, u64, u64),
    /// Remove a name.
    Unlink(FPath),
    /// Rename (replacing an existing target).
    Rename(FPath, FPath),
    /// New hard link `to` of `from`.
    Link(FPath, FPath),
    /// copy_file_range(from, off_in, to, off_out, len) between two different files at block
    /// aligned offsets: whole blocks are shared (one record), a partial last block is written.
    Copy(FPath, u64, FPath, u64, u64),
    /// Background dedup (the remap contract): file block `index` of the file is pointed at
    /// another stored copy of its bytes, the first found in the listed files (blocks
    /// `0..span`). Content never changes; nothing happens unless duplicates were stored apart.
    Remap(FPath, u64, Vec<FPath>, u64),
    /// Policy `smart`'s out-of-line worker works through up to this many queued blocks
    /// (remaps and entries for blocks never fingerprinted); content never changes, and on
    /// other policies nothing happens.
    SmartStep(u32),
    /// fsync / sync.
    Sync,
    /// `fstrim`: every free block given back to the medium's holder (a test medium overwrites
    /// it with a poison pattern, so a block recovery still needed would show).
    Trim,
    /// Write a checkpoint (switches the superblock; the riskiest step for crash consistency).
    Checkpoint,
    /// The engine gives up its live state (as after a store it could not undo) and failure
    /// recovery while mounted rebuilds it; content never changes.
    Rebuild,
}

/// One file as the model sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct MFile {
    data: Vec<u8>,
}

/// The model state.
#[derive(Debug, Clone, Default)]
pub struct Model {
    names: BTreeMap<FPath, u64>,
    files: BTreeMap<u64, MFile>,
    next: u64,
}

/// What a snapshot records per path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Smallest path sharing this file (hard links have the same group).
    pub group: String,
    /// Link count.
    pub nlink: u32,
    /// Size in bytes.
    pub size: u64,
    /// xxh3 of the content.
    pub hash: u64,
}

/// A canonical view of the namespace and contents, comparable across model and file system.
pub type Snapshot = BTreeMap<String, Entry>;

fn hash(data: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(data)
}

fn canon(items: Vec<(String, u64, u32, Vec<u8>)>) -> Snapshot {
    // items: (path, identity, nlink, content)
    let mut first: BTreeMap<u64, String> = BTreeMap::new();
    for (p, id, _, _) in &items {
        let e = first.entry(*id).or_insert_with(|| p.clone());
        if p < e {
            *e = p.clone();
        }
    }
    items
        .into_iter()
        .map(|(p, id, nlink, data)| {
            (
                p,
                Entry {
                    group: first[&id].clone(),
                    nlink,
                    size: data.len() as u64,
                    hash: hash(&data),
                },
            )
        })
        .collect()
}

fn zero(v: &mut [u8], from: u64, to: u64) {
    let to = (to as usize).min(v.len());
    let from = (from as usize).min(to);
    v[from..to].fill(0);
}

impl Model {
    /// Paths that exist.
    pub fn paths(&self) -> Vec<FPath> {
        self.names.keys().cloned().collect()
    }

    /// Size of the file at `p`.
    pub fn size(&self, p: &FPath) -> Option<u64> {
        self.names.get(p).map(|i| self.files[i].data.len() as u64)
    }

    /// Content of the file at `p`.
    pub fn content(&self, p: &FPath) -> Option<&[u8]> {
        self.names.get(p).map(|i| &self.files[i].data[..])
    }

    /// True when `a` and `b` name the same file.
    pub fn same_file(&self, a: &FPath, b: &FPath) -> bool {
        matches!((self.names.get(a), self.names.get(b)), (Some(x), Some(y)) if x == y)
    }

    fn drop_name(&mut self, p: &FPath) {
        if let Some(i) = self.names.remove(p) {
            if !self.names.values().any(|&j| j == i) {
                self.files.remove(&i);
            }
        }
    }

    /// The states an operation passes through on the medium, in order: one per log record it
    /// appends (the last one is the state after the operation). Multi-record operations (an
    /// unaligned punch) have visible intermediate states; every other operation has one.
    pub fn apply_steps(&mut self, op: &Op) -> Vec<Snapshot> {
        let mut out = Vec::new();
        match op {
            Op::Create(p) => {
                self.next += 1;
                self.files.insert(self.next, MFile::default());
                self.names.insert(p.clone(), self.next);
            }
            Op::Write(p, off, data) => {
                let f = self.files.get_mut(&self.names[p]).expect("model file");
                let end = *off as usize + data.len();
                if f.data.len() < end {
                    f.data.resize(end, 0);
                }
                f.data[*off as usize..end].copy_from_slice(data);
            }
            Op::Truncate(p, size) => {
                let f = self.files.get_mut(&self.names[p]).expect("model file");
                f.data.resize(*size as usize, 0);
            }
            Op::Punch(p, off, len) => {
                let id = self.names[p];
                let size = self.files[&id].data.len() as u64;
                let zend = (off + len).min(size);
                if *off < zend {
                    // Mirrors the file system's record order: first edge, last edge, full blocks.
                    let first_full = off.div_ceil(BS);
                    if off % BS != 0 {
                        let to = zend.min((off / BS + 1) * BS);
                        zero(&mut self.files.get_mut(&id).unwrap().data, *off, to);
                        out.push(self.snapshot());
                    }
                    if zend % BS != 0
                        && zend / BS >= first_full
                        && (off % BS == 0 || zend / BS != off / BS)
                    {
                        zero(
                            &mut self.files.get_mut(&id).unwrap().data,
                            zend / BS * BS,
                            zend,
                        );
                        out.push(self.snapshot());
                    }
                    zero(&mut self.files.get_mut(&id).unwrap().data, *off, zend);
                }
            }
            Op::Unlink(p) => self.drop_name(p),
            Op::Rename(a, b) => {
                if !self.same_file(a, b) {
                    let id = self.names[a];
                    self.drop_name(b);
                    self.names.remove(a);
                    self.names.insert(b.clone(), id);
                }
            }
            Op::Link(a, b) => {
                let id = self.names[a];
                self.names.insert(b.clone(), id);
            }
            Op::Remap(..) | Op::SmartStep(_) => {}
            Op::Copy(a, off_in, b, off_out, len) => {
                let src = self.files[&self.names[a]].data.clone();
                let size = src.len() as u64;
                if *off_in < size {
                    let n = (*len).min(size - off_in);
                    let whole = n / BS * BS;
                    let dst = self.names[b];
                    let put = |m: &mut Model, at: u64, from: u64, to: u64| {
                        let d = &mut m.files.get_mut(&dst).expect("model file").data;
                        let end = (at + to - from) as usize;
                        if d.len() < end {
                            d.resize(end, 0);
                        }
                        d[at as usize..end].copy_from_slice(&src[from as usize..to as usize]);
                    };
                    if whole > 0 {
                        put(self, *off_out, *off_in, off_in + whole);
                        if n > whole {
                            out.push(self.snapshot());
                        }
                    }
                    if n > whole {
                        put(self, off_out + whole, off_in + whole, off_in + n);
                    }
                }
            }
            Op::Sync | Op::Trim | Op::Checkpoint | Op::Rebuild => {}
        }
        out.push(self.snapshot());
        out
    }

    /// The canonical snapshot of the model.
    pub fn snapshot(&self) -> Snapshot {
        let mut nl: BTreeMap<u64, u32> = BTreeMap::new();
        for &i in self.names.values() {
            *nl.entry(i).or_default() += 1;
        }
        canon(
            self.names
                .iter()
                .map(|(p, &i)| (p.text(), i, nl[&i], self.files[&i].data.clone()))
                .collect(),
        )
    }
}

/// Inode of the subdirectory.
pub fn subdir_ino(fs: &FileSystem) -> Result<u64, FsError> {
    Ok(fs.lookup(ROOT_INO, SUBDIR.as_bytes())?.0)
}

fn parent_of(fs: &FileSystem, p: &FPath) -> Result<u64, FsError> {
    if p.sub {
        subdir_ino(fs)
    } else {
        Ok(ROOT_INO)
    }
}

fn ino_of(fs: &FileSystem, p: &FPath) -> Result<u64, FsError> {
    Ok(fs.lookup(parent_of(fs, p)?, p.name.as_bytes())?.0)
}

/// Create the subdirectory every workload starts with.
pub fn setup(fs: &FileSystem) -> Result<(), FsError> {
    fs.mknod(
        ROOT_INO,
        SUBDIR.as_bytes(),
        Kind::Dir,
        0o755,
        0,
        b"",
        Caller::default(),
    )?;
    Ok(())
}

/// Perform `op` on the file system.
pub fn run_op(fs: &FileSystem, op: &Op) -> Result<(), FsError> {
    match op {
        Op::Create(p) => {
            fs.mknod(
                parent_of(fs, p)?,
                p.name.as_bytes(),
                Kind::File,
                0o644,
                0,
                b"",
                Caller::default(),
            )?;
        }
        Op::Write(p, off, data) => {
            fs.write(ino_of(fs, p)?, *off, data)?;
        }
        Op::Truncate(p, size) => {
            fs.truncate(ino_of(fs, p)?, *size)?;
        }
        Op::Punch(p, off, len) => {
            fs.fallocate(
                ino_of(fs, p)?,
                *off,
                *len,
                falloc::PUNCH_HOLE | falloc::KEEP_SIZE,
            )?;
        }
        Op::Unlink(p) => fs.unlink(parent_of(fs, p)?, p.name.as_bytes())?,
        Op::Rename(a, b) => fs.rename(
            parent_of(fs, a)?,
            a.name.as_bytes(),
            parent_of(fs, b)?,
            b.name.as_bytes(),
            0,
        )?,
        Op::Link(a, b) => {
            fs.link(ino_of(fs, a)?, parent_of(fs, b)?, b.name.as_bytes())?;
        }
        Op::Copy(a, off_in, b, off_out, len) => {
            let src = ino_of(fs, a)?;
            let want = (*len).min(fs.getattr(src)?.size.saturating_sub(*off_in));
            let n = fs.copy_range(src, *off_in, ino_of(fs, b)?, *off_out, *len)?;
            // A short count is how copy_file_range reports an error after some bytes were
            // copied (as write(2) does): the caller is told, so it counts as a reported EIO,
            // not a swallowed fault.
            if n < want {
                return Err(FsError::Errno(libc::EIO));
            }
        }
        Op::Remap(a, index, others, span) => {
            let ino = ino_of(fs, a)?;
            let from = fs.mapped_block(ino, *index)?;
            if from == 0 {
                return Ok(());
            }
            let want = fs.read(ino, index * BS, BS as usize)?;
            for p in others {
                let other = ino_of(fs, p)?;
                for j in 0..*span {
                    let to = fs.mapped_block(other, j)?;
                    if to == 0 || to == from || fs.read(other, j * BS, BS as usize)? != want {
                        continue;
                    }
                    let o = fs.remap_block(ino, *index, from, to)?;
                    if o == RemapOutcome::Done {
                        REMAPS_DONE.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                }
            }
        }
        Op::SmartStep(n) => {
            let done = fs.smart_step(*n as usize)?;
            SMART_BLOCKS_DONE.fetch_add(done as u64, Ordering::Relaxed);
        }
        Op::Sync => fs.sync()?,
        Op::Trim => {
            fs.trim(0, u64::MAX, 0)?;
        }
        Op::Checkpoint => fs.checkpoint(false)?,
        Op::Rebuild => {
            fs.engine().give_up_live_state();
            if !fs.recover_if_gave_up(true) {
                // Why changes stay refused (a medium error in the rebuild, say).
                fs.changes_possible()?;
            }
        }
    }
    Ok(())
}

/// Read the whole namespace and every file of `fs` into a canonical snapshot. Anything that
/// is not a regular file (other than the subdirectory) is reported as an error string.
pub fn snapshot_fs(fs: &FileSystem) -> Result<Snapshot, String> {
    let e = |x: FsError| x.to_string();
    let mut items = Vec::new();
    let sub = subdir_ino(fs).map_err(|x| format!("subdirectory: {x}"))?;
    for (dir, prefix) in [(ROOT_INO, ""), (sub, "d/")] {
        let mut after = 0;
        loop {
            let ents = fs.readdir(dir, after, 64).map_err(e)?;
            if ents.is_empty() {
                break;
            }
            for (cookie, ino, kind, name) in ents {
                after = cookie;
                let name = String::from_utf8_lossy(&name).into_owned();
                if name == "." || name == ".." || (dir == ROOT_INO && name == SUBDIR) {
                    continue;
                }
                if kind != Kind::File {
                    return Err(format!("{prefix}{name}: unexpected kind {kind:?}"));
                }
                let attr = fs.getattr(ino).map_err(e)?;
                let data = fs
                    .read(ino, 0, attr.size as usize)
                    .map_err(|x| format!("{prefix}{name}: read: {x}"))?;
                if data.len() as u64 != attr.size {
                    return Err(format!(
                        "{prefix}{name}: read {} bytes of {}",
                        data.len(),
                        attr.size
                    ));
                }
                items.push((format!("{prefix}{name}"), ino, attr.nlink, data));
            }
        }
    }
    Ok(canon(items))
}

/// First difference between two snapshots, for reports.
pub fn diff(want: &Snapshot, got: &Snapshot) -> String {
    for (p, w) in want {
        match got.get(p) {
            None => return format!("{p} missing"),
            Some(g) if g != w => return format!("{p}: want {w:?}, got {g:?}"),
            _ => {}
        }
    }
    for p in got.keys() {
        if !want.contains_key(p) {
            return format!("{p} should not exist");
        }
    }
    "equal".into()
}
