//! Consistency check of a file system: directory tree and link counts, block maps against the
//! image geometry and the metadata chains, and (through the engine) each referenced block's
//! reference count and the allocator. `repair` fixes what failure recovery would, and reports
//! what it changed.

use crate::error::Result;
use crate::fs::FileSystem;
use crate::inode::{Kind, ROOT_INO};
use crate::state::Tables;
use nodup_core::alloc::bitmap::Bitmap;
use nodup_core::BLOCK_SIZE;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{HashMap, HashSet, VecDeque};

/// What fsck found (and fixed, with `repair`).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct FsckReport {
    pub inodes: u64,
    pub files: u64,
    pub directories: u64,
    pub block_refs: u64,
    pub distinct_blocks: u64,
    pub problems: Vec<String>,
    pub repaired: Vec<String>,
}

impl FsckReport {
    /// True when no problem was found.
    pub fn consistent(&self) -> bool {
        self.problems.is_empty()
    }

    /// A problem fsck's open found: reported as `problem` by a read-only check, as `repaired`
    /// by a read-write one (whose open already fixed it).
    fn found_at_open(&mut self, read_only: bool, problem: String, repaired: String) {
        if read_only {
            self.problems.push(problem);
        } else {
            self.repaired.push(repaired);
        }
    }
}

/// The problem a read-only check of an image that was not unmounted cleanly reports.
pub const NEEDS_RECOVERY: &str =
    "image was not unmounted cleanly: failure recovery needed (mount it, or fsck --repair); the allocator and reference counts are checked after it";

