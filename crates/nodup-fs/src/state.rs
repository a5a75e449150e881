//! The in-DRAM metadata state (the inode table) and how a log record changes it.
//!
//! The running file system and log replay share these apply functions, so replaying the log
//! reproduces exactly the state that was live when the records were appended.

use crate::acl::{self, ACL_ACCESS, ACL_DEFAULT};
use crate::error::Result;
use crate::inode::{Inode, Kind, ROOT_INO};
use crate::log::check::{self, corrupt};
use crate::log::record::Record;
use crate::persist::Persist;
use nodup_core::BlockNr;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;

/// A shared, individually locked inode.
pub type InodeRef = Arc<RwLock<Inode>>;

/// Every inode by number, plus the next inode number to hand out. Every change made through
/// [`Tables::apply`] and [`apply_inode`] is recorded in `persist` for the next checkpoint.
#[derive(Default)]
pub struct Tables {
    pub inodes: HashMap<u64, InodeRef>,
    pub next_ino: u64,
    pub persist: Arc<Persist>,
}

/// Units marked changed in an inode's map or directory.
fn dirty_units(n: &Inode) -> usize {
    n.unit_dirt().map_or(0, |d| d.len())
}

/// Apply `f` to `n` and record the change for the next checkpoint.
fn changing<R>(p: &Persist, n: &mut Inode, f: impl FnOnce(&mut Inode) -> R) -> R {
    let before = dirty_units(n);
    let r = f(n);
    let after = dirty_units(n);
    p.touch(n, after.saturating_sub(before));
    r
}

/// What applying a record did beyond the DRAM state: references to give back to the engine and
/// the change in mapped file blocks (for `logical_bytes`).
#[derive(Debug, Default)]
pub struct Effects {
    pub released: Vec<BlockNr>,
    pub mapped_delta: i64,
}

impl Effects {
    fn merge(&mut self, o: Effects) {
        self.released.extend(o.released);
        self.mapped_delta += o.mapped_delta;
    }
}

impl Tables {
    /// The inode `ino`.
    pub fn get(&self, ino: u64) -> Option<InodeRef> {
        self.inodes.get(&ino).cloned()
    }

    /// The inode `ino`; a record naming one that does not exist is corrupt.
    pub(crate) fn need(&self, ino: u64) -> Result<InodeRef> {
        self.get(ino)
            .ok_or_else(|| corrupt(&format!("missing inode {ino}")))
    }

    /// Insert a fully built inode (checkpoint load, mkfs).
    pub fn insert(&mut self, node: Inode) {
        self.next_ino = self.next_ino.max(node.ino + 1);
        self.inodes.insert(node.ino, Arc::new(RwLock::new(node)));
    }

    /// Remove inode `ino` from the table; its persisted units stop being current.
    pub fn remove_inode(&mut self, ino: u64) -> Option<InodeRef> {
        let node = self.inodes.remove(&ino)?;
        self.persist.remove(&node.read());
        Some(node)
    }

    /// Drop one link of `ino`; deletes the inode when no link and no open handle is left.
    fn drop_link(&mut self, ino: u64, now: crate::inode::Ts) -> Result<Effects> {
        let node = self.need(ino)?;
        let mut n = node.write();
        changing(&self.persist, &mut n, |n| {
            n.attr.nlink = n.attr.nlink.saturating_sub(1);
            if n.attr.kind == Kind::Dir {
                // A removed directory loses both its entry and its "." link.
                n.attr.nlink = 0;
            }
            n.attr.ctime = now;
        });
        let mut eff = Effects::default();
        if n.attr.nlink == 0 && n.open_count == 0 {
            let mapped = n.map().map_or(0, |m| m.mapped());
            eff.released = n.map_mut().map(|m| m.clear()).unwrap_or_default();
            eff.mapped_delta = -(mapped as i64);
            drop(n);
            self.remove_inode(ino);
        }
        Ok(eff)
    }

