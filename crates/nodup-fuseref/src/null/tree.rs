//! The null file system's namespace: inodes with attributes, directories with stable listing
//! cookies, symlink targets, and the kernel's lookup counts that decide when a removed inode
//! can go. No file data is kept: a file is only its size.

use crate::attr::killed_suidgid;
use fuser::{FileAttr, FileType, INodeNo};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::time::SystemTime;

/// Errors of namespace operations are plain errno values.
pub type Result<T> = std::result::Result<T, i32>;

/// Listing cookies of "." and ".."; entries start after them.
const DOT: u64 = 1;
const DOTDOT: u64 = 2;

/// The entries of one directory: by name, and by cookie (the offset `readdir` resumes after).
#[derive(Default)]
struct Dir {
    by_name: FxHashMap<OsString, (u64, u64)>,
    by_cookie: BTreeMap<u64, (OsString, u64)>,
    next_cookie: u64,
}

enum Body {
    Data,
    Dir(Box<Dir>),
    Symlink(OsString),
}

/// One inode.
struct Node {
    attr: FileAttr,
    /// Directories only: the inode holding the entry (for "..").
    parent: u64,
    /// References the kernel holds (entries it was sent minus those it forgot).
    lookups: u64,
    body: Body,
}

/// Who creates an inode, and with which requested mode.
#[derive(Debug, Clone, Copy)]
pub struct Creator {
    pub uid: u32,
    pub gid: u32,
    /// Permission bits after the umask.
    pub perm: u16,
}

/// One entry of a listing: cookie to resume after it, inode, type, name.
pub type Listed = (u64, u64, FileType, OsString);

/// The whole namespace.
pub struct Tree {
    nodes: FxHashMap<u64, Node>,
    next_ino: u64,
}

fn node_attr(ino: u64, kind: FileType, c: Creator, rdev: u32, now: SystemTime) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: if kind == FileType::Directory { 4096 } else { 0 },
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm: c.perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: c.uid,
        gid: c.gid,
        rdev,
        blksize: 4096,
        flags: 0,
    }
}

impl Tree {
    /// A namespace holding an empty root directory owned by `uid`:`gid`.
    pub fn new(uid: u32, gid: u32) -> Tree {
        let mut t = Tree {
            nodes: FxHashMap::default(),
            next_ino: 2,
        };
        let c = Creator {
            uid,
            gid,
            perm: 0o755,
        };
        let root = 1;
        t.nodes.insert(
            root,
            Node {
                attr: node_attr(root, FileType::Directory, c, 0, SystemTime::now()),
                parent: root,
                lookups: 1,
                body: Body::Dir(Box::new(Dir {
                    next_cookie: DOTDOT + 1,
                    ..Dir::default()
                })),
            },
        );
        t
    }

    fn node(&self, ino: u64) -> Result<&Node> {
        self.nodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn dir(&self, ino: u64) -> Result<&Dir> {
        match &self.node(ino)?.body {
            Body::Dir(d) => Ok(d),
            _ => Err(libc::ENOTDIR),
        }
    }

    fn dir_mut(&mut self, ino: u64) -> Result<&mut Dir> {
        match &mut self.node_mut(ino)?.body {
            Body::Dir(d) => Ok(d),
            _ => Err(libc::ENOTDIR),
        }
    }

    /// The attributes of `ino`.
    pub fn attr(&self, ino: u64) -> Result<FileAttr> {
        Ok(self.node(ino)?.attr)
    }

    /// Mutable attributes of `ino`, for the write path and setattr.
    pub fn attr_mut(&mut self, ino: u64) -> Result<&mut FileAttr> {
        Ok(&mut self.node_mut(ino)?.attr)
    }

    /// The inode `name` in `parent` names ("." and ".." included), without counting a lookup.
    fn child(&self, parent: u64, name: &OsStr) -> Result<u64> {
        if name == "." {
            return self.dir(parent).map(|_| parent);
        }
        if name == ".." {
            return self.dir(parent).map(|_| self.nodes[&parent].parent);
        }
        self.dir(parent)?
            .by_name
            .get(name)
            .map(|&(_, ino)| ino)
            .ok_or(libc::ENOENT)
    }

    /// Look `name` up in `parent`, counting one kernel reference on the result.
    pub fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<FileAttr> {
        let ino = self.child(parent, name)?;
        let n = self.node_mut(ino)?;
        n.lookups += 1;
        Ok(n.attr)
    }

    /// The kernel dropped `count` references to `ino`.
    pub fn forget(&mut self, ino: u64, count: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.lookups = n.lookups.saturating_sub(count);
            if n.lookups == 0 && n.attr.nlink == 0 {
                self.nodes.remove(&ino);
            }
        }
    }