/// Check the metadata of `fs`; with `repair`, fix the tree, drop bad references, and rebuild
/// the engine's reference counts from the block maps.
pub fn check(fs: &FileSystem, repair: bool) -> Result<FsckReport> {
    let mut rep = FsckReport::default();
    let (start, len) = fs.engine().data_area();
    let meta: FxHashSet<u64> = fs.meta_blocks().into_iter().collect();
    // A file's block map may not point at a block of the engine's metadata layout either (the
    // table check unmaps it: failure recovery, which --repair runs, refuses such a reference).
    // One on a block of the store's groups is reported below as held twice, and --repair
    // keeps the file's and rebuilds the groups elsewhere.
    let mut off_limits = meta.clone();
    off_limits.extend(fs.engine().layout_blocks());
    let bounds = Bounds {
        data: start..start + len,
        meta: &off_limits,
    };
    let fixed = fs.with_tables(|t| check_tables(t, &bounds, &mut rep, repair));
    if let Some(t) = fixed {
        fs.replace_tables(t)?;
    }
    let mapped = fs.with_tables(|t| distinct_blocks(t, &bounds));
    rep.distinct_blocks = mapped.len() as u64;
    // The checkpoint as loaded, where the log changed what the table check above saw: a
    // normal open refuses it. A read-write open has already replaced it by a checkpoint of the
    // table after the log.
    for p in &fs.recovery().checkpoint_problems {
        if rep.problems.contains(p) {
            continue;
        }
        rep.found_at_open(
            fs.read_only,
            format!("checkpoint, before the log is replayed: {p} (fsck --repair writes a checkpoint of the table after the log)"),
            format!("checkpoint, before the log is replayed: {p}: replaced by a checkpoint of the table after the log"),
        );
    }
    // Opened with `fsck`: the log was read up to a record the table refused. A
    // read-write open has already cut the log there.
    if let Some(r) = &fs.recovery().refused_record {
        rep.found_at_open(
            fs.read_only,
            format!("{r}; the log was read up to it (fsck --repair ends the log there, dropping it and any records after it)"),
            format!("{r}: the log now ends before it; it and any records after it are dropped"),
        );
    }
    if fs.read_only && fs.recovery().kind == "failure" {
        // Opened read-only, an image that needs failure recovery has neither its allocator
        // nor its reference counts loaded (recovery rebuilds them from the block maps):
        // comparing them with the maps would only list the recovery itself.
        rep.problems.insert(0, NEEDS_RECOVERY.into());
        return Ok(rep);
    }
    // Allocator: every block a file references and every metadata block we hold is allocated.
    {
        let alloc = fs.engine().allocator();
        let mut unalloc = 0u64;
        fs.with_tables(|t| {
            let mut seen = HashSet::new();
            for b in t.data_refs() {
                if seen.insert(b) && !alloc.is_allocated(b) {
                    unalloc += 1;
                }
            }
        });
        if unalloc > 0 {
            rep.problems.push(format!(
                "{unalloc} referenced data blocks are free in the allocator"
            ));
        }
        let free_meta = meta.iter().filter(|&&b| !alloc.is_allocated(b)).count();
        if free_meta > 0 {
            rep.problems.push(format!(
                "{free_meta} file-system metadata blocks are free in the allocator"
            ));
        }
        let h = block_holders(fs, &bounds);
        if h.leaked > 0 {
            let behind = if h.unlisted > 0 {
                format!(
                    " beyond the {} blocks of damaged fingerprint groups, which cannot be listed",
                    h.unlisted
                )
            } else {
                String::new()
            };
            rep.problems.push(format!(
                "{} allocated blocks are held by no file, metadata or fingerprint store{behind} (leaked space; fsck --repair frees them)",
                h.leaked
            ));
        }
        if h.twice > 0 {
            rep.problems.push(format!(
                "{} block(s) held twice: by a file or the file-system metadata and by the engine's metadata layout or fingerprint store, or twice by those (fsck --repair rebuilds the allocator and the fingerprint groups, and unmaps a file's block that the metadata layout holds)",
                h.twice
            ));
        }
        if h.engine_free > 0 {
            rep.problems.push(format!(
                "{} block(s) of the engine's metadata layout or fingerprint store are free in the allocator (fsck --repair rebuilds the allocator and the fingerprint groups)",
                h.engine_free
            ));
        }
    }
    // Engine-side view: every distinct referenced block must be counted as in use, and so
    // must a block whose last reference a record dropped that is not durable yet (a block
    // file's release waits for the next sync), or that a failed append holds.
    let pending: Vec<u64> = fs.unmapped_refs();
    let es = fs.engine().stats();
    let physical_blocks = es.physical_bytes / BLOCK_SIZE as u64;
    let unmapped: FxHashSet<u64> = pending
        .iter()
        .copied()
        .filter(|b| bounds.allows(*b) && !mapped.contains(b))
        .collect();
    let held = rep.distinct_blocks + unmapped.len() as u64;
    if physical_blocks != held {
        rep.problems.push(format!(
            "engine counts {physical_blocks} data blocks in use, block maps reference {} distinct blocks{}",
            rep.distinct_blocks,
            if held > rep.distinct_blocks {
                format!(
                    " and references not in a map yet (releases waiting for a sync, failed appends) {} more",
                    held - rep.distinct_blocks
                )
            } else {
                String::new()
            }
        ));
    }
    if es.free_blocks > es.total_blocks {
        rep.problems.push(format!(
            "allocator: {} free blocks of {} total",
            es.free_blocks, es.total_blocks
        ));
    }
    // Per block: a count below the references lets an unlink free a block another file still
    // maps, so the distinct-block total above is not enough.
    rep.problems.extend(refcount_problems(fs, &pending));
    // The policy's on-media fingerprint groups (`smart`): only a finding aid, but damage on
    // the image all the same; failure recovery rebuilds them.
    rep.problems.extend(fs.engine().store_problems());
    if repair && !rep.problems.is_empty() {
        let report = fs.recover_engine()?;
        rep.repaired.push(format!(
            "rebuilt reference counts: {} fixed, {} entries recreated, {} entries invalidated, {} leaked blocks freed",
            report.refcounts_fixed,
            report.entries_recreated,
            report.entries_invalidated,
            report.leaked_blocks_freed
        ));
        rep.problems.clear();
        let es = fs.engine().stats();
        if es.physical_bytes / BLOCK_SIZE as u64 != rep.distinct_blocks {
            rep.problems.push(format!(
                "after repair the engine still counts {} data blocks, maps reference {}",
                es.physical_bytes / BLOCK_SIZE as u64,
                rep.distinct_blocks
            ));
        }
        rep.problems.extend(refcount_problems(fs, &[]));
        rep.problems.extend(fs.engine().store_problems());
    }
    Ok(rep)
}