    /// Apply one record (any kind); one that does not fit the table (see [`check`]) is refused
    /// as corrupt before anything changes.
    pub fn apply(&mut self, rec: &Record) -> Result<Effects> {
        check::namespace(self, rec)?;
        match rec {
            Record::Create {
                parent,
                name,
                ino,
                attr,
                target,
            } => {
                let p = self.need(*parent)?;
                let mut pn = p.write();
                let is_dir = attr.kind == Kind::Dir;
                let inherit = pn
                    .xattrs
                    .get(ACL_DEFAULT)
                    .map(|d| acl::inherited(d, attr.kind, attr.perm))
                    .unwrap_or_default();
                changing(&self.persist, &mut pn, |pn| {
                    if let Some(d) = pn.dir_mut() {
                        d.insert(name, *ino);
                    }
                    if is_dir {
                        pn.attr.nlink = pn.attr.nlink.saturating_add(1);
                    }
                    pn.attr.mtime = attr.ctime;
                    pn.attr.ctime = attr.ctime;
                });
                drop(pn);
                let mut n = Inode::new(*ino, attr.clone(), *parent, target);
                n.xattrs.extend(inherit);
                changing(&self.persist, &mut n, |_| {});
                self.insert(n);
                Ok(Effects::default())
            }
            Record::Link {
                parent,
                name,
                ino,
                now,
            } => {
                let node = self.need(*ino)?;
                let p = self.need(*parent)?;
                changing(&self.persist, &mut node.write(), |n| {
                    n.attr.nlink += 1;
                    n.attr.ctime = *now;
                });
                changing(&self.persist, &mut p.write(), |pn| {
                    if let Some(d) = pn.dir_mut() {
                        d.insert(name, *ino);
                    }
                    pn.attr.mtime = *now;
                    pn.attr.ctime = *now;
                });
                Ok(Effects::default())
            }
            Record::Unlink { parent, name, now } | Record::Rmdir { parent, name, now } => {
                let p = self.need(*parent)?;
                let ino = {
                    let mut pn = p.write();
                    let rmdir = matches!(rec, Record::Rmdir { .. });
                    changing(&self.persist, &mut pn, |pn| {
                        let ino = pn.dir_mut().and_then(|d| d.remove(name));
                        if rmdir {
                            pn.attr.nlink = pn.attr.nlink.saturating_sub(1);
                        }
                        pn.attr.mtime = *now;
                        pn.attr.ctime = *now;
                        ino
                    })
                    .ok_or_else(|| corrupt("a missing entry"))?
                };
                self.drop_link(ino, *now)
            }
            Record::Rename {
                parent,
                name,
                newparent,
                newname,
                now,
            } => {
                let p = self.need(*parent)?;
                let src = p
                    .read()
                    .dir()
                    .and_then(|d| d.get(name))
                    .ok_or_else(|| corrupt("a missing rename source"))?;
                let np = self.need(*newparent)?;
                let old = np.read().dir().and_then(|d| d.get(newname));
                let mut eff = Effects::default();
                if old == Some(src) {
                    return Ok(eff);
                }
                let src_is_dir = self.need(src)?.read().attr.kind == Kind::Dir;
                let ps = &self.persist;
                if let Some(t) = old {
                    let t_is_dir = self.need(t)?.read().attr.kind == Kind::Dir;
                    changing(ps, &mut np.write(), |g| {
                        g.dir_mut().map(|d| d.remove(newname));
                        if t_is_dir {
                            g.attr.nlink = g.attr.nlink.saturating_sub(1);
                        }
                    });
                    eff.merge(self.drop_link(t, *now)?);
                }
                let ps = &self.persist;
                if parent == newparent {
                    // Within one directory the entry keeps its cookie (readdir offsets stay
                    // stable under rename).
                    changing(ps, &mut p.write(), |g| {
                        if let Some(d) = g.dir_mut() {
                            d.rename_in_place(name, newname);
                        }
                        g.attr.mtime = *now;
                        g.attr.ctime = *now;
                    });
                } else {
                    changing(ps, &mut p.write(), |g| {
                        g.dir_mut().map(|d| d.remove(name));
                        g.attr.mtime = *now;
                        g.attr.ctime = *now;
                        if src_is_dir {
                            g.attr.nlink = g.attr.nlink.saturating_sub(1);
                        }
                    });
                    changing(ps, &mut np.write(), |g| {
                        if let Some(d) = g.dir_mut() {
                            d.insert(newname, src);
                        }
                        g.attr.mtime = *now;
                        g.attr.ctime = *now;
                        if src_is_dir {
                            g.attr.nlink = g.attr.nlink.saturating_add(1);
                        }
                    });
                }
                let s = self.need(src)?;
                changing(ps, &mut s.write(), |sg| {
                    sg.attr.ctime = *now;
                    if let Some(d) = sg.dir_mut() {
                        d.parent = *newparent;
                    }
                });
                Ok(eff)
            }
            Record::SetAttr { ino, .. }
            | Record::Write { ino, .. }
            | Record::Truncate { ino, .. }
            | Record::Punch { ino, .. }
            | Record::SetXattr { ino, .. }
            | Record::RemoveXattr { ino, .. }
            | Record::Remap { ino, .. } => {
                let node = self.need(*ino)?;
                let mut n = node.write();
                apply_inode(&mut n, rec, &self.persist)
            }
        }
    }

