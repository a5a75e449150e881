//! The engine superblock (block 0): magic, version, geometry, policy, fingerprint, layout, clean
//! flag and checksum, validated on every open.
//!
//! On-media layout (little endian, `SB_SIZE` bytes at offset 0 of block 0):
//!
//! | offset | width | field             |
//! |-------:|------:|-------------------|
//! | 0      | 8     | magic `NODUPENG`  |
//! | 8      | 4     | version           |
//! | 12     | 4     | block size        |
//! | 16     | 8     | total blocks      |
//! | 24     | 8     | client area start |
//! | 32     | 8     | client area blocks|
//! | 40     | 8     | revmap start      |
//! | 48     | 8     | revmap blocks     |
//! | 56     | 8     | layout start      |
//! | 64     | 8     | layout blocks     |
//! | 72     | 8     | layout slots      |
//! | 80     | 8     | save area start   |
//! | 88     | 8     | save area blocks  |
//! | 96     | 8     | data area start   |
//! | 104    | 8     | data area blocks  |
//! | 112    | 4     | policy            |
//! | 116    | 4     | fingerprint       |
//! | 120    | 4     | metadata layout   |
//! | 124    | 4     | clean flag (1 = clean shutdown, save area valid) |
//! | 128    | 8     | memory budget     |
//! | 136    | 8     | xxh3-64 of bytes 0..136 |

use crate::codec::{le_u32, le_u64, put_u32, put_u64};
use crate::fingerprint::FpKind;
use crate::media::Medium;
use crate::meta::revmap;
use crate::meta::MetaLayoutKind;
use crate::policy::PolicyKind;
use crate::{Error, Result, BLOCK_SIZE};

/// Superblock magic.
pub const MAGIC: [u8; 8] = *b"NODUPENG";
/// On-media version this build writes and reads.
pub const VERSION: u32 = 1;
/// Encoded size.
pub const SB_SIZE: usize = 144;

/// Byte offsets of the fields (the table above).
mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const BLOCK_SIZE: usize = 12;
    pub const TOTAL_BLOCKS: usize = 16;
    pub const CLIENT_START: usize = 24;
    pub const CLIENT_BLOCKS: usize = 32;
    pub const REVMAP_START: usize = 40;
    pub const REVMAP_BLOCKS: usize = 48;
    pub const LAYOUT_START: usize = 56;
    pub const LAYOUT_BLOCKS: usize = 64;
    pub const LAYOUT_SLOTS: usize = 72;
    pub const SAVE_START: usize = 80;
    pub const SAVE_BLOCKS: usize = 88;
    pub const DATA_START: usize = 96;
    pub const DATA_BLOCKS: usize = 104;
    pub const POLICY: usize = 112;
    pub const FINGERPRINT: usize = 116;
    pub const META_LAYOUT: usize = 120;
    pub const CLEAN: usize = 124;
    pub const MEM_BUDGET: usize = 128;
    /// xxh3-64 of every byte before it.
    pub const CHECKSUM: usize = 136;
}
/// Header bytes of the save area before its payload (one block).
pub const SAVE_HEADER_BLOCKS: u64 = 1;
/// Smallest data area accepted at format.
pub const MIN_DATA_BLOCKS: u64 = 16;

/// The decoded superblock.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// On-media version.
    pub version: u32,
    /// Block size (4096).
    pub block_size: u32,
    /// Blocks of the whole image.
    pub total_blocks: u64,
    /// First block of the caller's area (1).
    pub client_start: u64,
    /// Blocks of the caller's area.
    pub client_blocks: u64,
    /// First block of the reverse map.
    pub revmap_start: u64,
    /// Blocks of the reverse map.
    pub revmap_blocks: u64,
    /// First block of the layout's fixed area.
    pub layout_start: u64,
    /// Blocks of the layout's fixed area.
    pub layout_blocks: u64,
    /// Entry slots of the fixed area (entry / hashtable layouts).
    pub layout_slots: u64,
    /// First block of the clean-shutdown save area.
    pub save_start: u64,
    /// Blocks of the save area.
    pub save_blocks: u64,
    /// First block of the data area.
    pub data_start: u64,
    /// Blocks of the data area.
    pub data_blocks: u64,
    /// Dedup policy.
    pub policy: PolicyKind,
    /// Fingerprint function in use.
    pub fingerprint: FpKind,
    /// Metadata layout.
    pub meta_layout: MetaLayoutKind,
    /// Set by a complete clean shutdown, cleared at open.
    pub clean: bool,
    /// Memory budget for policies that have one.
    pub mem_budget: u64,
}