/// Problems of the inode table alone, what an open refuses in a checkpoint: the tree, link
/// counts, and block maps inside the data area, off the checkpoint, the log and the engine's
/// metadata layout, before their files' ends. (A block free in the allocator, held by a
/// `smart` group too, or counted once and mapped twice, is for [`check`]: blocks the file
/// system took from free space since the open, its reserve, do not count here.)
pub fn check_tree(fs: &FileSystem) -> Vec<String> {
    let (start, len) = fs.engine().data_area();
    let mut meta: FxHashSet<u64> = fs.meta_blocks().into_iter().collect();
    for b in fs.meta.lock().reserve.iter().chain(&fs.log.lock().spare) {
        meta.remove(b);
    }
    meta.extend(fs.engine().layout_blocks());
    fs.with_tables(|t| table_problems(t, start..start + len, &meta))
}

/// What [`check_tables`] finds wrong with `t`, block maps held to the data area `data` and off
/// the metadata blocks `meta` (the open's check of a version-1 checkpoint, fsck's of the
/// checkpoint as loaded, [`check_tree`]).
pub(crate) fn table_problems(
    t: &Tables,
    data: std::ops::Range<u64>,
    meta: &FxHashSet<u64>,
) -> Vec<String> {
    let mut rep = FsckReport::default();
    check_tables(t, &Bounds { data, meta }, &mut rep, false);
    rep.problems
}

/// What [`block_holders`] found, in blocks; each count but `unlisted` is a problem.
struct Holding {
    /// Allocated blocks of the data area that nothing holds, beyond `unlisted`.
    leaked: u64,
    /// Extra holds of blocks the engine holds: by a file, the file system's metadata or a
    /// deferred release too, or listed twice by the engine (a block with three holders counts
    /// two).
    twice: u64,
    /// Blocks the engine holds that are free in the allocator.
    engine_free: u64,
    /// Blocks of damaged fingerprint groups that could not be listed (held, but not known
    /// which): a leak no larger than this cannot be told from them.
    unlisted: u64,
}

/// Who holds each block of the data area: files, the file system's metadata, releases
/// deferred to the next sync, the metadata layout's regions and the fingerprint store's
/// blocks (the blocks of a `smart` group dropped as damaged are no longer the store's: they
/// show as leaked until failure recovery or --repair rebuilds the allocator). Block by block,
/// so a leak and a block held twice cannot hide each other. Taken under the gate, so no file
/// operation moves blocks in between; a mount's background work (deferred releases at sync, a
/// checkpoint's writes) runs outside the gate, so on a live mount the figures are only as good
/// as its quiet moment. A file's reference `bounds` refuses is the table check's to report (one
/// onto a region of the metadata layout would otherwise count as held twice too).
fn block_holders(fs: &FileSystem, bounds: &Bounds) -> Holding {
    let eng = fs.engine();
    let alloc = eng.allocator();
    let (start, len) = eng.data_area();
    let _g = fs.gate.write();
    let mut held: HashSet<u64> = fs
        .tables
        .read()
        .data_refs()
        .into_iter()
        .filter(|&b| bounds.allows(b))
        .collect();
    held.extend(fs.meta_blocks());
    held.extend(fs.unmapped_refs());
    let mut h = Holding {
        leaked: 0,
        twice: 0,
        engine_free: 0,
        unlisted: 0,
    };
    // The store's blocks and the allocator are copied together, while the store can neither
    // take blocks nor give any back; the counting happens after its lock is released.
    let mut engine = Vec::new();
    let mut snap = Bitmap::new(0);
    eng.with_engine_owned_blocks(&mut |blocks, unlisted| {
        engine.extend_from_slice(blocks);
        snap = alloc.snapshot();
        h.unlisted = unlisted;
    });
    // The snapshot counts from the allocator's first block.
    let first = alloc.start();
    let allocated = |b: u64| {
        b.checked_sub(first)
            .is_some_and(|i| i < snap.len() as u64 && snap.get(i as usize))
    };
    let mut engine_held = HashSet::with_capacity(engine.len());
    for b in engine {
        if held.contains(&b) || !engine_held.insert(b) {
            h.twice += 1;
        } else if !allocated(b) {
            h.engine_free += 1;
        }
    }
    let loose = (start..start + len)
        .filter(|&b| allocated(b) && !held.contains(&b) && !engine_held.contains(&b))
        .count() as u64;
    h.leaked = loose.saturating_sub(h.unlisted);
    h
}

/// Detailed messages kept per kind of refcount problem (the rest are only counted).
const MAX_REFCOUNT_MESSAGES: usize = 16;

