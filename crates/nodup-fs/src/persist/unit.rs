//! Checkpoint units: the pieces of metadata a checkpoint segment holds.
//!
//! A segment's payload is a sequence of unit frames (little endian):
//!
//! | offset | width | field                                   |
//! |-------:|------:|-----------------------------------------|
//! | 0      | 4     | frame length (header included)          |
//! | 4      | 4     | crc32c of bytes 8..length               |
//! | 8      | 1     | kind: 1 head, 2 map unit, 3 dir unit    |
//! | 9      | 8     | inode number                            |
//! | 17     | 8     | unit index (0 for a head)               |
//! | 25     | ...   | body                                    |
//!
//! Bodies (byte strings are u32-length prefixed; a *unit list* is a u32 count of runs, each
//! run a first unit u64 and a count u32; *map entries* are a u32 count of runs, each run a
//! first index u32 inside the unit, a count u32 and that many physical blocks u64; *dir
//! entries* are a u32 count of (cookie u64, inode u64, name bytes)):
//! - head: attributes | xattr count u32, (name, value)* | then by kind: file: unit list, map
//!   entries of unit 0; directory: parent u64, next cookie u64, unit list, dir entries of
//!   unit 0; symlink: target; others: nothing.
//! - map unit: map entries; dir unit: dir entries.
//!
//! Every field is checked on decode: lengths, checksums, indices inside their unit, cookies
//! inside their unit and increasing, names valid, no zero block or inode number (nor
//! `u64::MAX`, one past which the next inode number would overflow), and a head's attributes
//! possible (`impossible`). What the units say together (the tree, link counts, block
//! numbers) is checked as the loader walks the tree (`persist::load::Tree`).

use crate::blockmap::{BlockMap, CHUNK, DIRECT};
use crate::codec::{Dec, Enc};
use crate::dir::{Directory, UNIT_COOKIES};
use crate::error::{FsError, Result};
use crate::inode::{Attr, Body, Inode};
use crate::log::check::xattr_fits;
use nodup_core::BlockNr;
use std::collections::BTreeMap;

/// Bytes of a unit frame header.
pub const UNIT_HEADER: usize = 25;

/// What a unit holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnitKind {
    /// Attributes, xattrs, unit list and unit 0 of an inode.
    Head = 1,
    /// A further unit of a file's block map.
    Map = 2,
    /// A further unit of a directory.
    Dir = 3,
}

impl UnitKind {
    fn from_u8(v: u8) -> Result<UnitKind> {
        Ok(match v {
            1 => UnitKind::Head,
            2 => UnitKind::Map,
            3 => UnitKind::Dir,
            _ => return Err(corrupt(format!("unit kind {v}"))),
        })
    }
}

fn corrupt(m: String) -> FsError {
    FsError::Corrupt(format!("checkpoint segment: {m}"))
}

/// Append one unit frame to `out`, its body written in place by `body`; returns its length.
fn frame(
    out: &mut Vec<u8>,
    kind: UnitKind,
    ino: u64,
    unit: u64,
    body: impl FnOnce(&mut Enc),
) -> u32 {
    let start = out.len();
    let mut e = Enc {
        buf: std::mem::take(out),
    };
    e.u32(0);
    e.u32(0);
    e.u8(kind as u8);
    e.u64(ino);
    e.u64(unit);
    body(&mut e);
    *out = e.buf;
    let len = out.len() - start;
    out[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
    let crc = crc32c::crc32c(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    len as u32
}

fn enc_unit_list(e: &mut Enc, units: &[u64]) {
    let mut runs: Vec<(u64, u32)> = Vec::new();
    for &u in units {
        match runs.last_mut() {
            Some((s, n)) if *s + *n as u64 == u && *n < u32::MAX => *n += 1,
            _ => runs.push((u, 1)),
        }
    }
    e.u32(runs.len() as u32);
    for (s, n) in runs {
        e.u64(s);
        e.u32(n);
    }
}

fn dec_unit_list(d: &mut Dec, max_unit: u64) -> Result<Vec<u64>> {
    let runs = d.u32()?;
    let mut v: Vec<u64> = Vec::new();
    for _ in 0..runs {
        let s = d.u64()?;
        let n = d.u32()? as u64;
        let end = s
            .checked_add(n)
            .filter(|&e| e <= max_unit.saturating_add(1));
        if s == 0 || n == 0 || end.is_none() || v.last().is_some_and(|&l| l >= s) {
            return Err(corrupt("bad unit list".into()));
        }
        if v.len() as u64 + n > (1 << 32) || n > d.remaining() as u64 * 8 + 1 {
            return Err(corrupt("unit list too long".into()));
        }
        v.extend(s..s + n);
    }
    Ok(v)
}

/// Append `v` as little-endian u64s (one copy on little-endian machines: a map unit is mostly
/// this, and the cut that encodes it pauses operations).
fn put_u64s(out: &mut Vec<u8>, v: &[u64]) {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: a u64 slice is 8 * len initialised bytes with no padding; reading them as
        // bytes is their little-endian encoding on this target.
        let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 8) };
        out.extend_from_slice(bytes);
    }
    #[cfg(not(target_endian = "little"))]
    for &b in v {
        out.extend_from_slice(&b.to_le_bytes());
    }
}

