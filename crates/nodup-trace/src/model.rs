//! The compact expected-content model of a trace's LBA space, shared by replay and statistics.
//!
//! Digests are interned to 28-bit ids; a sector's content is a `SectorKey` = id << 4 | kind
//! (kind as in `content`), 0 meaning never written. Each touched 4 KiB block of each device keeps
//! its 8 sector keys (32 bytes), so memory grows with the touched blocks, never with bytes.

use crate::content::{SectorContent, KIND_ZERO};
use crate::error::{Result, TraceError};
use crate::record::{Digest, Record, SECTORS_PER_BLOCK};
use std::collections::HashMap;

/// Interned identity of one sector's content (0 = never written).
pub type SectorKey = u32;
/// Identity of one 4 KiB block's content: its eight sector keys.
pub type BlockKey = [SectorKey; SECTORS_PER_BLOCK as usize];

const MAX_DIGEST_ID: u32 = (1 << 28) - 1;

/// Digest interner: digest <-> small id.
#[derive(Default)]
pub struct Interner {
    ids: HashMap<Digest, u32>,
    digests: Vec<Digest>,
}

impl Interner {
    /// Key of a sector content, interning its digest.
    pub fn key(&mut self, sc: SectorContent) -> Result<SectorKey> {
        if sc.kind == KIND_ZERO {
            return Ok(0);
        }
        let id = match self.ids.get(&sc.digest) {
            Some(&id) => id,
            None => {
                let id = self.digests.len() as u32 + 1;
                if id > MAX_DIGEST_ID {
                    return Err(TraceError::Invalid(
                        "more than 2^28 distinct digests in one trace".into(),
                    ));
                }
                self.digests.push(sc.digest);
                self.ids.insert(sc.digest, id);
                id
            }
        };
        Ok(id << 4 | sc.kind as u32)
    }

    /// The sector content a key stands for.
    pub fn content(&self, key: SectorKey) -> SectorContent {
        let id = key >> 4;
        if id == 0 {
            return SectorContent::ZERO;
        }
        SectorContent {
            digest: self.digests[(id - 1) as usize],
            kind: (key & 15) as u8,
        }
    }

    /// Number of distinct digests seen.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Whether no digest was seen.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }
}

/// One 4 KiB block touched by a request: which sectors of it the request covers.
#[derive(Debug, Clone, Copy)]
pub struct BlockTouch {
    /// Block number within the device.
    pub block: u64,
    /// First covered sector within the block (0..8).
    pub from: u8,
    /// One past the last covered sector within the block (1..=8).
    pub to: u8,
    /// Index of the block's first covered sector within the request.
    pub req_sector: u32,
}

/// The blocks a request touches, in order, with the covered sector range of each.
pub fn touches(r: &Record) -> impl Iterator<Item = BlockTouch> + '_ {
    let start = r.lba;
    let end = r.lba + r.sectors as u64;
    (r.first_block()..r.end_block()).map(move |b| {
        let bs = b * SECTORS_PER_BLOCK;
        let from = start.max(bs);
        let to = end.min(bs + SECTORS_PER_BLOCK);
        BlockTouch {
            block: b,
            from: (from - bs) as u8,
            to: (to - bs) as u8,
            req_sector: (from - start) as u32,
        }
    })
}

/// How one block's content is stored: most blocks are exactly one 4 KiB digest (one id, 4 bytes);
/// only blocks mixing sources (512 B digests, unaligned writes) keep all eight sector keys.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stored {
    Whole(u32),
    Sectors(Box<BlockKey>),
}

impl Stored {
    fn pack(k: BlockKey) -> Stored {
        let id = k[0] >> 4;
        let whole = id != 0
            && k.iter()
                .enumerate()
                .all(|(i, &s)| s == (id << 4 | (i as u32 + 1)));
        if whole {
            Stored::Whole(id)
        } else {
            Stored::Sectors(Box::new(k))
        }
    }

    fn unpack(&self) -> BlockKey {
        match self {
            Stored::Whole(id) => std::array::from_fn(|i| id << 4 | (i as u32 + 1)),
            Stored::Sectors(k) => **k,
        }
    }
}

/// Bits of the packed map key that hold the block number (the device index sits above them):
/// parsers bound LBAs by `record::MAX_LBA_END` (2^53 sectors = 2^50 blocks).
const BLOCK_BITS: u32 = 50;
/// Most distinct devices one trace may address (the bits left above the block number).
pub const MAX_DEVICES: u32 = 1 << (64 - BLOCK_BITS);

