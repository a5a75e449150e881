//! Cryptographic fingerprints truncated to 64 bits for the DRAM index: SHA-256 and BLAKE3.
//!
//! Truncation: the first 8 bytes of the digest, read little-endian. The `strong` policy trusts
//! a match of these functions without comparing bytes (the NV-Dedup / Dedup_SHA1 role).

use super::{Fingerprinter, FpKind};
use sha2::{Digest, Sha256 as Sha256Hasher};

fn first_u64(d: &[u8]) -> u64 {
    u64::from_le_bytes(d[..8].try_into().expect("digest has at least 8 bytes"))
}

/// SHA-256, first 64 bits.
pub struct Sha256;

impl Fingerprinter for Sha256 {
    fn kind(&self) -> FpKind {
        FpKind::Sha256
    }
    fn fingerprint(&self, block: &[u8]) -> u64 {
        first_u64(&Sha256Hasher::digest(block))
    }
}

/// BLAKE3, first 64 bits.
pub struct Blake3;

impl Fingerprinter for Blake3 {
    fn kind(&self) -> FpKind {
        FpKind::Blake3
    }
    fn fingerprint(&self, block: &[u8]) -> u64 {
        first_u64(blake3::hash(block).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_known_vectors() {
        // FIPS 180-2: SHA-256("abc") = ba7816bf 8f01cfea ...
        assert_eq!(
            Sha256.fingerprint(b"abc"),
            u64::from_le_bytes([0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea])
        );
        // SHA-256("") = e3b0c442 98fc1c14 ...
        assert_eq!(
            Sha256.fingerprint(b""),
            u64::from_le_bytes([0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14])
        );
    }

    #[test]
    fn blake3_known_vectors() {
        // BLAKE3("") = af1349b9 f5f9a1a6 ...
        assert_eq!(
            Blake3.fingerprint(b""),
            u64::from_le_bytes([0xaf, 0x13, 0x49, 0xb9, 0xf5, 0xf9, 0xa1, 0xa6])
        );
        // BLAKE3("abc") = 6437b3ac 38465133 ...
        assert_eq!(
            Blake3.fingerprint(b"abc"),
            u64::from_le_bytes([0x64, 0x37, 0xb3, 0xac, 0x38, 0x46, 0x51, 0x33])
        );
    }
}
