//! The null file system: one flat root directory whose regular files keep a mode and a size but
//! no data (writes are discarded, reads return zeros). It answers decoded requests with
//! [`Reply`] values and knows nothing of the transport that carried them, so the classic and
//! the ring transport run exactly the same code.

use crate::abi::{self, op, Wire};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// How long the kernel may cache names and attributes (seconds).
const TTL_SECS: u64 = 1;
/// Block size reported in attributes and statfs.
const BLOCK: u32 = 4096;
/// Largest reply body other than READ data (CREATE's entry + open reply is 144 bytes).
const BODY_CAP: usize = 256;

/// `setattr` valid bits used here.
const FATTR_MODE: u32 = 1 << 0;
const FATTR_SIZE: u32 = 1 << 3;

/// A reply body of fixed-size structs, kept inline (no allocation per request).
#[derive(Clone, Copy)]
pub struct Body {
    buf: [u8; BODY_CAP],
    len: usize,
}

impl Body {
    /// An empty body (success without data: FLUSH, RELEASE, FSYNC, ...).
    pub fn empty() -> Self {
        Body {
            buf: [0; BODY_CAP],
            len: 0,
        }
    }
    fn of(parts: &[&[u8]]) -> Self {
        let mut b = Body::empty();
        for p in parts {
            b.buf[b.len..b.len + p.len()].copy_from_slice(p);
            b.len += p.len();
        }
        b
    }
    /// The body's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// What to send back for one request.
// The body stays inline on purpose: one reply per request, no allocation on the hot path.
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    /// Nothing (FORGET, BATCH_FORGET, INTERRUPT expect no reply).
    None,
    /// Failure with this (positive) errno.
    Err(i32),
    /// Success with this body.
    Body(Body),
    /// Success with this many zero bytes (READ data).
    Zeros(usize),
}

struct Node {
    mode: AtomicU32,
    size: AtomicU64,
    uid: u32,
    gid: u32,
}

/// The null file system's state: names in the root and the inodes behind them.
pub struct NullFs {
    names: Mutex<HashMap<Vec<u8>, u64>>,
    nodes: RwLock<HashMap<u64, Node>>,
    next_ino: AtomicU64,
    born: u64,
    /// `open_flags` of every OPEN and CREATE reply (FOPEN_DIRECT_IO with `--direct-io`).
    pub open_flags: u32,
}

impl Default for NullFs {
    fn default() -> Self {
        Self::new()
    }
}

fn name_of(extra: &[u8]) -> Option<&[u8]> {
    let end = extra.iter().position(|&c| c == 0)?;
    (end > 0).then(|| &extra[..end])
}

impl NullFs {
    /// An empty file system owned by the current user, root directory mode 0777.
    pub fn new() -> Self {
        let born = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let root = Node {
            mode: AtomicU32::new(libc::S_IFDIR | 0o777),
            size: AtomicU64::new(0),
            uid,
            gid,
        };
        NullFs {
            names: Mutex::new(HashMap::new()),
            nodes: RwLock::new(HashMap::from([(abi::ROOT_ID, root)])),
            next_ino: AtomicU64::new(abi::ROOT_ID + 1),
            born,
            open_flags: 0,
        }
    }