/// Encode the non-zero slots of a unit as runs of consecutive mapped blocks.
fn enc_map_slots(e: &mut Enc, slots: &[BlockNr]) {
    let at = e.buf.len();
    e.u32(0);
    let mut runs = 0u32;
    let mut i = 0;
    while i < slots.len() {
        if slots[i] == 0 {
            i += 1;
            continue;
        }
        let start = i;
        while i < slots.len() && slots[i] != 0 {
            i += 1;
        }
        e.u32(start as u32);
        e.u32((i - start) as u32);
        put_u64s(&mut e.buf, &slots[start..i]);
        runs += 1;
    }
    e.buf[at..at + 4].copy_from_slice(&runs.to_le_bytes());
}

/// Map entries of one unit: (index inside the unit, physical block).
pub type MapEntries = Vec<(u32, BlockNr)>;
/// Directory entries of one unit: (cookie, name, inode).
pub type DirEntries = Vec<(u64, Vec<u8>, u64)>;

fn dec_map_entries(d: &mut Dec, unit_len: u32) -> Result<MapEntries> {
    let runs = d.u32()?;
    let mut v: MapEntries = Vec::new();
    for _ in 0..runs {
        let s = d.u32()?;
        let n = d.u32()?;
        let ok = n > 0
            && s.checked_add(n).is_some_and(|e| e <= unit_len)
            && v.last().is_none_or(|&(l, _)| l < s);
        if !ok || (n as usize) > d.remaining() / 8 {
            return Err(corrupt("bad map run".into()));
        }
        for i in 0..n {
            let b = d.u64()?;
            if b == 0 {
                return Err(corrupt("map entry names block 0".into()));
            }
            v.push((s + i, b));
        }
    }
    Ok(v)
}

fn enc_dir_entries(e: &mut Enc, d: &Directory, unit: u64) {
    let at = e.buf.len();
    e.u32(0);
    let mut n = 0u32;
    for (c, name, ino) in d.unit_entries(unit) {
        e.u64(c);
        e.u64(ino);
        e.bytes(name);
        n += 1;
    }
    e.buf[at..at + 4].copy_from_slice(&n.to_le_bytes());
}

fn dec_dir_entries(d: &mut Dec, unit: u64) -> Result<DirEntries> {
    let n = d.u32()?;
    if n as u64 > UNIT_COOKIES {
        return Err(corrupt("too many directory entries in a unit".into()));
    }
    let lo = unit.saturating_mul(UNIT_COOKIES);
    let mut v: DirEntries = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let c = d.u64()?;
        let ino = d.u64()?;
        let name = d.bytes()?;
        let bad_name = name.is_empty()
            || name.len() > crate::fs::NAME_MAX
            || name.contains(&b'/')
            || name == b"."
            || name == b"..";
        if c < lo || c - lo >= UNIT_COOKIES || v.last().is_some_and(|l| l.0 >= c) {
            return Err(corrupt("directory cookie out of order".into()));
        }
        if ino == 0 || ino == u64::MAX || bad_name {
            return Err(corrupt("bad directory entry".into()));
        }
        v.push((c, name, ino));
    }
    Ok(v)
}

/// Append the head unit of `n` to `out`; returns its frame length.
pub fn encode_head(out: &mut Vec<u8>, n: &Inode) -> u32 {
    frame(out, UnitKind::Head, n.ino, 0, |e| {
        n.enc_attr_xattrs(e);
        match &n.body {
            Body::File(m) => {
                let units: Vec<u64> = m.units().into_iter().filter(|&u| u != 0).collect();
                enc_unit_list(e, &units);
                enc_map_slots(e, m.unit_slots(0));
            }
            Body::Dir(d) => {
                e.u64(d.parent);
                e.u64(d.next_cookie());
                let units: Vec<u64> = d.units().into_iter().filter(|&u| u != 0).collect();
                enc_unit_list(e, &units);
                enc_dir_entries(e, d, 0);
            }
            Body::Symlink(t) => e.bytes(t),
            Body::Special => {}
        }
    })
}

