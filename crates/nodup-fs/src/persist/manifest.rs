//! The checkpoint manifest: every segment the checkpoint in force needs, oldest first.
//!
//! Payload (little endian), in a chain of kind `Manifest`:
//!
//! | offset | width | field                                        |
//! |-------:|------:|----------------------------------------------|
//! | 0      | 8     | magic `NDMANI02`                             |
//! | 8      | 4     | version (2)                                  |
//! | 12     | 4     | segment count n                              |
//! | 16     | 8     | next inode number                            |
//! | 24     | 24·n  | per segment: head block 8, gen 8, blocks 4, payload bytes 4 |
//! | 24+24n | 4     | crc32c of bytes 0..24+24n                    |

use crate::codec::{Dec, Enc};
use crate::error::{FsError, Result};
use nodup_core::BlockNr;

/// Magic at the start of a manifest.
pub const MANIFEST_MAGIC: [u8; 8] = *b"NDMANI02";
/// Manifest format version.
pub const MANIFEST_VERSION: u32 = 2;
/// Bytes before the segment list.
pub const HEADER: usize = 24;
/// Bytes per segment entry.
pub const ENTRY: usize = 24;

/// Where one segment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegRef {
    pub head: BlockNr,
    pub gen: u64,
    pub blocks: u32,
    pub bytes: u32,
}

/// A decoded manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub next_ino: u64,
    /// Oldest first (ascending generation).
    pub segs: Vec<SegRef>,
}

impl Manifest {
    /// Encode with its checksum.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::with_capacity(HEADER + ENTRY * self.segs.len() + 4);
        e.buf.extend_from_slice(&MANIFEST_MAGIC);
        e.u32(MANIFEST_VERSION);
        e.u32(self.segs.len() as u32);
        e.u64(self.next_ino);
        for s in &self.segs {
            e.u64(s.head);
            e.u64(s.gen);
            e.u32(s.blocks);
            e.u32(s.bytes);
        }
        let crc = crc32c::crc32c(&e.buf);
        e.u32(crc);
        e.buf
    }

    /// Decode and validate (magic, version, checksum, ascending generations, sizes that fit
    /// their block counts).
    pub fn decode(payload: &[u8]) -> Result<Manifest> {
        let bad = |m: &str| FsError::Corrupt(format!("checkpoint manifest: {m}"));
        if payload.len() < HEADER + 4 || payload[..8] != MANIFEST_MAGIC {
            return Err(bad("header missing"));
        }
        let mut d = Dec::new(&payload[8..HEADER]);
        let version = d.u32()?;
        if version != MANIFEST_VERSION {
            return Err(FsError::Version {
                found: version,
                supported: MANIFEST_VERSION,
            });
        }
        let n = d.u32()? as usize;
        let next_ino = d.u64()?;
        let end = n
            .checked_mul(ENTRY)
            .and_then(|x| x.checked_add(HEADER))
            .filter(|&e| e + 4 <= payload.len())
            .ok_or_else(|| bad("shorter than its segment count"))?;
        let mut c = Dec::new(&payload[end..end + 4]);
        if crc32c::crc32c(&payload[..end]) != c.u32()? {
            return Err(bad("checksum mismatch"));
        }
        let mut d = Dec::new(&payload[HEADER..end]);
        let mut segs: Vec<SegRef> = Vec::with_capacity(n);
        for _ in 0..n {
            let s = SegRef {
                head: d.u64()?,
                gen: d.u64()?,
                blocks: d.u32()?,
                bytes: d.u32()?,
            };
            let fits = (s.bytes as u64)
                .div_ceil(crate::chain::PAYLOAD as u64)
                .max(1)
                == s.blocks as u64;
            if s.head == 0 || !fits || segs.last().is_some_and(|l| l.gen >= s.gen) {
                return Err(bad("bad segment entry"));
            }
            segs.push(s);
        }
        Ok(Manifest { next_ino, segs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_checks() {
        let m = Manifest {
            next_ino: 77,
            segs: vec![
                SegRef {
                    head: 10,
                    gen: 3,
                    blocks: 1,
                    bytes: 100,
                },
                SegRef {
                    head: 20,
                    gen: 9,
                    blocks: 2,
                    bytes: 5000,
                },
            ],
        };
        let b = m.encode();
        assert_eq!(Manifest::decode(&b).unwrap(), m);
        for i in 0..b.len() {
            let mut x = b.clone();
            x[i] ^= 1;
            assert!(Manifest::decode(&x).is_err(), "byte {i}");
        }
        let mut out_of_order = m.clone();
        out_of_order.segs.swap(0, 1);
        assert!(Manifest::decode(&out_of_order.encode()).is_err());
    }
}
