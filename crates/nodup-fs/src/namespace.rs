//! The namespace: creating nodes, links, unlinks, renames and directory removal (each one
//! record, so multi-inode changes are atomic), and the open-handle counts that keep an
//! unlinked inode alive until its last close.

use crate::acl::{Acl, ACL_DEFAULT};
use crate::error::{errno, FsError, Result};
use crate::fs::{name_ok, rename_flags, Caller, FileSystem, LINK_MAX, NAME_MAX};
use crate::inode::{Attr, Kind, Ts};
use crate::log::check::moves_below_itself;
use crate::log::record::Record;
use crate::state::{Effects, InodeRef, Tables};

impl FileSystem {
    fn new_attr(
        t: &Tables,
        parent: u64,
        kind: Kind,
        perm: u32,
        rdev: u32,
        who: Caller,
    ) -> Result<Attr> {
        let p = t.get(parent).ok_or(FsError::Errno(libc::ENOENT))?;
        let pn = p.read();
        if pn.attr.kind != Kind::Dir {
            return errno(libc::ENOTDIR);
        }
        let mut perm = match pn.xattrs.get(ACL_DEFAULT).and_then(|d| Acl::parse(d)) {
            Some(acl) if kind != Kind::Symlink => acl.create_mode(perm & 0o7777),
            _ => perm & 0o7777 & !who.umask,
        };
        let gid = if pn.attr.perm & libc::S_ISGID != 0 {
            if kind == Kind::Dir {
                perm |= libc::S_ISGID;
            }
            pn.attr.gid
        } else {
            who.gid
        };
        let now = Ts::now();
        Ok(Attr {
            kind,
            perm,
            uid: who.uid,
            gid,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            size: 0,
            rdev,
            atime: now,
            mtime: now,
            ctime: now,
        })
    }

    fn check_new_name(t: &Tables, parent: u64, name: &[u8]) -> Result<()> {
        name_ok(name)?;
        let p = t.get(parent).ok_or(FsError::Errno(libc::ENOENT))?;
        let pn = p.read();
        let d = pn.dir().ok_or(FsError::Errno(libc::ENOTDIR))?;
        if pn.attr.nlink == 0 {
            return errno(libc::ENOENT);
        }
        if d.get(name).is_some() {
            return errno(libc::EEXIST);
        }
        Ok(())
    }

