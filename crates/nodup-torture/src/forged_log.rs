//! Fuzz body `log_records`: log records forged with valid checksums and sequence numbers.
//!
//! A byte patch of the log (the `fs_image` target) almost never survives the frame checksum,
//! so the record decoder and the checks a record must pass before it is applied
//! (`nodup_fs::log::check`) were out of the fuzzers' reach. Here the input is a small program
//! of records: each is built from a few input bytes (inode numbers, names, block numbers and
//! sizes drawn from what the base image holds, plus extremes), framed correctly, and appended
//! after the last record of the dirty base image's log; one kind of step frames raw bytes
//! instead, for the decoder. The frames go into the room left in the log's last block (no
//! forged frame spans two blocks). The image is then opened with failure recovery. A refused
//! open is fine; an open that succeeds must leave a file system that fsck finds consistent,
//! and reading its files and symlinks (errors allowed) must not panic.

use std::sync::{Arc, OnceLock};

use nodup_core::media::{Medium, MemMedium};
use nodup_core::BLOCK_SIZE;
use nodup_fs::chain::{off, PAYLOAD};
use nodup_fs::inode::{Attr, Kind, Ts, ROOT_INO};
use nodup_fs::log::record::Record;
use nodup_fs::log::replay::replay;
use nodup_fs::superblock::probe_medium;
use nodup_fs::{fsck, FileSystem, FsOptions};

use crate::fuzzing::{fs_base, walk};

/// Where the dirty base image's log ends and what the next record needs.
struct LogEnd {
    /// Byte offset in the image of the next frame.
    at: usize,
    /// Payload bytes left in that log block (forged frames stay inside it).
    room: usize,
    /// Sequence number of the next frame.
    seq: u64,
}

fn log_end() -> &'static LogEnd {
    static E: OnceLock<LogEnd> = OnceLock::new();
    E.get_or_init(|| {
        let m = MemMedium::from_bytes(fs_base().dirty.clone());
        let (sb, _, _) = probe_medium(&m).expect("base superblock");
        let r = replay(&m, sb.log_start(), sb.log_gen, &mut |_, _| Ok(true)).expect("base log");
        LogEnd {
            at: r.end.block as usize * BLOCK_SIZE + off::PAYLOAD + r.end.off,
            room: PAYLOAD - r.end.off,
            seq: r.end.seq,
        }
    })
}

/// The input, read a byte at a time; `None` once it is used up (`forged_checkpoint` reads its
/// input this way too).
pub(crate) struct Input<'a>(pub(crate) &'a [u8]);

impl Input<'_> {
    pub(crate) fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    /// An inode number: mostly one of the base image's (1-7) or the next few, else an extreme.
    fn ino(&mut self) -> Option<u64> {
        Some(match self.u8()? {
            255 => u64::MAX,
            254 => 0,
            b => 1 + u64::from(b % 12),
        })
    }
    /// A name: the base image's, new ones, and invalid ones.
    fn name(&mut self) -> Option<Vec<u8>> {
        const NAMES: [&[u8]; 12] = [
            b"dir", b"f0", b"f1", b"f3", b"g2", b"h0", b"new", b"x", b"", b".", b"..", b"a/b",
        ];
        let b = self.u8()?;
        Some(match b {
            255 => vec![b'n'; 256],
            _ => NAMES[b as usize % NAMES.len()].to_vec(),
        })
    }
    /// A physical block: mostly one the base image's files hold, else any (0 is a hole).
    fn block(&mut self) -> Option<u64> {
        let b = self.u8()?;
        let refs = &fs_base().refs;
        Some(match b {
            0 => 0,
            1..=127 if !refs.is_empty() => refs[b as usize % refs.len()],
            _ => u64::from(self.u8()?) << (b % 16),
        })
    }
    /// A file block index or block count: small, else at the largest file's edge.
    fn index(&mut self) -> Option<u64> {
        Some(match self.u8()? {
            255 => u64::MAX,
            254 => nodup_fs::fs::MAX_FILE_BLOCKS - 1,
            b => u64::from(b % 16),
        })
    }
    /// A byte size around the blocks above.
    fn size(&mut self) -> Option<u64> {
        Some(match self.u8()? {
            255 => u64::MAX,
            b => u64::from(b) * 397,
        })
    }
}

