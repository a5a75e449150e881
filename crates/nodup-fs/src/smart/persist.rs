//! The skipped buffer's checkpoint (SmartDedup §3.4: "periodically checkpoints the inodes and
//! LBNs from the skipped buffer"), so blocks still waiting for the worker are not forgotten by
//! an unmount or a crash. It lives in the engine's client area after the superblock pair
//! (blocks `area + 2 ..`, [`AREA_BLOCKS`] of them; an image whose client area is smaller keeps
//! no checkpoint). It is a hint only: a damaged or stale checkpoint is ignored (those blocks are
//! merely not deduplicated out of line), and every item is checked again by the worker.
//!
//! | offset | width | field                                                       |
//! |-------:|------:|-------------------------------------------------------------|
//! | 0      | 8     | magic `NDSKIP01`                                            |
//! | 8      | 4     | version (1)                                                 |
//! | 12     | 4     | kind: 0 = (inode, block) pairs, 1 = inode numbers           |
//! | 16     | 8     | items                                                       |
//! | 24     | 8     | xxh3-64 of the payload                                      |
//! | 32     | 8     | xxh3-64 of bytes 0..32                                      |
//! | 40     | ...   | payload: pairs (inode u64, block u64) or inodes (u64)       |

use nodup_core::codec::{le_u32, le_u64, put_u32, put_u64};
use nodup_core::media::Medium;
use nodup_core::BLOCK_SIZE;

use super::skipped::Item;

/// Client-area blocks of the checkpoint.
pub const AREA_BLOCKS: u64 = 8;
/// First client-area block after the superblock pair.
pub const AREA_OFFSET: u64 = 2;
const MAGIC: [u8; 8] = *b"NDSKIP01";
const VERSION: u32 = 1;
const HDR: usize = 40;
const BYTES: usize = AREA_BLOCKS as usize * BLOCK_SIZE;

mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const KIND: usize = 12;
    pub const COUNT: usize = 16;
    pub const PAYLOAD_SUM: usize = 24;
    pub const HEADER_SUM: usize = 32;
}

/// Encode `items` into the area: pairs when they fit, else the distinct inodes (a file item
/// stands for all its blocks), else as many inodes as fit. Returns the bytes and the items
/// that did not fit.
pub fn encode(items: &[Item]) -> (Vec<u8>, u64) {
    let mut b = vec![0u8; BYTES];
    let room = |w: usize| (BYTES - HDR) / w;
    let all_pairs = items.iter().all(|i| matches!(i, Item::Block { .. }));
    let (kind, words, lost): (u32, Vec<u64>, u64) = if all_pairs && items.len() <= room(16) {
        let mut w = Vec::with_capacity(items.len() * 2);
        for it in items {
            if let Item::Block { ino, lbn, .. } = *it {
                w.push(ino);
                w.push(lbn);
            }
        }
        (0, w, 0)
    } else {
        let mut inos: Vec<u64> = items
            .iter()
            .map(|i| match *i {
                Item::Block { ino, .. } | Item::File { ino } => ino,
            })
            .collect();
        inos.sort_unstable();
        inos.dedup();
        let lost = inos.len().saturating_sub(room(8)) as u64;
        inos.truncate(room(8));
        (1, inos, lost)
    };
    b[off::MAGIC..off::MAGIC + 8].copy_from_slice(&MAGIC);
    put_u32(&mut b, off::VERSION, VERSION);
    put_u32(&mut b, off::KIND, kind);
    let n = if kind == 0 {
        words.len() / 2
    } else {
        words.len()
    };
    put_u64(&mut b, off::COUNT, n as u64);
    for (i, w) in words.iter().enumerate() {
        put_u64(&mut b, HDR + 8 * i, *w);
    }
    let psum = xxhash_rust::xxh3::xxh3_64(&b[HDR..HDR + 8 * words.len()]);
    put_u64(&mut b, off::PAYLOAD_SUM, psum);
    let hsum = xxhash_rust::xxh3::xxh3_64(&b[..off::HEADER_SUM]);
    put_u64(&mut b, off::HEADER_SUM, hsum);
    (b, lost)
}

/// Decode the area; `None` when it holds no valid checkpoint.
pub fn decode(b: &[u8]) -> Option<Vec<Item>> {
    if b.len() < BYTES
        || b[off::MAGIC..off::MAGIC + 8] != MAGIC
        || le_u32(b, off::VERSION) != VERSION
        || xxhash_rust::xxh3::xxh3_64(&b[..off::HEADER_SUM]) != le_u64(b, off::HEADER_SUM)
    {
        return None;
    }
    let kind = le_u32(b, off::KIND);
    let n = le_u64(b, off::COUNT) as usize;
    let width = match kind {
        0 => 16,
        1 => 8,
        _ => return None,
    };
    if n > (BYTES - HDR) / width {
        return None;
    }
    let payload = &b[HDR..HDR + n * width];
    if xxhash_rust::xxh3::xxh3_64(payload) != le_u64(b, off::PAYLOAD_SUM) {
        return None;
    }
    Some(
        (0..n)
            .map(|i| match kind {
                0 => Item::Block {
                    ino: le_u64(payload, 16 * i),
                    lbn: le_u64(payload, 16 * i + 8),
                    fp: None,
                },
                _ => Item::File {
                    ino: le_u64(payload, 8 * i),
                },
            })
            .collect(),
    )
}

/// Write the checkpoint of `items` into client-area block `first` onward (durable on return).
pub fn store(m: &dyn Medium, first: u64, items: &[Item]) -> nodup_core::Result<u64> {
    let (b, lost) = encode(items);
    let off = first * BLOCK_SIZE as u64;
    m.write(off, &b)?;
    m.flush(off, b.len() as u64);
    m.fence()?;
    Ok(lost)
}

/// Read the checkpoint at client-area block `first` (nothing when none is valid).
pub fn load(m: &dyn Medium, first: u64) -> Vec<Item> {
    let mut b = vec![0u8; BYTES];
    if m.read(first * BLOCK_SIZE as u64, &mut b).is_err() {
        return Vec::new();
    }
    decode(&b).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_then_inodes_round_trip_and_damage_is_ignored() {
        let items: Vec<Item> = (0..100)
            .map(|i| Item::Block {
                ino: 2 + i % 7,
                lbn: i,
                fp: Some(9),
            })
            .collect();
        let (mut b, lost) = encode(&items);
        assert_eq!(lost, 0);
        let back = decode(&b).unwrap();
        assert_eq!(back.len(), 100);
        assert_eq!(
            back[3],
            Item::Block {
                ino: 5,
                lbn: 3,
                fp: None
            }
        );
        // Too many pairs: the distinct inodes.
        let many: Vec<Item> = (0..5000)
            .map(|i| Item::Block {
                ino: 2 + i % 3,
                lbn: i,
                fp: None,
            })
            .collect();
        let (b2, _) = encode(&many);
        assert_eq!(decode(&b2).unwrap().len(), 3);
        b[HDR + 5] ^= 1;
        assert!(decode(&b).is_none());
        assert!(decode(&vec![0u8; BYTES]).is_none());
    }
}
