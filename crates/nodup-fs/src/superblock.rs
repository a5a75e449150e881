//! The file-system superblock: two alternating copies in the engine's client area, so switching
//! to a new checkpoint is one atomic step (write the older copy with a higher sequence number).

use crate::error::{FsError, Result};
use nodup_core::codec::{le_u32, le_u64, put_u32, put_u64};
use nodup_core::media::Medium;
use nodup_core::{BlockNr, BLOCK_SIZE};
use std::io::Read;
use std::path::Path;

/// Magic at offset 0 of both superblock copies.
pub const SB_MAGIC: [u8; 8] = *b"NODUPFS1";
/// On-media format version written by this build (log records, checkpoints, chains, superblock).
/// Version 2: incremental checkpoints (manifest + segments) and a log that continues across them.
pub const FS_VERSION: u32 = 2;
/// Oldest format version this build opens. A version-1 image (full-snapshot checkpoints) is
/// converted to version 2 by its first read-write open.
pub const FS_VERSION_MIN: u32 = 1;
/// Superblock flag: the last unmount was clean (checkpoint written, engine shut down).
pub const FLAG_CLEAN: u32 = 1;

/// Offsets of the superblock fields (see the layout above [`Superblock`]).
pub mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const FLAGS: usize = 12;
    pub const SEQ: usize = 16;
    pub const BLOCK_SIZE: usize = 24;
    pub const MEDIUM: usize = 28;
    pub const TOTAL_BLOCKS: usize = 32;
    pub const POLICY: usize = 40;
    pub const FINGERPRINT: usize = 44;
    pub const META_LAYOUT: usize = 48;
    pub const CKPT_HEAD: usize = 56;
    pub const CKPT_GEN: usize = 64;
    pub const LOG_HEAD: usize = 72;
    pub const LOG_GEN: usize = 80;
    pub const LOG_SEQ: usize = 88;
    pub const NEXT_GEN: usize = 96;
    pub const CREATED: usize = 104;
    pub const LOG_INDEX: usize = 112;
    pub const LOG_OFF: usize = 120;
    pub const CHECKSUM: usize = 128;
    /// Encoded size in bytes.
    pub const END: usize = 136;
    /// Where version 1 kept its checksum (it had no log index and offset).
    pub const V1_CHECKSUM: usize = 112;
}

nodup_core::named_enum! {
    /// Which medium the image was made for; recorded at mkfs so mount opens it the same way.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
    pub enum MediumKind {
        /// Memory-mapped image (tmpfs, DAX): durable when a call returns.
        Pmem = 1 => "pmem",
        /// pread/pwrite image: durable after fsync.
        BlockFile = 2 => "blockfile",
    }
}

/// One superblock copy.
///
/// Layout (little endian, 136 bytes at the start of the block; offsets in [`off`]):
/// magic 8 | version 4 | flags 4 | seq 8 | block_size 4 | medium 4 | total_blocks 8 |
/// policy 4 | fingerprint 4 | meta_layout 4 | pad 4 | ckpt_head 8 | ckpt_gen 8 |
/// log_head 8 | log_gen 8 | log_seq 8 | next_gen 8 | created 8 | log_index 8 | log_off 4 |
/// pad 4 | crc32c(0..128) 4 | pad 4
///
/// `ckpt_head`/`ckpt_gen` name the checkpoint manifest chain (version 1: the snapshot chain).
/// Replay starts in block `log_head` (chain index `log_index` of log chain `log_gen`) at payload
/// offset `log_off`, with the record numbered `log_seq`. Version 1 ended at byte 120 with its
/// checksum at 112 and always started replay at index 0, offset 0.
#[repr(C)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub magic: [u8; 8],
    pub version: u32,
    pub flags: u32,
    pub seq: u64,
    pub block_size: u32,
    pub medium: u32,
    pub total_blocks: u64,
    pub policy: u32,
    pub fingerprint: u32,
    pub meta_layout: u32,
    pub _pad: u32,
    pub ckpt_head: u64,
    pub ckpt_gen: u64,
    pub log_head: u64,
    pub log_gen: u64,
    pub log_seq: u64,
    pub next_gen: u64,
    pub created: u64,
    pub log_index: u64,
    pub log_off: u32,
    pub _pad3: u32,
    pub checksum: u32,
    pub _pad2: u32,
}

