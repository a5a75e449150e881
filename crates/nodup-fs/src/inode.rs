//! Inodes in DRAM: attributes, extended attributes and the kind-specific body (block map,
//! directory, symlink target).

use crate::blockmap::BlockMap;
use crate::codec::{Dec, Enc};
use crate::dir::Directory;
use crate::error::{FsError, Result};
use std::collections::BTreeMap;

/// Inode number of the root directory (FUSE's fixed root).
pub const ROOT_INO: u64 = 1;

/// A timestamp: seconds and nanoseconds since the epoch (negative seconds allowed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ts {
    pub sec: i64,
    pub nsec: u32,
}

impl Ts {
    /// The current wall-clock time, from the kernel's coarse clock (`CLOCK_REALTIME_COARSE`,
    /// one tick of resolution): with the writeback cache the kernel stamps mtime/ctime of
    /// written files itself from that clock, and a finer one here would let a later write
    /// carry an earlier time than a change the daemon stamped a moment before.
    pub fn now() -> Ts {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid timespec to fill; the clock id is a constant.
        if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut t) } != 0 {
            return Ts::default();
        }
        Ts {
            sec: t.tv_sec,
            nsec: t.tv_nsec as u32,
        }
    }
    /// True when the nanoseconds are below a second, as every time the file system makes is
    /// (a larger value could overflow the conversion to a `SystemTime`).
    pub fn valid(self) -> bool {
        self.nsec < 1_000_000_000
    }
    /// Convert to a `SystemTime` (for FUSE attributes).
    pub fn to_system(self) -> std::time::SystemTime {
        use std::time::{Duration, UNIX_EPOCH};
        if self.sec >= 0 {
            UNIX_EPOCH + Duration::new(self.sec as u64, self.nsec)
        } else {
            UNIX_EPOCH - Duration::from_secs(self.sec.unsigned_abs())
                + Duration::from_nanos(self.nsec as u64)
        }
    }
    /// Convert from a `SystemTime`.
    pub fn from_system(t: std::time::SystemTime) -> Ts {
        match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Ts {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let (mut sec, mut nsec) = (-(d.as_secs() as i64), d.subsec_nanos());
                if nsec > 0 {
                    sec -= 1;
                    nsec = 1_000_000_000 - nsec;
                }
                Ts { sec, nsec }
            }
        }
    }
    fn enc(&self, e: &mut Enc) {
        e.i64(self.sec);
        e.u32(self.nsec);
    }
    fn dec(d: &mut Dec) -> Result<Ts> {
        Ok(Ts {
            sec: d.i64()?,
            nsec: d.u32()?,
        })
    }
}

/// File type of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    Fifo = 4,
    CharDev = 5,
    BlockDev = 6,
    Socket = 7,
}

impl Kind {
    /// Decode the on-media value.
    pub fn from_u8(v: u8) -> Result<Kind> {
        Ok(match v {
            1 => Kind::File,
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::Fifo,
            5 => Kind::CharDev,
            6 => Kind::BlockDev,
            7 => Kind::Socket,
            _ => return Err(FsError::Corrupt(format!("inode kind {v}"))),
        })
    }
    /// Kind from the `S_IFMT` bits of a mode.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            libc::S_IFSOCK => Kind::Socket,
            _ => return None,
        })
    }
}

/// The attributes of an inode (everything `stat` shows except the inode number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub kind: Kind,
    /// Permission bits incl. setuid/setgid/sticky (no type bits).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub rdev: u32,
    pub atime: Ts,
    pub mtime: Ts,
    pub ctime: Ts,
}

impl Attr {
    /// Encode for a log record or checkpoint.
    pub fn enc(&self, e: &mut Enc) {
        e.u8(self.kind as u8);
        e.u32(self.perm);
        e.u32(self.uid);
        e.u32(self.gid);
        e.u32(self.nlink);
        e.u64(self.size);
        e.u32(self.rdev);
        self.atime.enc(e);
        self.mtime.enc(e);
        self.ctime.enc(e);
    }
    /// Decode what [`Attr::enc`] wrote.
    pub fn dec(d: &mut Dec) -> Result<Attr> {
        Ok(Attr {
            kind: Kind::from_u8(d.u8()?)?,
            perm: d.u32()?,
            uid: d.u32()?,
            gid: d.u32()?,
            nlink: d.u32()?,
            size: d.u64()?,
            rdev: d.u32()?,
            atime: Ts::dec(d)?,
            mtime: Ts::dec(d)?,
            ctime: Ts::dec(d)?,
        })
    }

