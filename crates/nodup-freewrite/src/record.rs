//! The record format of every file the stores write (FAWN data log, LSM write-ahead log and
//! SSTable data): a length-prefixed, checksummed key-value record. A bubble is an ordinary
//! record whose key is the empty key, which no user may use (user keys are 1..=`MAX_KEY`
//! bytes), so any reader skips bubbles with no metadata of their places or sizes (Freewrite
//! §3.2). A bubble cannot be shorter than a record header: the planner never asks for one.

use crate::error::{Error, Result};
use nodup_core::codec::{le_u32, put_u32};

// Record layout, little-endian; the header is `HEADER` = 12 bytes, key and value follow:
//
// | offset | size | field                                                  |
// |--------|------|--------------------------------------------------------|
// | 0      | 4    | crc32c of bytes 4..end of the record                   |
// | 4      | 4    | value length                                           |
// | 8      | 2    | key length (0: a bubble; user keys are 1..=MAX_KEY)     |
// | 10     | 1    | kind: 1 put, 2 delete (value length 0)                 |
// | 11     | 1    | reserved, 0                                            |
// | 12     | klen | key                                                    |
// | 12+klen| vlen | value (a bubble's value is zeros)                      |
const O_CRC: usize = 0;
const O_VLEN: usize = 4;
const O_KLEN: usize = 8;
const O_KIND: usize = 10;
const O_RESERVED: usize = 11;

/// Bytes of a record header; also the smallest possible bubble.
pub const HEADER: usize = 12;
/// Longest user key.
pub const MAX_KEY: usize = 1024;
/// Longest value (and bubble).
pub const MAX_VALUE: usize = 16 << 20;

const KIND_PUT: u8 = 1;
const KIND_DELETE: u8 = 2;

/// What a decoded record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry<'a> {
    /// A key and its value.
    Put {
        /// The user key.
        key: &'a [u8],
        /// The value.
        value: &'a [u8],
    },
    /// A DELETE marker for a key.
    Delete {
        /// The user key.
        key: &'a [u8],
    },
    /// Padding that keeps the following data block aligned; readers skip it.
    Bubble,
}

impl<'a> Entry<'a> {
    /// The user key, `None` for a bubble.
    pub fn key(&self) -> Option<&'a [u8]> {
        match *self {
            Entry::Put { key, .. } | Entry::Delete { key } => Some(key),
            Entry::Bubble => None,
        }
    }
}

/// Result of decoding the record at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A valid record of `len` bytes.
    Record {
        /// What it holds.
        entry: Entry<'a>,
        /// Its encoded length.
        len: usize,
    },
    /// The buffer ends before the record does (a torn tail at the end of a log).
    Short,
    /// The bytes are not a valid record (the reason).
    Bad(String),
}

/// Encoded length of a record with a `key` and `value` of these lengths.
pub fn encoded_len(key: usize, value: usize) -> usize {
    HEADER + key + value
}

/// Refuse keys outside the user key space (empty keys belong to bubbles).
pub fn check_key(key: &[u8]) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(Error::Invalid(format!(
            "key of {} bytes: keys are 1..={MAX_KEY} bytes (the empty key marks bubbles)",
            key.len()
        )));
    }
    Ok(())
}

/// Refuse values longer than [`MAX_VALUE`].
pub fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE {
        return Err(Error::Invalid(format!(
            "value of {} bytes: at most {MAX_VALUE}",
            value.len()
        )));
    }
    Ok(())
}

fn encode(out: &mut Vec<u8>, kind: u8, key: &[u8], value: &[u8]) {
    let start = out.len();
    out.resize(start + HEADER, 0);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    let rec = &mut out[start..];
    put_u32(rec, O_VLEN, value.len() as u32);
    rec[O_KLEN..O_KLEN + 2].copy_from_slice(&(key.len() as u16).to_le_bytes());
    rec[O_KIND] = kind;
    rec[O_RESERVED] = 0;
    let crc = crc32c::crc32c(&rec[O_VLEN..]);
    put_u32(rec, O_CRC, crc);
}

/// Append a put record (the caller checked key and value with [`check_key`]/[`check_value`]).
pub fn encode_put(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    encode(out, KIND_PUT, key, value);
}

/// Append a DELETE marker for `key`.
pub fn encode_delete(out: &mut Vec<u8>, key: &[u8]) {
    encode(out, KIND_DELETE, key, &[]);
}

/// Append a bubble of exactly `len` bytes (`HEADER..=HEADER + MAX_VALUE`; the planner never
/// asks for a smaller one).
pub fn encode_bubble(out: &mut Vec<u8>, len: usize) {
    assert!(
        (HEADER..=HEADER + MAX_VALUE).contains(&len),
        "bubble of {len} bytes"
    );
    let start = out.len();
    out.resize(start + len, 0);
    let rec = &mut out[start..];
    put_u32(rec, O_VLEN, (len - HEADER) as u32);
    rec[O_KIND] = KIND_PUT;
    let crc = crc32c::crc32c(&rec[O_VLEN..]);
    put_u32(rec, O_CRC, crc);
}