impl Superblock {
    /// Geometry for a medium of `len` bytes.
    pub fn plan(
        len: u64,
        client_blocks: u64,
        policy: PolicyKind,
        fingerprint: FpKind,
        meta_layout: MetaLayoutKind,
        mem_budget: u64,
        max_state_words: impl Fn(u64, u64) -> u64,
    ) -> Result<Superblock> {
        let total = len / BLOCK_SIZE as u64;
        let bs = BLOCK_SIZE as u64;
        if client_blocks >= total {
            return Err(Error::Invalid(format!(
                "client area of {client_blocks} blocks does not fit a medium of {total} blocks"
            )));
        }
        let client_start = 1u64;
        let revmap_start = client_start
            .checked_add(client_blocks)
            .ok_or_else(|| Error::Invalid("client area too large".into()))?;
        let revmap_blocks = (total * revmap::SLOT).div_ceil(bs);
        let layout_start = revmap_start + revmap_blocks;
        let (layout_blocks, layout_slots) = meta_layout.fixed_area(total);
        let save_start = layout_start + layout_blocks;
        let words = total.div_ceil(64) + total + max_state_words(total, layout_slots);
        let save_blocks = SAVE_HEADER_BLOCKS + (words * 8).div_ceil(bs);
        let data_start = save_start + save_blocks;
        if total < data_start + MIN_DATA_BLOCKS {
            return Err(Error::Invalid(format!(
                "medium of {len} bytes is too small (needs at least {} blocks)",
                data_start + MIN_DATA_BLOCKS
            )));
        }
        Ok(Superblock {
            version: VERSION,
            block_size: BLOCK_SIZE as u32,
            total_blocks: total,
            client_start,
            client_blocks,
            revmap_start,
            revmap_blocks,
            layout_start,
            layout_blocks,
            layout_slots,
            save_start,
            save_blocks,
            data_start,
            data_blocks: total - data_start,
            policy,
            fingerprint,
            meta_layout,
            clean: false,
            mem_budget,
        })
    }

    /// Encode with checksum.
    pub fn encode(&self) -> [u8; SB_SIZE] {
        let mut b = [0u8; SB_SIZE];
        b[off::MAGIC..off::MAGIC + 8].copy_from_slice(&MAGIC);
        put_u32(&mut b, off::VERSION, self.version);
        put_u32(&mut b, off::BLOCK_SIZE, self.block_size);
        for (o, v) in [
            (off::TOTAL_BLOCKS, self.total_blocks),
            (off::CLIENT_START, self.client_start),
            (off::CLIENT_BLOCKS, self.client_blocks),
            (off::REVMAP_START, self.revmap_start),
            (off::REVMAP_BLOCKS, self.revmap_blocks),
            (off::LAYOUT_START, self.layout_start),
            (off::LAYOUT_BLOCKS, self.layout_blocks),
            (off::LAYOUT_SLOTS, self.layout_slots),
            (off::SAVE_START, self.save_start),
            (off::SAVE_BLOCKS, self.save_blocks),
            (off::DATA_START, self.data_start),
            (off::DATA_BLOCKS, self.data_blocks),
            (off::MEM_BUDGET, self.mem_budget),
        ] {
            put_u64(&mut b, o, v);
        }
        put_u32(&mut b, off::POLICY, self.policy as u32);
        put_u32(&mut b, off::FINGERPRINT, self.fingerprint as u32);
        put_u32(&mut b, off::META_LAYOUT, self.meta_layout as u32);
        put_u32(&mut b, off::CLEAN, self.clean as u32);
        let sum = xxhash_rust::xxh3::xxh3_64(&b[..off::CHECKSUM]);
        put_u64(&mut b, off::CHECKSUM, sum);
        b
    }

