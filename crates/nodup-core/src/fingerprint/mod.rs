//! Block fingerprints behind one trait, chosen at mkfs time and recorded in the superblock.

use serde::{Deserialize, Serialize};

crate::named_enum! {
    /// The fingerprint functions nodup knows; the numeric value is stored on the medium.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[repr(u32)]
    pub enum FpKind {
        /// xxh3-64, the default (non-cryptographic, verified byte by byte).
        Xxh3 = 1 => "xxh3",
        /// CRC-32C (hardware accelerated where available).
        Crc32c = 2 => "crc32c",
        /// SECDED Hamming (72,64) check bytes XOR-folded over the block (FSDedup's "ECC as fingerprint").
        Ecc = 3 => "ecc",
        /// SHA-256 truncated to 64 bits for the index; trusted without comparison by the `strong` policy.
        Sha256 = 4 => "sha256",
        /// BLAKE3 truncated to 64 bits for the index.
        Blake3 = 5 => "blake3",
        /// Test-only: a fingerprint with very few distinct values, to force collisions.
        TestCollide = 99 => "test-collide",
    }
}

/// A block fingerprint function. Fingerprints are 64-bit; shorter codes are zero-extended,
/// longer digests are truncated (the full digest is never needed: a match is either verified
/// byte by byte or, for the `strong` policy, trusted because the function is cryptographic).
pub trait Fingerprinter: Send + Sync {
    /// Which function this is.
    fn kind(&self) -> FpKind;
    /// Fingerprint of one 4 KiB block.
    fn fingerprint(&self, block: &[u8]) -> u64;
    /// Fingerprint of `block` while copying it to `dst` with non-temporal stores (functions
    /// that can do both in one pass over the data override this; the default copies, then
    /// fingerprints).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `block.len()` bytes, not overlap `block`, and be
    /// 64-byte aligned; `block.len()` must be a multiple of 64.
    unsafe fn fingerprint_stream(&self, block: &[u8], dst: *mut u8) -> u64 {
        // SAFETY: forwarded from the caller.
        unsafe { stream_or_copy(block, dst) };
        self.fingerprint(block)
    }
    /// Fingerprint of `block` while copying it to `dst` with ordinary stores, which the caller
    /// then flushes (one pass over the data where the function can; else copy, then hash).
    ///
    /// # Safety
    /// As [`Fingerprinter::fingerprint_stream`].
    unsafe fn fingerprint_copy(&self, block: &[u8], dst: *mut u8) -> u64 {
        // SAFETY: forwarded from the caller.
        unsafe { std::ptr::copy_nonoverlapping(block.as_ptr(), dst, block.len()) };
        self.fingerprint(block)
    }
    /// Fingerprint of `block` while copying it into a [`Medium::fill_with`] destination, with
    /// the store kind the medium asked for.
    ///
    /// # Safety
    /// As [`Fingerprinter::fingerprint_stream`], for `dst.ptr`.
    ///
    /// [`Medium::fill_with`]: crate::media::Medium::fill_with
    unsafe fn fingerprint_into(&self, block: &[u8], dst: crate::media::FillDst) -> u64 {
        // SAFETY: forwarded from the caller.
        unsafe {
            if dst.streaming {
                self.fingerprint_stream(block, dst.ptr)
            } else {
                self.fingerprint_copy(block, dst.ptr)
            }
        }
    }
}

/// xxh3-64 with seed 0, the default fingerprint (AVX2 inner loop chosen at run time, see
/// [`xxh3_avx2`]; bit-identical to `xxhash_rust::xxh3::xxh3_64`).
pub struct Xxh3;

impl Fingerprinter for Xxh3 {
    fn kind(&self) -> FpKind {
        FpKind::Xxh3
    }
    fn fingerprint(&self, block: &[u8]) -> u64 {
        xxh3_avx2::xxh3_64(block)
    }
    unsafe fn fingerprint_stream(&self, block: &[u8], dst: *mut u8) -> u64 {
        // SAFETY: forwarded from the caller.
        unsafe { xxh3_avx2::xxh3_64_stream(block, dst) }
    }
    unsafe fn fingerprint_copy(&self, block: &[u8], dst: *mut u8) -> u64 {
        // SAFETY: forwarded from the caller.
        unsafe { xxh3_avx2::xxh3_64_copy(block, dst) }
    }
}

/// Non-temporal copy where the architecture has it, plain copy elsewhere.
///
/// # Safety
/// As [`Fingerprinter::fingerprint_stream`].
pub(crate) unsafe fn stream_or_copy(block: &[u8], dst: *mut u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller (64-byte alignment implies the 16 the copy needs).
    unsafe {
        crate::media::stream_copy(block, dst)
    };
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded from the caller.
    unsafe {
        std::ptr::copy_nonoverlapping(block.as_ptr(), dst, block.len())
    };
}

pub mod crc32c;
pub mod crypto;
pub mod ecc;
pub mod test_collide;
pub mod xxh3_avx2;

pub use self::crc32c::Crc32c;
pub use self::crypto::{Blake3, Sha256};
pub use self::ecc::Ecc;
pub use self::test_collide::TestCollide;

/// The fingerprinter for `kind`.
pub fn fingerprinter(kind: FpKind) -> Box<dyn Fingerprinter> {
    match kind {
        FpKind::Xxh3 => Box::new(Xxh3),
        FpKind::Crc32c => Box::new(Crc32c),
        FpKind::Ecc => Box::new(Ecc),
        FpKind::Sha256 => Box::new(Sha256),
        FpKind::Blake3 => Box::new(Blake3),
        FpKind::TestCollide => Box::new(TestCollide),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xxh3_known_vector() {
        // XXH3_64bits("") with seed 0.
        assert_eq!(Xxh3.fingerprint(b""), 0x2D06_8005_38D3_94C2);
    }

    #[test]
    fn every_kind_is_wired_and_round_trips_its_name() {
        let block: Vec<u8> = (0..4096u32).map(|i| (i * 31 + 7) as u8).collect();
        let mut other = block.clone();
        other[4095] ^= 1;
        for kind in [
            FpKind::Xxh3,
            FpKind::Crc32c,
            FpKind::Ecc,
            FpKind::Sha256,
            FpKind::Blake3,
            FpKind::TestCollide,
        ] {
            let f = fingerprinter(kind);
            assert_eq!(f.kind(), kind);
            assert_eq!(FpKind::from_name(kind.name()), Some(kind));
            assert_eq!(FpKind::from_u32(kind as u32), Some(kind));
            assert_eq!(f.fingerprint(&block), f.fingerprint(&block.clone()));
            if kind != FpKind::TestCollide {
                assert_ne!(
                    f.fingerprint(&block),
                    f.fingerprint(&other),
                    "{}",
                    kind.name()
                );
            }
        }
        assert_eq!(FpKind::from_name("md5"), None);
        assert_eq!(FpKind::from_u32(0), None);
    }
}