    /// Create a node of `kind` (file, dir, symlink, fifo, device, socket).
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        kind: Kind,
        perm: u32,
        rdev: u32,
        target: &[u8],
        who: Caller,
    ) -> Result<(u64, Attr)> {
        if kind == Kind::Symlink && (target.is_empty() || target.len() > 4095) {
            return errno(if target.is_empty() {
                libc::ENOENT
            } else {
                libc::ENAMETOOLONG
            });
        }
        // Only a symlink has a target (a record with one on another kind is refused).
        if kind != Kind::Symlink && !target.is_empty() {
            return errno(libc::EINVAL);
        }
        self.meta_op(true, |t| {
            Self::check_new_name(t, parent, name)?;
            let mut attr = Self::new_attr(t, parent, kind, perm, rdev, who)?;
            if kind == Kind::Symlink {
                attr.perm = 0o777;
                attr.size = target.len() as u64;
            }
            let ino = t.next_ino;
            let rec = Record::Create {
                parent,
                name: name.to_vec(),
                ino,
                attr: attr.clone(),
                target: target.to_vec(),
            };
            Ok((rec, (ino, attr)))
        })
    }

    /// New hard link `newparent/newname` to `ino`.
    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        self.meta_op(false, |t| {
            let node = t.get(ino).ok_or(FsError::Errno(libc::ENOENT))?;
            {
                let n = node.read();
                if n.attr.kind == Kind::Dir {
                    return errno(libc::EPERM);
                }
                if n.attr.nlink >= LINK_MAX {
                    return errno(libc::EMLINK);
                }
                if n.attr.nlink == 0 {
                    return errno(libc::ENOENT);
                }
            }
            Self::check_new_name(t, newparent, newname)?;
            Ok((
                Record::Link {
                    parent: newparent,
                    name: newname.to_vec(),
                    ino,
                    now: Ts::now(),
                },
                (),
            ))
        })?;
        self.getattr(ino)
    }

    fn child(t: &Tables, parent: u64, name: &[u8]) -> Result<(u64, InodeRef)> {
        if name.len() > NAME_MAX {
            return errno(libc::ENAMETOOLONG);
        }
        let p = t.get(parent).ok_or(FsError::Errno(libc::ENOENT))?;
        let ino = {
            let pn = p.read();
            let d = pn.dir().ok_or(FsError::Errno(libc::ENOTDIR))?;
            d.get(name).ok_or(FsError::Errno(libc::ENOENT))?
        };
        let node = t
            .get(ino)
            .ok_or_else(|| FsError::Corrupt(format!("entry points at missing inode {ino}")))?;
        Ok((ino, node))
    }

    /// Remove a non-directory entry.
    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.meta_op(false, |t| {
            let (_, node) = Self::child(t, parent, name)?;
            if node.read().attr.kind == Kind::Dir {
                return errno(libc::EISDIR);
            }
            Ok((
                Record::Unlink {
                    parent,
                    name: name.to_vec(),
                    now: Ts::now(),
                },
                (),
            ))
        })
    }

    /// Remove an empty directory.
    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        if name == b"." {
            return errno(libc::EINVAL);
        }
        if name == b".." {
            return errno(libc::ENOTEMPTY);
        }
        self.meta_op(false, |t| {
            let (_, node) = Self::child(t, parent, name)?;
            let n = node.read();
            let d = n.dir().ok_or(FsError::Errno(libc::ENOTDIR))?;
            if !d.is_empty() {
                return errno(libc::ENOTEMPTY);
            }
            Ok((
                Record::Rmdir {
                    parent,
                    name: name.to_vec(),
                    now: Ts::now(),
                },
                (),
            ))
        })
    }

    /// Move `parent/name` to `newparent/newname` (replacing a compatible target).
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> Result<()> {
        if flags & rename_flags::EXCHANGE != 0
            || flags & !(rename_flags::NOREPLACE | rename_flags::EXCHANGE) != 0
        {
            return errno(libc::EINVAL);
        }
        name_ok(newname)?;
        self.meta_op(false, |t| {
            let (src, snode) = Self::child(t, parent, name)?;
            let src_dir = snode.read().attr.kind == Kind::Dir;
            let np = t.get(newparent).ok_or(FsError::Errno(libc::ENOENT))?;
            let target = {
                let g = np.read();
                let d = g.dir().ok_or(FsError::Errno(libc::ENOTDIR))?;
                // A removed directory still open takes no new entries (as in create).
                if g.attr.nlink == 0 {
                    return errno(libc::ENOENT);
                }
                d.get(newname)
            };
            if let Some(tino) = target {
                if flags & rename_flags::NOREPLACE != 0 {
                    return errno(libc::EEXIST);
                }
                if tino == src {
                    return Err(FsError::Errno(0));
                }
                let tnode = t.get(tino).ok_or(FsError::Errno(libc::ENOENT))?;
                let tn = tnode.read();
                match (src_dir, tn.attr.kind == Kind::Dir) {
                    (true, false) => return errno(libc::ENOTDIR),
                    (false, true) => return errno(libc::EISDIR),
                    (true, true) if tn.dir().is_some_and(|d| !d.is_empty()) => {
                        return errno(libc::ENOTEMPTY)
                    }
                    _ => {}
                }
            }
            // A directory cannot move below itself.
            if src_dir {
                match moves_below_itself(t, src, newparent) {
                    Some(false) => {}
                    Some(true) => return errno(libc::EINVAL),
                    None => {
                        return Err(FsError::Corrupt(format!(
                            "directory {newparent}: its parent chain does not reach the root"
                        )))
                    }
                }
            }
            let rec = Record::Rename {
                parent,
                name: name.to_vec(),
                newparent,
                newname: newname.to_vec(),
                now: Ts::now(),
            };
            Ok((rec, ()))
        })
        .or_else(|e| match e {
            FsError::Errno(0) => Ok(()),
            e => Err(e),
        })
    }

    /// A handle to `ino` was opened (an unlinked inode lives while handles exist).
    pub fn open_handle(&self, ino: u64) -> Result<Attr> {
        let node = self.node(ino)?;
        let mut n = node.write();
        n.open_count += 1;
        Ok(n.attr.clone())
    }

    /// A handle to `ino` was closed; deletes the inode when it was the last one of an unlinked file.
    pub fn release_handle(&self, ino: u64) -> Result<()> {
        // Fast path: the inode keeps a link or another handle; only its counter changes.
        {
            let Ok(node) = self.node(ino) else {
                return Ok(());
            };
            let mut n = node.write();
            if n.open_count > 1 || n.attr.nlink > 0 {
                n.open_count = n.open_count.saturating_sub(1);
                return Ok(());
            }
        }
        let _g = self.gate.read();
        let mut t = self.tables.write();
        let Some(node) = t.get(ino) else {
            return Ok(());
        };
        let mut n = node.write();
        n.open_count = n.open_count.saturating_sub(1);
        if n.open_count == 0 && n.attr.nlink == 0 {
            let mapped = n.map().map_or(0, |m| m.mapped());
            let released = n.map_mut().map(|m| m.clear()).unwrap_or_default();
            drop(n);
            t.remove_inode(ino);
            drop(t);
            // No log record: an inode without links is dropped at the next open anyway.
            self.finish(Effects {
                released,
                mapped_delta: -(mapped as i64),
            })?;
        }
        Ok(())
    }
}