const NOW: Ts = Ts { sec: 9, nsec: 0 };

/// The next record of the input, or raw frame bytes; `None` when the input ends.
fn step(inp: &mut Input, seq: u64) -> Option<Vec<u8>> {
    let rec = match inp.u8()? % 13 {
        0 => {
            let kind = [Kind::File, Kind::Dir, Kind::Symlink, Kind::Fifo][inp.u8()? as usize % 4];
            let flaw = inp.u8()?;
            let attr = Attr {
                kind,
                perm: if flaw == 1 { 0o170_644 } else { 0o644 },
                nlink: u32::from(kind == Kind::Dir) + 1 + u32::from(flaw == 2),
                size: 0,
                rdev: 0,
                uid: 0,
                gid: 0,
                atime: NOW,
                mtime: NOW,
                ctime: NOW,
            };
            let target = if (kind == Kind::Symlink) != (flaw == 3) {
                b"f0".to_vec()
            } else {
                Vec::new()
            };
            Record::Create {
                parent: inp.ino()?,
                name: inp.name()?,
                ino: inp.ino()?.saturating_add(8),
                attr,
                target,
            }
        }
        1 => Record::Link {
            parent: inp.ino()?,
            name: inp.name()?,
            ino: inp.ino()?,
            now: NOW,
        },
        2 => Record::Unlink {
            parent: inp.ino()?,
            name: inp.name()?,
            now: NOW,
        },
        3 => Record::Rmdir {
            parent: inp.ino()?,
            name: inp.name()?,
            now: NOW,
        },
        4 => Record::Rename {
            parent: inp.ino()?,
            name: inp.name()?,
            newparent: inp.ino()?,
            newname: inp.name()?,
            now: NOW,
        },
        5 => Record::SetAttr {
            ino: inp.ino()?,
            perm: u32::from(inp.u8()?) << 4,
            uid: 1,
            gid: 1,
            atime: NOW,
            mtime: NOW,
            ctime: NOW,
        },
        6 => {
            let n = inp.u8()? % 5;
            let (ino, first) = (inp.ino()?, inp.index()?);
            let blocks = (0..n).map(|_| inp.block()).collect::<Option<Vec<_>>>()?;
            Record::Write {
                ino,
                first,
                blocks,
                size: inp.size()?,
                mtime: NOW,
            }
        }
        7 => {
            let (ino, size) = (inp.ino()?, inp.size()?);
            let tail = match inp.u8()? % 3 {
                0 => None,
                1 => Some((size / BLOCK_SIZE as u64, inp.block()?)),
                _ => Some((inp.index()?, inp.block()?)),
            };
            Record::Truncate {
                ino,
                size,
                tail,
                now: NOW,
            }
        }
        8 => Record::Punch {
            ino: inp.ino()?,
            start: inp.index()?,
            end: inp.index()?,
            now: NOW,
        },
        9 => Record::Remap {
            ino: inp.ino()?,
            index: inp.index()?,
            from: inp.block()?,
            to: inp.block()?,
        },
        10 => Record::SetXattr {
            ino: inp.ino()?,
            name: inp.name()?,
            value: vec![1; inp.u8()? as usize],
            now: NOW,
        },
        11 => Record::RemoveXattr {
            ino: inp.ino()?,
            name: inp.name()?,
            now: NOW,
        },
        _ => {
            // Raw: a kind byte and a body of the input's bytes, framed as a record.
            let kind = inp.u8()?;
            let len = inp.u8()? as usize;
            let body: Vec<u8> = (0..len).map(|_| inp.u8()).collect::<Option<_>>()?;
            return Some(raw_frame(seq, kind, &body));
        }
    };
    Some(rec.frame(seq))
}

