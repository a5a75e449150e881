//! `ecc`: FSDedup's "ECC as fingerprint" — a SECDED Hamming (72,64) code per 8-byte word,
//! the 8 check bytes of each 64-byte line packed into one u64, XOR-folded over the block.
//!
//! # The code
//!
//! A 64-bit data word is laid out in a Hamming codeword of positions 1..=71: the 7 positions that
//! are powers of two (1, 2, 4, ..., 64) hold parity bits, the other 64 positions hold the data
//! bits in order (data bit 0 at position 3, bit 1 at 5, bit 2 at 6, bit 3 at 7, bit 4 at 9, ...).
//! Parity bit `i` (at position `2^i`) is the XOR of the data bits whose position has bit `i`
//! set. An overall parity bit (the XOR of all 71 other bits) makes it SECDED: any single-bit
//! error is corrected, any double-bit error is detected.
//!
//! Check byte of a word: bits 0..=6 = Hamming parity bits p0..p6, bit 7 = overall parity.
//!
//! Decoding ([`decode`]): the syndrome is the 7 recomputed parity bits XOR the stored ones,
//! i.e. the position of a single flipped bit; together with the overall parity it tells
//! no error / single error (at the syndrome's position, or the overall bit itself) / double error.
//!
//! # The fingerprint
//!
//! Line fingerprint: `u64::from_le_bytes([ecc(w0), ecc(w1), ..., ecc(w7)])` for the 8 little-
//! endian words of a 64-byte line. Block fingerprint: XOR of the 64 line fingerprints. The
//! code is linear over GF(2), so the XOR of the check bytes of word `i` of every line equals the
//! check byte of the XOR of those words: the block fingerprint is computed by XOR-folding the
//! block to one line and encoding its 8 words (see the test that checks it against the
//! definition). The fingerprint is a similarity filter: equal blocks give equal fingerprints,
//! many different blocks do too (it is linear), so matches are always verified byte by byte.

use super::{Fingerprinter, FpKind};

/// Position (1..=71) of data bit `j` in the Hamming codeword.
const fn data_positions() -> [u8; 64] {
    let mut out = [0u8; 64];
    let mut pos = 1u8;
    let mut j = 0;
    while j < 64 {
        if !pos.is_power_of_two() {
            out[j] = pos;
            j += 1;
        }
        pos += 1;
    }
    out
}

/// `DATA_POS[j]` = codeword position of data bit `j`.
const DATA_POS: [u8; 64] = data_positions();

/// `PARITY_MASK[i]` = the data bits covered by Hamming parity bit `i`.
const PARITY_MASK: [u64; 7] = {
    let mut m = [0u64; 7];
    let mut i = 0;
    while i < 7 {
        let mut j = 0;
        while j < 64 {
            if DATA_POS[j] & (1 << i) != 0 {
                m[i] |= 1 << j;
            }
            j += 1;
        }
        i += 1;
    }
    m
};

/// Per-byte lookup: `BYTE_TABLE[k][b]` = check byte of the word whose only non-zero byte is
/// byte `k` with value `b` (the code is linear, so a word's check byte is the XOR over its bytes).
static BYTE_TABLE: [[u8; 256]; 8] = {
    let mut t = [[0u8; 256]; 8];
    let mut k = 0;
    while k < 8 {
        let mut b = 0;
        while b < 256 {
            t[k][b] = encode_slow((b as u64) << (8 * k));
            b += 1;
        }
        k += 1;
    }
    t
};

/// Check byte of `word` computed from the definition (parity masks); used to build the table.
pub const fn encode_slow(word: u64) -> u8 {
    let mut check = 0u8;
    let mut i = 0;
    while i < 7 {
        check |= (((word & PARITY_MASK[i]).count_ones() & 1) as u8) << i;
        i += 1;
    }
    let overall = (word.count_ones() + (check as u32).count_ones()) & 1;
    check | ((overall as u8) << 7)
}

/// SECDED check byte of one 64-bit word (bits 0..=6 Hamming parity, bit 7 overall parity).
#[inline]
pub fn encode(word: u64) -> u8 {
    let b = word.to_le_bytes();
    BYTE_TABLE[0][b[0] as usize]
        ^ BYTE_TABLE[1][b[1] as usize]
        ^ BYTE_TABLE[2][b[2] as usize]
        ^ BYTE_TABLE[3][b[3] as usize]
        ^ BYTE_TABLE[4][b[4] as usize]
        ^ BYTE_TABLE[5][b[5] as usize]
        ^ BYTE_TABLE[6][b[6] as usize]
        ^ BYTE_TABLE[7][b[7] as usize]
}

/// Outcome of checking a word against its check byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded {
    /// Word and check byte agree.
    Clean,
    /// One bit was flipped (in the data or in the check byte); here is the corrected pair.
    Corrected { word: u64, check: u8 },
    /// Two bits (or an uncorrectable pattern) were flipped: detected, not correctable.
    DoubleError,
}

