//! XXH3-64 (seed 0, default secret) for long inputs with an AVX2 inner loop chosen at run time.
//!
//! The `xxhash-rust` crate picks its SIMD width at *compile* time (`cfg(target_feature)`), so a
//! portable build runs the SSE2 loop even on AVX2 machines, about half as fast on 4 KiB blocks.
//! This module implements the same long-input algorithm (XXH3 spec: stripes of 64 bytes,
//! accumulate with the secret, scramble every 1024 bytes, merge) with the accumulate and
//! scramble steps in AVX2 intrinsics, and [`xxh3_64`] dispatches to it when the CPU has AVX2
//! and the input is longer than 240 bytes; everything else goes to the crate. Results are
//! bit-identical to `xxhash_rust::xxh3::xxh3_64` (tested on many lengths and contents).

/// XXH3's default 192-byte secret (`kSecret` of the reference implementation).
const SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

const STRIPE_LEN: usize = 64;
const SECRET_CONSUME_RATE: usize = 8;
const STRIPES_PER_BLOCK: usize = (SECRET.len() - STRIPE_LEN) / SECRET_CONSUME_RATE; // 16
const BLOCK_LEN: usize = STRIPE_LEN * STRIPES_PER_BLOCK; // 1024
const SECRET_LASTACC_START: usize = 7;
const SECRET_MERGEACCS_START: usize = 11;
/// Inputs up to this length use XXH3's short-input paths (left to the crate).
const MID_SIZE_MAX: usize = 240;

/// XXH3-64 of `input` with seed 0: the AVX2 long-input loop when available, else the crate.
#[inline]
pub fn xxh3_64(input: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if input.len() > MID_SIZE_MAX && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available (checked just above).
        return unsafe { long_avx2(input) };
    }
    xxhash_rust::xxh3::xxh3_64(input)
}

/// XXH3-64 of `input` while copying it to `dst` with non-temporal stores in the same pass
/// (each stripe is loaded once, hashed and streamed out), so a new block is read from memory
/// once instead of once for the hash and once more for the copy.
///
/// # Safety
/// `dst` must be valid for writes of `input.len()` bytes, not overlap `input`, and be 64-byte
/// aligned; `input.len()` must be a multiple of 64.
#[inline]
pub unsafe fn xxh3_64_stream(input: &[u8], dst: *mut u8) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if input.len() > MID_SIZE_MAX && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available; the caller vouches for `dst`.
        return unsafe { long_avx2_impl::<STREAM>(input, dst) };
    }
    // SAFETY: the caller vouches for `dst`.
    unsafe { super::stream_or_copy(input, dst) };
    xxhash_rust::xxh3::xxh3_64(input)
}

/// XXH3-64 of `input` while copying it to `dst` with ordinary (cached) stores in the same
/// pass, so the block is loaded once for both; the caller flushes `dst` afterwards.
///
/// # Safety
/// As [`xxh3_64_stream`].
#[inline]
pub unsafe fn xxh3_64_copy(input: &[u8], dst: *mut u8) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if input.len() > MID_SIZE_MAX && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available; the caller vouches for `dst`.
        return unsafe { long_avx2_impl::<STORE>(input, dst) };
    }
    // SAFETY: the caller vouches for `dst`.
    unsafe { std::ptr::copy_nonoverlapping(input.as_ptr(), dst, input.len()) };
    xxhash_rust::xxh3::xxh3_64(input)
}

/// Copy modes of the long-input loop: hash only, also stream the input out, also store it.
const NO_COPY: u8 = 0;
const STREAM: u8 = 1;
const STORE: u8 = 2;

#[inline(always)]
fn read64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

fn avalanche(mut h: u64) -> u64 {
    h ^= h >> 37;
    h = h.wrapping_mul(0x1656_6791_9E37_79F9);
    h ^ (h >> 32)
}

fn mul128_fold64(a: u64, b: u64) -> u64 {
    let p = a as u128 * b as u128;
    (p as u64) ^ ((p >> 64) as u64)
}

fn merge_accs(acc: &[u64; 8], len: usize) -> u64 {
    let s = SECRET_MERGEACCS_START;
    let mut r = (len as u64).wrapping_mul(PRIME64_1);
    for i in 0..4 {
        r = r.wrapping_add(mul128_fold64(
            acc[2 * i] ^ read64(&SECRET, s + 16 * i),
            acc[2 * i + 1] ^ read64(&SECRET, s + 16 * i + 8),
        ));
    }
    avalanche(r)
}

const INITIAL_ACC: [u64; 8] = [
    PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1,
];