/// Expected content of every touched block of every device.
#[derive(Default)]
pub struct LbaModel {
    /// The digest interner.
    pub interner: Interner,
    devices: HashMap<(u32, u32), u32>,
    /// (device index << 50 | block) -> content: 8 + 16 bytes per entry instead of 16 + 32.
    blocks: HashMap<u64, Stored>,
}

fn map_key(dev: u32, block: u64) -> u64 {
    debug_assert!(block < 1 << BLOCK_BITS && dev < MAX_DEVICES);
    (dev as u64) << BLOCK_BITS | block
}

impl LbaModel {
    /// Dense index of a device (in order of first appearance).
    pub fn device_index(&mut self, dev: (u32, u32)) -> Result<u32> {
        let n = self.devices.len() as u32;
        if n >= MAX_DEVICES && !self.devices.contains_key(&dev) {
            return Err(TraceError::Invalid(format!(
                "more than {MAX_DEVICES} devices in one trace"
            )));
        }
        Ok(*self.devices.entry(dev).or_insert(n))
    }

    /// Current content of a block (all zero keys if never written).
    pub fn get(&self, dev: u32, block: u64) -> BlockKey {
        self.blocks
            .get(&map_key(dev, block))
            .map(Stored::unpack)
            .unwrap_or_default()
    }

    /// Apply a write to one touched block (read-modify-write at sector granularity); returns (old, new).
    pub fn write(&mut self, dev: u32, r: &Record, t: BlockTouch) -> Result<(BlockKey, BlockKey)> {
        let old = self.get(dev, t.block);
        let mut new = old;
        for s in t.from..t.to {
            let i = t.req_sector + (s - t.from) as u32;
            new[s as usize] = self.interner.key(r.sector_content(i))?;
        }
        self.blocks.insert(map_key(dev, t.block), Stored::pack(new));
        Ok((old, new))
    }

    /// Number of distinct devices seen.
    pub fn device_index_count(&self) -> u64 {
        self.devices.len() as u64
    }

    /// Blocks that hold written data.
    pub fn live_blocks(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{DigestUnit, Op};

    fn rec(lba: u64, sectors: u32, unit: DigestUnit, seed: u8) -> Record {
        let n = Record::expected_digests(unit, sectors);
        Record {
            ts: 0,
            pid: 1,
            process: "t".into(),
            lba,
            sectors,
            op: Op::Write,
            major: 1,
            minor: 0,
            unit,
            digests: (0..n).map(|i| [seed.wrapping_add(i as u8); 16]).collect(),
        }
    }

    #[test]
    fn touches_cover_unaligned_requests() {
        let r = rec(5, 12, DigestUnit::Sector, 0);
        let t: Vec<_> = touches(&r)
            .map(|t| (t.block, t.from, t.to, t.req_sector))
            .collect();
        assert_eq!(t, vec![(0, 5, 8, 0), (1, 0, 8, 3), (2, 0, 1, 11)]);
    }

    #[test]
    fn partial_write_keeps_other_sectors() {
        let mut m = LbaModel::default();
        let d = m.device_index((1, 0)).unwrap();
        let full = rec(0, 8, DigestUnit::Sector, 10);
        for t in touches(&full).collect::<Vec<_>>() {
            m.write(d, &full, t).unwrap();
        }
        let part = rec(2, 3, DigestUnit::Sector, 50);
        for t in touches(&part).collect::<Vec<_>>() {
            m.write(d, &part, t).unwrap();
        }
        let k = m.get(d, 0);
        let seeds: Vec<u8> = k.iter().map(|&k| m.interner.content(k).digest[0]).collect();
        assert_eq!(seeds, vec![10, 11, 50, 51, 52, 15, 16, 17]);
    }

    #[test]
    fn compact_storage_round_trips() {
        let whole: BlockKey = std::array::from_fn(|i| 5 << 4 | (i as u32 + 1));
        assert_eq!(Stored::pack(whole), Stored::Whole(5));
        assert_eq!(Stored::pack(whole).unpack(), whole);
        let mut mixed = whole;
        mixed[3] = 9 << 4 | 9;
        assert!(matches!(Stored::pack(mixed), Stored::Sectors(_)));
        assert_eq!(Stored::pack(mixed).unpack(), mixed);
        // Parts out of order (an unaligned 4 KiB digest) must not pass as a whole block.
        let mut shifted = whole;
        shifted.rotate_left(1);
        assert_eq!(Stored::pack(shifted).unpack(), shifted);
        assert!(matches!(Stored::pack(shifted), Stored::Sectors(_)));
        let zero = BlockKey::default();
        assert_eq!(Stored::pack(zero).unpack(), zero);
    }
}
