//! Loading a version-2 checkpoint: the manifest, then every segment newest first (the first
//! copy of a unit seen is the current one), then the inode table built from the root through
//! the directory entries. Memory: one segment's payload at a time plus the decoded units.

use super::manifest::Manifest;
use super::unit::{self, DirEntries, HeadBody, MapEntries, UnitKind};
use super::{Loc, Persist, SegInfo, SegTable};
use crate::blockmap::{unit_start, BlockMap};
use crate::chain::{read_chain, ChainKind};
use crate::dir::{Directory, UNIT_COOKIES};
use crate::error::{FsError, Result};
use crate::inode::{Body, Inode, Kind, ROOT_INO};
use crate::state::Tables;
use nodup_core::alloc::bitmap::Bitmap;
use nodup_core::media::Medium;
use nodup_core::BlockNr;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::sync::Arc;

const BS: u64 = nodup_core::BLOCK_SIZE as u64;

/// A checkpoint as loaded.
pub struct Loaded {
    /// The inode table (nothing marked changed; every unit's location known).
    pub tables: Tables,
    /// Blocks of the manifest chain.
    pub manifest_blocks: Vec<BlockNr>,
    /// Units read that are no longer current (older copies, deleted inodes).
    pub dead_units: u64,
    /// Loaded with bounds: the data-area blocks some block map points at, by offset from the
    /// area's start (the open checks the engine's own blocks against it once the engine is
    /// open: the two are read side by side).
    pub mapped: Option<Bitmap>,
}

fn corrupt(m: String) -> FsError {
    FsError::Corrupt(format!("checkpoint: {m}"))
}

/// Read the manifest chain `gen` at `head`.
pub fn read_manifest(m: &dyn Medium, head: BlockNr, gen: u64) -> Result<(Manifest, Vec<BlockNr>)> {
    let (blocks, payload) = read_chain(m, head, ChainKind::Manifest, gen, u64::MAX)?;
    if blocks.is_empty() {
        return Err(corrupt("manifest not found".into()));
    }
    Ok((Manifest::decode(&payload)?, blocks))
}

/// Read segment `s` of a manifest: its blocks and exactly its payload bytes.
pub fn read_segment(
    m: &dyn Medium,
    s: &super::manifest::SegRef,
) -> Result<(Vec<BlockNr>, Vec<u8>)> {
    let (blocks, payload) = read_chain(m, s.head, ChainKind::Segment, s.gen, s.bytes as u64)?;
    if blocks.len() != s.blocks as usize || payload.len() != s.bytes as usize {
        return Err(corrupt(format!(
            "segment {} is {} blocks / {} bytes, the manifest says {} / {}",
            s.gen,
            blocks.len(),
            payload.len(),
            s.blocks,
            s.bytes
        )));
    }
    Ok((blocks, payload))
}

/// A hasher for the loader's integer keys (inode numbers, unit indices): one multiply, where
/// the default SipHash was a tenth of the load time.
#[derive(Default, Clone, Copy)]
struct IntHasher(u64);

impl std::hash::Hasher for IntHasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x100_0000_01B3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(29) ^ v).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    }
}

type IntMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<IntHasher>>;
type IntSet = HashSet<u64, std::hash::BuildHasherDefault<IntHasher>>;

/// Where the current copy of a unit is: segment (index into the payloads), byte range of its
/// body, and its location for the live-bytes accounting.
#[derive(Clone, Copy)]
struct Raw {
    seg: u32,
    start: u32,
    end: u32,
    loc: Loc,
}

/// The newest copy of every unit, found by a pass over all segments (newest first) that only
/// checks frames; bodies are decoded once, when the inode is reached from the root.
#[derive(Default)]
struct Units {
    payloads: Vec<Vec<u8>>,
    heads: IntMap<u64, Raw>,
    maps: IntMap<(u64, u64), Raw>,
    dirs: IntMap<(u64, u64), Raw>,
    dead: u64,
}

impl Units {
    fn body(&self, r: &Raw) -> &[u8] {
        &self.payloads[r.seg as usize][r.start as usize..r.end as usize]
    }
}

