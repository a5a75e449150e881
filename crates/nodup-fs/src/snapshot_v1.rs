//! Version-1 checkpoints: a full snapshot of the metadata (every inode with its attributes,
//! xattrs, block map, directory entries or symlink target) in one chain. This build only reads
//! them, to convert a version-1 image at its first read-write open (version 2 writes
//! incremental checkpoints, see [`crate::persist`]).
//!
//! Payload layout (little endian): magic 8 ("NDCKPT01") | version 4 | next_ino 8 | inodes 8 |
//! body_len 8 | body crc32c 4 | body. Per inode in the body: ino 8 | attr | xattr count 4 |
//! (name, value)* | kind-specific part — file: run count 8, runs of (first file block 8,
//! count 4, physical blocks 8 each); directory: parent 8, entry count 8, (name, ino 8)*;
//! symlink: target. Byte strings are u32-length prefixed.

use crate::blockmap::BlockMap;
use crate::codec::Dec;
#[cfg(test)]
use crate::codec::Enc;
use crate::dir::Directory;
use crate::error::{FsError, Result};
use crate::fs::MAX_FILE_BLOCKS;
use crate::inode::{Body, Inode};
use crate::state::Tables;

/// Format version of the snapshots this module reads.
const SNAPSHOT_VERSION: u32 = 1;

/// Magic at the start of a checkpoint payload.
pub const CKPT_MAGIC: [u8; 8] = *b"NDCKPT01";
/// Bytes of the fixed header before the body.
pub const HEADER: usize = 40;

#[cfg(test)]
fn enc_inode(e: &mut Enc, n: &Inode) {
    e.u64(n.ino);
    n.enc_attr_xattrs(e);
    match &n.body {
        Body::File(m) => {
            // Runs of consecutive mapped file blocks.
            let mut runs: Vec<(u64, Vec<u64>)> = Vec::new();
            for (fb, b) in m.iter() {
                match runs.last_mut() {
                    Some((start, v))
                        if *start + v.len() as u64 == fb && v.len() < u32::MAX as usize =>
                    {
                        v.push(b)
                    }
                    _ => runs.push((fb, vec![b])),
                }
            }
            e.u64(runs.len() as u64);
            for (start, v) in runs {
                e.u64(start);
                e.u32(v.len() as u32);
                for b in v {
                    e.u64(b);
                }
            }
        }
        Body::Dir(d) => {
            e.u64(d.parent);
            e.u64(d.len() as u64);
            // Cookie (creation) order, so readdir order survives a remount.
            for (_, name, ino) in d.entries_after(0) {
                e.bytes(name);
                e.u64(ino);
            }
        }
        Body::Symlink(t) => e.bytes(t),
        Body::Special => {}
    }
}

fn dec_inode(d: &mut Dec) -> Result<Inode> {
    let ino = d.u64()?;
    let (attr, xattrs) = Inode::dec_attr_xattrs(d)?;
    if let Some(what) = crate::persist::unit::impossible(&attr, &xattrs) {
        return Err(FsError::Corrupt(format!(
            "checkpoint: inode {ino} has {what}"
        )));
    }
    let body = match attr.kind {
        crate::inode::Kind::File => {
            let mut m = BlockMap::default();
            let runs = d.u64()?;
            for _ in 0..runs {
                let start = d.u64()?;
                let n = d.u32()? as u64;
                if start.checked_add(n).is_none_or(|end| end > MAX_FILE_BLOCKS) {
                    return Err(FsError::Corrupt(format!(
                        "checkpoint: inode {ino} maps blocks past the largest file"
                    )));
                }
                for i in 0..n {
                    m.set(start + i, d.u64()?);
                }
            }
            Body::File(m)
        }
        crate::inode::Kind::Dir => {
            let mut dir = Directory::new(d.u64()?);
            let n = d.u64()?;
            for _ in 0..n {
                let name = d.bytes()?;
                dir.insert(&name, d.u64()?);
            }
            Body::Dir(dir)
        }
        crate::inode::Kind::Symlink => Body::Symlink(d.bytes()?),
        _ => Body::Special,
    };
    Ok(Inode {
        ino,
        attr,
        xattrs,
        body,
        open_count: 0,
        ck: Default::default(),
    })
}

