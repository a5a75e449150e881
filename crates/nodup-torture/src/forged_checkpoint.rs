//! Fuzz body `checkpoint_tree`: checkpoints whose units are all well framed, forged by changing
//! the inode table of the clean base image (`fuzzing::tree_base`) by hand and letting the
//! checkpoint writer write it.
//!
//! A byte patch of a checkpoint (the `fs_image` target) almost never survives a unit's
//! checksum, so what the units say together (the tree, link counts, where the block maps
//! point) and the attributes a head holds were out of the fuzzers' reach. Here the input is a
//! small program of changes to the table (an entry added or removed, a link count, a parent
//! pointer, a mapped block (a file's, one of the engine's metadata, an extreme), a size, an
//! impossible mode, timestamp or extended attribute, an inode dropped), each built from a few
//! input bytes. The forged image must then:
//! - open normally, with a tree fsck's table check finds sound and that can be read and
//!   emptied without a panic, or be refused as corrupt without a byte written;
//! - unless a unit does not decode (an impossible attribute) or the root is gone, be opened by
//!   fsck and left by `fsck --repair` consistent and opening normally.

use std::sync::Arc;

use nodup_core::media::MemMedium;
use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::state::Tables;
use nodup_fs::{fsck, FileSystem, FsError, FsOptions};

use crate::forged_log::Input;
use crate::fuzzing::{tree_base, walk, write_one};

/// The table's inodes, sorted, and those of one kind.
fn inodes(t: &Tables, keep: impl Fn(Kind) -> bool) -> Vec<u64> {
    let mut v: Vec<u64> = t
        .inodes
        .iter()
        .filter(|(_, n)| keep(n.read().attr.kind))
        .map(|(&i, _)| i)
        .collect();
    v.sort_unstable();
    v
}

/// Apply the next change of the input to `t`; `None` when the input ends.
fn step(inp: &mut Input, t: &mut Tables) -> Option<()> {
    let all = inodes(t, |_| true);
    let dirs = inodes(t, |k| k == Kind::Dir);
    let files = inodes(t, |k| k == Kind::File);
    let op = inp.u8()? % 10;
    let pick = |v: &[u64], b: u8| v.get(b as usize % v.len().max(1)).copied();
    let (a, b) = (inp.u8()?, inp.u8()?);
    match op {
        0 => {
            // Another name, for any inode (the root, a directory, a missing number too).
            let target = if b == 255 { 99 } else { pick(&all, b)? };
            let name = [b"dir".as_slice(), b"f0", b"x", b"y"][a as usize % 4];
            t.get(pick(&dirs, a)?)?
                .write()
                .dir_mut()?
                .insert(name, target);
        }
        1 => {
            let node = t.get(pick(&dirs, a)?)?;
            let mut n = node.write();
            let d = n.dir_mut()?;
            let name = d.iter().nth(b as usize % d.len().max(1))?.0.to_vec();
            d.remove(&name);
        }
        // Not 0: the writer deletes an inode without links instead of writing it.
        2 => t.get(pick(&all, a)?)?.write().attr.nlink = 1 + u32::from(b % 4),
        3 => t.get(pick(&dirs, a)?)?.write().dir_mut()?.parent = pick(&all, b)?,
        4 => {
            let (refs, engine) = (&tree_base().refs, &tree_base().engine_blocks);
            let fb = if b & 0x80 != 0 { 511 } else { u64::from(b % 4) };
            let phys = match inp.u8()? {
                0 => 0,
                c @ 1..=127 if !refs.is_empty() => refs[c as usize % refs.len()],
                c @ 144..=159 if !engine.is_empty() => engine[c as usize % engine.len()],
                c => u64::from(c) << (b % 12),
            };
            t.get(pick(&files, a)?)?.write().map_mut()?.set(fb, phys);
        }
        5 => {
            let size = match b {
                255 => u64::MAX,
                254 => nodup_fs::fs::MAX_FILE_SIZE + 1,
                _ => u64::from(b) * 397,
            };
            t.get(pick(&files, a)?)?.write().attr.size = size;
        }
        6 => t.get(pick(&all, a)?)?.write().attr.perm = 0o644 | u32::from(b) << 12,
        7 => t.get(pick(&all, a)?)?.write().attr.mtime.nsec = 999_999_000 + u32::from(b) * 8,
        8 => {
            let (name, len) = match b % 3 {
                0 => (Vec::new(), 1),
                1 => (vec![b'u'; 256], 1),
                _ => (b"user.v".to_vec(), 65_536 + usize::from(b % 2)),
            };
            let node = t.get(pick(&all, a)?)?;
            node.write().xattrs.insert(name, vec![7; len]);
        }
        _ => {
            let ino = pick(&all, a)?;
            if ino != ROOT_INO {
                t.remove_inode(ino);
            }
        }
    }
    Some(())
}