/// Scalar reference of the long-input loop (used by tests to check the AVX2 one step by step).
#[cfg(test)]
fn long_scalar(input: &[u8]) -> u64 {
    fn accumulate_512(acc: &mut [u64; 8], stripe: &[u8], secret_off: usize) {
        for i in 0..8 {
            let v = read64(stripe, 8 * i);
            let k = v ^ read64(&SECRET, secret_off + 8 * i);
            acc[i ^ 1] = acc[i ^ 1].wrapping_add(v);
            acc[i] = acc[i].wrapping_add((k & 0xFFFF_FFFF).wrapping_mul(k >> 32));
        }
    }
    fn scramble(acc: &mut [u64; 8]) {
        let off = SECRET.len() - STRIPE_LEN;
        for (i, a) in acc.iter_mut().enumerate() {
            *a ^= *a >> 47;
            *a ^= read64(&SECRET, off + 8 * i);
            *a = a.wrapping_mul(PRIME32_1);
        }
    }
    let mut acc = INITIAL_ACC;
    let nb_blocks = (input.len() - 1) / BLOCK_LEN;
    for b in 0..nb_blocks {
        for s in 0..STRIPES_PER_BLOCK {
            let o = b * BLOCK_LEN + s * STRIPE_LEN;
            accumulate_512(&mut acc, &input[o..o + STRIPE_LEN], s * SECRET_CONSUME_RATE);
        }
        scramble(&mut acc);
    }
    let nb_stripes = ((input.len() - 1) - BLOCK_LEN * nb_blocks) / STRIPE_LEN;
    for s in 0..nb_stripes {
        let o = nb_blocks * BLOCK_LEN + s * STRIPE_LEN;
        accumulate_512(&mut acc, &input[o..o + STRIPE_LEN], s * SECRET_CONSUME_RATE);
    }
    let last = input.len() - STRIPE_LEN;
    accumulate_512(
        &mut acc,
        &input[last..],
        SECRET.len() - STRIPE_LEN - SECRET_LASTACC_START,
    );
    merge_accs(&acc, input.len())
}

/// The long-input loop with AVX2 accumulate/scramble.
///
/// # Safety
/// The CPU must support AVX2; `input.len() > 240`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn long_avx2(input: &[u8]) -> u64 {
    long_avx2_impl::<NO_COPY>(input, std::ptr::null_mut())
}