/// Append map unit `u` (>= 1) of file `ino` to `out`; returns its frame length.
pub fn encode_map_unit(out: &mut Vec<u8>, ino: u64, u: u64, m: &BlockMap) -> u32 {
    frame(out, UnitKind::Map, ino, u, |e| {
        enc_map_slots(e, m.unit_slots(u))
    })
}

/// Append directory unit `u` (>= 1) of directory `ino` to `out`; returns its frame length.
pub fn encode_dir_unit(out: &mut Vec<u8>, ino: u64, u: u64, d: &Directory) -> u32 {
    frame(out, UnitKind::Dir, ino, u, |e| enc_dir_entries(e, d, u))
}

/// A decoded head unit.
#[derive(Debug, Clone)]
pub struct Head {
    pub attr: Attr,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    pub body: HeadBody,
}

/// The kind-specific part of a head.
#[derive(Debug, Clone)]
pub enum HeadBody {
    File {
        units: Vec<u64>,
        first: MapEntries,
    },
    Dir {
        parent: u64,
        next_cookie: u64,
        units: Vec<u64>,
        first: DirEntries,
    },
    Symlink(Vec<u8>),
    Special,
}

/// Units a file can have (its largest file block is below `MAX_FILE_SIZE`).
fn max_map_unit() -> u64 {
    crate::blockmap::unit_of(crate::fs::MAX_FILE_BLOCKS)
}

/// Largest next cookie a directory head may hold: cookies are readdir offsets, which the kernel
/// holds as signed 64-bit numbers, and half that range leaves counting on from it 2^62 inserts.
const MAX_NEXT_COOKIE: u64 = i64::MAX as u64 / 2;

/// What makes a head's attributes impossible for any inode the file system writes (a created
/// inode's in a log record too, `log::check`): mode bits
/// beyond the permission bits, a size past the largest file, a timestamp's nanoseconds past a
/// second (its conversion to a `SystemTime` could overflow), an extended attribute of a size
/// `setxattr` refuses.
pub(crate) fn impossible(attr: &Attr, xattrs: &crate::inode::Xattrs) -> Option<&'static str> {
    if attr.perm & !0o7777 != 0 {
        return Some("mode bits beyond the permission bits");
    }
    if attr.size > crate::fs::MAX_FILE_SIZE {
        return Some("a size past the largest file");
    }
    if ![attr.atime, attr.mtime, attr.ctime]
        .iter()
        .all(|t| t.valid())
    {
        return Some("a timestamp out of range");
    }
    if !xattrs.iter().all(|(k, v)| xattr_fits(k, v)) {
        return Some("an extended attribute of an impossible size");
    }
    None
}

/// Decode a head body.
pub fn decode_head(body: &[u8]) -> Result<Head> {
    let mut d = Dec::new(body);
    let (attr, xattrs) = Inode::dec_attr_xattrs(&mut d)?;
    if let Some(what) = impossible(&attr, &xattrs) {
        return Err(corrupt(format!("a head with {what}")));
    }
    use crate::inode::Kind;
    let body = match attr.kind {
        Kind::File => HeadBody::File {
            units: dec_unit_list(&mut d, max_map_unit())?,
            first: dec_map_entries(&mut d, DIRECT as u32)?,
        },
        Kind::Dir => {
            let parent = d.u64()?;
            let next_cookie = d.u64()?;
            if next_cookie > MAX_NEXT_COOKIE {
                return Err(corrupt("directory cookies past their range".into()));
            }
            let units = dec_unit_list(&mut d, next_cookie / UNIT_COOKIES)?;
            HeadBody::Dir {
                parent,
                next_cookie,
                units,
                first: dec_dir_entries(&mut d, 0)?,
            }
        }
        Kind::Symlink => HeadBody::Symlink(d.bytes()?),
        _ => HeadBody::Special,
    };
    if d.remaining() != 0 {
        return Err(corrupt("trailing bytes in a head".into()));
    }
    Ok(Head { attr, xattrs, body })
}

/// Decode a map unit body.
pub fn decode_map_unit(body: &[u8]) -> Result<MapEntries> {
    let mut d = Dec::new(body);
    let v = dec_map_entries(&mut d, CHUNK as u32)?;
    if d.remaining() != 0 || v.is_empty() {
        return Err(corrupt("bad map unit".into()));
    }
    Ok(v)
}

/// Decode directory unit `unit`'s body.
pub fn decode_dir_unit(body: &[u8], unit: u64) -> Result<DirEntries> {
    let mut d = Dec::new(body);
    let v = dec_dir_entries(&mut d, unit)?;
    if d.remaining() != 0 || v.is_empty() {
        return Err(corrupt("bad directory unit".into()));
    }
    Ok(v)
}