/// Compare each referenced block's engine reference count with its references in the block
/// maps and in `pending` (releases waiting for a sync, references held for failed appends; a
/// block without an entry counts as one reference); one message per mismatch, capped.
fn refcount_problems(fs: &FileSystem, pending: &[u64]) -> Vec<String> {
    let (start, len) = fs.engine().data_area();
    let mut count: HashMap<u64, u64> = HashMap::new();
    fs.with_tables(|t| {
        for b in t.data_refs().into_iter().chain(pending.iter().copied()) {
            // Blocks outside the data area are reported by the block-map check already.
            if b >= start && b < start + len {
                *count.entry(b).or_default() += 1;
            }
        }
    });
    let mut blocks: Vec<(u64, u64)> = count.into_iter().collect();
    blocks.sort_unstable();
    let mut out = Vec::new();
    let mut bad = 0usize;
    for (b, n) in blocks {
        let msg = match fs.engine().block_refcount(b) {
            Ok(Some(rc)) if rc == n => continue,
            Ok(None) if n == 1 => continue,
            Ok(Some(rc)) => format!("block {b}: reference count {rc}, {n} references"),
            Ok(None) => format!("block {b}: no dedup entry (count 1), {n} references"),
            Err(e) => format!("block {b}: reference count unreadable: {e}"),
        };
        bad += 1;
        if out.len() < MAX_REFCOUNT_MESSAGES {
            out.push(msg);
        }
    }
    if bad > out.len() {
        out.push(format!(
            "{} more blocks with a wrong reference count",
            bad - out.len()
        ));
    }
    out
}

/// Where a block map may point: inside the engine's data area, not at a block of the file
/// system's own metadata.
pub(crate) struct Bounds<'a> {
    pub data: std::ops::Range<u64>,
    pub meta: &'a FxHashSet<u64>,
}

impl Bounds<'_> {
    /// True when a block map may point at `b`.
    pub(crate) fn allows(&self, b: u64) -> bool {
        self.data.contains(&b) && !self.meta.contains(&b)
    }
}

