//! The engine superblock (block 0): magic, version, geometry, policy, fingerprint, layout, clean
//! flag, incompatible-feature bits, the policy's own parameters and checksum, validated on every
//! open.
//!
//! On-media layout, version 2 (little endian, `SB_SIZE` = 272 bytes at offset 0 of block 0;
//! offsets in `off`):
//!
//! | offset | width | field             |
//! |-------:|------:|-------------------|
//! | 0      | 8     | magic `NODUPENG`  |
//! | 8      | 4     | version (2)       |
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
//! | 128    | 8     | incompatible features (bit mask) |
//! | 136    | 128   | policy parameters (below) |
//! | 264    | 8     | xxh3-64 of bytes 0..264 |
//!
//! The policy-parameter area (offsets from the start of the superblock; relative to the area
//! in `param`):
//!
//! | offset | width | field                                              |
//! |-------:|------:|----------------------------------------------------|
//! | 136    | 8     | memory budget, bytes (0 = unlimited)               |
//! | 144    | 8     | hot-cache entries (0 = the policy's default)       |
//! | 152    | 8     | prefetch-cache bytes (0 = the policy's default)    |
//! | 160    | 4     | cipher id (0 = none, 1 = AES-256: XTS data, CTR metadata) |
//! | 164    | 4     | key derivation (cipher 1: 1 = raw 32-byte key, 2 = argon2id) |
//! | 168    | 4     | argon2id memory, KiB                               |
//! | 172    | 4     | argon2id passes                                    |
//! | 176    | 4     | argon2id lanes                                     |
//! | 180    | 16    | salt (random per image; also separates keystreams) |
//! | 196    | 16    | key check value (`media::crypt`)                   |
//! | 212    | 52    | reserved, zero                                     |
//!
//! Rules of version 2:
//! - **Incompatible features**: a set bit means a build that does not know it would misread the
//!   image, so open refuses every bit outside [`FEATURES_INCOMPAT_KNOWN`] (none yet), naming
//!   the bits. A later change that older builds must not open adds a bit here instead of a
//!   version bump.
//! - **Reserved bytes** are written as zero and refused when they are not: a later format that
//!   gives them a meaning bumps the version or sets an incompatible-feature bit, so an older
//!   build never misreads them.
//! - **Cipher**: 0 = none (then bytes 164..212 are zero too); 1 = encrypted at rest
//!   (`media::crypt`: data blocks AES-256-XTS, metadata AES-256-CTR by position, this block and
//!   the file system's superblock pair in the clear). Other values are refused at open.
//! - **Memory budget** moved from its version-1 place (offset 128) into the parameter area; it
//!   is not kept twice (one place cannot disagree with itself).
//! - The hot-cache and prefetch-cache sizes are not used by any policy yet: formatted as 0, read
//!   as they are. A policy that uses one bounds it against its own limits.
//!
//! Version 1 (frozen: images made before the parameter area still open; offsets in `off_v1`),
//! 144 bytes: bytes 0..128 hold the same fields at the same offsets as version 2 (with
//! version 1), then:
//!
//! | offset | width | field                   |
//! |-------:|------:|-------------------------|
//! | 128    | 8     | memory budget           |
//! | 136    | 8     | xxh3-64 of bytes 0..136 |
//!
//! Upgrade: a version-1 superblock decodes with no features and default parameters (its memory
//! budget, everything else 0), and `version` stays 1 in memory. Open writes nothing; the
//! superblock is written, always in the current layout, only when the engine writes it anyway:
//! when a writable open of a clean image clears the clean flag ([`Engine::begin_use`]), and at
//! every clean shutdown (a dirty image that went through failure recovery). A read-only open
//! leaves a version-1 image byte-identical.
//!
//! [`Engine::begin_use`]: crate::Engine::begin_use

use crate::codec::{le_u32, le_u64, put_u32, put_u64};
use crate::fingerprint::FpKind;
use crate::media::Medium;
use crate::meta::revmap;
use crate::meta::MetaLayoutKind;
use crate::policy::PolicyKind;
use crate::{Error, Result, BLOCK_SIZE};

/// Superblock magic.
pub const MAGIC: [u8; 8] = *b"NODUPENG";
/// On-media version this build writes (and the newest it reads).
pub const VERSION: u32 = 2;
/// Oldest on-media version this build reads (converted to [`VERSION`] by the next store).
pub const MIN_VERSION: u32 = 1;
/// Encoded size (version 2).
pub const SB_SIZE: usize = 272;
/// Encoded size of a version-1 superblock.
pub const SB_SIZE_V1: usize = off_v1::END;
/// Size of the policy-parameter area.
pub const PARAMS_SIZE: usize = param::END;
/// Incompatible-feature bits this build understands (none yet). Open refuses any other bit.
pub const FEATURES_INCOMPAT_KNOWN: u64 = 0;
/// Cipher id of an image that is not encrypted.
pub const CIPHER_NONE: u32 = 0;
/// Cipher id of an image encrypted at rest (`media::crypt`).
pub const CIPHER_AES256: u32 = 1;