/// What a loaded tree is checked against.
pub struct Bounds {
    /// The engine's data area, where every mapped block lies.
    pub data: Range<BlockNr>,
    /// Metadata blocks besides the checkpoint's own that no block map may point at (the
    /// log's first block: a clean image's whole log; replayed records bring failure recovery,
    /// which checks every reference against the whole log).
    pub meta: Vec<BlockNr>,
}

/// Load the checkpoint whose manifest is chain `gen` at `head`. With `bounds`, what the units
/// say together is checked as well ([`Tree`]); fsck loads without and runs its own table
/// check, which reports and repairs the same problems.
pub fn load(m: &dyn Medium, head: BlockNr, gen: u64, bounds: Option<Bounds>) -> Result<Loaded> {
    let (man, manifest_blocks) = read_manifest(m, head, gen)?;
    let mut segs = SegTable::new();
    let mut u = Units::default();
    for s in man.segs.iter().rev() {
        let (blocks, payload) = read_segment(m, s)?;
        let seg = u.payloads.len() as u32;
        let mut at = 0usize;
        unit::for_each_unit(&payload, &mut |r| {
            let raw = Raw {
                seg,
                start: (at + unit::UNIT_HEADER) as u32,
                end: (at + r.len as usize) as u32,
                loc: Loc {
                    gen: s.gen,
                    bytes: r.len,
                },
            };
            at += r.len as usize;
            let fresh = match r.kind {
                UnitKind::Head => u.heads.try_insert_raw(r.ino, raw),
                UnitKind::Map => u.maps.try_insert_raw((r.ino, r.unit), raw),
                UnitKind::Dir => u.dirs.try_insert_raw((r.ino, r.unit), raw),
            };
            if !fresh {
                u.dead += 1;
            }
            Ok(())
        })?;
        u.payloads.push(payload);
        segs.insert(
            s.gen,
            SegInfo {
                blocks,
                bytes: s.bytes,
                live: 0,
            },
        );
    }
    let persist = Arc::new(Persist::default());
    let mut t = Tables {
        inodes: HashMap::with_capacity(u.heads.len()),
        next_ino: man.next_ino,
        persist: persist.clone(),
    };
    let mut tree = bounds.map(|b| {
        let mut tree = Tree::new(b.data);
        let ckpt = segs.values().flat_map(|s| &s.blocks);
        for &m in ckpt.chain(&manifest_blocks).chain(&b.meta) {
            tree.hold(m);
        }
        tree
    });
    build(&mut u, &mut t, &mut segs, tree.as_mut())?;
    let mapped = tree.map(Tree::finish).transpose()?;
    u.dead += (u.heads.len() + u.maps.len() + u.dirs.len()) as u64;
    *persist.segs.lock() = segs;
    Ok(Loaded {
        tables: t,
        manifest_blocks,
        dead_units: u.dead,
        mapped,
    })
}

/// Insert when the key is new (the first copy seen, newest first, is the current one).
trait TryInsertRaw<K> {
    fn try_insert_raw(&mut self, k: K, raw: Raw) -> bool;
}

impl<K: std::hash::Hash + Eq> TryInsertRaw<K> for IntMap<K, Raw> {
    fn try_insert_raw(&mut self, k: K, raw: Raw) -> bool {
        match self.entry(k) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(raw);
                true
            }
        }
    }
}

fn live(segs: &mut SegTable, loc: Loc) {
    if let Some(s) = segs.get_mut(&loc.gen) {
        s.live += loc.bytes as u64;
    }
}

/// The checks of a loaded tree that no single unit can show, made while the loader walks it
/// (a second walk over the table cost a third of the load on a tree of 200 000 files): the
/// same rules as fsck's table check, refused with its wording and the way out.
pub struct Tree {
    data: Range<BlockNr>,
    /// Metadata blocks (the checkpoint's and the log's first), by offset in the data area.
    meta: Bitmap,
    /// Blocks some block map points at, by offset in the data area.
    mapped: Bitmap,
    /// Entries naming each inode (the root starts at 0: any entry naming it is one too many).
    links: IntMap<u64, u32>,
    /// Subdirectories of each directory, counted through the parent pointers (each checked
    /// against the entry that reached the directory).
    subdirs: IntMap<u64, u32>,
    /// (inode, link count, is a directory) of every inode loaded.
    nlinks: Vec<(u64, u32, bool)>,
}

