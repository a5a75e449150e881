//! Digest -> deterministic bytes: equal digests give equal bytes, different digests different bytes.
//!
//! The unit of synthesis is the 512 B sector. A sector's content is identified by a digest and a
//! `kind`: part 0..7 of a 4 KiB digest, or a whole 512 B digest. A 4 KiB digest therefore gives the
//! eight parts concatenated, and eight 512 B digests compose a 4 KiB block, so two blocks that
//! share some but not all 512 B digests share exactly those sectors, as in the original data.
//!
//! Sector layout (512 B):
//!   [0..16)   the digest
//!   [16]      kind (1..=8: part of a 4 KiB digest, 9: 512 B digest)
//!   [17..24)  b"nodupTR" marker
//!   [24..512) splitmix64 stream seeded by (digest, kind)
//! Embedding the digest and kind makes distinct (digest, kind) pairs distinct by construction; the
//! pseudo-random tail keeps the data incompressible like real data.

use crate::record::{Digest, DigestUnit, Record, SECTORS_PER_BLOCK, SECTOR_BYTES};

/// Kind value of a never-written sector: all zeros, as a hole in a sparse file reads.
pub const KIND_ZERO: u8 = 0;
/// Kind value of a sector covered by a 512 B digest.
pub const KIND_SECTOR: u8 = 9;

const MARKER: &[u8; 7] = b"nodupTR";

/// Identity of one 512 B sector's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SectorContent {
    /// The trace digest (all zeros for `KIND_ZERO`).
    pub digest: Digest,
    /// 0 = zeros, 1..=8 = part (kind-1) of a 4 KiB digest, 9 = 512 B digest.
    pub kind: u8,
}

impl SectorContent {
    /// A never-written sector (zeros).
    pub const ZERO: SectorContent = SectorContent {
        digest: [0; 16],
        kind: KIND_ZERO,
    };

    /// Part `part` (0..8) of the 4 KiB content of `digest`.
    pub fn block_part(digest: Digest, part: u8) -> Self {
        debug_assert!(part < 8);
        SectorContent {
            digest,
            kind: part + 1,
        }
    }

    /// The 512 B content of a sector digest.
    pub fn sector(digest: Digest) -> Self {
        SectorContent {
            digest,
            kind: KIND_SECTOR,
        }
    }

    /// Whether this is a never-written (zero) sector.
    pub fn is_zero(&self) -> bool {
        self.kind == KIND_ZERO
    }

    /// Write the 512 bytes of this sector into `out` (which must be 512 bytes long).
    pub fn fill(&self, out: &mut [u8]) {
        debug_assert_eq!(out.len() as u64, SECTOR_BYTES);
        if self.is_zero() {
            out.fill(0);
            return;
        }
        out[..16].copy_from_slice(&self.digest);
        out[16] = self.kind;
        out[17..24].copy_from_slice(MARKER);
        let lo = u64::from_le_bytes(self.digest[..8].try_into().unwrap_or_default());
        let hi = u64::from_le_bytes(self.digest[8..].try_into().unwrap_or_default());
        let mut state =
            lo ^ hi.rotate_left(29) ^ (self.kind as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        // 488 bytes = 61 whole words; exact chunks let the copy compile to plain stores.
        for chunk in out[24..].chunks_exact_mut(8) {
            chunk.copy_from_slice(&splitmix64(&mut state).to_le_bytes());
        }
    }
}

/// One step of splitmix64: a tiny, fast, well-mixed generator (Steele, Lea, Flood 2014).
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fill `out` (a multiple of 512 bytes) with the given sectors' contents, one per 512 B.
pub fn fill_sectors(sectors: &[SectorContent], out: &mut [u8]) {
    for (sc, chunk) in sectors.iter().zip(out.chunks_mut(SECTOR_BYTES as usize)) {
        sc.fill(chunk);
    }
}

// The record knows its digests; what a sector's bytes are is this module's concern, so the
// method lives here and `record` does not depend on `content`.
impl Record {
    /// Content of the `i`-th sector of the request (0-based, relative to `lba`).
    ///
    /// A 4 KiB digest covers the 8 sectors that follow the start of its 4 KiB piece of the request,
    /// so sector `i` is part `i % 8` of digest `i / 8`.
    pub fn sector_content(&self, i: u32) -> SectorContent {
        match self.unit {
            DigestUnit::Block => SectorContent::block_part(
                self.digests[(i / SECTORS_PER_BLOCK as u32) as usize],
                (i % SECTORS_PER_BLOCK as u32) as u8,
            ),
            DigestUnit::Sector => SectorContent::sector(self.digests[i as usize]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(x: u8) -> Digest {
        let mut a = [0u8; 16];
        a[0] = x;
        a[15] = x.wrapping_mul(7);
        a
    }

    fn bytes(sc: SectorContent) -> Vec<u8> {
        let mut v = vec![0xAA; 512];
        sc.fill(&mut v);
        v
    }

    #[test]
    fn equal_digests_give_equal_bytes() {
        assert_eq!(
            bytes(SectorContent::sector(d(1))),
            bytes(SectorContent::sector(d(1)))
        );
        assert_eq!(
            bytes(SectorContent::block_part(d(1), 3)),
            bytes(SectorContent::block_part(d(1), 3))
        );
    }

    #[test]
    fn different_identities_give_different_bytes() {
        let mut all = Vec::new();
        for x in 0..20u8 {
            all.push(bytes(SectorContent::sector(d(x))));
            for p in 0..8 {
                all.push(bytes(SectorContent::block_part(d(x), p)));
            }
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
    }

    #[test]
    fn zero_is_zeros_and_tail_is_not_constant() {
        assert!(bytes(SectorContent::ZERO).iter().all(|&b| b == 0));
        let b = bytes(SectorContent::sector(d(5)));
        let distinct: std::collections::HashSet<u8> = b[24..].iter().copied().collect();
        assert!(
            distinct.len() > 100,
            "tail looks degenerate: {} distinct bytes",
            distinct.len()
        );
    }

    #[test]
    fn sector_digests_compose_blocks_with_partial_sharing() {
        // Two blocks sharing 6 of 8 sector digests share exactly those 6 sectors.
        let a: Vec<_> = (0..8).map(|i| SectorContent::sector(d(i))).collect();
        let mut b = a.clone();
        b[2] = SectorContent::sector(d(100));
        b[7] = SectorContent::sector(d(101));
        let (mut ba, mut bb) = (vec![0u8; 4096], vec![0u8; 4096]);
        fill_sectors(&a, &mut ba);
        fill_sectors(&b, &mut bb);
        for s in 0..8 {
            let same = ba[s * 512..(s + 1) * 512] == bb[s * 512..(s + 1) * 512];
            assert_eq!(same, s != 2 && s != 7, "sector {s}");
        }
    }
}
