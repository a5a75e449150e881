//! Step 2 of a checkpoint: the new segments and manifest go to fresh blocks (the reserve
//! first), then, after a fence, the superblock switches to them; and the undo of a cut whose
//! write failed, which leaves the previous checkpoint in force.

use super::build::{blocks_for, Builder, Change};
use crate::chain::{ChainKind, ChainWriter};
use crate::error::{FsError, Result};
use crate::fs::FileSystem;
use crate::log::writer::LogPos;
use crate::persist::manifest::Manifest;
use crate::persist::Loc;
use crate::superblock::{FLAG_CLEAN, FS_VERSION};
use nodup_core::BlockNr;

impl FileSystem {
    /// Step 2: segments, manifest, fence, superblock. Returns the manifest's blocks and the
    /// deferred releases the fence made safe.
    pub(super) fn write_checkpoint(
        &self,
        segs: &[Vec<u8>],
        gen0: u64,
        mut manifest: Manifest,
        man_gen: u64,
        pos: &LogPos,
        clean: bool,
    ) -> Result<(Vec<BlockNr>, Vec<BlockNr>)> {
        let m = &*self.medium;
        let man_bytes = manifest_len(manifest.segs.len());
        let need: usize =
            segs.iter().map(|s| blocks_for(s.len())).sum::<usize>() + blocks_for(man_bytes);
        let mut blocks = self.take_meta_blocks(need)?;
        let give_back = |fs: &FileSystem, v: Vec<BlockNr>| fs.meta.lock().reserve.extend(v);
        let r = (|| -> Result<Vec<BlockNr>> {
            let mut at = 0;
            for (i, s) in segs.iter().enumerate() {
                let n = blocks_for(s.len());
                let bl = &blocks[at..at + n];
                at += n;
                let gen = gen0 + i as u64;
                let mut w = ChainWriter::start(m, ChainKind::Segment, gen, bl[0])?;
                w.append(m, s, &bl[1..])?;
                if let Some(e) = manifest.segs.iter_mut().find(|x| x.gen == gen) {
                    e.head = bl[0];
                }
                if let Some(si) = self.persist.segs.lock().get_mut(&gen) {
                    si.blocks = bl.to_vec();
                }
            }
            let bytes = manifest.encode();
            let bl = &blocks[at..];
            let mut w = ChainWriter::start(m, ChainKind::Manifest, man_gen, bl[0])?;
            w.append(m, &bytes, &bl[1..])?;
            Ok(bl.to_vec())
        })();
        let man_blocks = match r {
            Ok(b) => b,
            Err(e) => {
                give_back(self, std::mem::take(&mut blocks));
                return Err(e);
            }
        };
        let mut meta = self.meta.lock();
        let pending = std::mem::take(&mut *self.pending.lock());
        // Everything before the switch (data, segments, manifest) must be durable first.
        let switched = m.fence().map_err(FsError::from).and_then(|()| {
            let mut sb = meta.sb.clone();
            sb.version = FS_VERSION;
            sb.seq += 1;
            sb.ckpt_head = man_blocks[0];
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
        Ok((man_blocks, pending))
    }

    /// Blocks for a checkpoint: the reserve first, then the engine.
    fn take_meta_blocks(&self, need: usize) -> Result<Vec<BlockNr>> {
        let mut meta = self.meta.lock();
        let from_reserve = need.min(meta.reserve.len());
        let mut blocks: Vec<BlockNr> = meta.reserve.drain(..from_reserve).collect();
        if blocks.len() < need {
            match self.engine.alloc_meta(need - blocks.len()) {
                Ok(more) => blocks.extend(more),
                Err(e) => {
                    meta.reserve.append(&mut blocks);
                    return Err(e.into());
                }
            }
        }
        Ok(blocks)
    }

    /// A checkpoint failed after its cut: every unit it moved points at its old copy again and
    /// is marked changed, so the next checkpoint writes it.
    pub(super) fn undo_cut(&self, changes: &[Change], b: &Builder, gen0: u64, cut: (u64, u64)) {
        let _g = self.gate.read();
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
        for i in 0..b.segs.len() {
            segs.remove(&(gen0 + i as u64));
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

/// Encoded bytes of a manifest listing `n` segments.
fn manifest_len(n: usize) -> usize {
    crate::persist::manifest::HEADER + crate::persist::manifest::ENTRY * n + 4
}