/// The long-input loop; with `COPY` = `STREAM` or `STORE`, every stripe is also written to
/// `dst` at its offset, with non-temporal or ordinary stores (the stripes cover the whole input;
/// the last one, at `len - 64`, rewrites bytes of its predecessors unless `len` is a multiple
/// of 64).
///
/// # Safety
/// The CPU must support AVX2; `input.len() > 240`; unless `COPY` = `NO_COPY`, `dst` is valid
/// for writes of `input.len()` bytes, does not overlap `input`, is 64-byte aligned, and
/// `input.len()` is a multiple of 64.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn long_avx2_impl<const COPY: u8>(input: &[u8], dst: *mut u8) -> u64 {
    use core::arch::x86_64::*;

    debug_assert!(input.len() > MID_SIZE_MAX);
    let sp = SECRET.as_ptr();
    let ip = input.as_ptr();
    let mut acc = [
        _mm256_loadu_si256(INITIAL_ACC.as_ptr().cast()),
        _mm256_loadu_si256(INITIAL_ACC.as_ptr().add(4).cast()),
    ];

    // One 64-byte stripe at `stripe` with the secret at `secret`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn accumulate<const COPY: u8>(
        acc: &mut [__m256i; 2],
        stripe: *const u8,
        secret: *const u8,
        out: *mut u8,
    ) {
        for (j, a) in acc.iter_mut().enumerate() {
            let data = _mm256_loadu_si256(stripe.add(32 * j).cast());
            if COPY == STREAM {
                _mm256_stream_si256(out.add(32 * j).cast(), data);
            } else if COPY == STORE {
                _mm256_store_si256(out.add(32 * j).cast(), data);
            }
            let key = _mm256_loadu_si256(secret.add(32 * j).cast());
            let dk = _mm256_xor_si256(data, key);
            // (dk & 0xffffffff) * (dk >> 32) per 64-bit lane.
            let dk_hi = _mm256_shuffle_epi32::<0x31>(dk);
            let product = _mm256_mul_epu32(dk, dk_hi);
            // acc[i ^ 1] += data: swap the 64-bit halves of each 128-bit lane.
            let swapped = _mm256_shuffle_epi32::<0x4E>(data);
            *a = _mm256_add_epi64(_mm256_add_epi64(*a, swapped), product);
        }
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn scramble(acc: &mut [__m256i; 2], secret: *const u8) {
        let prime = _mm256_set1_epi32(PRIME32_1 as i32);
        for (j, a) in acc.iter_mut().enumerate() {
            let key = _mm256_loadu_si256(secret.add(32 * j).cast());
            let x = _mm256_xor_si256(_mm256_xor_si256(*a, _mm256_srli_epi64::<47>(*a)), key);
            // x * PRIME32_1 (64 x 32 bits): lo * p + (hi * p) << 32.
            let lo = _mm256_mul_epu32(x, prime);
            let hi = _mm256_mul_epu32(_mm256_shuffle_epi32::<0x31>(x), prime);
            *a = _mm256_add_epi64(lo, _mm256_slli_epi64::<32>(hi));
        }
    }

    let nb_blocks = (input.len() - 1) / BLOCK_LEN;
    for b in 0..nb_blocks {
        for s in 0..STRIPES_PER_BLOCK {
            let o = b * BLOCK_LEN + s * STRIPE_LEN;
            accumulate::<COPY>(
                &mut acc,
                ip.add(o),
                sp.add(s * SECRET_CONSUME_RATE),
                dst.wrapping_add(o),
            );
        }
        scramble(&mut acc, sp.add(SECRET.len() - STRIPE_LEN));
    }
    let nb_stripes = ((input.len() - 1) - BLOCK_LEN * nb_blocks) / STRIPE_LEN;
    for s in 0..nb_stripes {
        let o = nb_blocks * BLOCK_LEN + s * STRIPE_LEN;
        accumulate::<COPY>(
            &mut acc,
            ip.add(o),
            sp.add(s * SECRET_CONSUME_RATE),
            dst.wrapping_add(o),
        );
    }
    let o = input.len() - STRIPE_LEN;
    accumulate::<COPY>(
        &mut acc,
        ip.add(o),
        sp.add(SECRET.len() - STRIPE_LEN - SECRET_LASTACC_START),
        dst.wrapping_add(o),
    );
    let mut out = [0u64; 8];
    _mm256_storeu_si256(out.as_mut_ptr().cast(), acc[0]);
    _mm256_storeu_si256(out.as_mut_ptr().add(4).cast(), acc[1]);
    merge_accs(&out, input.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn matches_the_crate_on_many_lengths() {
        let seed = 0x3A3;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut buf = vec![0u8; 9000];
        rng.fill(&mut buf[..]);
        let random: Vec<usize> = (0..50).map(|_| rng.gen_range(241..9000)).collect();
        let lens = (0..300)
            .chain([
                511, 512, 513, 1023, 1024, 1025, 2048, 4095, 4096, 4097, 8192, 9000,
            ])
            .chain(random);
        for len in lens {
            let off = rng.gen_range(0..=(9000 - len).min(7));
            let input = &buf[off..off + len];
            let want = xxhash_rust::xxh3::xxh3_64(input);
            assert_eq!(xxh3_64(input), want, "len {len} off {off} (seed {seed})");
            if len > MID_SIZE_MAX {
                assert_eq!(long_scalar(input), want, "scalar len {len}");
            }
        }
        // Known vector of the reference implementation's sanity buffer is covered by the crate;
        // a block of zeros and a block of 0xFF must agree too.
        for b in [[0u8; 4096], [0xFF; 4096]] {
            assert_eq!(xxh3_64(&b), xxhash_rust::xxh3::xxh3_64(&b));
        }
    }

    #[test]
    fn copying_variants_hash_alike_and_copy_every_byte() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x3A4);
        let mut buf = vec![0u8; 9000];
        rng.fill(&mut buf[..]);
        // 64-byte aligned destination inside a larger buffer.
        let mut backing = vec![0u8; 9000 + 256];
        let pad = backing.as_ptr().align_offset(64);
        for len in [64, 192, 256, 320, 1024, 1088, 4032, 4096, 8192] {
            let input = &buf[..len];
            let dst = &mut backing[pad..pad + len + 64];
            dst.fill(0xA5);
            for streaming in [true, false] {
                dst.fill(0xA5);
                // SAFETY: `dst` holds `len` + 64 bytes, is 64-byte aligned and separate from
                // `input`; `len` is a multiple of 64.
                let h = unsafe {
                    if streaming {
                        xxh3_64_stream(input, dst.as_mut_ptr())
                    } else {
                        xxh3_64_copy(input, dst.as_mut_ptr())
                    }
                };
                assert_eq!(h, xxhash_rust::xxh3::xxh3_64(input), "len {len}");
                assert_eq!(
                    &dst[..len],
                    input,
                    "copy of len {len} (streaming {streaming})"
                );
                assert!(
                    dst[len..].iter().all(|&x| x == 0xA5),
                    "wrote past len {len} (streaming {streaming})"
                );
            }
        }
    }
}