    /// A regular file's attributes for tests: mode 0644, one link, empty, every time `now`.
    #[cfg(test)]
    pub(crate) fn test_file(uid: u32, gid: u32, now: Ts) -> Attr {
        Attr {
            kind: Kind::File,
            perm: 0o644,
            uid,
            gid,
            nlink: 1,
            size: 0,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
        }
    }
}

/// Kind-specific content of an inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Regular file data.
    File(BlockMap),
    /// Directory entries.
    Dir(Directory),
    /// Symlink target.
    Symlink(Vec<u8>),
    /// Fifo, device or socket: attributes only.
    Special,
}

/// Extended attributes by name.
pub type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

/// One inode in DRAM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub ino: u64,
    pub attr: Attr,
    pub xattrs: Xattrs,
    pub body: Body,
    /// Open file handles (runtime only): an unlinked inode lives until the last one closes.
    pub open_count: u32,
    /// Checkpoint bookkeeping (runtime only): what changed, where it is persisted.
    pub ck: crate::persist::CkState,
}

impl Inode {
    /// A new inode of `attr.kind`; `parent` is used for directories, `target` for symlinks.
    pub fn new(ino: u64, attr: Attr, parent: u64, target: &[u8]) -> Inode {
        let body = match attr.kind {
            Kind::File => Body::File(BlockMap::default()),
            Kind::Dir => Body::Dir(Directory::new(parent)),
            Kind::Symlink => Body::Symlink(target.to_vec()),
            _ => Body::Special,
        };
        Inode {
            ino,
            attr,
            xattrs: BTreeMap::new(),
            body,
            open_count: 0,
            ck: Default::default(),
        }
    }
    /// The block map of a regular file.
    pub fn map(&self) -> Option<&BlockMap> {
        match &self.body {
            Body::File(m) => Some(m),
            _ => None,
        }
    }
    /// The block map of a regular file, mutable.
    pub fn map_mut(&mut self) -> Option<&mut BlockMap> {
        match &mut self.body {
            Body::File(m) => Some(m),
            _ => None,
        }
    }
    /// The directory of a directory inode.
    pub fn dir(&self) -> Option<&Directory> {
        match &self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }
    /// The directory of a directory inode, mutable.
    pub fn dir_mut(&mut self) -> Option<&mut Directory> {
        match &mut self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }
    /// The checkpoint units of a file's map or a directory that changed since the last
    /// checkpoint took them (`None` for other kinds, which have only their head).
    pub fn unit_dirt(&self) -> Option<&crate::persist::ChunkSet> {
        match &self.body {
            Body::File(m) => Some(&m.dirty),
            Body::Dir(d) => Some(&d.dirty),
            _ => None,
        }
    }

    /// See [`Inode::unit_dirt`].
    pub fn unit_dirt_mut(&mut self) -> Option<&mut crate::persist::ChunkSet> {
        match &mut self.body {
            Body::File(m) => Some(&mut m.dirty),
            Body::Dir(d) => Some(&mut d.dirty),
            _ => None,
        }
    }

    /// Checkpoint units that hold map entries or directory entries, ascending.
    pub fn units(&self) -> Vec<u64> {
        match &self.body {
            Body::File(m) => m.units(),
            Body::Dir(d) => d.units(),
            _ => Vec::new(),
        }
    }

    /// Attributes and extended attributes, as heads of checkpoints encode them.
    pub fn enc_attr_xattrs(&self, e: &mut Enc) {
        self.attr.enc(e);
        e.u32(self.xattrs.len() as u32);
        for (k, v) in &self.xattrs {
            e.bytes(k);
            e.bytes(v);
        }
    }

    /// Decode what [`Inode::enc_attr_xattrs`] wrote.
    pub fn dec_attr_xattrs(d: &mut Dec) -> Result<(Attr, Xattrs)> {
        let attr = Attr::dec(d)?;
        let n = d.u32()?;
        let mut xattrs = BTreeMap::new();
        for _ in 0..n {
            let k = d.bytes()?;
            xattrs.insert(k, d.bytes()?);
        }
        Ok((attr, xattrs))
    }

    /// Data blocks referenced by this inode (once per reference).
    pub fn data_blocks(&self) -> Vec<u64> {
        self.map().map(|m| m.blocks().collect()).unwrap_or_default()
    }
}