const _: () = assert!(std::mem::size_of::<Superblock>() == off::END);

impl Superblock {
    /// A superblock with every pointer empty (filled in by mkfs).
    pub fn new(medium: MediumKind, total_blocks: u64, policy: u32, fp: u32, layout: u32) -> Self {
        Superblock {
            magic: SB_MAGIC,
            version: FS_VERSION,
            flags: 0,
            seq: 0,
            block_size: BLOCK_SIZE as u32,
            medium: medium as u32,
            total_blocks,
            policy,
            fingerprint: fp,
            meta_layout: layout,
            _pad: 0,
            ckpt_head: 0,
            ckpt_gen: 0,
            log_head: 0,
            log_gen: 0,
            log_seq: 1,
            next_gen: 1,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            log_index: 0,
            log_off: 0,
            _pad3: 0,
            checksum: 0,
            _pad2: 0,
        }
    }

    /// Encode into `off::END` bytes with a fresh checksum.
    pub fn encode(&self) -> [u8; off::END] {
        let mut b = [0u8; off::END];
        b[off::MAGIC..off::MAGIC + 8].copy_from_slice(&self.magic);
        put_u32(&mut b, off::VERSION, self.version);
        put_u32(&mut b, off::FLAGS, self.flags);
        put_u64(&mut b, off::SEQ, self.seq);
        put_u32(&mut b, off::BLOCK_SIZE, self.block_size);
        put_u32(&mut b, off::MEDIUM, self.medium);
        put_u64(&mut b, off::TOTAL_BLOCKS, self.total_blocks);
        put_u32(&mut b, off::POLICY, self.policy);
        put_u32(&mut b, off::FINGERPRINT, self.fingerprint);
        put_u32(&mut b, off::META_LAYOUT, self.meta_layout);
        put_u64(&mut b, off::CKPT_HEAD, self.ckpt_head);
        put_u64(&mut b, off::CKPT_GEN, self.ckpt_gen);
        put_u64(&mut b, off::LOG_HEAD, self.log_head);
        put_u64(&mut b, off::LOG_GEN, self.log_gen);
        put_u64(&mut b, off::LOG_SEQ, self.log_seq);
        put_u64(&mut b, off::NEXT_GEN, self.next_gen);
        put_u64(&mut b, off::CREATED, self.created);
        put_u64(&mut b, off::LOG_INDEX, self.log_index);
        put_u32(&mut b, off::LOG_OFF, self.log_off);
        let crc = crc32c::crc32c(&b[..off::CHECKSUM]);
        put_u32(&mut b, off::CHECKSUM, crc);
        b
    }