    /// Inodes without links (unlinked while open), which a clean checkpoint and a reopen drop.
    pub fn unlinked(&self) -> Vec<u64> {
        self.inodes
            .iter()
            .filter(|(_, n)| n.read().attr.nlink == 0)
            .map(|(&i, _)| i)
            .collect()
    }

    /// An independent copy (fsck repairs a copy): same inodes, sharing nothing, with fresh
    /// checkpoint bookkeeping in which every unit is marked changed.
    pub fn deep_copy(&self) -> Tables {
        let persist = Arc::new(Persist::default());
        let mut inodes = HashMap::with_capacity(self.inodes.len());
        for (&ino, n) in &self.inodes {
            let mut c = n.read().clone();
            c.open_count = 0;
            persist.touch_all(&mut c);
            inodes.insert(ino, Arc::new(RwLock::new(c)));
        }
        Tables {
            inodes,
            next_ino: self.next_ino,
            persist,
        }
    }

    /// Some reference (inode, file block, physical block) whose physical block `hit` selects
    /// (which one, when several are, is unspecified).
    pub fn find_ref(&self, hit: impl Fn(BlockNr) -> bool) -> Option<(u64, u64, BlockNr)> {
        for (&ino, node) in &self.inodes {
            let n = node.read();
            if let Some((fb, b)) = n.map().and_then(|m| m.iter().find(|&(_, b)| hit(b))) {
                return Some((ino, fb, b));
            }
        }
        None
    }

    /// Every data-block reference held by files (once per reference).
    pub fn data_refs(&self) -> Vec<BlockNr> {
        let mut v = Vec::new();
        for node in self.inodes.values() {
            let n = node.read();
            if let Some(m) = n.map() {
                v.extend(m.blocks());
            }
        }
        v
    }

    /// Extents of all files: runs of consecutive file blocks on consecutive physical blocks
    /// (what deduplication fragments; SmartDedup §4.5 counts them).
    pub fn extents(&self) -> u64 {
        let mut n = 0;
        for node in self.inodes.values() {
            let g = node.read();
            if let Some(m) = g.map() {
                let mut prev: Option<(u64, BlockNr)> = None;
                for (fb, b) in m.iter() {
                    if prev != Some((fb.wrapping_sub(1), b.wrapping_sub(1))) {
                        n += 1;
                    }
                    prev = Some((fb, b));
                }
            }
        }
        n
    }

    /// Heap bytes of every file's block map.
    pub fn block_map_bytes(&self) -> u64 {
        self.inodes
            .values()
            .map(|n| n.read().map().map_or(0, |m| m.heap_bytes()))
            .sum()
    }

    /// Bytes of the checkpoint's record of where each file-map unit is persisted: one B-tree
    /// entry per unit, [`crate::persist::UNIT_INDEX_BYTES`] each. It grows with the maps, as
    /// they do; the budget figure of `smart` counts it with them.
    pub fn map_index_bytes(&self) -> u64 {
        self.inodes
            .values()
            .map(|n| {
                let g = n.read();
                if g.map().is_some() {
                    g.ck.units.len() as u64 * crate::persist::UNIT_INDEX_BYTES
                } else {
                    0
                }
            })
            .sum()
    }

    /// Total mapped file blocks (logical size in blocks).
    pub fn mapped_blocks(&self) -> u64 {
        self.inodes
            .values()
            .map(|n| n.read().map().map_or(0, |m| m.mapped()))
            .sum()
    }

    /// A table holding only an empty root directory owned by `uid:gid`.
    pub fn with_root(uid: u32, gid: u32) -> Tables {
        let now = crate::inode::Ts::now();
        let attr = crate::inode::Attr {
            kind: Kind::Dir,
            perm: 0o755,
            uid,
            gid,
            nlink: 2,
            size: 0,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
        };
        let mut t = Tables {
            inodes: HashMap::new(),
            next_ino: ROOT_INO + 1,
            persist: Arc::default(),
        };
        let mut root = Inode::new(ROOT_INO, attr, ROOT_INO, b"");
        t.persist.touch(&mut root, 0);
        t.insert(root);
        t
    }
}

/// Apply a record that changes a single inode (attributes, data, xattrs), recording the change
/// in `p` for the next checkpoint.
pub fn apply_inode(n: &mut Inode, rec: &Record, p: &Persist) -> Result<Effects> {
    let before = dirty_units(n);
    let r = apply_inode_inner(n, rec);
    if r.is_ok() {
        let after = dirty_units(n);
        p.touch(n, after.saturating_sub(before));
    }
    r
}