/// One unit frame of a segment, checked but not decoded.
#[derive(Debug, Clone, Copy)]
pub struct RawUnit<'a> {
    pub kind: UnitKind,
    pub ino: u64,
    pub unit: u64,
    /// Frame length (what the unit costs in its segment).
    pub len: u32,
    pub body: &'a [u8],
}

/// Visit every unit frame of a segment payload (exactly `payload.len()` bytes of frames).
pub fn for_each_unit(payload: &[u8], f: &mut dyn FnMut(RawUnit) -> Result<()>) -> Result<()> {
    let mut pos = 0;
    while pos < payload.len() {
        let rest = &payload[pos..];
        if rest.len() < UNIT_HEADER {
            return Err(corrupt("truncated unit".into()));
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len < UNIT_HEADER || len > rest.len() {
            return Err(corrupt("unit length out of range".into()));
        }
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if crc32c::crc32c(&rest[8..len]) != crc {
            return Err(corrupt("unit checksum mismatch".into()));
        }
        let mut d = Dec::new(&rest[8..UNIT_HEADER]);
        let kind = UnitKind::from_u8(d.u8()?)?;
        let ino = d.u64()?;
        let unit = d.u64()?;
        if ino == 0 || ino == u64::MAX || (kind == UnitKind::Head) != (unit == 0) {
            return Err(corrupt("bad unit key".into()));
        }
        f(RawUnit {
            kind,
            ino,
            unit,
            len: len as u32,
            body: &rest[UNIT_HEADER..len],
        })?;
        pos += len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inode::{Kind, Ts};

    fn attr(kind: Kind) -> Attr {
        let now = Ts { sec: 3, nsec: 4 };
        Attr {
            kind,
            perm: 0o640,
            uid: 7,
            gid: 8,
            nlink: 1,
            size: 1 << 30,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
        }
    }

    #[test]
    fn heads_and_units_roundtrip() {
        let mut f = Inode::new(9, attr(Kind::File), 1, b"");
        f.xattrs.insert(b"user.a".to_vec(), b"xyz".to_vec());
        let m = f.map_mut().unwrap();
        for fb in [0u64, 1, 2, 7, 511, 512, 513, 900, 5000, 5001] {
            m.set(fb, 1000 + fb);
        }
        let mut out = Vec::new();
        let hl = encode_head(&mut out, &f);
        let units: Vec<u64> = f.map().unwrap().units();
        assert_eq!(units, vec![0, 1, 9]);
        for &u in &units[1..] {
            encode_map_unit(&mut out, 9, u, f.map().unwrap());
        }
        let mut dir = Inode::new(10, attr(Kind::Dir), 1, b"");
        for i in 0..300u64 {
            dir.dir_mut()
                .unwrap()
                .insert(format!("n{i}").as_bytes(), 100 + i);
        }
        encode_head(&mut out, &dir);
        for u in dir.dir().unwrap().units().into_iter().filter(|&u| u != 0) {
            encode_dir_unit(&mut out, 10, u, dir.dir().unwrap());
        }
        let mut seen = Vec::new();
        for_each_unit(&out, &mut |r| {
            seen.push((r.kind, r.ino, r.unit));
            match r.kind {
                UnitKind::Head if r.ino == 9 => {
                    assert_eq!(r.len, hl);
                    let h = decode_head(r.body).unwrap();
                    assert_eq!(h.attr, f.attr);
                    assert_eq!(h.xattrs, f.xattrs);
                    let HeadBody::File { units, first } = h.body else {
                        panic!("not a file head")
                    };
                    assert_eq!(units, vec![1, 9]);
                    assert_eq!(first.len(), 5);
                }
                UnitKind::Head => {
                    let HeadBody::Dir { units, first, .. } = decode_head(r.body).unwrap().body
                    else {
                        panic!("not a dir head")
                    };
                    assert_eq!(units, vec![1, 2]);
                    assert_eq!(first.len(), 125);
                }
                UnitKind::Map => {
                    let e = decode_map_unit(r.body).unwrap();
                    assert!(!e.is_empty());
                }
                UnitKind::Dir => {
                    let e = decode_dir_unit(r.body, r.unit).unwrap();
                    assert!(e.iter().all(|x| x.0 / UNIT_COOKIES == r.unit));
                }
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.len(), 6);
        // Any flipped byte is caught by a checksum or a field check.
        for i in [3usize, 5, 8, 12, 30, out.len() - 1] {
            let mut bad = out.clone();
            bad[i] ^= 0x10;
            assert!(for_each_unit(&bad, &mut |_| Ok(())).is_err(), "byte {i}");
        }
    }
}