/// Decode the record at the start of `buf`, checking every field and the checksum.
pub fn decode(buf: &[u8]) -> Decoded<'_> {
    if buf.len() < HEADER {
        return Decoded::Short;
    }
    let vlen = le_u32(buf, O_VLEN) as usize;
    let klen = u16::from_le_bytes([buf[O_KLEN], buf[O_KLEN + 1]]) as usize;
    let kind = buf[O_KIND];
    if buf[O_RESERVED] != 0 {
        return Decoded::Bad("reserved header byte is not 0".into());
    }
    if kind != KIND_PUT && kind != KIND_DELETE {
        return Decoded::Bad(format!("unknown record kind {kind}"));
    }
    if klen > MAX_KEY || vlen > MAX_VALUE {
        return Decoded::Bad(format!(
            "key length {klen} or value length {vlen} too large"
        ));
    }
    if kind == KIND_DELETE && (klen == 0 || vlen != 0) {
        return Decoded::Bad("DELETE marker with an empty key or a value".into());
    }
    let len = HEADER + klen + vlen;
    if buf.len() < len {
        return Decoded::Short;
    }
    if crc32c::crc32c(&buf[O_VLEN..len]) != le_u32(buf, O_CRC) {
        return Decoded::Bad("checksum mismatch".into());
    }
    let key = &buf[HEADER..HEADER + klen];
    let entry = if klen == 0 {
        Entry::Bubble
    } else if kind == KIND_DELETE {
        Entry::Delete { key }
    } else {
        Entry::Put {
            key,
            value: &buf[HEADER + klen..len],
        }
    };
    Decoded::Record { entry, len }
}

/// Every record of a complete region (SSTable data, a whole log): `(offset, length, entry)`
/// with offsets counted from `base`; a short or bad record is an error naming its offset.
pub fn records(buf: &[u8], base: u64) -> Records<'_> {
    Records { buf, pos: 0, base }
}

/// Iterator of [`records`].
pub struct Records<'a> {
    buf: &'a [u8],
    pos: usize,
    base: u64,
}

/// Where a region's record at `offset` failed to decode, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    /// Offset of the record (from the region's base).
    pub offset: u64,
    /// Why it did not decode.
    pub msg: String,
}

impl<'a> Iterator for Records<'a> {
    type Item = std::result::Result<(u64, usize, Entry<'a>), BadRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.buf.len() {
            return None;
        }
        let offset = self.base + self.pos as u64;
        match decode(&self.buf[self.pos..]) {
            Decoded::Record { entry, len } => {
                self.pos += len;
                Some(Ok((offset, len, entry)))
            }
            Decoded::Short => {
                self.pos = self.buf.len();
                Some(Err(BadRecord {
                    offset,
                    msg: "record runs past the end of its region".into(),
                }))
            }
            Decoded::Bad(msg) => {
                self.pos = self.buf.len();
                Some(Err(BadRecord { offset, msg }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bubbles_are_skippable_records() {
        let mut b = Vec::new();
        encode_put(&mut b, b"k1", b"value");
        encode_bubble(&mut b, HEADER);
        encode_delete(&mut b, b"k2");
        encode_bubble(&mut b, 100);
        let got: Vec<_> = records(&b, 7).map(|r| r.unwrap()).collect();
        assert_eq!(got.len(), 4);
        assert_eq!(
            got[0],
            (
                7,
                HEADER + 7,
                Entry::Put {
                    key: b"k1",
                    value: b"value"
                }
            )
        );
        assert_eq!(got[1], (7 + 19, HEADER, Entry::Bubble));
        assert_eq!(got[2].2, Entry::Delete { key: b"k2" });
        assert_eq!((got[3].1, got[3].2), (100, Entry::Bubble));
        assert_eq!(b.len(), 19 + 12 + 14 + 100);
    }

    #[test]
    fn torn_and_corrupt_records_are_told_apart() {
        let mut b = Vec::new();
        encode_put(&mut b, b"key", &[9u8; 40]);
        for cut in 0..b.len() {
            assert_eq!(decode(&b[..cut]), Decoded::Short, "cut at {cut}");
        }
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(
                !matches!(decode(&c), Decoded::Record { .. }),
                "flip at byte {i} accepted"
            );
        }
        assert!(matches!(decode(&[0u8; 64]), Decoded::Bad(_)));
    }

    #[test]
    fn user_keys_exclude_the_bubble_key() {
        assert!(check_key(b"").is_err());
        assert!(check_key(&[1u8; MAX_KEY + 1]).is_err());
        assert!(check_key(b"a").is_ok());
    }
}
