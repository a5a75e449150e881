//! Step 2 of a checkpoint: the segments the cut wrote are flushed and the manifest goes to
//! fresh blocks (the reserve first), then, after a fence, the superblock switches to them; and
//! the undo of a cut whose writes failed, which leaves the previous checkpoint in force.

use super::build::{blocks_for, Builder, Change};
use crate::chain::{ChainKind, ChainWriter};
use crate::error::{FsError, Result};
use crate::fs::FileSystem;
use crate::log::writer::LogPos;
use crate::persist::manifest::Manifest;
use crate::persist::Loc;
use crate::superblock::{FLAG_CLEAN, FS_VERSION};
use nodup_core::{BlockNr, BLOCK_SIZE};

impl FileSystem {
    /// Step 2: the cut's segments (`seg_blocks`, written but not flushed) flushed, the
    /// manifest written, fence, superblock. Returns the manifest's blocks and the deferred
    /// releases the fence made safe.
    pub(super) fn write_checkpoint(
        &self,
        seg_blocks: &[BlockNr],
        manifest: Manifest,
        man_gen: u64,
        pos: &LogPos,
        clean: bool,
    ) -> Result<(Vec<BlockNr>, Vec<BlockNr>)> {
        let m = &*self.medium;
        for &b in seg_blocks {
            m.flush(b * BLOCK_SIZE as u64, BLOCK_SIZE as u64);
        }
        let bytes = manifest.encode();
        let blocks = self.take_meta_blocks(blocks_for(bytes.len()))?;
        let r = ChainWriter::start(m, ChainKind::Manifest, man_gen, blocks[0])
            .and_then(|mut w| w.append(m, &bytes, &blocks[1..]));
        if let Err(e) = r {
            self.give_back(blocks);
            return Err(e);
        }
        let mut meta = self.meta.lock();
        let pending = std::mem::take(&mut *self.pending.lock());
        // Everything before the switch (data, segments, manifest) must be durable first, and so
        // must the records that made `pending`'s releases: operations ran on after the cut
        // (the gate is not held here but at unmount), and on a block file their records wait
        // in memory (`log/held.rs`) until written out; each is appended before its release
        // joins `pending`, so all of those are written here.
        let switched = self
            .write_out_log()
            .and_then(|()| m.fence().map_err(FsError::from))
            .and_then(|()| {
                let mut sb = meta.sb.clone();
                sb.version = FS_VERSION;
                sb.seq += 1;
                sb.ckpt_head = blocks[0];
                sb.ckpt_gen = man_gen;
                sb.log_head = pos.block;
                sb.log_gen = self.log.lock().gen();
                sb.log_index = pos.index;
                sb.log_off = pos.off as u32;
                sb.log_seq = pos.seq;
                sb.next_gen = meta.next_gen;
                sb.flags = if clean { FLAG_CLEAN } else { 0 };
                let slot = 1 - meta.slot;
                self.switch_sb(&meta.sb, slot, &sb)?;
                meta.sb = sb;
                meta.slot = slot;
                Ok(())
            });
        if let Err(e) = switched {
            self.pending.lock().extend(pending);
            meta.reserve.extend(blocks);
            return Err(e);
        }
        Ok((blocks, pending))
    }

    /// A checkpoint failed after its cut: every unit it moved points at its old copy again and
    /// is marked changed, so the next checkpoint writes it. The caller holds the gate.
    pub(super) fn undo_cut(&self, changes: &[Change], b: &Builder, cut: (u64, u64)) {
        let t = self.tables.read();
        let mut revived: Vec<Loc> = Vec::new();
        for c in changes.iter().rev() {
            let (ino, u, old) = match c {
                Change::Head(i, o) => (*i, None, *o),
                Change::Unit(i, u, o) => (*i, Some(*u), *o),
            };
            let Some(node) = t.get(ino) else { continue };
            let mut n = node.write();
            match u {
                None => n.ck.head = old,
                Some(u) => {
                    match old {
                        Some(l) => n.ck.units.insert(u, l),
                        None => n.ck.units.remove(&u),
                    };
                    if let Some(d) = n.unit_dirt_mut() {
                        d.insert(u);
                    }
                }
            }
            revived.extend(old);
            t.persist.touch(&mut n, usize::from(u.is_some()));
        }
        let mut segs = self.persist.segs.lock();
        for s in &b.segs {
            segs.remove(&s.gen);
        }
        for l in revived {
            if let Some(s) = segs.get_mut(&l.gen) {
                s.live += l.bytes as u64;
            }
        }
        drop(segs);
        self.log.lock().unmark_cut(cut);
    }
}