/// Byte offsets of the version-2 fields (the first table above).
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
    pub const FEATURES_INCOMPAT: usize = 128;
    /// Start of the policy-parameter area (`PARAMS_SIZE` bytes, laid out in `param`).
    pub const PARAMS: usize = 136;
    /// xxh3-64 of every byte before it.
    pub const CHECKSUM: usize = 264;
}

/// Byte offsets inside the policy-parameter area (the second table above, minus `off::PARAMS`).
mod param {
    pub const MEM_BUDGET: usize = 0;
    pub const HOT_CACHE_ENTRIES: usize = 8;
    pub const PREFETCH_CACHE_BYTES: usize = 16;
    pub const CIPHER: usize = 24;
    pub const KDF: usize = 28;
    pub const KDF_M: usize = 32;
    pub const KDF_T: usize = 36;
    pub const KDF_P: usize = 40;
    pub const SALT: usize = 44;
    pub const CHECK: usize = 60;
    /// Reserved up to `END`: zero.
    pub const RESERVED: usize = 76;
    pub const END: usize = 128;
}

/// Byte offsets of version 1 where it differs from version 2 (frozen; the third table above).
mod off_v1 {
    /// Bytes before this are laid out exactly as in version 2 (`off`).
    pub const HEAD_END: usize = 128;
    pub const MEM_BUDGET: usize = 128;
    /// xxh3-64 of every byte before it.
    pub const CHECKSUM: usize = 136;
    pub const END: usize = 144;
}

// `Superblock::decode` knows the layouts of versions 1 and 2: a new version adds its own.
const _: () = assert!(MIN_VERSION == 1 && VERSION == 2);
const _: () = assert!(off::CLEAN + 4 == off::FEATURES_INCOMPAT);
const _: () = assert!(off::FEATURES_INCOMPAT + 8 == off::PARAMS);
const _: () = assert!(off::PARAMS + PARAMS_SIZE == off::CHECKSUM);
const _: () = assert!(off::CHECKSUM + 8 == SB_SIZE && SB_SIZE <= BLOCK_SIZE);
const _: () = assert!(param::CIPHER + 4 == param::KDF && param::KDF_P + 4 == param::SALT);
const _: () = assert!(param::SALT + 16 == param::CHECK && param::CHECK + 16 == param::RESERVED);
const _: () = assert!(param::RESERVED < param::END);
const _: () = assert!(off_v1::HEAD_END == off::CLEAN + 4);
const _: () = assert!(off_v1::MEM_BUDGET + 8 == off_v1::CHECKSUM);
const _: () = assert!(off_v1::CHECKSUM + 8 == off_v1::END && off_v1::END <= SB_SIZE);

/// Header bytes of the save area before its payload (one block).
pub const SAVE_HEADER_BLOCKS: u64 = 1;
/// Smallest data area accepted at format.
pub const MIN_DATA_BLOCKS: u64 = 16;

/// The policy's own parameters, fixed at format (the parameter area of the table above).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PolicyParams {
    /// Memory budget in bytes for policies that have one (`smart`); 0 = unlimited.
    pub mem_budget: u64,
    /// Entries of the policy's hot fingerprint cache; 0 = the policy's default (none uses it yet).
    pub hot_cache_entries: u64,
    /// Bytes of the policy's prefetch cache; 0 = the policy's default (none uses it yet).
    pub prefetch_cache_bytes: u64,
    /// Cipher: [`CIPHER_NONE`] or [`CIPHER_AES256`].
    pub cipher: u32,
    /// Key derivation of an encrypted image (`None` for a plain one).
    pub kdf: Option<crate::media::crypt::KdfParams>,
    /// Random salt of an encrypted image (zero for a plain one).
    pub salt: [u8; 16],
    /// Key check value of an encrypted image (zero for a plain one).
    pub key_check: [u8; 16],
}