/// The 7-bit syndrome of `(word, check)`: 0 when the Hamming bits agree, else the codeword
/// position of a single flipped bit.
pub fn syndrome(word: u64, check: u8) -> u8 {
    (encode(word) ^ check) & 0x7F
}

/// Check `word` against `check`, correcting a single-bit error and detecting a double one.
pub fn decode(word: u64, check: u8) -> Decoded {
    let s = syndrome(word, check);
    // Overall parity over all 72 bits: even for a valid codeword.
    let parity_ok = (word.count_ones() + (check as u32).count_ones()).is_multiple_of(2);
    match (s, parity_ok) {
        (0, true) => Decoded::Clean,
        // Only the overall parity bit flipped.
        (0, false) => Decoded::Corrected {
            word,
            check: check ^ 0x80,
        },
        (_, true) => Decoded::DoubleError,
        (s, false) if s.is_power_of_two() => Decoded::Corrected {
            word,
            check: check ^ s,
        },
        (s, false) => match DATA_POS.iter().position(|&p| p == s) {
            Some(j) => Decoded::Corrected {
                word: word ^ (1 << j),
                check,
            },
            // Syndrome points past position 71: more than one error.
            None => Decoded::DoubleError,
        },
    }
}

/// Packed check bytes of one 64-byte line: byte `i` = check byte of the line's word `i`.
pub fn line_code(line: &[u8]) -> u64 {
    assert_eq!(line.len(), 64, "a line is 64 bytes");
    let mut out = [0u8; 8];
    for (i, w) in line.chunks_exact(8).enumerate() {
        out[i] = encode(u64::from_le_bytes(w.try_into().expect("8-byte word")));
    }
    u64::from_le_bytes(out)
}

/// FSDedup-style ECC fingerprint of a block: XOR of the [`line_code`] of its 64-byte lines.
/// A trailing partial line (blocks are 4 KiB, so only in tests) is zero-padded.
pub fn block_code(block: &[u8]) -> u64 {
    // Fold the block to one line (linearity), then encode its 8 words.
    let mut fold = [0u64; 8];
    let mut lines = block.chunks_exact(64);
    for line in &mut lines {
        for (i, w) in line.chunks_exact(8).enumerate() {
            fold[i] ^= u64::from_le_bytes(w.try_into().expect("8-byte word"));
        }
    }
    let rest = lines.remainder();
    if !rest.is_empty() {
        let mut pad = [0u8; 64];
        pad[..rest.len()].copy_from_slice(rest);
        for (i, w) in pad.chunks_exact(8).enumerate() {
            fold[i] ^= u64::from_le_bytes(w.try_into().expect("8-byte word"));
        }
    }
    let mut out = [0u8; 8];
    for i in 0..8 {
        out[i] = encode(fold[i]);
    }
    u64::from_le_bytes(out)
}

/// The `ecc` fingerprint.
pub struct Ecc;

