//! What a log record may ask of the inode table, checked before the record changes anything.
//!
//! The running file system logs only records that pass: its own checks come first and answer
//! with errnos, and these run again before every append (`FileSystem::append_for`, `meta_op`),
//! so a record they refuse is an error there and never reaches the log. A record read back
//! from the medium has a valid checksum and sequence number, but a bug that wrote it, or a
//! forged frame, could still ask for a loop in the tree, a second name for a directory, a block
//! past the end of a file or a reference to block 0. Replay refuses such a record as corrupt
//! instead of building a table that only fsck would notice.

use crate::error::{FsError, Result};
use crate::fs::{name_ok, LINK_MAX, MAX_FILE_BLOCKS, MAX_FILE_SIZE, NAME_MAX};
use crate::inode::{Inode, Kind, Ts, Xattrs, ROOT_INO};
use crate::log::record::Record;
use crate::persist::unit::impossible;
use crate::state::{InodeRef, Tables};
use nodup_core::BLOCK_SIZE;

const BS: u64 = BLOCK_SIZE as u64;
/// Largest extended-attribute value the file system stores (Linux's XATTR_SIZE_MAX).
pub const XATTR_VALUE_MAX: usize = 65536;

/// An extended attribute the file system can hold: a name of 1 to NAME_MAX bytes and a value
/// of at most [`XATTR_VALUE_MAX`] (what setxattr accepts; checkpoint heads are held to it too).
pub(crate) fn xattr_fits(name: &[u8], value: &[u8]) -> bool {
    !name.is_empty() && name.len() <= NAME_MAX && value.len() <= XATTR_VALUE_MAX
}

/// The error for a record that asks for `what`.
pub(crate) fn corrupt(what: &str) -> FsError {
    FsError::Corrupt(format!("log record refers to {what}"))
}

/// Whether moving directory `dir` into `newparent` would put it below itself: `Some(true)` when
/// `newparent` is `dir` or one of its descendants, `Some(false)` when the parent chain from
/// `newparent` reaches the root first, `None` when that chain is broken (a missing inode, a
/// non-directory, a loop), which only a damaged table has.
pub(crate) fn moves_below_itself(t: &Tables, dir: u64, newparent: u64) -> Option<bool> {
    let mut cur = newparent;
    // A chain longer than the table has inodes is a loop.
    for _ in 0..=t.inodes.len() {
        if cur == dir {
            return Some(true);
        }
        if cur == ROOT_INO {
            return Some(false);
        }
        cur = t.get(cur)?.read().dir()?.parent;
    }
    None
}

/// The inode `parent/name` names (the entry must exist and point at an inode).
fn entry(t: &Tables, parent: u64, name: &[u8]) -> Result<(u64, InodeRef)> {
    let ino = t
        .need(parent)?
        .read()
        .dir()
        .and_then(|d| d.get(name))
        .ok_or_else(|| corrupt("a missing entry"))?;
    Ok((ino, t.need(ino)?))
}

/// `parent/name` can be created: a valid name, absent from an existing directory.
fn new_entry(t: &Tables, parent: u64, name: &[u8]) -> Result<()> {
    name_ok(name).map_err(|_| corrupt("an invalid name"))?;
    match t.need(parent)?.read().dir() {
        None => Err(corrupt("a non-directory parent")),
        Some(d) if d.get(name).is_some() => Err(corrupt("a name that already exists")),
        Some(_) => Ok(()),
    }
}

/// Every timestamp a record carries (padded with zero times).
fn times(rec: &Record) -> [Ts; 3] {
    let z = Ts::default();
    match rec {
        Record::Create { attr, .. } => [attr.atime, attr.mtime, attr.ctime],
        Record::SetAttr {
            atime,
            mtime,
            ctime,
            ..
        } => [*atime, *mtime, *ctime],
        Record::Write { mtime, .. } => [*mtime, z, z],
        Record::Link { now, .. }
        | Record::Unlink { now, .. }
        | Record::Rmdir { now, .. }
        | Record::Rename { now, .. }
        | Record::Truncate { now, .. }
        | Record::Punch { now, .. }
        | Record::SetXattr { now, .. }
        | Record::RemoveXattr { now, .. } => [*now, z, z],
        Record::Remap { .. } => [z, z, z],
    }
}

