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
use nodup_core::media::Medium;
use nodup_core::BlockNr;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// A checkpoint as loaded.
pub struct Loaded {
    /// The inode table (nothing marked changed; every unit's location known).
    pub tables: Tables,
    /// Blocks of the manifest chain.
    pub manifest_blocks: Vec<BlockNr>,
    /// Units read that are no longer current (older copies, deleted inodes).
    pub dead_units: u64,
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

/// Load the checkpoint whose manifest is chain `gen` at `head`.
pub fn load(m: &dyn Medium, head: BlockNr, gen: u64) -> Result<Loaded> {
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
    build(&mut u, &mut t, &mut segs)?;
    u.dead += (u.heads.len() + u.maps.len() + u.dirs.len()) as u64;
    *persist.segs.lock() = segs;
    Ok(Loaded {
        tables: t,
        manifest_blocks,
        dead_units: u.dead,
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

fn build(u: &mut Units, t: &mut Tables, segs: &mut SegTable) -> Result<()> {
    let mut queue = VecDeque::from([(ROOT_INO, ROOT_INO)]);
    let mut seen = HashSet::from([ROOT_INO]);
    let mut max_ino = ROOT_INO;
    while let Some((ino, from)) = queue.pop_front() {
        let hraw = u.heads.remove(&ino).ok_or_else(|| {
            corrupt(format!(
                "directory {from} has an entry for inode {ino}, which has no head"
            ))
        })?;
        let h = unit::decode_head(u.body(&hraw))?;
        let hloc = hraw.loc;
        max_ino = max_ino.max(ino);
        let mut n = Inode::new(ino, h.attr.clone(), ROOT_INO, b"");
        n.xattrs = h.xattrs;
        n.ck.head = Some(hloc);
        live(segs, hloc);
        match h.body {
            HeadBody::File { units, first } => {
                if h.attr.kind != Kind::File {
                    return Err(corrupt(format!("inode {ino}: head kind mismatch")));
                }
                let mut map = BlockMap::default();
                put_map(&mut map, 0, &first);
                for k in units {
                    let raw = u
                        .maps
                        .remove(&(ino, k))
                        .ok_or_else(|| corrupt(format!("inode {ino}: map unit {k} missing")))?;
                    put_map(&mut map, k, &unit::decode_map_unit(u.body(&raw))?);
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
                let mut d = Directory::new(parent);
                d.set_next_cookie(next_cookie);
                let mut add = |d: &mut Directory, e: DirEntries| -> Result<()> {
                    for (c, name, child) in e {
                        if !d.load_entry(name, child, c) {
                            return Err(corrupt(format!("directory {ino}: duplicate entry")));
                        }
                        if seen.insert(child) {
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

fn put_map(map: &mut BlockMap, unit: u64, e: &MapEntries) {
    let base = unit_start(unit);
    for &(i, b) in e {
        map.set(base + i as u64, b);
    }
}