impl Tree {
    fn new(data: Range<BlockNr>) -> Tree {
        let len = data.end.saturating_sub(data.start);
        let bits = usize::try_from(len).unwrap_or(usize::MAX);
        let mut t = Tree {
            meta: Bitmap::new(bits),
            mapped: Bitmap::new(bits),
            data,
            links: IntMap::default(),
            subdirs: IntMap::default(),
            nlinks: Vec::new(),
        };
        t.links.insert(ROOT_INO, 0);
        t
    }

    /// Block `b` is metadata (of the checkpoint or the log).
    fn hold(&mut self, b: BlockNr) {
        if self.data.contains(&b) {
            self.meta.set((b - self.data.start) as usize);
        }
    }

    /// An entry names `child`; true when it is the first (the walk goes on into it).
    fn entry(&mut self, child: u64) -> bool {
        let n = self.links.entry(child).or_insert(0);
        *n += 1;
        *n == 1 && child != ROOT_INO
    }

    /// Inode `ino`, reached from directory `from`, is a directory whose parent pointer is
    /// `parent`.
    fn dir(&mut self, ino: u64, from: u64, parent: u64) -> Result<()> {
        if parent != from {
            return refuse(format!("directory {ino}: parent pointer is not {from}"));
        }
        if ino != ROOT_INO {
            *self.subdirs.entry(from).or_insert(0) += 1;
        }
        Ok(())
    }

    /// File block `fb` of inode `ino` (of `size` bytes) maps physical block `b`.
    fn block(&mut self, ino: u64, size: u64, fb: u64, b: BlockNr) -> Result<()> {
        let at = b.wrapping_sub(self.data.start) as usize;
        let ok = self.data.contains(&b) && !self.meta.get(at);
        if !ok {
            return refuse(format!(
                "inode {ino} block {fb}: invalid physical block {b}"
            ));
        }
        if fb >= size.div_ceil(BS) {
            return refuse(format!(
                "inode {ino}: block {fb} mapped beyond the end of file"
            ));
        }
        self.mapped.set(at);
        Ok(())
    }

    /// After the walk: every directory has one name (the root none), every link count is the
    /// number of names (a directory's: two plus its subdirectories). Returns the blocks mapped.
    fn finish(self) -> Result<Bitmap> {
        for &(ino, nlink, is_dir) in &self.nlinks {
            let names = self.links.get(&ino).copied().unwrap_or(0);
            let expect = if is_dir {
                if names != u32::from(ino != ROOT_INO) {
                    return refuse(format!("directory {ino} has more than one parent"));
                }
                2 + self.subdirs.get(&ino).copied().unwrap_or(0)
            } else {
                names
            };
            if nlink != expect {
                return refuse(format!(
                    "inode {ino}: link count {nlink} but {expect} links"
                ));
            }
        }
        Ok(self.mapped)
    }
}

/// Refuse the checkpoint for `problem`, which fsck --repair fixes.
fn refuse<T>(problem: String) -> Result<T> {
    Err(corrupt(format!(
        "{problem}; `nodup fsck --repair` repairs it"
    )))
}