    fn add_entry(&mut self, parent: u64, name: &OsStr, ino: u64) -> Result<()> {
        let d = self.dir_mut(parent)?;
        let cookie = d.next_cookie;
        d.next_cookie += 1;
        d.by_name.insert(name.to_owned(), (cookie, ino));
        d.by_cookie.insert(cookie, (name.to_owned(), ino));
        Ok(())
    }

    fn remove_entry(&mut self, parent: u64, name: &OsStr) -> Result<u64> {
        let d = self.dir_mut(parent)?;
        let (cookie, ino) = d.by_name.remove(name).ok_or(libc::ENOENT)?;
        d.by_cookie.remove(&cookie);
        Ok(ino)
    }

    fn touch_dir(&mut self, ino: u64, now: SystemTime, nlink_delta: i32) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.attr.mtime = now;
            n.attr.ctime = now;
            n.attr.nlink = n.attr.nlink.saturating_add_signed(nlink_delta);
        }
    }

    /// Create `name` in `parent` (a file, directory, symlink or special file), counting one
    /// kernel reference on it.
    pub fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        kind: FileType,
        c: Creator,
        rdev: u32,
        target: Option<&OsStr>,
    ) -> Result<FileAttr> {
        if self.dir(parent)?.by_name.contains_key(name) || name == "." || name == ".." {
            return Err(libc::EEXIST);
        }
        let now = SystemTime::now();
        let ino = self.next_ino;
        self.next_ino += 1;
        let mut attr = node_attr(ino, kind, c, rdev, now);
        let body = match kind {
            FileType::Directory => Body::Dir(Box::new(Dir {
                next_cookie: DOTDOT + 1,
                ..Dir::default()
            })),
            FileType::Symlink => {
                let t = target.unwrap_or_default().to_owned();
                attr.size = t.len() as u64;
                Body::Symlink(t)
            }
            _ => Body::Data,
        };
        self.add_entry(parent, name, ino)?;
        self.nodes.insert(
            ino,
            Node {
                attr,
                parent,
                lookups: 1,
                body,
            },
        );
        let dirs = i32::from(kind == FileType::Directory);
        self.touch_dir(parent, now, dirs);
        Ok(attr)
    }

    /// A new name `name` in `parent` for the non-directory `ino`.
    pub fn link(&mut self, ino: u64, parent: u64, name: &OsStr) -> Result<FileAttr> {
        if self.node(ino)?.attr.kind == FileType::Directory {
            return Err(libc::EPERM);
        }
        if self.dir(parent)?.by_name.contains_key(name) {
            return Err(libc::EEXIST);
        }
        self.add_entry(parent, name, ino)?;
        let now = SystemTime::now();
        self.touch_dir(parent, now, 0);
        let n = self.node_mut(ino)?;
        n.attr.nlink += 1;
        n.attr.ctime = now;
        n.lookups += 1;
        Ok(n.attr)
    }

    /// Drop one link of `ino` (the entry is already gone); it goes when nothing refers to it.
    fn unlinked(&mut self, ino: u64, now: SystemTime) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.attr.nlink = if n.attr.kind == FileType::Directory {
                0
            } else {
                n.attr.nlink.saturating_sub(1)
            };
            n.attr.ctime = now;
            if n.attr.nlink == 0 && n.lookups == 0 {
                self.nodes.remove(&ino);
            }
        }
    }

    fn is_empty_dir(&self, ino: u64) -> Result<bool> {
        Ok(self.dir(ino)?.by_name.is_empty())
    }

    /// Remove the entry `name` of `parent`: a non-directory (`dir` false) or an empty
    /// directory (`dir` true).
    pub fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<()> {
        let ino = self.child(parent, name)?;
        let is_dir = self.node(ino)?.attr.kind == FileType::Directory;
        match (dir, is_dir) {
            (false, true) => return Err(libc::EISDIR),
            (true, false) => return Err(libc::ENOTDIR),
            (true, true) if !self.is_empty_dir(ino)? => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        self.remove_entry(parent, name)?;
        let now = SystemTime::now();
        self.touch_dir(parent, now, -i32::from(is_dir));
        self.unlinked(ino, now);
        Ok(())
    }

    /// Whether `ino` is `anc` or lies below it.
    fn is_within(&self, mut ino: u64, anc: u64) -> bool {
        loop {
            if ino == anc {
                return true;
            }
            match self.nodes.get(&ino) {
                Some(n) if n.parent != ino => ino = n.parent,
                _ => return false,
            }
        }
    }

    /// Move `name` of `parent` to `newname` of `newparent` (replacing a compatible target;
    /// RENAME_NOREPLACE and RENAME_EXCHANGE as rename(2)).
    pub fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        let ino = self.child(parent, name)?;
        let src_dir = self.node(ino)?.attr.kind == FileType::Directory;
        if src_dir && self.is_within(newparent, ino) {
            return Err(libc::EINVAL);
        }
        let target = match self.child(newparent, newname) {
            Ok(t) => Some(t),
            Err(libc::ENOENT) => None,
            Err(e) => return Err(e),
        };
        if target == Some(ino) {
            return Ok(());
        }
        let now = SystemTime::now();
        if flags & libc::RENAME_EXCHANGE != 0 {
            let t = target.ok_or(libc::ENOENT)?;
            let t_dir = self.node(t)?.attr.kind == FileType::Directory;
            if t_dir && self.is_within(parent, t) {
                return Err(libc::EINVAL);
            }
            self.remove_entry(parent, name)?;
            self.remove_entry(newparent, newname)?;
            self.add_entry(parent, name, t)?;
            self.add_entry(newparent, newname, ino)?;
            self.reparent(ino, newparent, now);
            self.reparent(t, parent, now);
            let moved = i32::from(src_dir) - i32::from(t_dir);
            self.touch_dir(parent, now, -moved);
            self.touch_dir(newparent, now, moved);
            return Ok(());
        }
        if let Some(t) = target {
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(libc::EEXIST);
            }
            let t_dir = self.node(t)?.attr.kind == FileType::Directory;
            match (src_dir, t_dir) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) if !self.is_empty_dir(t)? => return Err(libc::ENOTEMPTY),
                _ => {}
            }
            self.remove_entry(newparent, newname)?;
            self.touch_dir(newparent, now, -i32::from(t_dir));
            self.unlinked(t, now);
        }
        self.remove_entry(parent, name)?;
        self.add_entry(newparent, newname, ino)?;
        self.reparent(ino, newparent, now);
        let d = i32::from(src_dir);
        self.touch_dir(parent, now, -d);
        self.touch_dir(newparent, now, d);
        Ok(())
    }

    fn reparent(&mut self, ino: u64, parent: u64, now: SystemTime) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.parent = parent;
            n.attr.ctime = now;
        }
    }

    /// The target of the symlink `ino`.
    pub fn readlink(&self, ino: u64) -> Result<OsString> {
        match &self.node(ino)?.body {
            Body::Symlink(t) => Ok(t.clone()),
            _ => Err(libc::EINVAL),
        }
    }

    /// Up to `max` entries of directory `ino` after cookie `offset` ("." and ".." first).
    pub fn list(&self, ino: u64, offset: u64, max: usize) -> Result<Vec<Listed>> {
        let d = self.dir(ino)?;
        let mut out = Vec::new();
        if offset < DOT {
            out.push((DOT, ino, FileType::Directory, ".".into()));
        }
        if offset < DOTDOT {
            let parent = self.nodes[&ino].parent;
            out.push((DOTDOT, parent, FileType::Directory, "..".into()));
        }
        for (&cookie, (name, child)) in d.by_cookie.range(offset.max(DOTDOT) + 1..) {
            if out.len() >= max {
                break;
            }
            let kind = self
                .nodes
                .get(child)
                .map_or(FileType::RegularFile, |n| n.attr.kind);
            out.push((cookie, *child, kind, name.clone()));
        }
        Ok(out)
    }

    /// Count one kernel reference on `ino` (an entry sent by readdirplus).
    pub fn hold(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.lookups += 1;
        }
    }

    /// Set-id clearing after a data change by a caller in group `gid` (HANDLE_KILLPRIV_V2).
    pub fn kill_suidgid(&mut self, ino: u64, gid: u32) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.attr.perm = killed_suidgid(n.attr.perm as u32, n.attr.gid, gid) as u16;
        }
    }

    /// Number of inodes held (the root included).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Creator = Creator {
        uid: 0,
        gid: 0,
        perm: 0o644,
    };

    fn names(t: &Tree, dir: u64) -> Vec<String> {
        t.list(dir, 0, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(_, _, _, n)| n.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn create_rename_remove_and_forget() {
        let mut t = Tree::new(0, 0);
        let d = t
            .create(1, "d".as_ref(), FileType::Directory, C, 0, None)
            .unwrap();
        let f = t
            .create(d.ino.0, "f".as_ref(), FileType::RegularFile, C, 0, None)
            .unwrap();
        assert_eq!(t.attr(1).unwrap().nlink, 3);
        assert_eq!(names(&t, d.ino.0), [".", "..", "f"]);
        t.rename(d.ino.0, "f".as_ref(), 1, "g".as_ref(), 0).unwrap();
        assert_eq!(names(&t, 1), [".", "..", "d", "g"]);
        assert_eq!(
            t.rename(1, "d".as_ref(), d.ino.0, "x".as_ref(), 0),
            Err(libc::EINVAL),
            "a directory cannot move into itself"
        );
        assert_eq!(t.remove(1, "d".as_ref(), false), Err(libc::EISDIR));
        t.remove(1, "g".as_ref(), false).unwrap();
        assert!(t.attr(f.ino.0).is_ok(), "kept while the kernel holds it");
        t.forget(f.ino.0, 1);
        assert_eq!(t.attr(f.ino.0), Err(libc::ENOENT));
        t.remove(1, "d".as_ref(), true).unwrap();
        t.forget(d.ino.0, 1);
        assert_eq!(t.len(), 1);
        assert_eq!(t.attr(1).unwrap().nlink, 2);
    }

    #[test]
    fn listing_resumes_after_cookies_despite_removals() {
        let mut t = Tree::new(0, 0);
        for i in 0..10 {
            let n = format!("f{i}");
            t.create(1, n.as_ref(), FileType::RegularFile, C, 0, None)
                .unwrap();
        }
        let first = t.list(1, 0, 5).unwrap();
        let resume = first.last().unwrap().0;
        t.remove(1, "f1".as_ref(), false).unwrap();
        let rest = t.list(1, resume, usize::MAX).unwrap();
        let all: Vec<_> = first.iter().chain(&rest).map(|e| e.3.clone()).collect();
        assert_eq!(
            all.len(),
            12,
            "dots, f0..f2 (f1 listed before its removal), f3..f9"
        );
        assert_eq!(rest.first().unwrap().3, "f3");
    }

    #[test]
    fn exchange_and_noreplace() {
        let mut t = Tree::new(0, 0);
        let a = t
            .create(1, "a".as_ref(), FileType::RegularFile, C, 0, None)
            .unwrap();
        let b = t
            .create(1, "b".as_ref(), FileType::Symlink, C, 0, Some("x".as_ref()))
            .unwrap();
        assert_eq!(
            t.rename(1, "a".as_ref(), 1, "b".as_ref(), libc::RENAME_NOREPLACE),
            Err(libc::EEXIST)
        );
        t.rename(1, "a".as_ref(), 1, "b".as_ref(), libc::RENAME_EXCHANGE)
            .unwrap();
        assert_eq!(t.child(1, "a".as_ref()), Ok(b.ino.0));
        assert_eq!(t.child(1, "b".as_ref()), Ok(a.ino.0));
        assert_eq!(t.readlink(b.ino.0).unwrap(), "x");
        t.link(a.ino.0, 1, "c".as_ref()).unwrap();
        assert_eq!(t.attr(a.ino.0).unwrap().nlink, 2);
    }
}