impl Fingerprinter for Ecc {
    fn kind(&self) -> FpKind {
        FpKind::Ecc
    }
    fn fingerprint(&self, block: &[u8]) -> u64 {
        block_code(block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn layout_of_the_code() {
        assert_eq!(&DATA_POS[..5], &[3, 5, 6, 7, 9]);
        assert_eq!(DATA_POS[63], 71);
        // Every data bit is covered by at least two parity bits (its position is no power of two).
        for m in 0..64 {
            let covered = PARITY_MASK.iter().filter(|pm| *pm & (1 << m) != 0).count();
            assert!(covered >= 2);
        }
        assert_eq!(encode(0), 0);
        // Data bit 0 sits at position 3 = parity bits 0 and 1; overall parity is then 1^1^1 = 1.
        assert_eq!(encode(1), 0b1000_0011);
        for w in [0u64, 1, u64::MAX, 0xDEAD_BEEF_0123_4567] {
            assert_eq!(encode(w), encode_slow(w));
        }
    }

    /// Hand-computed SECDED vectors (positions from the layout in the module doc), and the code
    /// against a second encoder that builds the 72-bit codeword position by position.
    #[test]
    fn known_secded_vectors() {
        // Data bit 63 sits at position 71 = 0b100_0111: parity bits 0, 1, 2, 6; overall parity
        // over 1 data bit + 4 check bits is odd, so bit 7 is set.
        assert_eq!(encode(1 << 63), 0xC7);
        // Data bit 4 at position 9 = 0b1001: parity bits 0 and 3, overall 1 + 2 = odd.
        assert_eq!(encode(1 << 4), 0x89);
        // All ones: each parity bit covers an odd number of data bits (35, 35, 35, 31, 31, 31, 7
        // for p0..p6), and 64 + 7 set bits make the overall parity odd.
        assert_eq!(encode(u64::MAX), 0xFF);
        assert_eq!(encode(0x0000_0000_0000_0003), 0x83 ^ 0x85);
        // Decoding: a flipped data bit's syndrome is its position; two flips are detected.
        assert_eq!(syndrome(1, 0), 3);
        assert_eq!(syndrome(1 << 63, 0), 71);
        assert_eq!(decode(1, 0), Decoded::Corrected { word: 0, check: 0 });
        assert_eq!(decode(0, 0x01), Decoded::Corrected { word: 0, check: 0 });
        assert_eq!(decode(0, 0x80), Decoded::Corrected { word: 0, check: 0 });
        assert_eq!(decode(3, 0), Decoded::DoubleError);
        assert_eq!(decode(0, 0x03), Decoded::DoubleError);
        // Packed line code: word i's check byte in byte i.
        let mut line = [0u8; 64];
        assert_eq!(line_code(&line), 0);
        for w in line.chunks_exact_mut(8) {
            w.copy_from_slice(&(1u64 << 63).to_le_bytes());
        }
        assert_eq!(line_code(&line), 0xC7C7_C7C7_C7C7_C7C7);
        line[8] = 0x10; // word 1 becomes 1<<63 | 1<<4
        assert_eq!(line_code(&line), 0xC7C7_C7C7_C7C7_4EC7);

        // Reference encoder: lay the codeword out bit by bit and compute each parity over positions.
        let reference = |w: u64| -> u8 {
            let mut cw = [0u8; 72]; // index = position 1..=71
            let mut j = 0;
            for (pos, bit) in cw.iter_mut().enumerate().skip(1) {
                if !pos.is_power_of_two() {
                    *bit = ((w >> j) & 1) as u8;
                    j += 1;
                }
            }
            let mut check = 0u8;
            for i in 0..7 {
                let p = (1..72)
                    .filter(|pos| pos & (1 << i) != 0)
                    .fold(0, |a, pos| a ^ cw[pos]);
                check |= p << i;
            }
            let overall = (w.count_ones() + check.count_ones()) & 1;
            check | (overall as u8) << 7
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xECC);
        for _ in 0..1000 {
            let w: u64 = rng.gen();
            assert_eq!(encode(w), reference(w), "word {w:#x}");
        }
    }

    #[test]
    fn corrects_every_single_bit_flip_and_detects_doubles() {
        let seed = 0x5EC_DED;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for _ in 0..200 {
            let w: u64 = rng.gen();
            let c = encode(w);
            assert_eq!(decode(w, c), Decoded::Clean, "seed {seed}");
            // Every single flip among the 72 bits is corrected.
            for bit in 0..72 {
                let (fw, fc) = if bit < 64 {
                    (w ^ (1 << bit), c)
                } else {
                    (w, c ^ (1 << (bit - 64)))
                };
                assert_eq!(
                    decode(fw, fc),
                    Decoded::Corrected { word: w, check: c },
                    "seed {seed} word {w:#x} bit {bit}"
                );
            }
            // Random double flips are detected, never "corrected" into something else.
            for _ in 0..50 {
                let a = rng.gen_range(0..72);
                let mut b = rng.gen_range(0..72);
                while b == a {
                    b = rng.gen_range(0..72);
                }
                let (mut fw, mut fc) = (w, c);
                for bit in [a, b] {
                    if bit < 64 {
                        fw ^= 1 << bit;
                    } else {
                        fc ^= 1 << (bit - 64);
                    }
                }
                assert_eq!(
                    decode(fw, fc),
                    Decoded::DoubleError,
                    "seed {seed} bits {a},{b}"
                );
            }
        }
    }

    #[test]
    fn block_code_matches_the_definition() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut block = vec![0u8; 4096];
        rng.fill(&mut block[..]);
        let naive = block
            .chunks_exact(64)
            .fold(0u64, |acc, l| acc ^ line_code(l));
        assert_eq!(block_code(&block), naive);
        assert_eq!(Ecc.fingerprint(&block), naive);
        assert_eq!(Ecc.fingerprint(&[0u8; 4096]), 0);
        // A single flipped bit changes the fingerprint (SECDED: every bit is covered).
        block[1000] ^= 0x10;
        assert_ne!(Ecc.fingerprint(&block), naive);
        // Known vector: a block of 0x01 bytes. Each word 0x0101..01 has 8 set bits; 64 lines
        // (an even count) fold to zero.
        assert_eq!(Ecc.fingerprint(&[1u8; 4096]), 0);
        // One line of 0x01 bytes and the rest zero: each of the 8 check bytes is encode(0x0101..).
        let mut one = vec![0u8; 4096];
        one[..64].fill(1);
        let e = encode(0x0101_0101_0101_0101);
        assert_eq!(Ecc.fingerprint(&one), u64::from_le_bytes([e; 8]));
        assert_eq!(e, encode_slow(0x0101_0101_0101_0101));
    }
}