fn build(
    u: &mut Units,
    t: &mut Tables,
    segs: &mut SegTable,
    mut tree: Option<&mut Tree>,
) -> Result<()> {
    let mut queue = VecDeque::from([(ROOT_INO, ROOT_INO)]);
    // Without the tree checks, the inodes the walk has reached (with them, `Tree::entry`).
    let mut seen: IntSet = IntSet::default();
    seen.insert(ROOT_INO);
    let mut max_ino = ROOT_INO;
    while let Some((ino, from)) = queue.pop_front() {
        let Some(hraw) = u.heads.remove(&ino) else {
            if ino != ROOT_INO && tree.is_none() {
                // fsck: the entry stays, pointing at no inode, for its table check to report
                // and --repair to remove.
                continue;
            }
            let what = format!("directory {from} has an entry for inode {ino}, which has no head");
            return if ino == ROOT_INO {
                Err(corrupt(what))
            } else {
                refuse(what)
            };
        };
        let h = unit::decode_head(u.body(&hraw))?;
        if ino == ROOT_INO && h.attr.kind != Kind::Dir {
            // Nothing to repair towards: fsck refuses it too.
            return Err(corrupt("the root is not a directory".into()));
        }
        let hloc = hraw.loc;
        max_ino = max_ino.max(ino);
        let mut n = Inode::new(ino, h.attr.clone(), ROOT_INO, b"");
        n.xattrs = h.xattrs;
        n.ck.head = Some(hloc);
        live(segs, hloc);
        if let Some(tr) = tree.as_deref_mut() {
            tr.nlinks
                .push((ino, h.attr.nlink, h.attr.kind == Kind::Dir));
        }
        match h.body {
            HeadBody::File { units, first } => {
                if h.attr.kind != Kind::File {
                    return Err(corrupt(format!("inode {ino}: head kind mismatch")));
                }
                // Where this file's blocks may point, when the tree is checked.
                let mut check = tree.as_deref_mut().map(|tr| (tr, ino, h.attr.size));
                let mut map = BlockMap::default();
                put_map(&mut map, 0, &first, &mut check)?;
                for k in units {
                    let raw = u
                        .maps
                        .remove(&(ino, k))
                        .ok_or_else(|| corrupt(format!("inode {ino}: map unit {k} missing")))?;
                    put_map(
                        &mut map,
                        k,
                        &unit::decode_map_unit(u.body(&raw))?,
                        &mut check,
                    )?;
                    n.ck.units.insert(k, raw.loc);
                    live(segs, raw.loc);
                }
                map.dirty.take();
                n.body = Body::File(map);
            }
            HeadBody::Dir {
                parent,
                next_cookie,
                units,
                first,
            } => {
                if let Some(tr) = tree.as_deref_mut() {
                    tr.dir(ino, from, parent)?;
                }
                let mut d = Directory::new(parent);
                d.set_next_cookie(next_cookie);
                let mut add = |d: &mut Directory, e: DirEntries| -> Result<()> {
                    for (c, name, child) in e {
                        if !d.load_entry(name, child, c) {
                            return Err(corrupt(format!("directory {ino}: duplicate entry")));
                        }
                        let first = match tree.as_deref_mut() {
                            Some(tr) => tr.entry(child),
                            None => seen.insert(child),
                        };
                        if first {
                            queue.push_back((child, ino));
                        }
                    }
                    Ok(())
                };
                add(&mut d, first)?;
                for k in units {
                    if k >= next_cookie.div_ceil(UNIT_COOKIES) {
                        return Err(corrupt(format!(
                            "directory {ino}: unit {k} past its cookies"
                        )));
                    }
                    let raw = u
                        .dirs
                        .remove(&(ino, k))
                        .ok_or_else(|| corrupt(format!("directory {ino}: unit {k} missing")))?;
                    add(&mut d, unit::decode_dir_unit(u.body(&raw), k)?)?;
                    n.ck.units.insert(k, raw.loc);
                    live(segs, raw.loc);
                }
                d.dirty.take();
                n.body = Body::Dir(d);
            }
            HeadBody::Symlink(target) => n.body = Body::Symlink(target),
            HeadBody::Special => {}
        }
        t.inodes.insert(ino, Arc::new(parking_lot::RwLock::new(n)));
    }
    t.next_ino = t.next_ino.max(max_ino + 1);
    Ok(())
}

/// Put map unit `unit`'s entries into `map`; `check` = (tree, inode, size) checks each.
fn put_map(
    map: &mut BlockMap,
    unit: u64,
    e: &MapEntries,
    check: &mut Option<(&mut Tree, u64, u64)>,
) -> Result<()> {
    let base = unit_start(unit);
    for &(i, b) in e {
        let fb = base + i as u64;
        if let Some((tr, ino, size)) = check {
            tr.block(*ino, *size, fb, b)?;
        }
        map.set(fb, b);
    }
    Ok(())
}
