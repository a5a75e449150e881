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

/// Pairs the area holds at most.
pub const ROOM_PAIRS: usize = (BYTES - HDR) / 16;
/// Inode numbers the area holds at most.
pub const ROOM_INOS: usize = (BYTES - HDR) / 8;

/// Encode a checkpoint block by block: `words` are flattened (inode, block) pairs when
/// `pairs`, else inode numbers (as [`SkippedBuffer::checkpoint_words`] gives them; at most the
/// area's room). `put(k, block)` receives each of the area's blocks in order, from one
/// block-sized buffer on the stack: the periodic checkpoint allocates nothing for the area.
///
/// [`SkippedBuffer::checkpoint_words`]: super::skipped::SkippedBuffer::checkpoint_words
pub fn encode_blocks<E>(
    pairs: bool,
    words: &[u64],
    mut put: impl FnMut(u64, &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let words = &words[..words.len().min(ROOM_INOS)];
    let (kind, n) = if pairs {
        (0, words.len() / 2)
    } else {
        (1, words.len())
    };
    let used = if pairs { 2 * n } else { n };
    let mut psum = xxhash_rust::xxh3::Xxh3::new();
    for w in &words[..used] {
        psum.update(&w.to_le_bytes());
    }
    // Payload word i sits at area byte HDR + 8 i: blocks split it between words (HDR and
    // the block size are multiples of 8).
    const _: () = assert!(HDR.is_multiple_of(8) && BLOCK_SIZE.is_multiple_of(8));
    let mut b = [0u8; BLOCK_SIZE];
    let mut next = 0;
    for k in 0..AREA_BLOCKS {
        b.fill(0);
        let mut o = 0;
        if k == 0 {
            b[off::MAGIC..off::MAGIC + 8].copy_from_slice(&MAGIC);
            put_u32(&mut b, off::VERSION, VERSION);
            put_u32(&mut b, off::KIND, kind);
            put_u64(&mut b, off::COUNT, n as u64);
            put_u64(&mut b, off::PAYLOAD_SUM, psum.digest());
            let hsum = xxhash_rust::xxh3::xxh3_64(&b[..off::HEADER_SUM]);
            put_u64(&mut b, off::HEADER_SUM, hsum);
            o = HDR;
        }
        while o < BLOCK_SIZE && next < used {
            put_u64(&mut b, o, words[next]);
            o += 8;
            next += 1;
        }
        put(k, &b)?;
    }
    Ok(())
}

/// The whole encoded area (see [`encode_blocks`]).
#[cfg(test)]
pub fn encode(pairs: bool, words: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(BYTES);
    let _ = encode_blocks::<()>(pairs, words, |_, b| {
        out.extend_from_slice(b);
        Ok(())
    });
    out
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
                    again: false,
                },
                _ => Item::File {
                    ino: le_u64(payload, 8 * i),
                },
            })
            .collect(),
    )
}

/// Write a checkpoint (see [`encode_blocks`]) into client-area block `first` onward (durable on
/// return).
pub fn store(m: &dyn Medium, first: u64, pairs: bool, words: &[u64]) -> nodup_core::Result<()> {
    let at = first * BLOCK_SIZE as u64;
    encode_blocks(pairs, words, |k, b| m.write(at + k * BLOCK_SIZE as u64, b))?;
    m.flush(at, BYTES as u64);
    m.fence()?;
    Ok(())
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

    use super::super::skipped::SkippedBuffer;

    /// The checkpoint of `b` (and a file being scanned), decoded.
    fn round_trip(b: &SkippedBuffer, extra: Option<u64>) -> (Vec<u8>, Vec<Item>) {
        let mut w = Vec::new();
        let pairs = b.checkpoint_words(extra, ROOM_PAIRS, ROOM_INOS, &mut w);
        assert!(
            w.capacity() <= ROOM_INOS + ROOM_INOS / 4 + 1,
            "{}",
            w.capacity()
        );
        let bytes = encode(pairs, &w);
        let back = decode(&bytes).unwrap();
        (bytes, back)
    }

    #[test]
    fn pairs_then_inodes_round_trip_and_damage_is_ignored() {
        let mut b = SkippedBuffer::new(1 << 20);
        for i in 0..100 {
            b.push(2 + i % 7, i, Some(9));
        }
        let (mut bytes, back) = round_trip(&b, None);
        assert_eq!(back.len(), 100);
        let mut got: Vec<(u64, u64)> = back
            .iter()
            .map(|it| match *it {
                Item::Block { ino, lbn, fp, .. } => {
                    assert_eq!(fp, None);
                    (ino, lbn)
                }
                Item::File { .. } => panic!("a file item among pairs"),
            })
            .collect();
        got.sort_unstable();
        let mut want: Vec<(u64, u64)> = (0..100).map(|i| (2 + i % 7, i)).collect();
        want.sort_unstable();
        assert_eq!(got, want);
        // Pairs spanning every block of the area.
        let mut wide = SkippedBuffer::new(1 << 20);
        for i in 0..ROOM_PAIRS as u64 {
            wide.push(2 + i % 5, i, None);
        }
        let (_, back) = round_trip(&wide, None);
        assert_eq!(back.len(), ROOM_PAIRS);
        assert!(back.iter().all(|it| matches!(*it,
            Item::Block { ino, lbn, .. } if ino == 2 + lbn % 5 && lbn < ROOM_PAIRS as u64)));
        // A file being scanned: the distinct inodes, that file among them.
        let (_, back) = round_trip(&b, Some(50));
        let want: Vec<Item> = (2..9).chain([50]).map(|ino| Item::File { ino }).collect();
        assert_eq!(back, want);
        // Too many pairs: the distinct inodes.
        let mut many = SkippedBuffer::new(1 << 20);
        for i in 0..5000 {
            many.push(2 + i % 3, i, None);
        }
        let (_, back) = round_trip(&many, None);
        assert_eq!(back.len(), 3);
        bytes[HDR + 5] ^= 1;
        assert!(decode(&bytes).is_none());
        assert!(decode(&vec![0u8; BYTES]).is_none());
    }

    #[test]
    fn more_distinct_inodes_than_fit_keep_the_smallest() {
        // 3 * ROOM_INOS distinct files, pushed in scrambled order: the smallest ROOM_INOS kept,
        // ascending, whatever the order the buffer holds them in.
        let n = 3 * ROOM_INOS as u64;
        let mut b = SkippedBuffer::new(8 << 20);
        for k in 0..n {
            b.push(1 + (k * 7919) % n, k, None);
        }
        let (_, back) = round_trip(&b, None);
        let want: Vec<Item> = (1..=ROOM_INOS as u64)
            .map(|ino| Item::File { ino })
            .collect();
        assert_eq!(back, want);
    }
}