impl PolicyParams {
    /// Encode into the parameter area (reserved bytes zero).
    fn encode(&self) -> [u8; PARAMS_SIZE] {
        let mut a = [0u8; PARAMS_SIZE];
        put_u64(&mut a, param::MEM_BUDGET, self.mem_budget);
        put_u64(&mut a, param::HOT_CACHE_ENTRIES, self.hot_cache_entries);
        put_u64(
            &mut a,
            param::PREFETCH_CACHE_BYTES,
            self.prefetch_cache_bytes,
        );
        put_u32(&mut a, param::CIPHER, self.cipher);
        if let Some(k) = self.kdf {
            put_u32(&mut a, param::KDF, k.kind as u32);
            put_u32(&mut a, param::KDF_M, k.m_kib);
            put_u32(&mut a, param::KDF_T, k.t);
            put_u32(&mut a, param::KDF_P, k.p);
        }
        a[param::SALT..param::SALT + 16].copy_from_slice(&self.salt);
        a[param::CHECK..param::CHECK + 16].copy_from_slice(&self.key_check);
        a
    }

    /// Decode and validate the parameter area `a` (`PARAMS_SIZE` bytes): an unknown cipher
    /// and non-zero reserved bytes are refused.
    fn decode(a: &[u8]) -> Result<PolicyParams> {
        if a.len() != PARAMS_SIZE {
            return Err(Error::Corrupt(
                "engine superblock: policy-parameter area truncated".into(),
            ));
        }
        let cipher = le_u32(a, param::CIPHER);
        let (mut kdf, mut salt, mut key_check) = (None, [0u8; 16], [0u8; 16]);
        match cipher {
            CIPHER_NONE => {
                if a[param::KDF..param::RESERVED].iter().any(|&x| x != 0) {
                    return Err(Error::Corrupt(
                        "engine superblock: key parameters on an image without a cipher".into(),
                    ));
                }
            }
            CIPHER_AES256 => {
                use crate::media::crypt::{KdfKind, KdfParams};
                let kind = KdfKind::from_u32(le_u32(a, param::KDF)).ok_or_else(|| {
                    Error::Corrupt(format!(
                        "engine superblock: unknown key derivation {}",
                        le_u32(a, param::KDF)
                    ))
                })?;
                let k = KdfParams {
                    kind,
                    m_kib: le_u32(a, param::KDF_M),
                    t: le_u32(a, param::KDF_T),
                    p: le_u32(a, param::KDF_P),
                };
                // Bounds argon2 accepts and a mount can afford (at most 4 GiB, 64 passes).
                let sane = match kind {
                    // argon2 needs at least 8 KiB per lane.
                    KdfKind::Argon2id => {
                        (8..=4 << 20).contains(&k.m_kib)
                            && (1..=64).contains(&k.t)
                            && (1..=16).contains(&k.p)
                            && k.m_kib >= 8 * k.p
                    }
                    KdfKind::Raw => k.m_kib == 0 && k.t == 0 && k.p == 0,
                };
                if !sane {
                    return Err(Error::Corrupt(format!(
                        "engine superblock: argon2id parameters m={} KiB t={} p={} out of range",
                        k.m_kib, k.t, k.p
                    )));
                }
                kdf = Some(k);
                salt.copy_from_slice(&a[param::SALT..param::SALT + 16]);
                key_check.copy_from_slice(&a[param::CHECK..param::CHECK + 16]);
            }
            _ => {
                return Err(Error::Unsupported(format!(
                    "image is encrypted with cipher {cipher}, which this build does not support"
                )))
            }
        }
        if a[param::RESERVED..].iter().any(|&x| x != 0) {
            return Err(Error::Corrupt(format!(
                "engine superblock: reserved policy-parameter bytes {}..{} are not zero",
                off::PARAMS + param::RESERVED,
                off::PARAMS + param::END
            )));
        }
        Ok(PolicyParams {
            mem_budget: le_u64(a, param::MEM_BUDGET),
            hot_cache_entries: le_u64(a, param::HOT_CACHE_ENTRIES),
            prefetch_cache_bytes: le_u64(a, param::PREFETCH_CACHE_BYTES),
            cipher,
            kdf,
            salt,
            key_check,
        })
    }
}