    /// Decode and validate one copy: magic, checksum, version, block size.
    pub fn decode(b: &[u8]) -> Result<Superblock> {
        if b.len() < off::END || b[..8] != SB_MAGIC {
            return Err(FsError::NotNodup("no nodup file-system superblock".into()));
        }
        let version = le_u32(b, off::VERSION);
        let crc_at = if version == 1 {
            off::V1_CHECKSUM
        } else {
            off::CHECKSUM
        };
        if crc32c::crc32c(&b[..crc_at]) != le_u32(b, crc_at) {
            return Err(FsError::Corrupt("superblock checksum mismatch".into()));
        }
        if !(FS_VERSION_MIN..=FS_VERSION).contains(&version) {
            return Err(FsError::Version {
                found: version,
                supported: FS_VERSION,
            });
        }
        let v2 = version >= 2;
        let sb = Superblock {
            magic: SB_MAGIC,
            version,
            flags: le_u32(b, off::FLAGS),
            seq: le_u64(b, off::SEQ),
            block_size: le_u32(b, off::BLOCK_SIZE),
            medium: le_u32(b, off::MEDIUM),
            total_blocks: le_u64(b, off::TOTAL_BLOCKS),
            policy: le_u32(b, off::POLICY),
            fingerprint: le_u32(b, off::FINGERPRINT),
            meta_layout: le_u32(b, off::META_LAYOUT),
            _pad: 0,
            ckpt_head: le_u64(b, off::CKPT_HEAD),
            ckpt_gen: le_u64(b, off::CKPT_GEN),
            log_head: le_u64(b, off::LOG_HEAD),
            log_gen: le_u64(b, off::LOG_GEN),
            log_seq: le_u64(b, off::LOG_SEQ),
            next_gen: le_u64(b, off::NEXT_GEN),
            created: le_u64(b, off::CREATED),
            log_index: if v2 { le_u64(b, off::LOG_INDEX) } else { 0 },
            log_off: if v2 { le_u32(b, off::LOG_OFF) } else { 0 },
            _pad3: 0,
            checksum: le_u32(b, crc_at),
            _pad2: 0,
        };
        if sb.block_size as usize != BLOCK_SIZE {
            return Err(FsError::Corrupt(format!("block size {}", sb.block_size)));
        }
        if MediumKind::from_u32(sb.medium).is_none() {
            return Err(FsError::Corrupt(format!(
                "unknown medium kind {}",
                sb.medium
            )));
        }
        Ok(sb)
    }

    /// True when the last unmount was clean.
    pub fn is_clean(&self) -> bool {
        self.flags & FLAG_CLEAN != 0
    }

    /// The medium kind recorded at mkfs.
    pub fn medium_kind(&self) -> MediumKind {
        MediumKind::from_u32(self.medium).unwrap_or(MediumKind::BlockFile)
    }

    /// Where replay starts: the log position of the checkpoint's cut.
    pub fn log_start(&self) -> crate::log::writer::LogPos {
        crate::log::writer::LogPos {
            block: self.log_head,
            index: self.log_index,
            off: self.log_off as usize,
            seq: self.log_seq,
        }
    }
}

/// Pick the newest valid copy out of two decode results; report the most telling error when
/// neither is valid (a newer version beats corruption beats "not nodup").
pub fn newest(a: Result<Superblock>, b: Result<Superblock>) -> Result<(Superblock, usize)> {
    match (a, b) {
        (Ok(x), Ok(y)) => Ok(if y.seq > x.seq { (y, 1) } else { (x, 0) }),
        (Ok(x), Err(_)) => Ok((x, 0)),
        (Err(_), Ok(y)) => Ok((y, 1)),
        (Err(e1), Err(e2)) => Err(worse(e1, e2)),
    }
}

fn worse(a: FsError, b: FsError) -> FsError {
    fn rank(e: &FsError) -> u8 {
        match e {
            FsError::Version { .. } => 3,
            FsError::Corrupt(_) => 2,
            _ => 1,
        }
    }
    if rank(&b) > rank(&a) {
        b
    } else {
        a
    }
}

/// Read both copies from the client area `[area, area+2)` of an open medium.
pub fn read_pair(m: &dyn Medium, area: BlockNr) -> Result<(Superblock, usize)> {
    let mut buf = [0u8; off::END];
    m.read(area * BLOCK_SIZE as u64, &mut buf)?;
    let a = Superblock::decode(&buf);
    m.read((area + 1) * BLOCK_SIZE as u64, &mut buf)?;
    let b = Superblock::decode(&buf);
    newest(a, b)
}

/// Write `sb` into copy `slot` (0 or 1) of the client area and make it durable.
pub fn write_slot(m: &dyn Medium, area: BlockNr, slot: usize, sb: &Superblock) -> Result<()> {
    let off = (area + slot as u64) * BLOCK_SIZE as u64;
    m.write(off, &sb.encode())?;
    m.flush(off, off::END as u64);
    m.fence()?;
    Ok(())
}

/// Blocks from the start of an image searched for the superblock before the engine is opened.
pub const PROBE_BLOCKS: u64 = 64;

