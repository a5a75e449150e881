//! XTS-AES-256 of one data block fused on AES-NI: the tweak doubling, both whitening XORs and
//! the 14 AES rounds of 8 interleaved units run in registers (the round keys are read from L1),
//! with no pass through memory in between.
//!
//! Why by hand: the `aes` crate encrypts batches of blocks, so XTS around it is three passes
//! through memory (whiten, encrypt, whiten), and on this project's hosts the two whitening
//! passes cost nearly as much as AES itself (4 KiB blocks: 3.8 GB/s against 7.0 GB/s for bare
//! AES; fused, 6.1 GB/s). The result is checked unit for unit against the portable path
//! (`crypt.rs`, the `aes` crate) and, through it, against the `xts-mode` crate.

use std::arch::x86_64::*;

/// Round keys of one AES-256 key for the fused XTS (present only where the CPU has AES-NI).
pub(super) struct NiXts {
    /// Encryption round keys 0..=14.
    enc: [__m128i; 15],
    /// Decryption round keys (equivalent inverse cipher: reversed, InvMixColumns on 1..=13).
    dec: [__m128i; 15],
}

/// Units per interleaved group: enough independent AES chains to fill AES-NI's pipeline.
const LANES: usize = 8;

impl NiXts {
    /// The round keys of `key`, or None when this CPU lacks AES-NI.
    pub(super) fn new(key: &[u8; 32]) -> Option<NiXts> {
        if !std::arch::is_x86_feature_detected!("aes") {
            return None;
        }
        // SAFETY: AES-NI is present (checked above); SSE2 is part of x86_64.
        Some(unsafe { expand(key) })
    }

    /// XTS of the units of `src` (a multiple of 128 bytes) into `dst` (same length), the first
    /// unit whitened with `tweak` (the encrypted block number) and each next one with it
    /// doubled in GF(2^128).
    pub(super) fn xts(&self, tweak: [u8; 16], src: &[u8], dst: &mut [u8], encrypt: bool) {
        assert!(src.len() == dst.len() && src.len().is_multiple_of(16 * LANES));
        // SAFETY: `new` returned Some only where AES-NI is present; lengths checked above.
        unsafe { xts_fused(self, tweak, src, dst, encrypt) }
    }
}

/// Each 32-bit lane of `k` XORed with every lane below it (the key schedule's running XOR).
#[inline(always)]
unsafe fn prefix_xor(k: __m128i) -> __m128i {
    let k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    let k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    _mm_xor_si128(k, _mm_slli_si128(k, 4))
}

/// FIPS-197 key expansion of AES-256, with AESKEYGENASSIST for SubWord/RotWord.
#[target_feature(enable = "aes")]
unsafe fn expand(key: &[u8; 32]) -> NiXts {
    let mut rk = [_mm_setzero_si128(); 15];
    let mut a = _mm_loadu_si128(key.as_ptr() as *const __m128i);
    let mut b = _mm_loadu_si128(key.as_ptr().add(16) as *const __m128i);
    rk[0] = a;
    rk[1] = b;
    // The round constant must be an immediate, hence one expansion per step: each step makes
    // the next even round key from the last odd one, and the odd one after it (SubWord
    // without rotation or constant) from that; the last step needs only its even key.
    macro_rules! even {
        ($i:expr, $rcon:expr) => {
            let t = _mm_shuffle_epi32(_mm_aeskeygenassist_si128(b, $rcon), 0xff);
            a = _mm_xor_si128(prefix_xor(a), t);
            rk[2 * $i] = a;
        };
    }
    macro_rules! step {
        ($i:expr, $rcon:expr) => {
            even!($i, $rcon);
            let t = _mm_shuffle_epi32(_mm_aeskeygenassist_si128(a, 0), 0xaa);
            b = _mm_xor_si128(prefix_xor(b), t);
            rk[2 * $i + 1] = b;
        };
    }
    step!(1, 0x01);
    step!(2, 0x02);
    step!(3, 0x04);
    step!(4, 0x08);
    step!(5, 0x10);
    step!(6, 0x20);
    even!(7, 0x40);
    let mut dk = [_mm_setzero_si128(); 15];
    dk[0] = rk[14];
    for i in 1..14 {
        dk[i] = _mm_aesimc_si128(rk[14 - i]);
    }
    dk[14] = rk[0];
    NiXts { enc: rk, dec: dk }
}

/// The tweak times the primitive element of GF(2^128) (IEEE 1619): each 64-bit half shifted
/// left, the low half's top bit carried into the high half, the high half's reduced by 0x87.
#[inline(always)]
unsafe fn double(t: __m128i) -> __m128i {
    let carries = _mm_shuffle_epi32(_mm_srai_epi32(t, 31), 0x13);
    _mm_xor_si128(
        _mm_add_epi64(t, t),
        _mm_and_si128(carries, _mm_set_epi32(0, 1, 0, 0x87)),
    )
}

#[target_feature(enable = "aes")]
unsafe fn xts_fused(k: &NiXts, tweak: [u8; 16], src: &[u8], dst: &mut [u8], encrypt: bool) {
    let rk = if encrypt { &k.enc } else { &k.dec };
    let mut tw = _mm_loadu_si128(tweak.as_ptr() as *const __m128i);
    let s = src.as_ptr() as *const __m128i;
    let d = dst.as_mut_ptr() as *mut __m128i;
    for g in (0..src.len() / 16).step_by(LANES) {
        let mut t = [_mm_setzero_si128(); LANES];
        let mut b = [_mm_setzero_si128(); LANES];
        for j in 0..LANES {
            t[j] = tw;
            tw = double(tw);
            b[j] = _mm_xor_si128(_mm_xor_si128(_mm_loadu_si128(s.add(g + j)), t[j]), rk[0]);
        }
        if encrypt {
            for r in &rk[1..14] {
                for x in &mut b {
                    *x = _mm_aesenc_si128(*x, *r);
                }
            }
            for x in &mut b {
                *x = _mm_aesenclast_si128(*x, rk[14]);
            }
        } else {
            for r in &rk[1..14] {
                for x in &mut b {
                    *x = _mm_aesdec_si128(*x, *r);
                }
            }
            for x in &mut b {
                *x = _mm_aesdeclast_si128(*x, rk[14]);
            }
        }
        for j in 0..LANES {
            _mm_storeu_si128(d.add(g + j), _mm_xor_si128(b[j], t[j]));
        }
    }
}
