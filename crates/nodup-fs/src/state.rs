//! The in-DRAM metadata state (the inode table) and how a log record changes it.
//!
//! The running file system and log replay share these apply functions, so replaying the log
//! reproduces exactly the state that was live when the records were appended.

use crate::error::{FsError, Result};
use crate::inode::{Inode, Kind, ROOT_INO};
use crate::log::record::Record;
use nodup_core::BlockNr;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;

/// A shared, individually locked inode.
pub type InodeRef = Arc<RwLock<Inode>>;

/// Every inode by number, plus the next inode number to hand out.
#[derive(Default)]
pub struct Tables {
    pub inodes: HashMap<u64, InodeRef>,
    pub next_ino: u64,
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

fn corrupt(what: &str) -> FsError {
    FsError::Corrupt(format!("log record refers to {what}"))
}

impl Tables {
    /// The inode `ino`.
    pub fn get(&self, ino: u64) -> Option<InodeRef> {
        self.inodes.get(&ino).cloned()
    }

    fn need(&self, ino: u64) -> Result<InodeRef> {
        self.get(ino)
            .ok_or_else(|| corrupt(&format!("missing inode {ino}")))
    }

    /// Insert a fully built inode (checkpoint load, mkfs).
    pub fn insert(&mut self, node: Inode) {
        self.next_ino = self.next_ino.max(node.ino + 1);
        self.inodes.insert(node.ino, Arc::new(RwLock::new(node)));
    }

    /// Drop one link of `ino`; deletes the inode when no link and no open handle is left.
    fn drop_link(&mut self, ino: u64, now: crate::inode::Ts) -> Result<Effects> {
        let node = self.need(ino)?;
        let mut n = node.write();
        n.attr.nlink = n.attr.nlink.saturating_sub(1);
        if n.attr.kind == Kind::Dir {
            // A removed directory loses both its entry and its "." link.
            n.attr.nlink = 0;
        }
        n.attr.ctime = now;
        let mut eff = Effects::default();
        if n.attr.nlink == 0 && n.open_count == 0 {
            let mapped = n.map().map_or(0, |m| m.mapped());
            eff.released = n.map_mut().map(|m| m.clear()).unwrap_or_default();
            eff.mapped_delta = -(mapped as i64);
            drop(n);
            self.inodes.remove(&ino);
        }
        Ok(eff)
    }

    /// Apply one record (any kind).
    pub fn apply(&mut self, rec: &Record) -> Result<Effects> {
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
                let d = pn
                    .dir_mut()
                    .ok_or_else(|| corrupt("a non-directory parent"))?;
                d.insert(name, *ino);
                if is_dir {
                    pn.attr.nlink += 1;
                }
                pn.attr.mtime = attr.ctime;
                pn.attr.ctime = attr.ctime;
                drop(pn);
                self.insert(Inode::new(*ino, attr.clone(), *parent, target));
                Ok(Effects::default())
            }
            Record::Link {
                parent,
                name,
                ino,
                now,
            } => {
                let node = self.need(*ino)?;
                {
                    let mut n = node.write();
                    n.attr.nlink += 1;
                    n.attr.ctime = *now;
                }
                let p = self.need(*parent)?;
                let mut pn = p.write();
                pn.dir_mut()
                    .ok_or_else(|| corrupt("a non-directory parent"))?
                    .insert(name, *ino);
                pn.attr.mtime = *now;
                pn.attr.ctime = *now;
                Ok(Effects::default())
            }
            Record::Unlink { parent, name, now } | Record::Rmdir { parent, name, now } => {
                let p = self.need(*parent)?;
                let ino = {
                    let mut pn = p.write();
                    let ino = pn
                        .dir_mut()
                        .and_then(|d| d.remove(name))
                        .ok_or_else(|| corrupt("a missing entry"))?;
                    if matches!(rec, Record::Rmdir { .. }) {
                        pn.attr.nlink = pn.attr.nlink.saturating_sub(1);
                    }
                    pn.attr.mtime = *now;
                    pn.attr.ctime = *now;
                    ino
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
                if let Some(t) = old {
                    let t_is_dir = self.need(t)?.read().attr.kind == Kind::Dir;
                    np.write().dir_mut().map(|d| d.remove(newname));
                    if t_is_dir {
                        let mut g = np.write();
                        g.attr.nlink = g.attr.nlink.saturating_sub(1);
                    }
                    eff.merge(self.drop_link(t, *now)?);
                }
                {
                    let mut g = p.write();
                    g.dir_mut().map(|d| d.remove(name));
                    g.attr.mtime = *now;
                    g.attr.ctime = *now;
                    if src_is_dir && parent != newparent {
                        g.attr.nlink = g.attr.nlink.saturating_sub(1);
                    }
                }
                {
                    let mut g = np.write();
                    g.dir_mut()
                        .ok_or_else(|| corrupt("a non-directory rename target"))?
                        .insert(newname, src);
                    g.attr.mtime = *now;
                    g.attr.ctime = *now;
                    if src_is_dir && parent != newparent {
                        g.attr.nlink += 1;
                    }
                }
                let s = self.need(src)?;
                let mut sg = s.write();
                sg.attr.ctime = *now;
                if let Some(d) = sg.dir_mut() {
                    d.parent = *newparent;
                }
                Ok(eff)
            }
            Record::SetAttr { ino, .. }
            | Record::Write { ino, .. }
            | Record::Truncate { ino, .. }
            | Record::Punch { ino, .. }
            | Record::SetXattr { ino, .. }
            | Record::RemoveXattr { ino, .. } => {
                let node = self.need(*ino)?;
                let mut n = node.write();
                apply_inode(&mut n, rec)
            }
        }
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
        };
        t.insert(Inode::new(ROOT_INO, attr, ROOT_INO, b""));
        t
    }
}

/// Apply a record that changes a single inode (attributes, data, xattrs).
pub fn apply_inode(n: &mut Inode, rec: &Record) -> Result<Effects> {
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
            for (i, &b) in blocks.iter().enumerate() {
                let old = map.set(first + i as u64, b);
                if old != 0 {
                    eff.released.push(old);
                }
            }
            eff.mapped_delta = map.mapped() as i64 - before as i64;
            n.attr.size = *size;
            n.attr.mtime = *mtime;
            n.attr.ctime = *mtime;
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
            n.xattrs.insert(name.clone(), value.clone());
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
