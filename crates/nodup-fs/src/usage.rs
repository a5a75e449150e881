//! Per-file and per-directory space accounting (`nodup du`): what a path refers to, what
//! deleting it would free, and what it shares with the rest of the file system.

use crate::error::{FsError, Result};
use crate::fs::FileSystem;
use crate::inode::Kind;
use nodup_core::BLOCK_SIZE;
use std::collections::{HashMap, HashSet, VecDeque};

/// Space accounting of one path (a file, or a directory and everything below it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// Bytes of the mapped blocks of its files, each reference counted (holes excluded; a
    /// partial last block counts whole). A hard-linked file counts once.
    pub logical_bytes: u64,
    /// Bytes of the distinct data blocks referenced only from inside it: what deleting it frees.
    pub exclusive_bytes: u64,
    /// Bytes of the distinct data blocks it references that are also referenced from outside.
    pub shared_bytes: u64,
    /// Regular files counted.
    pub files: u64,
}

impl FileSystem {
    /// Space accounting of inode `ino` and, for a directory, everything below it.
    pub fn usage(&self, ino: u64) -> Result<Usage> {
        if !self.durable_on_return() {
            // Released blocks wait for durability before their references go; settle them so
            // the counts below are the files' own.
            self.sync()?;
        }
        let _g = self.gate.read();
        let t = self.tables.read();
        // The files of the subtree, each once (hard links).
        let mut files: HashSet<u64> = HashSet::new();
        let mut queue = VecDeque::from([ino]);
        let mut seen_dirs: HashSet<u64> = HashSet::new();
        while let Some(i) = queue.pop_front() {
            let node = t.get(i).ok_or(FsError::Errno(libc::ENOENT))?;
            let n = node.read();
            match n.attr.kind {
                Kind::File => {
                    files.insert(i);
                }
                Kind::Dir if seen_dirs.insert(i) => {
                    if let Some(d) = n.dir() {
                        queue.extend(d.iter().map(|(_, c)| c));
                    }
                }
                _ => {}
            }
        }
        let mut local: HashMap<u64, u64> = HashMap::new();
        let mut u = Usage {
            files: files.len() as u64,
            ..Usage::default()
        };
        for f in &files {
            if let Some(node) = t.get(*f) {
                if let Some(m) = node.read().map() {
                    for b in m.blocks() {
                        *local.entry(b).or_default() += 1;
                        u.logical_bytes += BLOCK_SIZE as u64;
                    }
                }
            }
        }
        drop(t);
        for (b, refs_inside) in local {
            let total = self.engine().block_refcount(b)?.unwrap_or(1);
            if refs_inside >= total {
                u.exclusive_bytes += BLOCK_SIZE as u64;
            } else {
                u.shared_bytes += BLOCK_SIZE as u64;
            }
        }
        Ok(u)
    }
}