/// A record's times are ones the file system makes: a checkpoint holding another would not
/// decode (`persist::unit`), so replaying it would leave an image that cannot be opened.
fn times_ok(rec: &Record) -> Result<()> {
    if times(rec).iter().all(|t| t.valid()) {
        Ok(())
    } else {
        Err(corrupt("a timestamp out of range"))
    }
}

/// Check a record that changes the namespace (create, link, unlink, rmdir, rename) against
/// `t`; records that change one inode are checked by [`inode`] and pass here.
pub(crate) fn namespace(t: &Tables, rec: &Record) -> Result<()> {
    if matches!(
        rec,
        Record::Create { .. }
            | Record::Link { .. }
            | Record::Unlink { .. }
            | Record::Rmdir { .. }
            | Record::Rename { .. }
    ) {
        times_ok(rec)?;
    }
    match rec {
        Record::Create {
            parent,
            name,
            ino,
            attr,
            target,
        } => {
            new_entry(t, *parent, name)?;
            if *ino <= ROOT_INO || *ino == u64::MAX || t.get(*ino).is_some() {
                return Err(corrupt(&format!("new inode {ino}, a number in use")));
            }
            let nlink = if attr.kind == Kind::Dir { 2 } else { 1 };
            if attr.nlink != nlink
                || impossible(attr, &Xattrs::new()).is_some()
                || (attr.kind == Kind::Symlink) == target.is_empty()
            {
                return Err(corrupt("a new inode with impossible attributes"));
            }
            Ok(())
        }
        Record::Link {
            parent, name, ino, ..
        } => {
            new_entry(t, *parent, name)?;
            let node = t.need(*ino)?;
            let n = node.read();
            if n.attr.kind == Kind::Dir || n.attr.nlink == 0 || n.attr.nlink >= LINK_MAX {
                return Err(corrupt("a link to an inode that cannot take one"));
            }
            Ok(())
        }
        Record::Unlink { parent, name, .. } | Record::Rmdir { parent, name, .. } => {
            let (_, node) = entry(t, *parent, name)?;
            let n = node.read();
            match (matches!(rec, Record::Rmdir { .. }), n.dir()) {
                (false, None) => Ok(()),
                (true, Some(d)) if d.is_empty() => Ok(()),
                (false, Some(_)) => Err(corrupt("an unlink of a directory")),
                (true, _) => Err(corrupt(
                    "a removal of a non-empty directory or a non-directory",
                )),
            }
        }
        Record::Rename {
            parent,
            name,
            newparent,
            newname,
            ..
        } => {
            let (src, snode) = entry(t, *parent, name)?;
            name_ok(newname).map_err(|_| corrupt("an invalid name"))?;
            let target = t
                .need(*newparent)?
                .read()
                .dir()
                .ok_or_else(|| corrupt("a non-directory rename target"))?
                .get(newname);
            if target == Some(src) {
                return Ok(());
            }
            let src_dir = snode.read().attr.kind == Kind::Dir;
            if let Some(tino) = target {
                let tnode = t.need(tino)?;
                let tn = tnode.read();
                match (src_dir, tn.dir()) {
                    (false, None) => {}
                    (true, Some(d)) if d.is_empty() => {}
                    _ => {
                        return Err(corrupt(
                            "a rename over an entry of another kind or a non-empty directory",
                        ))
                    }
                }
            }
            if src_dir && moves_below_itself(t, src, *newparent) != Some(false) {
                return Err(corrupt("a directory moved below itself"));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Check a record that changes the single inode `n` (attributes, data, extended attributes).
pub(crate) fn inode(n: &Inode, rec: &Record) -> Result<()> {
    times_ok(rec)?;
    let file = || {
        n.map()
            .ok_or_else(|| corrupt("a data change to a non-file"))
    };
    let ok = |cond: bool, what: &str| if cond { Ok(()) } else { Err(corrupt(what)) };
    match rec {
        Record::SetAttr { perm, .. } => {
            ok(perm & !0o7777 == 0, "a mode beyond the permission bits")
        }
        Record::Write {
            first,
            blocks,
            size,
            ..
        } => {
            file()?;
            // A record may claim any range: the map must not grow units past the largest file.
            let fits = first
                .checked_add(blocks.len() as u64)
                .is_some_and(|end| end <= MAX_FILE_BLOCKS);
            ok(fits, "a write past the largest file size")?;
            // A write never shrinks its file, and every block it maps lies before the end.
            let last = blocks.iter().rposition(|&b| b != 0);
            ok(
                *size <= MAX_FILE_SIZE
                    && *size >= n.attr.size
                    && last.is_none_or(|i| (first + i as u64) * BS < *size),
                "a write whose blocks or size pass its end of file",
            )
        }
        Record::Truncate { size, tail, .. } => {
            file()?;
            ok(
                *size <= MAX_FILE_SIZE,
                "a truncation past the largest file size",
            )?;
            ok(
                tail.is_none_or(|(fb, b)| b != 0 && size % BS != 0 && fb == size / BS),
                "a truncation's tail block other than its new last block",
            )
        }
        Record::Punch { start, end, .. } => {
            file()?;
            ok(
                start < end && *end <= MAX_FILE_BLOCKS,
                "a hole punched outside the largest file",
            )
        }
        Record::Remap {
            index, from, to, ..
        } => {
            let map = file()?;
            ok(
                *index < MAX_FILE_BLOCKS && *from != 0 && *to != 0 && map.get(*index) == *from,
                "a remap of a block the file does not hold",
            )
        }
        Record::SetXattr { name, value, .. } => ok(
            xattr_fits(name, value),
            "an extended attribute of an impossible size",
        ),
        Record::RemoveXattr { .. } => Ok(()),
        _ => Err(corrupt("a namespace record applied to one inode")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsck::{check_tables, Bounds, FsckReport};
    use crate::inode::{Attr, Ts};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const NOW: Ts = Ts { sec: 5, nsec: 0 };

    fn name() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            8 => prop::sample::select(vec![&b"a"[..], b"b", b"d", b"e", b"f", b"g", b"h", b"s"]).prop_map(|n| n.to_vec()),
            1 => prop::sample::select(vec![&b""[..], b".", b"..", b"x/y"]).prop_map(|n| n.to_vec()),
        ]
    }

    /// Inode numbers: mostly ones a small table has, sometimes the extremes.
    fn ino() -> impl Strategy<Value = u64> {
        prop_oneof![16 => 1u64..10, 2 => 10u64..14, 1 => Just(0u64), 1 => Just(u64::MAX)]
    }

    /// A new inode's attributes and symlink target: right nine times in ten, else one thing off.
    fn attr_target() -> impl Strategy<Value = (Attr, Vec<u8>)> {
        (
            0u8..3,
            prop::sample::select(vec![0u8, 0, 0, 0, 0, 0, 0, 1, 2, 3]),
        )
            .prop_map(|(k, flaw)| {
                let kind = [Kind::File, Kind::Dir, Kind::Symlink][k as usize];
                let nlink = if kind == Kind::Dir { 2 } else { 1 };
                let attr = Attr {
                    kind,
                    perm: if flaw == 1 { 0o100755 } else { 0o755 },
                    nlink: if flaw == 2 { nlink + 1 } else { nlink },
                    ..Attr::test_file(0, 0, NOW)
                };
                let symlink = (kind == Kind::Symlink) != (flaw == 3);
                (
                    attr,
                    if symlink {
                        b"dest".to_vec()
                    } else {
                        Vec::new()
                    },
                )
            })
    }

    fn record() -> impl Strategy<Value = Record> {
        let blocks = prop::collection::vec(prop_oneof![3 => 1u64..4, 1 => Just(0u64)], 0..5);
        prop_oneof![
            6 => (ino(), name(), prop_oneof![9 => 10u64..16, 1 => ino()], attr_target())
                .prop_map(|(parent, name, ino, (attr, target))| Record::Create { parent, name, ino, attr, target }),
            2 => (ino(), name(), ino()).prop_map(|(parent, name, ino)| Record::Link { parent, name, ino, now: NOW }),
            2 => (ino(), name()).prop_map(|(parent, name)| Record::Unlink { parent, name, now: NOW }),
            2 => (ino(), name()).prop_map(|(parent, name)| Record::Rmdir { parent, name, now: NOW }),
            2 => (ino(), name(), ino(), name()).prop_map(|(parent, name, newparent, newname)| {
                Record::Rename { parent, name, newparent, newname, now: NOW }
            }),
            1 => (ino(), prop_oneof![Just(0o644u32), Just(0o104755), Just(0o40755)]).prop_map(|(ino, perm)| {
                Record::SetAttr { ino, perm, uid: 1, gid: 1, atime: NOW, mtime: NOW, ctime: NOW }
            }),
            // Sizes mostly at or just inside the end of the blocks written, so many fit.
            6 => (ino(), prop_oneof![8 => 0u64..6, 1 => Just(u64::MAX - 1), 1 => Just(MAX_FILE_BLOCKS - 1)],
                  blocks, prop_oneof![4 => (0u64..4096).prop_map(Some), 1 => Just(None)], 0u64..40_000)
                .prop_map(|(ino, first, blocks, slack, any_size)| {
                    let end = first.saturating_add(blocks.len() as u64).saturating_mul(4096);
                    let size = slack.map_or(any_size, |s| end.saturating_sub(s));
                    Record::Write { ino, first, blocks, size, mtime: NOW }
                }),
            3 => (ino(), 0u64..40_000, 0u64..6, prop::sample::select(vec![0u8, 0, 0, 1, 2])).prop_map(|(ino, size, b, t)| {
                // Mostly the tail a shrinking truncation logs (the new last block, when partial).
                let tail = match t {
                    0 => (size % 4096 != 0).then_some((size / 4096, b)),
                    1 => None,
                    _ => Some((size / 4096 + 1, b)),
                };
                Record::Truncate { ino, size, tail, now: NOW }
            }),
            2 => (ino(), 0u64..8, prop_oneof![0u64..10, Just(u64::MAX)])
                .prop_map(|(ino, start, end)| Record::Punch { ino, start, end, now: NOW }),
            3 => (ino(), prop_oneof![0u64..3, Just(u64::MAX)], 0u64..4, 1u64..6)
                .prop_map(|(ino, index, from, to)| Record::Remap { ino, index, from, to }),
            1 => (ino(), prop::sample::select(vec![&b"user.a"[..], b""]), 0usize..3)
                .prop_map(|(ino, n, len)| Record::SetXattr { ino, name: n.to_vec(), value: vec![7; len], now: NOW }),
            1 => ino().prop_map(|ino| Record::RemoveXattr { ino, name: b"user.a".to_vec(), now: NOW }),
        ]
    }

    /// A small tree every sequence starts from, so that records naming inodes 1-9 often fit:
    /// directories 2 (/d) and 3 (/d/e), files 4 (/f, three blocks), 5 (/d/g, a hole) and 7
    /// (/h, empty), symlink 6 (/d/e/s), empty directories 8 (/a) and 9 (/d/b).
    fn seeded() -> Tables {
        let mut t = Tables::with_root(0, 0);
        let create = |parent, name: &[u8], ino, kind| {
            let (nlink, target) = match kind {
                Kind::Dir => (2, Vec::new()),
                Kind::Symlink => (1, b"../../f".to_vec()),
                _ => (1, Vec::new()),
            };
            let attr = Attr {
                kind,
                nlink,
                ..Attr::test_file(0, 0, NOW)
            };
            Record::Create {
                parent,
                name: name.to_vec(),
                ino,
                attr,
                target,
            }
        };
        let write = |ino, blocks: &[u64], size| Record::Write {
            ino,
            first: 0,
            blocks: blocks.to_vec(),
            size,
            mtime: NOW,
        };
        for rec in [
            create(1, b"d", 2, Kind::Dir),
            create(2, b"e", 3, Kind::Dir),
            create(1, b"f", 4, Kind::File),
            create(2, b"g", 5, Kind::File),
            create(3, b"s", 6, Kind::Symlink),
            create(1, b"h", 7, Kind::File),
            create(1, b"a", 8, Kind::Dir),
            create(2, b"b", 9, Kind::Dir),
            write(4, &[1, 2, 3], 3 * 4096),
            write(5, &[2, 0, 3], 10_000),
        ] {
            t.apply(&rec).unwrap();
        }
        t
    }

    fn snapshot(t: &Tables) -> (u64, BTreeMap<u64, Inode>) {
        let inodes = t
            .inodes
            .iter()
            .map(|(&i, n)| (i, n.read().clone()))
            .collect();
        (t.next_ino, inodes)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Whatever records arrive, in whatever order: each one either leaves the table exactly
        /// as it was (refused) or leaves a tree fsck finds nothing wrong with, and none panics.
        #[test]
        fn any_record_is_refused_or_keeps_the_tree_sound(recs in prop::collection::vec(record(), 1..80)) {
            let mut t = seeded();
            let meta = rustc_hash::FxHashSet::default();
            let bounds = Bounds { data: 1..u64::MAX, meta: &meta };
            for rec in &recs {
                let before = snapshot(&t);
                match t.apply(rec) {
                    Ok(_) => {}
                    Err(e) => {
                        prop_assert!(matches!(e, FsError::Corrupt(_)), "{rec:?}: {e}");
                        prop_assert!(snapshot(&t) == before, "a refused {rec:?} changed the table");
                    }
                }
                let mut rep = FsckReport::default();
                check_tables(&t, &bounds, &mut rep, false);
                prop_assert!(rep.problems.is_empty(), "after {rec:?}: {:?}", rep.problems);
            }
        }
    }

    /// The generator is no use if it only makes records the table refuses: over a fixed
    /// sample, every kind of record is applied somewhere.
    #[test]
    fn the_generated_records_of_every_kind_are_sometimes_applied() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let mut applied = BTreeMap::new();
        for _ in 0..200 {
            let mut t = seeded();
            for _ in 0..60 {
                let rec = record().new_tree(&mut runner).unwrap().current();
                if t.apply(&rec).is_ok() {
                    *applied
                        .entry(
                            format!("{rec:?}")
                                .split([' ', '{'])
                                .next()
                                .unwrap()
                                .to_string(),
                        )
                        .or_insert(0) += 1;
                }
            }
        }
        assert!(
            applied.len() == 12 && applied.values().all(|&n| n >= 5),
            "{applied:?}"
        );
    }

    /// The clauses fsck's table check cannot see (modes, targets, sizes, empty ranges, holes)
    /// each refuse their record, naming it, and leave the table as it was.
    #[test]
    fn each_clause_refuses_what_it_names() {
        let mut t = seeded();
        let create = |perm, kind, target: &[u8]| Record::Create {
            parent: ROOT_INO,
            name: b"n".to_vec(),
            ino: 20,
            attr: Attr {
                kind,
                perm,
                ..Attr::test_file(0, 0, NOW)
            },
            target: target.to_vec(),
        };
        let create_with = |attr| Record::Create {
            parent: ROOT_INO,
            name: b"n".to_vec(),
            ino: 20,
            attr,
            target: Vec::new(),
        };
        let xattr = |name: Vec<u8>, len| Record::SetXattr {
            ino: 4,
            name,
            value: vec![0; len],
            now: NOW,
        };
        let cases = [
            (create(0o100644, Kind::File, b""), "impossible attributes"),
            (create(0o644, Kind::File, b"t"), "impossible attributes"),
            (create(0o777, Kind::Symlink, b""), "impossible attributes"),
            (
                Record::SetAttr {
                    ino: 4,
                    perm: 0o104755,
                    uid: 0,
                    gid: 0,
                    atime: NOW,
                    mtime: NOW,
                    ctime: NOW,
                },
                "beyond the permission bits",
            ),
            (
                create_with(Attr {
                    size: MAX_FILE_SIZE + 1,
                    ..Attr::test_file(0, 0, NOW)
                }),
                "impossible attributes",
            ),
            (
                create_with(Attr {
                    mtime: Ts {
                        sec: 1,
                        nsec: 1_000_000_000,
                    },
                    ..Attr::test_file(0, 0, NOW)
                }),
                "timestamp out of range",
            ),
            (
                Record::Unlink {
                    parent: ROOT_INO,
                    name: b"f".to_vec(),
                    now: Ts {
                        sec: 0,
                        nsec: u32::MAX,
                    },
                },
                "timestamp out of range",
            ),
            (
                Record::Write {
                    ino: 4,
                    first: 0,
                    blocks: vec![],
                    size: 3 * 4096,
                    mtime: Ts {
                        sec: 0,
                        nsec: 1_000_000_000,
                    },
                },
                "timestamp out of range",
            ),
            (xattr(Vec::new(), 1), "impossible size"),
            (xattr(vec![b'u'; NAME_MAX + 1], 1), "impossible size"),
            (
                xattr(b"user.a".to_vec(), XATTR_VALUE_MAX + 1),
                "impossible size",
            ),
            (
                Record::Punch {
                    ino: 4,
                    start: 2,
                    end: 2,
                    now: NOW,
                },
                "outside the largest file",
            ),
            // File 5's block 1 is a hole inside the file.
            (
                Record::Remap {
                    ino: 5,
                    index: 1,
                    from: 0,
                    to: 3,
                },
                "does not hold",
            ),
            (
                Record::Truncate {
                    ino: 4,
                    size: 5000,
                    tail: Some((1, 0)),
                    now: NOW,
                },
                "tail block",
            ),
            (
                Record::Write {
                    ino: 4,
                    first: 0,
                    blocks: vec![2],
                    size: 4096,
                    mtime: NOW,
                },
                "pass its end of file",
            ),
        ];
        for (rec, what) in cases {
            let before = snapshot(&t);
            match t.apply(&rec) {
                Err(FsError::Corrupt(m)) => assert!(m.contains(what), "{rec:?}: {m}"),
                r => panic!("{rec:?} gave {r:?}"),
            }
            assert!(snapshot(&t) == before, "{rec:?} changed the table");
        }
    }

    #[test]
    fn a_directory_cannot_be_renamed_below_itself_nor_linked() {
        let mut t = Tables::with_root(0, 0);
        let dir = Attr {
            kind: Kind::Dir,
            nlink: 2,
            ..Attr::test_file(0, 0, NOW)
        };
        for (parent, name, ino) in [(1, b"d", 2), (2, b"e", 3)] {
            t.apply(&Record::Create {
                parent,
                name: name.to_vec(),
                ino,
                attr: dir.clone(),
                target: Vec::new(),
            })
            .unwrap();
        }
        let rename = |newparent| Record::Rename {
            parent: 1,
            name: b"d".to_vec(),
            newparent,
            newname: b"x".to_vec(),
            now: NOW,
        };
        assert!(t.apply(&rename(3)).is_err());
        assert!(t.apply(&rename(2)).is_err());
        let link = Record::Link {
            parent: 1,
            name: b"y".to_vec(),
            ino: 3,
            now: NOW,
        };
        assert!(t.apply(&link).is_err());
        assert_eq!(moves_below_itself(&t, 2, 3), Some(true));
        assert_eq!(moves_below_itself(&t, 3, 1), Some(false));
        assert_eq!(moves_below_itself(&t, 3, 9), None);
    }
}
