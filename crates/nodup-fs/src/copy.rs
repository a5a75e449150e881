//! Server-side copy (`copy_file_range`): whole blocks of the source are shared with the
//! destination (one more reference each, no data written), the natural copy for a
//! deduplicating file system; partial blocks and unaligned ranges are read and written.

use crate::error::{errno, FsError, Result};
use crate::fs::{FileSystem, MAX_FILE_SIZE};
use crate::inode::{Body, Kind, Ts};
use crate::log::record::Record;
use crate::state::apply_inode;
use nodup_core::engine::Miss;
use nodup_core::{BlockNr, BLOCK_SIZE};
use std::sync::atomic::Ordering;

const BS: u64 = BLOCK_SIZE as u64;
/// Blocks shared per log record (bounds one record and the source lock hold).
const SHARE_BATCH: u64 = 4096;

impl FileSystem {
    /// Copy `len` bytes from `src` at `off_in` to `dst` at `off_out`; returns the bytes
    /// copied (fewer when the source ends first). Block-aligned whole blocks are shared.
    pub fn copy_range(
        &self,
        src: u64,
        off_in: u64,
        dst: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let src_size = {
            let n = self.node(src)?;
            let n = n.read();
            match n.attr.kind {
                Kind::File => n.attr.size,
                Kind::Dir => return errno(libc::EISDIR),
                _ => return errno(libc::EINVAL),
            }
        };
        match self.node(dst)?.read().attr.kind {
            Kind::File => {}
            Kind::Dir => return errno(libc::EISDIR),
            _ => return errno(libc::EINVAL),
        }
        if self.read_only {
            return errno(libc::EROFS);
        }
        if off_in >= src_size || len == 0 {
            return Ok(0);
        }
        let len = len.min(src_size - off_in);
        let end_out = off_out
            .checked_add(len)
            .ok_or(FsError::Errno(libc::EFBIG))?;
        if end_out > MAX_FILE_SIZE {
            return errno(libc::EFBIG);
        }
        if src == dst && off_in < end_out && off_out < off_in + len {
            return errno(libc::EINVAL);
        }
        let mut done = 0u64;
        let r = self.copy_steps(src, off_in, dst, off_out, len, &mut done);
        // Like write(2): bytes already copied are reported, the error only when none were.
        match r {
            Err(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    /// The steps of [`FileSystem::copy_range`], counting the bytes copied in `done`.
    fn copy_steps(
        &self,
        src: u64,
        off_in: u64,
        dst: u64,
        off_out: u64,
        len: u64,
        done: &mut u64,
    ) -> Result<()> {
        // Whole blocks can be shared when both offsets are block aligned.
        if off_in.is_multiple_of(BS) && off_out.is_multiple_of(BS) {
            let whole = len / BS;
            while *done < whole * BS {
                let fb = *done / BS;
                let n = (whole - fb).min(SHARE_BATCH);
                self.share_blocks(src, off_in / BS + fb, dst, off_out / BS + fb, n)?;
                *done += n * BS;
            }
        }
        // The rest (a partial last block, or an unaligned range) is read and written.
        while *done < len {
            let n = (len - *done).min(1 << 20) as usize;
            let data = self.read(src, off_in + *done, n)?;
            if data.is_empty() {
                break;
            }
            self.write(dst, off_out + *done, &data)?;
            *done += data.len() as u64;
        }
        Ok(())
    }

    /// Map file blocks `[dfb, dfb+n)` of `dst` to the blocks of `[sfb, sfb+n)` of `src`: each
    /// mapped source block gets one more reference (or, when it cannot be shared, its data is
    /// written anew), source holes become holes; one log record.
    fn share_blocks(&self, src: u64, sfb: u64, dst: u64, dfb: u64, n: u64) -> Result<()> {
        // Shared blocks take no space; blocks that must be copied find out in the write path.
        self.ensure_space(0, true, 64 + 8 * n as usize)?;
        let _g = self.gate.read();
        let dnode = self.node(dst)?;
        // Take the references while the source still maps the blocks, and read the blocks
        // that cannot be shared then too: once the lock is dropped a write to the source may
        // free them (a block without a dedup entry is freed at its last release).
        let (mut phys, ok, granted, unshared) = {
            let node = self.node(src)?;
            let s = node.read();
            let Body::File(m) = &s.body else {
                return errno(libc::EINVAL);
            };
            let phys: Vec<BlockNr> = (sfb..sfb + n).map(|fb| m.get(fb)).collect();
            let mapped: Vec<BlockNr> = phys.iter().copied().filter(|&b| b != 0).collect();
            let ok = self.engine.share(&mapped)?;
            let granted: Vec<BlockNr> = mapped
                .iter()
                .zip(&ok)
                .filter_map(|(&b, &shared)| shared.then_some(b))
                .collect();
            let mut unshared = Vec::new();
            for (&b, _) in mapped.iter().zip(&ok).filter(|(_, &shared)| !shared) {
                let mut buf = vec![0u8; BLOCK_SIZE];
                if let Err(e) = self.engine.read(b, &mut buf) {
                    let _ = self.engine.release_batch(&granted);
                    return Err(e.into());
                }
                unshared.push(buf);
            }
            (phys, ok, granted, unshared)
        };
        // Blocks that could not be shared are written anew (deduplicated as any write).
        let (new, misses) = if unshared.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let refs: Vec<&[u8]> = unshared.iter().map(|b| b.as_slice()).collect();
            match self.engine_write_misses(&refs, true) {
                Ok(v) => v,
                Err(e) => {
                    let _ = self.engine.release_batch(&granted);
                    return Err(e);
                }
            }
        };
        let mut newit = new.iter();
        // File block of each block written anew (the order of `new`).
        let mut new_fb = Vec::with_capacity(new.len());
        for ((fb, b), &shared) in (dfb..)
            .zip(phys.iter_mut())
            .filter(|(_, b)| **b != 0)
            .zip(&ok)
        {
            if !shared {
                if let Some(&nb) = newit.next() {
                    *b = nb;
                    new_fb.push(fb);
                }
            }
        }
        // The references this record takes over: shared ones and new blocks.
        let owned: Vec<BlockNr> = granted.iter().chain(&new).copied().collect();
        let mut d = dnode.write();
        let size = d.attr.size.max((dfb + n) * BS);
        let rec = Record::Write {
            ino: dst,
            first: dfb,
            blocks: phys,
            size,
            mtime: Ts::now(),
        };
        self.append_naming(&d, &rec, &owned)?;
        let eff = apply_inode(&mut d, &rec, &self.persist)?;
        // Blocks written anew replace the old content of their file blocks in `smart`'s
        // skipped buffer (under the inode lock, as a write's).
        for m in &misses {
            if let Some(&fb) = new_fb.get(m.index) {
                let one = Miss { index: 0, fp: m.fp };
                self.note_misses(dst, fb, &[one]);
            }
        }
        drop(d);
        self.finish(eff)?;
        self.copy_shared
            .fetch_add(granted.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}