    /// Decode and validate against a medium of `len` bytes.
    pub fn decode(b: &[u8], len: u64) -> Result<Superblock> {
        if b.len() < SB_SIZE || b[off::MAGIC..off::MAGIC + 8] != MAGIC {
            return Err(Error::NotNodup("bad engine superblock magic".into()));
        }
        let version = le_u32(b, off::VERSION);
        if version > VERSION {
            return Err(Error::Version {
                found: version,
                supported: VERSION,
            });
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&b[..off::CHECKSUM]);
        if sum != le_u64(b, off::CHECKSUM) {
            return Err(Error::Corrupt("engine superblock checksum mismatch".into()));
        }
        if version != VERSION {
            return Err(Error::Corrupt(format!(
                "engine superblock version {version}"
            )));
        }
        let corrupt = |m: &str| Error::Corrupt(format!("engine superblock: {m}"));
        let policy = PolicyKind::from_u32(le_u32(b, off::POLICY))
            .ok_or_else(|| corrupt("unknown policy"))?;
        let fingerprint = FpKind::from_u32(le_u32(b, off::FINGERPRINT))
            .ok_or_else(|| corrupt("unknown fingerprint"))?;
        let meta_layout = MetaLayoutKind::from_u32(le_u32(b, off::META_LAYOUT))
            .ok_or_else(|| corrupt("unknown metadata layout"))?;
        let clean = match le_u32(b, off::CLEAN) {
            0 => false,
            1 => true,
            _ => return Err(corrupt("bad clean flag")),
        };
        let sb = Superblock {
            version,
            block_size: le_u32(b, off::BLOCK_SIZE),
            total_blocks: le_u64(b, off::TOTAL_BLOCKS),
            client_start: le_u64(b, off::CLIENT_START),
            client_blocks: le_u64(b, off::CLIENT_BLOCKS),
            revmap_start: le_u64(b, off::REVMAP_START),
            revmap_blocks: le_u64(b, off::REVMAP_BLOCKS),
            layout_start: le_u64(b, off::LAYOUT_START),
            layout_blocks: le_u64(b, off::LAYOUT_BLOCKS),
            layout_slots: le_u64(b, off::LAYOUT_SLOTS),
            save_start: le_u64(b, off::SAVE_START),
            save_blocks: le_u64(b, off::SAVE_BLOCKS),
            data_start: le_u64(b, off::DATA_START),
            data_blocks: le_u64(b, off::DATA_BLOCKS),
            policy,
            fingerprint,
            meta_layout,
            clean,
            mem_budget: le_u64(b, off::MEM_BUDGET),
        };
        if sb.block_size != BLOCK_SIZE as u32 {
            return Err(corrupt("block size is not 4096"));
        }
        if sb
            .total_blocks
            .checked_mul(BLOCK_SIZE as u64)
            .is_none_or(|l| l > len)
        {
            return Err(corrupt("geometry larger than the medium"));
        }
        Ok(sb)
    }

    /// Check that the areas follow each other exactly as `plan` lays them out.
    pub fn check_geometry(&self, expected: &Superblock) -> Result<()> {
        let mut e = *expected;
        e.clean = self.clean;
        if e != *self {
            return Err(Error::Corrupt(
                "engine superblock geometry is inconsistent".into(),
            ));
        }
        Ok(())
    }

    /// Write to block 0 and make it durable.
    pub fn store(&self, m: &dyn Medium) -> Result<()> {
        m.write(0, &self.encode())?;
        m.flush(0, SB_SIZE as u64);
        m.fence()
    }

    /// Read block 0 of `m` and validate it.
    pub fn load(m: &dyn Medium) -> Result<Superblock> {
        let len = m.len();
        if len < BLOCK_SIZE as u64 {
            return Err(Error::NotNodup("medium smaller than one block".into()));
        }
        let mut b = [0u8; SB_SIZE];
        m.read(0, &mut b)?;
        Superblock::decode(&b, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_rejects() {
        let sb = Superblock::plan(
            64 << 20,
            16,
            PolicyKind::Light,
            FpKind::Xxh3,
            MetaLayoutKind::Region,
            0,
            |t, _| t + 1,
        )
        .unwrap();
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b, 64 << 20).unwrap(), sb);
        let mut bad = b;
        bad[20] ^= 1;
        assert!(matches!(
            Superblock::decode(&bad, 64 << 20),
            Err(Error::Corrupt(_))
        ));
        let mut bad = b;
        bad[0] = b'X';
        assert!(matches!(
            Superblock::decode(&bad, 64 << 20),
            Err(Error::NotNodup(_))
        ));
        let mut newer = sb;
        newer.version = VERSION + 1;
        assert!(matches!(
            Superblock::decode(&newer.encode(), 64 << 20),
            Err(Error::Version { .. })
        ));
        assert!(Superblock::decode(&b, 1 << 20).is_err());
    }
}