/// The bits set in `mask`, as "3, 17".
fn bit_list(mask: u64) -> String {
    (0..64)
        .filter(|i| mask >> i & 1 == 1)
        .map(|i: u32| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The decoded superblock.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// On-media version this superblock was read as (1 or 2; [`VERSION`] for a new one).
    /// [`Superblock::store`] always writes [`VERSION`].
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
    /// Incompatible-feature bits (only bits of [`FEATURES_INCOMPAT_KNOWN`] pass decoding).
    pub features_incompat: u64,
    /// The policy's own parameters.
    pub params: PolicyParams,
}

impl Superblock {
    /// Geometry for a medium of `len` bytes.
    pub fn plan(
        len: u64,
        client_blocks: u64,
        policy: PolicyKind,
        fingerprint: FpKind,
        meta_layout: MetaLayoutKind,
        params: PolicyParams,
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
            features_incompat: 0,
            params,
        })
    }

    /// Encode with checksum, in the current layout: version [`VERSION`] whatever `version`
    /// says (that is how a version-1 superblock is converted).
    pub fn encode(&self) -> [u8; SB_SIZE] {
        let mut b = [0u8; SB_SIZE];
        b[off::MAGIC..off::MAGIC + 8].copy_from_slice(&MAGIC);
        put_u32(&mut b, off::VERSION, VERSION);
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
            (off::FEATURES_INCOMPAT, self.features_incompat),
        ] {
            put_u64(&mut b, o, v);
        }
        put_u32(&mut b, off::POLICY, self.policy as u32);
        put_u32(&mut b, off::FINGERPRINT, self.fingerprint as u32);
        put_u32(&mut b, off::META_LAYOUT, self.meta_layout as u32);
        put_u32(&mut b, off::CLEAN, self.clean as u32);
        b[off::PARAMS..off::CHECKSUM].copy_from_slice(&self.params.encode());
        let sum = xxhash_rust::xxh3::xxh3_64(&b[..off::CHECKSUM]);
        put_u64(&mut b, off::CHECKSUM, sum);
        b
    }

    /// Decode and validate against a medium of `len` bytes. Reads version 2 and version 1 (see
    /// the module documentation); `b` needs the encoded size of its version.
    pub fn decode(b: &[u8], len: u64) -> Result<Superblock> {
        if b.len() < off::VERSION + 4 || b[off::MAGIC..off::MAGIC + 8] != MAGIC {
            return Err(Error::NotNodup("bad engine superblock magic".into()));
        }
        let corrupt = |m: &str| Error::Corrupt(format!("engine superblock: {m}"));
        let version = le_u32(b, off::VERSION);
        // Where the checksum is depends on the version, so the version is checked first.
        let sum_at = match version {
            2 => off::CHECKSUM,
            1 => off_v1::CHECKSUM,
            v if v > VERSION => {
                return Err(Error::Version {
                    found: v,
                    supported: VERSION,
                })
            }
            v => {
                return Err(Error::Corrupt(format!(
                    "engine superblock version {v} is unknown"
                )))
            }
        };
        if b.len() < sum_at + 8 {
            return Err(corrupt("truncated"));
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&b[..sum_at]);
        if sum != le_u64(b, sum_at) {
            return Err(Error::Corrupt("engine superblock checksum mismatch".into()));
        }
        let (features_incompat, params) = if version == 1 {
            let params = PolicyParams {
                mem_budget: le_u64(b, off_v1::MEM_BUDGET),
                ..PolicyParams::default()
            };
            (0, params)
        } else {
            let features = le_u64(b, off::FEATURES_INCOMPAT);
            let unknown = features & !FEATURES_INCOMPAT_KNOWN;
            if unknown != 0 {
                return Err(Error::Unsupported(format!(
                    "image uses incompatible engine features this build does not support: \
                     bit(s) {} (mask {unknown:#x}); upgrade nodup",
                    bit_list(unknown)
                )));
            }
            (
                features,
                PolicyParams::decode(&b[off::PARAMS..off::CHECKSUM])?,
            )
        };
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
            features_incompat,
            params,
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
        // Every area inside the image before anything uses one (the encrypted media take the
        // client area's offset before the geometry is checked against the plan).
        for (name, start, blocks) in [
            ("client", sb.client_start, sb.client_blocks),
            ("reverse map", sb.revmap_start, sb.revmap_blocks),
            ("layout", sb.layout_start, sb.layout_blocks),
            ("save", sb.save_start, sb.save_blocks),
            ("data", sb.data_start, sb.data_blocks),
        ] {
            if start
                .checked_add(blocks)
                .is_none_or(|end| end > sb.total_blocks)
            {
                return Err(corrupt(&format!("the {name} area ends past the image")));
            }
        }
        Ok(sb)
    }

    /// Check that the areas follow each other exactly as `plan` lays them out: every field
    /// must match `expected` but the clean flag, the version read and the feature bits.
    pub fn check_geometry(&self, expected: &Superblock) -> Result<()> {
        let mut e = *expected;
        e.clean = self.clean;
        e.version = self.version;
        e.features_incompat = self.features_incompat;
        if e != *self {
            return Err(Error::Corrupt(
                "engine superblock geometry is inconsistent".into(),
            ));
        }
        Ok(())
    }

    /// Write to block 0 in the current layout and make it durable; `version` becomes
    /// [`VERSION`] (a version-1 superblock is converted here).
    pub fn store(&mut self, m: &dyn Medium) -> Result<()> {
        m.write(0, &self.encode())?;
        m.flush(0, SB_SIZE as u64);
        m.fence()?;
        self.version = VERSION;
        Ok(())
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
mod tests;
