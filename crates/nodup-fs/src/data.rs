//! The data path: reading, writing, truncating and punching file contents. Data goes to the
//! engine copy-on-write (deduplicated), one log record per change, and replaced blocks are
//! released only once that record is durable (see `FileSystem::finish`).

use crate::error::{errno, FsError, Result};
use crate::fs::{falloc, FileSystem, MAX_FILE_SIZE};
use crate::inode::{Attr, Body, Inode, Kind, Ts};
use crate::log::record::Record;
use crate::state::{apply_inode, Effects};
use nodup_core::engine::Miss;
use nodup_core::{BlockNr, BLOCK_SIZE};

const BS: u64 = BLOCK_SIZE as u64;

/// The part of a write of `data` at `off` that the largest file size leaves room for: a write
/// that crosses it writes what fits and says so (a short write, as the kernel does at a file
/// system's limit); only one that starts there fails (EFBIG).
pub(crate) fn fitting(off: u64, data: &[u8]) -> Result<&[u8]> {
    if off >= MAX_FILE_SIZE {
        return errno(libc::EFBIG);
    }
    Ok(&data[..data.len().min((MAX_FILE_SIZE - off) as usize)])
}

impl FileSystem {
    /// The content of physical block `phys` into `buf`; zeros for a hole (`phys` 0).
    fn read_block(&self, phys: BlockNr, buf: &mut [u8]) -> Result<()> {
        if phys == 0 {
            buf.fill(0);
            Ok(())
        } else {
            Ok(self.engine.read(phys, buf)?)
        }
    }

    /// Read up to `size` bytes at `off`.
    pub fn read(&self, ino: u64, off: u64, size: usize) -> Result<Vec<u8>> {
        let _g = self.gate.read();
        let node = self.node(ino)?;
        let n = node.read();
        let map = match &n.body {
            Body::File(m) => m,
            Body::Dir(_) => return errno(libc::EISDIR),
            _ => return errno(libc::EINVAL),
        };
        let fsize = n.attr.size;
        if off >= fsize || size == 0 {
            return Ok(Vec::new());
        }
        let end = fsize.min(off.saturating_add(size as u64));
        let mut out = vec![0u8; (end - off) as usize];
        let mut tmp = vec![0u8; BLOCK_SIZE];
        let mut pos = off;
        while pos < end {
            let fb = pos / BS;
            let boff = (pos % BS) as usize;
            let take = ((BS - boff as u64).min(end - pos)) as usize;
            let phys = map.get(fb);
            let dst = &mut out[(pos - off) as usize..(pos - off) as usize + take];
            if phys != 0 {
                if boff == 0 && take == BLOCK_SIZE {
                    self.engine.read(phys, dst)?;
                } else {
                    self.engine.read(phys, &mut tmp)?;
                    dst.copy_from_slice(&tmp[boff..boff + take]);
                }
            }
            pos += take as u64;
        }
        Ok(out)
    }

    /// Write `data` at `off`: whole blocks go to the engine in one call, partial edge blocks are
    /// read-modify-write; one log record; replaced blocks are released after it is durable.
    pub fn write(&self, ino: u64, off: u64, data: &[u8]) -> Result<usize> {
        self.write_as(ino, off, data, true, None::<fn()>)
    }

    /// [`FileSystem::write`] of data the kernel flushes from its page cache (the writeback
    /// cache): no writer waits for it, so a large one is not split across threads (the
    /// writers are busy on the other cores filling the cache).
    pub fn write_back(&self, ino: u64, off: u64, data: &[u8]) -> Result<usize> {
        self.write_as(ino, off, data, false, None::<fn()>)
    }

