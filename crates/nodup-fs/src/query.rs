//! Queries that change nothing: attributes, directory lookups and listings, symlink targets
//! and where a file's data and holes are.

use crate::error::{errno, FsError, Result};
use crate::fs::{DirEntry, FileSystem, NAME_MAX};
use crate::inode::{Attr, Body, Kind};

const BS: u64 = nodup_core::BLOCK_SIZE as u64;

impl FileSystem {
    /// Attributes of `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let node = self.node(ino)?;
        let n = node.read();
        Ok(n.attr.clone())
    }

    /// Allocated 512-byte sectors of `ino` (st_blocks).
    pub fn sectors(&self, ino: u64) -> u64 {
        self.node(ino)
            .map(|n| n.read().map().map_or(0, |m| m.mapped() * (BS / 512)))
            .unwrap_or(0)
    }

    /// Find `name` in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<(u64, Attr)> {
        if name.len() > NAME_MAX {
            return errno(libc::ENAMETOOLONG);
        }
        let t = self.tables.read();
        let p = t.get(parent).ok_or(FsError::Errno(libc::ENOENT))?;
        if name == b"." {
            // Any inode: the kernel resolves a file handle by looking up "." in its node.
            let attr = p.read().attr.clone();
            return Ok((parent, attr));
        }
        let ino = {
            let pn = p.read();
            let d = pn.dir().ok_or(FsError::Errno(libc::ENOTDIR))?;
            if name == b".." {
                d.parent
            } else {
                d.get(name).ok_or(FsError::Errno(libc::ENOENT))?
            }
        };
        let n = t.get(ino).ok_or(FsError::Errno(libc::ENOENT))?;
        let attr = n.read().attr.clone();
        Ok((ino, attr))
    }

    /// Directory entries after offset `after` ("." is offset 1, ".." offset 2).
    pub fn readdir(&self, ino: u64, after: u64, max: usize) -> Result<Vec<DirEntry>> {
        let t = self.tables.read();
        let node = t.get(ino).ok_or(FsError::Errno(libc::ENOENT))?;
        let n = node.read();
        let d = n.dir().ok_or(FsError::Errno(libc::ENOTDIR))?;
        let mut out = Vec::new();
        if after < 1 {
            out.push((1, ino, Kind::Dir, b".".to_vec()));
        }
        if after < 2 {
            out.push((2, d.parent, Kind::Dir, b"..".to_vec()));
        }
        for (cookie, name, child) in d.entries_after(after.max(2)) {
            if out.len() >= max {
                break;
            }
            let kind = if child == ino {
                Kind::Dir
            } else {
                t.get(child).map_or(Kind::File, |c| c.read().attr.kind)
            };
            out.push((cookie, child, kind, name.to_vec()));
        }
        Ok(out)
    }

    /// SEEK_DATA / SEEK_HOLE from `off` in a regular file (holes are unmapped blocks; the end
    /// of the file is a hole). ENXIO at or past the end, or when no data follows `off`.
    pub fn seek_data_hole(&self, ino: u64, off: u64, whence: i32) -> Result<u64> {
        let node = self.node(ino)?;
        let n = node.read();
        let size = n.attr.size;
        let map = match &n.body {
            Body::File(m) => m,
            Body::Dir(_) => return errno(libc::EISDIR),
            _ => return errno(libc::EINVAL),
        };
        if off >= size {
            return errno(libc::ENXIO);
        }
        match whence {
            libc::SEEK_DATA => match map.next_mapped(off / BS) {
                Some(fb) if fb * BS < size => Ok((fb * BS).max(off)),
                _ => errno(libc::ENXIO),
            },
            libc::SEEK_HOLE => Ok((map.next_hole(off / BS) * BS).max(off).min(size)),
            _ => errno(libc::EINVAL),
        }
    }

    /// Target of a symlink.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let node = self.node(ino)?;
        let n = node.read();
        match &n.body {
            Body::Symlink(t) => Ok(t.clone()),
            _ => errno(libc::EINVAL),
        }
    }
}