    fn attr(&self, ino: u64) -> Option<abi::Attr> {
        let nodes = self.nodes.read();
        let n = nodes.get(&ino)?;
        let size = n.size.load(Ordering::Relaxed);
        let mode = n.mode.load(Ordering::Relaxed);
        Some(abi::Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.born,
            mtime: self.born,
            ctime: self.born,
            mode,
            nlink: if mode & libc::S_IFMT == libc::S_IFDIR {
                2
            } else {
                1
            },
            uid: n.uid,
            gid: n.gid,
            blksize: BLOCK,
            ..Default::default()
        })
    }

    fn entry(&self, ino: u64) -> Option<abi::EntryOut> {
        Some(abi::EntryOut {
            nodeid: ino,
            entry_valid: TTL_SECS,
            attr_valid: TTL_SECS,
            attr: self.attr(ino)?,
            ..Default::default()
        })
    }

    fn attr_reply(&self, ino: u64) -> Reply {
        match self.attr(ino) {
            Some(attr) => Reply::Body(Body::of(&[abi::AttrOut {
                attr_valid: TTL_SECS,
                attr,
                ..Default::default()
            }
            .bytes()])),
            None => Reply::Err(libc::ENOENT),
        }
    }

    fn open_out(&self) -> abi::OpenOut {
        abi::OpenOut {
            open_flags: self.open_flags,
            ..Default::default()
        }
    }

    /// Create a regular file `name` in the root (or find it, unless `excl`).
    fn create(&self, h: &abi::InHeader, name: &[u8], mode: u32, excl: bool) -> Result<u64, i32> {
        if h.nodeid != abi::ROOT_ID {
            return Err(libc::ENOENT);
        }
        if mode & libc::S_IFMT != libc::S_IFREG {
            return Err(libc::EPERM);
        }
        let mut names = self.names.lock();
        if let Some(&ino) = names.get(name) {
            return if excl { Err(libc::EEXIST) } else { Ok(ino) };
        }
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        let node = Node {
            mode: AtomicU32::new(mode),
            size: AtomicU64::new(0),
            uid: h.uid,
            gid: h.gid,
        };
        self.nodes.write().insert(ino, node);
        names.insert(name.to_vec(), ino);
        Ok(ino)
    }

    /// Answer one request: `op` is the opcode's fixed argument struct, `extra` what follows it
    /// (names, WRITE data).
    pub fn handle(&self, h: &abi::InHeader, op_in: &[u8], extra: &[u8]) -> Reply {
        match h.opcode {
            op::LOOKUP => {
                let ino = name_of(extra)
                    .filter(|_| h.nodeid == abi::ROOT_ID)
                    .and_then(|n| self.names.lock().get(n).copied());
                match ino.and_then(|i| self.entry(i)) {
                    Some(e) => Reply::Body(Body::of(&[e.bytes()])),
                    None => Reply::Err(libc::ENOENT),
                }
            }
            op::GETATTR => self.attr_reply(h.nodeid),
            op::SETATTR => {
                let Some(a) = abi::SetattrIn::read(op_in) else {
                    return Reply::Err(libc::EINVAL);
                };
                if let Some(n) = self.nodes.read().get(&h.nodeid) {
                    if a.valid & FATTR_MODE != 0 {
                        let kind = n.mode.load(Ordering::Relaxed) & libc::S_IFMT;
                        n.mode.store(kind | (a.mode & 0o7777), Ordering::Relaxed);
                    }
                    if a.valid & FATTR_SIZE != 0 {
                        n.size.store(a.size, Ordering::Relaxed);
                    }
                }
                self.attr_reply(h.nodeid)
            }
            op::MKNOD => {
                let (Some(a), Some(name)) = (abi::MknodIn::read(op_in), name_of(extra)) else {
                    return Reply::Err(libc::EINVAL);
                };
                match self.create(h, name, a.mode & !a.umask, true) {
                    Ok(ino) => match self.entry(ino) {
                        Some(e) => Reply::Body(Body::of(&[e.bytes()])),
                        None => Reply::Err(libc::ENOENT),
                    },
                    Err(e) => Reply::Err(e),
                }
            }
            op::CREATE => {
                let (Some(a), Some(name)) = (abi::CreateIn::read(op_in), name_of(extra)) else {
                    return Reply::Err(libc::EINVAL);
                };
                let excl = a.flags as i32 & libc::O_EXCL != 0;
                match self.create(h, name, a.mode & !a.umask, excl) {
                    Ok(ino) => match self.entry(ino) {
                        Some(e) => Reply::Body(Body::of(&[e.bytes(), self.open_out().bytes()])),
                        None => Reply::Err(libc::ENOENT),
                    },
                    Err(e) => Reply::Err(e),
                }
            }
            op::UNLINK => match name_of(extra) {
                Some(name) if self.names.lock().remove(name).is_some() => {
                    Reply::Body(Body::empty())
                }
                _ => Reply::Err(libc::ENOENT),
            },
            op::OPEN => Reply::Body(Body::of(&[self.open_out().bytes()])),
            op::READ => {
                let Some(a) = abi::ReadIn::read(op_in) else {
                    return Reply::Err(libc::EINVAL);
                };
                let size = self
                    .nodes
                    .read()
                    .get(&h.nodeid)
                    .map(|n| n.size.load(Ordering::Relaxed));
                let left = size.unwrap_or(0).saturating_sub(a.offset);
                Reply::Zeros(left.min(u64::from(a.size)) as usize)
            }
            op::WRITE => {
                let Some(a) = abi::WriteIn::read(op_in) else {
                    return Reply::Err(libc::EINVAL);
                };
                if extra.len() < a.size as usize {
                    return Reply::Err(libc::EINVAL);
                }
                if let Some(n) = self.nodes.read().get(&h.nodeid) {
                    n.size.fetch_max(
                        a.offset.saturating_add(u64::from(a.size)),
                        Ordering::Relaxed,
                    );
                }
                let out = abi::WriteOut {
                    size: a.size,
                    padding: 0,
                };
                Reply::Body(Body::of(&[out.bytes()]))
            }
            op::STATFS => {
                let out = abi::StatfsOut {
                    blocks: 1 << 30,
                    bfree: 1 << 30,
                    bavail: 1 << 30,
                    files: 1 << 20,
                    ffree: 1 << 20,
                    bsize: BLOCK,
                    namelen: 255,
                    frsize: BLOCK,
                    ..Default::default()
                };
                Reply::Body(Body::of(&[out.bytes()]))
            }
            op::RELEASE | op::FLUSH | op::FSYNC | op::DESTROY => Reply::Body(Body::empty()),
            // No extended attributes (and so no ACLs): the kernel caches that.
            op::GETXATTR => Reply::Err(libc::ENODATA),
            op::FORGET | op::BATCH_FORGET | op::INTERRUPT => Reply::None,
            _ => Reply::Err(libc::ENOSYS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(opcode: u32, nodeid: u64) -> abi::InHeader {
        abi::InHeader {
            opcode,
            nodeid,
            unique: 2,
            ..Default::default()
        }
    }

    fn body(r: Reply) -> Vec<u8> {
        match r {
            Reply::Body(b) => b.bytes().to_vec(),
            Reply::Err(e) => panic!("errno {e}"),
            _ => panic!("not a body"),
        }
    }

    #[test]
    fn create_write_stat_read() {
        let fs = NullFs::new();
        let create = abi::CreateIn {
            flags: (libc::O_WRONLY | libc::O_CREAT) as u32,
            mode: libc::S_IFREG | 0o644,
            ..Default::default()
        };
        let e = body(fs.handle(&req(op::CREATE, 1), create.bytes(), b"f\0"));
        assert_eq!(e.len(), 144);
        let ino = abi::EntryOut::read(&e).unwrap().nodeid;
        let w = abi::WriteIn {
            offset: 4096,
            size: 3,
            ..Default::default()
        };
        let out = body(fs.handle(&req(op::WRITE, ino), w.bytes(), b"abc"));
        assert_eq!(abi::WriteOut::read(&out).unwrap().size, 3);
        let a = body(fs.handle(&req(op::GETATTR, ino), &[0; 16], &[]));
        assert_eq!(abi::AttrOut::read(&a).unwrap().attr.size, 4099);
        let r = abi::ReadIn {
            offset: 4000,
            size: 1000,
            ..Default::default()
        };
        assert!(matches!(
            fs.handle(&req(op::READ, ino), r.bytes(), &[]),
            Reply::Zeros(99)
        ));
        let l = body(fs.handle(&req(op::LOOKUP, 1), &[], b"f\0"));
        assert_eq!(abi::EntryOut::read(&l).unwrap().nodeid, ino);
        assert!(matches!(
            fs.handle(&req(op::LOOKUP, 1), &[], b"g\0"),
            Reply::Err(libc::ENOENT)
        ));
        assert!(matches!(
            fs.handle(&req(op::WRITE, ino), w.bytes(), b"ab"),
            Reply::Err(libc::EINVAL)
        ));
    }
}