/// Check the inode table: one tree from the root (every directory reached by exactly one
/// entry, its parent pointer naming that directory), link counts, no inode unreachable, no
/// entry dangling, block maps inside `bounds` and their files. Problems go to `rep`; with
/// `repair`, returns a fixed copy of the table. The open runs it on a version-1 checkpoint and
/// fsck's open on the checkpoint as loaded (a version-2 checkpoint is held to the same rules
/// by `persist::load::Tree` as it loads).
pub(crate) fn check_tables(
    t: &Tables,
    bounds: &Bounds,
    rep: &mut FsckReport,
    repair: bool,
) -> Option<Tables> {
    let mut problems = Vec::new();
    let mut links: FxHashMap<u64, u32> = FxHashMap::default();
    let mut subdirs: FxHashMap<u64, u32> = FxHashMap::default();
    // Entries to remove: pointing at no inode, or a second name of a directory.
    let mut drop_entries: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut wrong_parent: Vec<(u64, u64)> = Vec::new();
    let mut seen_dirs: FxHashSet<u64> = FxHashSet::default();
    let mut queue = VecDeque::from([ROOT_INO]);
    seen_dirs.insert(ROOT_INO);
    match t.get(ROOT_INO) {
        None => problems.push("root directory missing".to_string()),
        Some(r) => {
            if r.read().dir().is_some_and(|d| d.parent != ROOT_INO) {
                problems.push(format!(
                    "directory {ROOT_INO}: parent pointer is not {ROOT_INO}"
                ));
                wrong_parent.push((ROOT_INO, ROOT_INO));
            }
        }
    }
    while let Some(d) = queue.pop_front() {
        let Some(node) = t.get(d) else { continue };
        let n = node.read();
        let Some(dir) = n.dir() else {
            problems.push(format!("inode {d} is used as a directory but is not one"));
            continue;
        };
        for (name, child) in dir.iter() {
            let Some(c) = t.get(child) else {
                problems.push(format!(
                    "entry {:?} in directory {d} points at missing inode {child}",
                    String::from_utf8_lossy(name)
                ));
                drop_entries.push((d, name.to_vec()));
                continue;
            };
            let cn = c.read();
            if cn.attr.kind == Kind::Dir {
                if !seen_dirs.insert(child) {
                    problems.push(format!(
                        "directory {child} has more than one parent (entry {:?} in directory {d})",
                        String::from_utf8_lossy(name)
                    ));
                    drop_entries.push((d, name.to_vec()));
                    continue;
                }
                *subdirs.entry(d).or_default() += 1;
                if cn.dir().map(|x| x.parent) != Some(d) {
                    problems.push(format!("directory {child}: parent pointer is not {d}"));
                    wrong_parent.push((child, d));
                }
                queue.push_back(child);
            } else {
                *links.entry(child).or_default() += 1;
            }
        }
    }
    let mut bad_refs: Vec<(u64, u64)> = Vec::new();
    let mut unreachable = Vec::new();
    let mut wrong_nlink = Vec::new();
    for (&ino, node) in &t.inodes {
        let n = node.read();
        rep.inodes += 1;
        let expect = match n.attr.kind {
            Kind::Dir => {
                rep.directories += 1;
                if !seen_dirs.contains(&ino) {
                    unreachable.push(ino);
                    continue;
                }
                2 + subdirs.get(&ino).copied().unwrap_or(0)
            }
            _ => {
                rep.files += 1;
                let l = links.get(&ino).copied().unwrap_or(0);
                // A root that is not a directory was reported above; removing it would leave
                // no tree at all.
                if l == 0 && ino != ROOT_INO {
                    unreachable.push(ino);
                    continue;
                }
                l
            }
        };
        if n.attr.nlink != expect {
            problems.push(format!(
                "inode {ino}: link count {} but {expect} links",
                n.attr.nlink
            ));
            wrong_nlink.push((ino, expect));
        }
        if let Some(m) = n.map() {
            for (fb, b) in m.iter() {
                rep.block_refs += 1;
                if !bounds.allows(b) {
                    problems.push(format!(
                        "inode {ino} block {fb}: invalid physical block {b}"
                    ));
                    bad_refs.push((ino, fb));
                } else if fb >= n.attr.size.div_ceil(BLOCK_SIZE as u64) {
                    problems.push(format!(
                        "inode {ino}: block {fb} mapped beyond the end of file"
                    ));
                    bad_refs.push((ino, fb));
                }
            }
        }
    }
    for ino in &unreachable {
        problems.push(format!("inode {ino} is not reachable from the root"));
    }
    rep.problems.extend(problems);
    if !repair || rep.problems.is_empty() {
        return None;
    }
    // Repair on a copy of the table: drop dangling entries, second names of directories and
    // bad references, fix parent pointers and link counts, and unreachable inodes go away
    // (their blocks are released by the recovery).
    let fixed = t.deep_copy();
    for (d, name) in drop_entries {
        if let Some(n) = fixed.get(d) {
            n.write().dir_mut().map(|x| x.remove(&name));
        }
        rep.repaired.push(format!(
            "removed entry {:?} in directory {d}",
            String::from_utf8_lossy(&name)
        ));
    }
    for (dir, parent) in wrong_parent {
        if let Some(n) = fixed.get(dir) {
            if let Some(x) = n.write().dir_mut() {
                x.parent = parent;
            }
        }
        rep.repaired
            .push(format!("set parent pointer of directory {dir} to {parent}"));
    }
    for (ino, fb) in bad_refs {
        if let Some(n) = fixed.get(ino) {
            n.write().map_mut().map(|m| m.set(fb, 0));
        }
        rep.repaired
            .push(format!("unmapped invalid block {fb} of inode {ino}"));
    }
    for (ino, nl) in wrong_nlink {
        if let Some(n) = fixed.get(ino) {
            n.write().attr.nlink = nl;
        }
        rep.repaired
            .push(format!("set link count of inode {ino} to {nl}"));
    }
    let mut fixed = fixed;
    for ino in unreachable {
        fixed.remove_inode(ino);
        rep.repaired
            .push(format!("removed unreachable inode {ino}"));
    }
    Some(fixed)
}

/// Distinct data blocks inside `bounds` the block maps of `t` reference (what the engine
/// should count in use; the others are reported as invalid).
fn distinct_blocks(t: &Tables, bounds: &Bounds) -> FxHashSet<u64> {
    let mut d = FxHashSet::default();
    for node in t.inodes.values() {
        if let Some(m) = node.read().map() {
            d.extend(m.blocks().filter(|&b| bounds.allows(b)));
        }
    }
    d
}
