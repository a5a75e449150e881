//! The file system's side of the remap contract (`nodup_core::engine::remap`): a background
//! dedup worker asks to replace file block `index` of `ino`, which it saw holding physical
//! block `from`, by the existing byte-identical block `to`. The change is one log record
//! ([`Record::Remap`]) made under the inode lock, so it is atomic and crash-safe, and a write
//! that raced with the request wins: a block rewritten after the request was queued no longer
//! holds `from` and is skipped. Content, size and times never change.

use crate::error::{errno, Result};
use crate::fs::FileSystem;
use crate::inode::Body;
use crate::log::record::Record;
use crate::state::apply_inode;
use nodup_core::engine::remap::RefGrant;
use nodup_core::engine::{Adopted, Miss};
use nodup_core::{BlockNr, BLOCK_SIZE};

/// What [`FileSystem::remap_block`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemapOutcome {
    /// The file block now names `to`; `from` lost this reference.
    Done,
    /// The file block no longer names `from` (rewritten, truncated or unlinked since): skipped.
    Moved,
    /// The blocks hold different bytes: skipped.
    Differs,
    /// `to` cannot take another reference (no dedup entry): skipped.
    NoEntry,
}

impl FileSystem {
    /// The fingerprint of stored block `b`'s bytes (read from the medium).
    pub(crate) fn block_fingerprint(&self, b: BlockNr) -> Result<u64> {
        let mut buf = vec![0u8; BLOCK_SIZE];
        self.engine.read(b, &mut buf)?;
        Ok(self.engine.fingerprint(&buf))
    }

    /// The physical block file block `index` of `ino` maps to (0 = a hole or past the end).
    pub fn mapped_block(&self, ino: u64, index: u64) -> Result<BlockNr> {
        let node = self.node(ino)?;
        let n = node.read();
        Ok(n.map().map_or(0, |m| m.get(index)))
    }

    /// Replace file block `index` of `ino`, expected to hold `from`, by block `to` when both
    /// hold the same bytes (see the module doc). Durable when the file system's log is (as a
    /// write's record is: at once on durable mounts, else at the next sync).
    pub fn remap_block(
        &self,
        ino: u64,
        index: u64,
        from: BlockNr,
        to: BlockNr,
    ) -> Result<RemapOutcome> {
        if self.read_only {
            return errno(libc::EROFS);
        }
        if from == 0 || to == 0 || from == to {
            return errno(libc::EINVAL);
        }
        self.ensure_space(0, false, 64)?;
        let _g = self.gate.read();
        let node = self.node(ino)?;
        let mut n = node.write();
        match &n.body {
            Body::File(m) if m.get(index) == from => {}
            _ => return Ok(RemapOutcome::Moved),
        }
        match self.engine.remap_ref(from, to)? {
            RefGrant::Granted => {}
            RefGrant::Differs => return Ok(RemapOutcome::Differs),
            RefGrant::NoEntry => return Ok(RemapOutcome::NoEntry),
        }
        let rec = Record::Remap {
            ino,
            index,
            from,
            to,
        };
        self.append_naming(&n, &rec, &[to])?;
        let eff = apply_inode(&mut n, &rec, &self.persist)?;
        drop(n);
        // Releases `from` once the record is durable (as for an overwrite).
        self.finish(eff)?;
        Ok(RemapOutcome::Done)
    }
}

/// What [`FileSystem::adopt_block`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdoptOutcome {
    /// The block now has an entry under the fingerprint given.
    Adopted,
    /// Nothing changed: the file no longer holds the block, or the engine had no free slot or
    /// already an entry for it.
    Skipped,
    /// Nothing changed: the block's bytes do not have the fingerprint given (it was learnt
    /// for an earlier content of the file block); this is the block's own fingerprint.
    Stale(u64),
}

impl FileSystem {
    /// Give physical block `block`, which file block `index` of `ino` holds without a dedup
    /// entry, an entry for fingerprint `fp` (the out-of-line worker, for blocks not
    /// fingerprinted inline), so later copies find it. Under the inode lock, so the file's one
    /// reference cannot be released meanwhile; nothing is logged (the entry is the engine's
    /// own, crash-safe metadata).
    ///
    /// `check`: `fp` was not computed from this block's bytes (the skipped buffer keeps the
    /// fingerprint a write computed for a file block, and the block may have been replaced
    /// since), so the block is read and fingerprinted under the lock first. An entry whose
    /// fingerprint is not its block's content would be found by the wrong copies and never by
    /// the right ones, and fails the engine's audit.
    pub fn adopt_block(
        &self,
        ino: u64,
        index: u64,
        block: BlockNr,
        fp: u64,
        check: bool,
    ) -> Result<AdoptOutcome> {
        if self.read_only {
            return errno(libc::EROFS);
        }
        let _g = self.gate.read();
        let node = self.node(ino)?;
        let n = node.read();
        match &n.body {
            Body::File(m) if m.get(index) == block => {}
            _ => return Ok(AdoptOutcome::Skipped),
        }
        if check {
            let own = self.block_fingerprint(block)?;
            if own != fp {
                // Queued again with its own fingerprint, under the inode lock like a write's
                // misses, so a write racing in cannot be overwritten by this older content.
                let again = Miss {
                    index: 0,
                    fp: Some(own),
                };
                self.note_misses(ino, index, &[again]);
                return Ok(AdoptOutcome::Stale(own));
            }
        }
        Ok(match self.engine.adopt(block, fp)? {
            Adopted::Done => AdoptOutcome::Adopted,
            Adopted::HasEntry | Adopted::NoSlot => AdoptOutcome::Skipped,
        })
    }
}