    /// The write itself; `admitted`, when given, runs as [`FileSystem::write_admitted`] says.
    pub(crate) fn write_as(
        &self,
        ino: u64,
        off: u64,
        data: &[u8],
        waited: bool,
        admitted: Option<impl FnOnce()>,
    ) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let data = fitting(off, data)?;
        let end = off + data.len() as u64;
        let nblocks = end.div_ceil(BS) - off / BS;
        self.ensure_space(nblocks, true, 64 + 8 * nblocks as usize)?;
        let _g = self.gate.read();
        let node = self.node(ino)?;
        let mut n = node.write();
        let map = match &n.body {
            Body::File(m) => m,
            Body::Dir(_) => return errno(libc::EISDIR),
            _ => return errno(libc::EINVAL),
        };
        let fb0 = off / BS;
        let fb_end = end.div_ceil(BS);
        let head_partial =
            !off.is_multiple_of(BS) || (fb_end - fb0 == 1 && !end.is_multiple_of(BS));
        let tail_partial = !end.is_multiple_of(BS) && fb_end - fb0 > 1;
        let mut head = Vec::new();
        let mut tail = Vec::new();
        if head_partial {
            head = vec![0u8; BLOCK_SIZE];
            self.read_block(map.get(fb0), &mut head)?;
            let boff = (off % BS) as usize;
            let take = (BLOCK_SIZE - boff).min(data.len());
            head[boff..boff + take].copy_from_slice(&data[..take]);
        }
        if tail_partial {
            tail = vec![0u8; BLOCK_SIZE];
            self.read_block(map.get(fb_end - 1), &mut tail)?;
            let len = (end % BS) as usize;
            tail[..len].copy_from_slice(&data[data.len() - len..]);
        }
        let mut slices: Vec<&[u8]> = Vec::with_capacity((fb_end - fb0) as usize);
        for fb in fb0..fb_end {
            if fb == fb0 && head_partial {
                slices.push(&head);
            } else if fb == fb_end - 1 && tail_partial {
                slices.push(&tail);
            } else {
                let s = (fb * BS - off) as usize;
                slices.push(&data[s..s + BLOCK_SIZE]);
            }
        }
        let admission =
            admitted.and_then(|answer| self.reserve_admitted(nblocks).inspect(|_| answer()));
        let (phys, misses) = self.engine_write_misses(&slices, waited)?;
        // Its blocks are allocated: the free count shows them now.
        drop(admission);
        let rec = Record::Write {
            ino,
            first: fb0,
            blocks: phys.clone(),
            size: n.attr.size.max(end),
            mtime: Ts::now(),
        };
        self.append_naming(&n, &rec, &phys)?;
        let eff = apply_inode(&mut n, &rec, &self.persist)?;
        self.note_misses(ino, fb0, &misses);
        drop(n);
        self.finish(eff)?;
        Ok(data.len())
    }

    /// Replace the part `[from, to)` (inside one block `fb`) of a block with zeros; returns the
    /// new physical block and, when it was stored as new data, what `smart`'s worker must hear
    /// of it (see [`FileSystem::note_misses`]); `None` when the block is a hole (already zero).
    fn zero_part(
        &self,
        map_phys: BlockNr,
        from: usize,
        to: usize,
    ) -> Result<Option<(BlockNr, Vec<Miss>)>> {
        if map_phys == 0 {
            return Ok(None);
        }
        let mut buf = vec![0u8; BLOCK_SIZE];
        self.engine.read(map_phys, &mut buf)?;
        buf[from..to].fill(0);
        let (phys, misses) = self.engine_write_misses(&[&buf], true)?;
        Ok(Some((phys[0], misses)))
    }

    /// File blocks of `ino` from `first` on got blocks stored as new data (`misses` of the
    /// engine write, indices relative to `first`): `smart`'s skipped buffer replaces its items
    /// for them, whose fingerprints were those of the old contents. Every path that maps new
    /// data into a file calls it (write, a truncate's or punch's partial block, a copy's
    /// unshared blocks), under the inode lock after the record is applied, so a file block's
    /// item is always that of its last rewrite (a racing writer's cannot land after it).
    pub(crate) fn note_misses(&self, ino: u64, first: u64, misses: &[Miss]) {
        if let Some(s) = &self.smart {
            s.note(ino, first, misses);
        }
    }

    fn truncate_locked(&self, ino: u64, n: &mut Inode, size: u64, now: Ts) -> Result<Effects> {
        if size > MAX_FILE_SIZE {
            return errno(libc::EFBIG);
        }
        let mut tail = None;
        let mut misses = Vec::new();
        if size < n.attr.size && !size.is_multiple_of(BS) {
            let fb = size / BS;
            let phys = n.map().map_or(0, |m| m.get(fb));
            if let Some((nb, m)) = self.zero_part(phys, (size % BS) as usize, BLOCK_SIZE)? {
                tail = Some((fb, nb));
                misses = m;
            }
        }
        let rec = Record::Truncate {
            ino,
            size,
            tail,
            now,
        };
        let named: Vec<BlockNr> = tail.iter().map(|&(_, b)| b).collect();
        self.append_naming(n, &rec, &named)?;
        let eff = apply_inode(n, &rec, &self.persist)?;
        if let Some((fb, _)) = tail {
            self.note_misses(ino, fb, &misses);
        }
        Ok(eff)
    }

    /// Set the size of a regular file.
    pub fn truncate(&self, ino: u64, size: u64) -> Result<Attr> {
        self.ensure_space(0, false, 128)?;
        let _g = self.gate.read();
        let node = self.node(ino)?;
        let mut n = node.write();
        match n.attr.kind {
            Kind::File => {}
            Kind::Dir => return errno(libc::EISDIR),
            _ => return errno(libc::EINVAL),
        }
        let eff = self.truncate_locked(ino, &mut n, size, Ts::now())?;
        let attr = n.attr.clone();
        drop(n);
        self.finish(eff)?;
        Ok(attr)
    }

    /// fallocate: PUNCH_HOLE (releases blocks) and ZERO_RANGE (the range reads as zeros).
    /// Preallocation (mode 0, KEEP_SIZE alone) is refused with EOPNOTSUPP: a deduplicating,
    /// copy-on-write file system cannot promise that later writes to a range find space (a
    /// rewrite needs a new block before the old one is released), and claiming it would be a
    /// lie. ZERO_RANGE zeroes but reserves nothing either. Programs that use posix_fallocate
    /// fall back to writing zeros (glibc), which deduplicate to one block.
    pub fn fallocate(&self, ino: u64, off: u64, len: u64, mode: i32) -> Result<()> {
        use falloc::*;
        if mode & !(KEEP_SIZE | PUNCH_HOLE | ZERO_RANGE) != 0 {
            return errno(libc::EOPNOTSUPP);
        }
        if mode & (PUNCH_HOLE | ZERO_RANGE) == 0 {
            return errno(libc::EOPNOTSUPP);
        }
        if mode & PUNCH_HOLE != 0 && mode & KEEP_SIZE == 0 {
            return errno(libc::EOPNOTSUPP);
        }
        let end = off.checked_add(len).ok_or(FsError::Errno(libc::EFBIG))?;
        if len == 0 {
            return errno(libc::EINVAL);
        }
        if end > MAX_FILE_SIZE {
            return errno(libc::EFBIG);
        }
        self.ensure_space(0, false, 512)?;
        let _g = self.gate.read();
        let node = self.node(ino)?;
        let mut n = node.write();
        match n.attr.kind {
            Kind::File => {}
            Kind::Dir => return errno(libc::EISDIR),
            _ => return errno(libc::ENODEV),
        }
        let now = Ts::now();
        let mut eff = Effects::default();
        // Records appended before a failure stay applied: their released references must
        // still be handed back, or they leak.
        let r = (|| -> Result<()> {
            if mode & (PUNCH_HOLE | ZERO_RANGE) != 0 {
                let zend = end.min(n.attr.size);
                if off < zend {
                    let first_full = off.div_ceil(BS);
                    let last_full = zend / BS; // exclusive
                                               // Partial edge blocks are rewritten with zeros in the punched part.
                    let mut edges: Vec<(u64, usize, usize)> = Vec::new();
                    if !off.is_multiple_of(BS) {
                        let fb = off / BS;
                        let to = if fb == zend / BS {
                            (zend % BS) as usize
                        } else {
                            BLOCK_SIZE
                        };
                        edges.push((fb, (off % BS) as usize, to));
                    }
                    if !zend.is_multiple_of(BS)
                        && zend / BS >= first_full
                        && (off.is_multiple_of(BS) || zend / BS != off / BS)
                    {
                        edges.push((zend / BS, 0, (zend % BS) as usize));
                    }
                    for (fb, from, to) in edges {
                        let phys = n.map().map_or(0, |m| m.get(fb));
                        if let Some((nb, misses)) = self.zero_part(phys, from, to)? {
                            let rec = Record::Write {
                                ino,
                                first: fb,
                                blocks: vec![nb],
                                size: n.attr.size,
                                mtime: now,
                            };
                            self.append_naming(&n, &rec, &[nb])?;
                            let e = apply_inode(&mut n, &rec, &self.persist)?;
                            self.note_misses(ino, fb, &misses);
                            eff.released.extend(e.released);
                            eff.mapped_delta += e.mapped_delta;
                        }
                    }
                    if first_full < last_full {
                        let rec = Record::Punch {
                            ino,
                            start: first_full,
                            end: last_full,
                            now,
                        };
                        self.append_for(&n, &rec)?;
                        let e = apply_inode(&mut n, &rec, &self.persist)?;
                        eff.released.extend(e.released);
                        eff.mapped_delta += e.mapped_delta;
                    }
                }
            }
            if mode & KEEP_SIZE == 0 && end > n.attr.size {
                let e = self.truncate_locked(ino, &mut n, end, now)?;
                eff.released.extend(e.released);
                eff.mapped_delta += e.mapped_delta;
            }
            Ok(())
        })();
        drop(n);
        let f = self.finish(eff);
        r.and(f)
    }
}