/// Find the file-system superblock in an image file without opening the engine (read-only):
/// returns the newest valid copy, its slot and the block number of the client area.
pub fn probe_file(path: &Path) -> Result<(Superblock, usize, BlockNr)> {
    let f = std::fs::File::open(path)?;
    let mut head = Vec::new();
    f.take(PROBE_BLOCKS * BLOCK_SIZE as u64)
        .read_to_end(&mut head)?;
    scan(&head).map_err(|e| match e {
        FsError::NotNodup(_) => FsError::NotNodup(format!(
            "{}: no nodup file-system superblock found",
            path.display()
        )),
        e => e,
    })
}

/// Find the file-system superblock at the start of an open medium.
pub fn probe_medium(m: &dyn Medium) -> Result<(Superblock, usize, BlockNr)> {
    let n = (m.len() / BLOCK_SIZE as u64).min(PROBE_BLOCKS);
    let mut head = vec![0u8; n as usize * BLOCK_SIZE];
    m.read(0, &mut head)?;
    scan(&head)
}

/// Look for a superblock pair among the blocks of `head`.
fn scan(head: &[u8]) -> Result<(Superblock, usize, BlockNr)> {
    let nblocks = head.len() / BLOCK_SIZE;
    let mut best: Option<Result<(Superblock, usize, BlockNr)>> = None;
    let at = |i: usize| &head[i * BLOCK_SIZE..i * BLOCK_SIZE + off::END];
    for blk in 0..nblocks.saturating_sub(1) {
        if at(blk)[..8] != SB_MAGIC {
            continue;
        }
        // The pair starts at `blk` when the previous block is not also a copy.
        if blk > 0 && at(blk - 1)[..8] == SB_MAGIC {
            continue;
        }
        let r = newest(Superblock::decode(at(blk)), Superblock::decode(at(blk + 1)))
            .map(|(sb, slot)| (sb, slot, blk as BlockNr));
        best = Some(match (best, r) {
            (None, r) => r,
            (Some(Ok(x)), _) => Ok(x),
            (Some(Err(_)), Ok(y)) => Ok(y),
            (Some(Err(e1)), Err(e2)) => Err(worse(e1, e2)),
        });
    }
    match best {
        Some(r) => r,
        None => Err(FsError::NotNodup(
            "no nodup file-system superblock found".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodup_core::media::MemMedium;

    #[test]
    fn encode_decode_and_validation() {
        let mut sb = Superblock::new(MediumKind::Pmem, 1000, 1, 1, 1);
        sb.seq = 7;
        sb.ckpt_head = 33;
        let b = sb.encode();
        let d = Superblock::decode(&b).unwrap();
        assert_eq!(d.seq, 7);
        assert_eq!(d.ckpt_head, 33);
        let mut bad = b;
        bad[off::CKPT_HEAD] ^= 1;
        assert!(matches!(Superblock::decode(&bad), Err(FsError::Corrupt(_))));
        let mut newer = sb.clone();
        newer.version = FS_VERSION + 1;
        assert!(matches!(
            Superblock::decode(&newer.encode()),
            Err(FsError::Version { .. })
        ));
        assert!(matches!(
            Superblock::decode(&[0u8; off::END]),
            Err(FsError::NotNodup(_))
        ));
    }

    #[test]
    fn newest_copy_wins_and_torn_copy_is_ignored() {
        let m = MemMedium::new(16 * BLOCK_SIZE as u64);
        let mut sb = Superblock::new(MediumKind::Pmem, 16, 1, 1, 1);
        sb.seq = 1;
        write_slot(&m, 2, 0, &sb).unwrap();
        sb.seq = 2;
        sb.log_head = 9;
        write_slot(&m, 2, 1, &sb).unwrap();
        let (got, slot) = read_pair(&m, 2).unwrap();
        assert_eq!((got.seq, got.log_head, slot), (2, 9, 1));
        // Tear the newer copy: the older one must be used.
        m.write(3 * BLOCK_SIZE as u64 + off::LOG_HEAD as u64, &[0xff])
            .unwrap();
        let (got, slot) = read_pair(&m, 2).unwrap();
        assert_eq!((got.seq, slot), (1, 0));
    }
}