/// A frame around an arbitrary body: the layout of `Record::frame`, checksum included.
fn raw_frame(seq: u64, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(17 + body.len());
    f.extend_from_slice(&((17 + body.len()) as u32).to_le_bytes());
    f.extend_from_slice(&[0; 4]);
    f.extend_from_slice(&seq.to_le_bytes());
    f.push(kind);
    f.extend_from_slice(body);
    let crc = crc32c::crc32c(&f);
    f[4..8].copy_from_slice(&crc.to_le_bytes());
    f
}

/// The crashed base image with `frames` written where its log ends.
fn with_frames(frames: &[u8]) -> Vec<u8> {
    let at = log_end().at;
    let mut img = fs_base().dirty.clone();
    img[at..at + frames.len()].copy_from_slice(frames);
    img
}

/// Fuzz body (see the module documentation).
pub fn log_records(data: &[u8]) {
    let end = log_end();
    let mut inp = Input(data);
    let mut frames = Vec::new();
    let mut seq = end.seq;
    while let Some(f) = step(&mut inp, seq) {
        if frames.len() + f.len() > end.room {
            break;
        }
        frames.extend_from_slice(&f);
        seq += 1;
    }
    let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(with_frames(&frames)));
    let Ok(fs) = FileSystem::open(m, &FsOptions::default()) else {
        return;
    };
    let rep = fsck::check(&fs, false).expect("fsck of an opened image");
    assert!(
        rep.consistent(),
        "forged records were applied into an inconsistent file system: {:?}",
        rep.problems
    );
    walk(&fs, ROOT_INO, 0);
    let _ = fs.shutdown();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forged frames reach replay: a valid new file is applied (the open finds it), and a
    /// record that would break the tree makes the open fail.
    #[test]
    fn forged_records_are_replayed_or_refused() {
        let end = log_end();
        let open = |recs: &[Record]| {
            let frames: Vec<u8> = (end.seq..)
                .zip(recs)
                .flat_map(|(seq, r)| r.frame(seq))
                .collect();
            let img = with_frames(&frames);
            FileSystem::open(Arc::new(MemMedium::from_bytes(img)), &FsOptions::default())
        };
        let create = Record::Create {
            parent: ROOT_INO,
            name: b"forged".to_vec(),
            ino: 40,
            attr: Attr {
                kind: Kind::File,
                perm: 0o600,
                nlink: 1,
                size: 0,
                rdev: 0,
                uid: 0,
                gid: 0,
                atime: NOW,
                mtime: NOW,
                ctime: NOW,
            },
            target: Vec::new(),
        };
        let fs = open(std::slice::from_ref(&create)).expect("a valid forged record");
        assert_eq!(fs.lookup(ROOT_INO, b"forged").unwrap().0, 40);
        drop(fs);
        let dir = open(&[]).unwrap().lookup(ROOT_INO, b"dir").unwrap().0;
        let into_itself = Record::Rename {
            parent: ROOT_INO,
            name: b"dir".to_vec(),
            newparent: dir,
            newname: b"loop".to_vec(),
            now: NOW,
        };
        match open(&[create, into_itself]) {
            Err(nodup_fs::FsError::Corrupt(m)) => assert!(m.contains("below itself"), "{m}"),
            r => panic!("a tree-breaking forged record: {:?}", r.err()),
        }
        // The fuzz body itself on a few fixed programs (no panic, no inconsistency).
        for input in [
            &b""[..],
            &[0, 0, 0, 0, 7, 6],
            &[4, 0, 0, 2, 6],
            &[12, 3, 4, 1, 2, 3, 4],
        ] {
            log_records(input);
        }
    }
}