/// Remove everything under `dir` (errors allowed), depth first.
fn empty(fs: &FileSystem, dir: u64, depth: usize) {
    let Ok(ents) = fs.readdir(dir, 0, 256) else {
        return;
    };
    for (_, ino, kind, name) in ents {
        if name == b"." || name == b".." {
            continue;
        }
        if kind == Kind::Dir && depth < 8 {
            empty(fs, ino, depth + 1);
            let _ = fs.rmdir(dir, &name);
        } else {
            let _ = fs.unlink(dir, &name);
        }
    }
}

fn open(img: &[u8], opts: &FsOptions) -> (Arc<MemMedium>, Result<FileSystem, FsError>) {
    let m = Arc::new(MemMedium::from_bytes(img.to_vec()));
    let fs = FileSystem::open(m.clone(), opts);
    (m, fs)
}

/// Fuzz body: see the module documentation.
pub fn checkpoint_tree(data: &[u8]) {
    let (m, fs) = open(&tree_base().clean, &FsOptions::default());
    let fs = fs.expect("the clean base image opens");
    let mut t = fs.with_tables(|t| t.deep_copy());
    let mut inp = Input(data);
    while step(&mut inp, &mut t).is_some() {}
    // The writer is not the code under test: a table it cannot write is not a forgery.
    if fs.replace_tables(t).is_err() || fs.shutdown().is_err() {
        return;
    }
    drop(fs);
    let img = m.snapshot();

    let (m, fs) = open(&img, &FsOptions::default());
    match fs {
        Ok(fs) => {
            let problems = fsck::check_tree(&fs);
            assert!(problems.is_empty(), "accepted a forged tree: {problems:?}");
            walk(&fs, ROOT_INO, 0);
            write_one(&fs);
            empty(&fs, ROOT_INO, 0);
            let _ = fs.shutdown();
        }
        Err(FsError::Corrupt(_)) => assert!(m.snapshot() == img, "a refused open wrote"),
        Err(e) => panic!("forged checkpoint: not refused as corrupt: {e}"),
    }

    let fsck_opts = FsOptions {
        fsck: true,
        ..FsOptions::default()
    };
    let (m, fs) = open(&img, &fsck_opts);
    let fs = match fs {
        Ok(fs) => fs,
        // A unit that does not decode (an impossible attribute), or no directory to hang a
        // tree on, leaves nothing to repair towards; anything else fsck must open.
        Err(FsError::Corrupt(m)) if m.contains("checkpoint segment:") || m.contains("root") => {
            return
        }
        Err(e) => panic!("fsck cannot open a forged checkpoint: {e}"),
    };
    let rep = fsck::check(&fs, true).expect("fsck --repair runs");
    assert!(rep.consistent(), "after repair: {:?}", rep.problems);
    fs.shutdown().expect("shutdown after repair");
    drop(fs);
    let (_, fs) = open(&m.snapshot(), &FsOptions::default());
    let fs = fs.expect("the repaired image opens");
    let again = fsck::check(&fs, false).expect("fsck");
    assert!(again.consistent(), "after repair: {:?}", again.problems);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forgeries reach both outcomes: some images open, some are refused, and fsck repairs
    /// the refused ones (a body that only ever made unopenable images would test nothing).
    #[test]
    fn forgeries_are_refused_or_open_and_repair_converges() {
        let forge = |input: &[u8]| {
            let (m, fs) = open(&tree_base().clean, &FsOptions::default());
            let fs = fs.unwrap();
            let mut t = fs.with_tables(|t| t.deep_copy());
            let mut inp = Input(input);
            while step(&mut inp, &mut t).is_some() {}
            fs.replace_tables(t).unwrap();
            fs.shutdown().unwrap();
            drop(fs);
            let img = m.snapshot();
            open(&img, &FsOptions::default())
                .1
                .err()
                .map(|e| e.to_string())
        };
        // No change; a second name for `dir`; a block past the image's end; a mode.
        assert_eq!(forge(&[]), None);
        let second = forge(&[0, 2, 1]).expect("refused");
        assert!(second.contains("more than one parent"), "{second}");
        let block = forge(&[4, 0, 2, 128]).expect("refused");
        assert!(block.contains("invalid physical block"), "{block}");
        let engine = forge(&[4, 0, 2, 144]).expect("refused");
        assert!(
            engine.contains("the engine's metadata holds it"),
            "{engine}"
        );
        let mode = forge(&[6, 1, 3]).expect("refused");
        assert!(mode.contains("mode bits"), "{mode}");
        for input in [
            &b""[..],
            &[0, 2, 1],
            &[4, 0, 2, 128],
            &[4, 0, 2, 144],
            &[3, 1, 0, 2, 3, 1],
            &[9, 2, 0],
        ] {
            checkpoint_tree(input);
        }
    }
}