/// Serialize the whole inode table (tests build version-1 snapshots with it).
#[cfg(test)]
pub fn encode(t: &Tables) -> Vec<u8> {
    let mut body = Enc::with_capacity(64 * t.inodes.len() + 4096);
    let mut inos: Vec<u64> = t.inodes.keys().copied().collect();
    inos.sort_unstable();
    for ino in &inos {
        if let Some(n) = t.inodes.get(ino) {
            enc_inode(&mut body, &n.read());
        }
    }
    let mut e = Enc::with_capacity(HEADER + body.buf.len());
    e.buf.extend_from_slice(&CKPT_MAGIC);
    e.u32(SNAPSHOT_VERSION);
    e.u64(t.next_ino);
    e.u64(inos.len() as u64);
    e.u64(body.buf.len() as u64);
    e.u32(crc32c::crc32c(&body.buf));
    e.buf.extend_from_slice(&body.buf);
    e.buf
}

/// Check a checkpoint payload's header and checksum without building anything.
pub fn validate(payload: &[u8]) -> Result<()> {
    header(payload).map(|_| ())
}

/// Validated header fields and body: (next_ino, inode count, body).
fn header(payload: &[u8]) -> Result<(u64, u64, &[u8])> {
    if payload.len() < HEADER || payload[..8] != CKPT_MAGIC {
        return Err(FsError::Corrupt("checkpoint header missing".into()));
    }
    let mut d = Dec::new(&payload[8..HEADER]);
    let version = d.u32()?;
    if version != SNAPSHOT_VERSION {
        return Err(FsError::Version {
            found: version,
            supported: SNAPSHOT_VERSION,
        });
    }
    let next_ino = d.u64()?;
    let count = d.u64()?;
    let len = d.u64()? as usize;
    let crc = d.u32()?;
    let body = payload
        .get(HEADER..HEADER.saturating_add(len))
        .ok_or_else(|| FsError::Corrupt("checkpoint shorter than its header says".into()))?;
    if crc32c::crc32c(body) != crc {
        return Err(FsError::Corrupt("checkpoint checksum mismatch".into()));
    }
    Ok((next_ino, count, body))
}

/// Rebuild the inode table from a snapshot payload (validated: magic, version, checksum); every
/// inode is marked changed, so the next checkpoint writes all of it in the current format.
pub fn decode(payload: &[u8]) -> Result<Tables> {
    let (next_ino, count, body) = header(payload)?;
    let mut t = Tables::default();
    t.inodes.reserve(count.min(1 << 24) as usize);
    let mut d = Dec::new(body);
    for _ in 0..count {
        let mut n = dec_inode(&mut d)?;
        t.persist.touch_all(&mut n);
        t.insert(n);
    }
    t.next_ino = t.next_ino.max(next_ino);
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inode::{Attr, Kind, Ts};
    use crate::log::record::Record;

    #[test]
    fn snapshot_roundtrip() {
        let mut t = Tables::with_root(0, 0);
        let now = Ts { sec: 1, nsec: 2 };
        let attr = |kind| Attr {
            kind,
            perm: 0o644,
            uid: 5,
            gid: 6,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            size: 0,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
        };
        t.apply(&Record::Create {
            parent: 1,
            name: b"f".to_vec(),
            ino: 2,
            attr: attr(Kind::File),
            target: vec![],
        })
        .unwrap();
        t.apply(&Record::Create {
            parent: 1,
            name: b"d".to_vec(),
            ino: 3,
            attr: attr(Kind::Dir),
            target: vec![],
        })
        .unwrap();
        t.apply(&Record::Create {
            parent: 3,
            name: b"l".to_vec(),
            ino: 4,
            attr: attr(Kind::Symlink),
            target: b"../f".to_vec(),
        })
        .unwrap();
        t.apply(&Record::Write {
            ino: 2,
            first: 3,
            blocks: vec![100, 101, 102],
            size: 6 << 30,
            mtime: now,
        })
        .unwrap();
        t.apply(&Record::Write {
            ino: 2,
            first: 1 << 20,
            blocks: vec![100],
            size: 6 << 30,
            mtime: now,
        })
        .unwrap();
        t.apply(&Record::SetXattr {
            ino: 2,
            name: b"user.a".to_vec(),
            value: b"v".to_vec(),
            now,
        })
        .unwrap();
        let bytes = encode(&t);
        let back = decode(&bytes).unwrap();
        assert_eq!(back.inodes.len(), 4);
        assert_eq!(back.next_ino, 5);
        for (ino, n) in &t.inodes {
            assert_eq!(*back.inodes[ino].read(), *n.read(), "inode {ino}");
        }
        let mut bad = bytes.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(decode(&bad).is_err());
    }
}