fn apply_inode_inner(n: &mut Inode, rec: &Record) -> Result<Effects> {
    check::inode(n, rec)?;
    let mut eff = Effects::default();
    match rec {
        Record::SetAttr {
            perm,
            uid,
            gid,
            atime,
            mtime,
            ctime,
            ..
        } => {
            // A mode change carries over to the access ACL (chmod).
            if (n.attr.perm ^ *perm) & 0o777 != 0 {
                if let Some(v) = n
                    .xattrs
                    .get(ACL_ACCESS)
                    .and_then(|v| acl::on_chmod(v, *perm))
                {
                    n.xattrs.insert(ACL_ACCESS.to_vec(), v);
                }
            }
            n.attr.perm = *perm;
            n.attr.uid = *uid;
            n.attr.gid = *gid;
            n.attr.atime = *atime;
            n.attr.mtime = *mtime;
            n.attr.ctime = *ctime;
        }
        Record::Write {
            first,
            blocks,
            size,
            mtime,
            ..
        } => {
            let map = n
                .map_mut()
                .ok_or_else(|| corrupt("a write to a non-file"))?;
            let before = map.mapped();
            map.set_run(*first, blocks, &mut eff.released);
            eff.mapped_delta = map.mapped() as i64 - before as i64;
            n.attr.size = *size;
            n.attr.mtime = *mtime;
            n.attr.ctime = *mtime;
        }
        Record::Remap {
            index, from, to, ..
        } => {
            let map = n
                .map_mut()
                .ok_or_else(|| corrupt("a remap of a non-file"))?;
            map.set(*index, *to);
            eff.released.push(*from);
        }
        Record::Truncate {
            size, tail, now, ..
        } => {
            if let Some(map) = n.map_mut() {
                let before = map.mapped();
                let keep = size.div_ceil(nodup_core::BLOCK_SIZE as u64);
                eff.released = map.remove_range(keep, u64::MAX);
                if let Some((fb, b)) = tail {
                    let old = map.set(*fb, *b);
                    if old != 0 {
                        eff.released.push(old);
                    }
                }
                eff.mapped_delta = map.mapped() as i64 - before as i64;
            }
            n.attr.size = *size;
            n.attr.mtime = *now;
            n.attr.ctime = *now;
        }
        Record::Punch {
            start, end, now, ..
        } => {
            let map = n
                .map_mut()
                .ok_or_else(|| corrupt("a punch in a non-file"))?;
            let before = map.mapped();
            eff.released = map.remove_range(*start, *end);
            eff.mapped_delta = map.mapped() as i64 - before as i64;
            n.attr.mtime = *now;
            n.attr.ctime = *now;
        }
        Record::SetXattr {
            name, value, now, ..
        } => {
            // An access ACL sets the mode bits; one the mode says in full is not kept.
            match (name.as_slice() == ACL_ACCESS)
                .then(|| acl::on_set_access(n.attr.perm, value))
                .flatten()
            {
                Some((perm, keep)) => {
                    n.attr.perm = perm;
                    if keep {
                        n.xattrs.insert(name.clone(), value.clone());
                    } else {
                        n.xattrs.remove(name);
                    }
                }
                None => {
                    n.xattrs.insert(name.clone(), value.clone());
                }
            }
            n.attr.ctime = *now;
        }
        Record::RemoveXattr { name, now, .. } => {
            n.xattrs.remove(name);
            n.attr.ctime = *now;
        }
        _ => return Err(corrupt("a namespace record applied to one inode")),
    }
    Ok(eff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::MAX_FILE_BLOCKS;
    use crate::inode::{Attr, Ts};

    fn file() -> Inode {
        Inode::new(7, Attr::test_file(0, 0, Ts { sec: 1, nsec: 0 }), 1, b"")
    }

    /// A write leaving the file at the largest size (so only its range can be wrong).
    fn write(first: u64, blocks: Vec<BlockNr>) -> Record {
        Record::Write {
            ino: 7,
            first,
            blocks,
            size: crate::fs::MAX_FILE_SIZE,
            mtime: Ts { sec: 2, nsec: 0 },
        }
    }

    #[test]
    fn a_write_past_the_largest_file_is_corrupt_and_changes_nothing() {
        let last = MAX_FILE_BLOCKS;
        let mut n = file();
        apply_inode_inner(&mut n, &write(last - 2, vec![5, 6])).unwrap();
        for (first, blocks) in [
            (last - 1, vec![8, 9]),
            (u64::MAX - 1, vec![8, 9]),
            (u64::MAX, vec![8]),
        ] {
            let before = n.clone();
            assert!(apply_inode_inner(&mut n, &write(first, blocks)).is_err());
            assert_eq!(n, before);
        }
    }
}
