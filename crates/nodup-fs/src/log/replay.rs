//! Log replay: read the log from a checkpoint's cut block by block and hand each valid record to
//! the caller, holding at most one block plus one record in memory.

use crate::chain::{ChainKind, ChainReader, PAYLOAD};
use crate::error::{FsError, Result};
use crate::log::record::{Record, FRAME_HEADER};
use crate::log::writer::LogPos;
use nodup_core::media::Medium;
use nodup_core::BlockNr;

/// What a replay found.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// Records applied.
    pub records: u64,
    /// Payload bytes they occupy.
    pub bytes: u64,
    /// Log blocks from the cut's block to the block where the log ends.
    pub blocks: Vec<BlockNr>,
    /// Where the log ends (the next record goes there).
    pub end: LogPos,
}

/// Replay the log chain `gen` from `start`, calling `apply` on each record in order, with its
/// sequence number. The log
/// ends at the first frame that is torn, fails its checksum or carries another sequence number,
/// or where `apply` answers `Ok(false)` (the log then ends before that record); an error from
/// `apply` stops the replay and is returned.
pub fn replay(
    m: &dyn Medium,
    start: LogPos,
    gen: u64,
    apply: &mut dyn FnMut(u64, Record) -> Result<bool>,
) -> Result<Replayed> {
    let mut rd = ChainReader::new(m, start.block, ChainKind::Log, gen, start.index);
    let mut blocks = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    match rd.next_block()? {
        Some((b, _, p)) => {
            blocks.push(b);
            buf.extend_from_slice(&p[start.off.min(PAYLOAD)..]);
        }
        None => return Err(FsError::Corrupt("log start block not found".into())),
    }
    // Payload offset (counted from the first block's payload start) of buf[0].
    let mut buf_at = start.off.min(PAYLOAD) as u64;
    let mut cur = 0usize;
    let mut seq = start.seq;
    let mut records = 0u64;
    let mut more = true;
    loop {
        let rest = &buf[cur..];
        let need = match Record::declared_len(rest) {
            Some(len) if len <= rest.len() => {
                let Some((rec, n)) = Record::parse(rest, seq) else {
                    break;
                };
                if !apply(seq, rec)? {
                    break;
                }
                cur += n;
                seq += 1;
                records += 1;
                continue;
            }
            Some(len) => len,
            None if rest.len() < FRAME_HEADER => FRAME_HEADER,
            None => break,
        };
        // The frame continues in the next block.
        if !more || buf.len() - cur >= need {
            break;
        }
        match rd.next_block()? {
            Some((b, _, p)) => {
                blocks.push(b);
                buf.drain(..cur);
                buf_at += cur as u64;
                cur = 0;
                buf.extend_from_slice(p);
            }
            None => more = false,
        }
    }
    let end_abs = buf_at + cur as u64;
    let first_off = start.off.min(PAYLOAD) as u64;
    // The end as (block, offset): a position on a block boundary stays in the earlier block
    // (offset PAYLOAD), since the next block may not be linked yet.
    let (bi, off) = if end_abs == 0 {
        (0, 0)
    } else {
        let k = (end_abs - 1) / PAYLOAD as u64;
        (k as usize, (end_abs - k * PAYLOAD as u64) as usize)
    };
    blocks.truncate(bi + 1);
    Ok(Replayed {
        records,
        bytes: end_abs - first_off,
        end: LogPos {
            block: blocks[bi],
            index: start.index + bi as u64,
            off,
            seq,
        },
        blocks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::ChainWriter;
    use crate::inode::Ts;
    use nodup_core::media::MemMedium;
    use nodup_core::BLOCK_SIZE;

    fn rec(i: u64, len: usize) -> Record {
        Record::SetXattr {
            ino: i,
            name: b"user.x".to_vec(),
            value: vec![i as u8; len],
            now: Ts { sec: 1, nsec: 0 },
        }
    }

    #[test]
    fn replays_frames_across_blocks_from_a_cut() {
        let m = MemMedium::new(64 * BLOCK_SIZE as u64);
        let mut w = ChainWriter::start(&m, ChainKind::Log, 3, 10).unwrap();
        let mut next = 11;
        let mut cut = None;
        let mut ends = Vec::new();
        for i in 0..40u64 {
            if i == 17 {
                let (block, index, off) = w.end();
                cut = Some(LogPos {
                    block,
                    index,
                    off,
                    seq: 100 + i,
                });
            }
            let f = rec(i, 300 + (i as usize * 37) % 900).frame(100 + i);
            let n = w.blocks_needed(f.len());
            let fresh: Vec<u64> = (next..next + n as u64).collect();
            next += n as u64;
            w.append(&m, &f, &fresh).unwrap();
            ends.push(w.end());
        }
        let cut = cut.unwrap();
        let mut seen = Vec::new();
        let r = replay(&m, cut, 3, &mut |_, rec| {
            if let Record::SetXattr { ino, .. } = rec {
                seen.push(ino);
            }
            Ok(true)
        })
        .unwrap();
        assert_eq!(seen, (17..40).collect::<Vec<_>>());
        assert_eq!(r.records, 23);
        let (b, i, o) = ends[39];
        assert_eq!(
            (r.end.block, r.end.index, r.end.off, r.end.seq),
            (b, i, o, 140)
        );
        assert_eq!(*r.blocks.last().unwrap(), b);
        assert_eq!(r.blocks[0], cut.block);
        // A torn frame ends the log at the previous frame.
        let (b, _, o) = ends[30];
        m.write(b * BLOCK_SIZE as u64 + 40 + o as u64 + 20, &[0xee; 4])
            .unwrap();
        let mut n = 0;
        let r = replay(&m, cut, 3, &mut |_, _| {
            n += 1;
            Ok(true)
        })
        .unwrap();
        assert_eq!(n, 31 - 17);
        let (b, i, o) = ends[30];
        assert_eq!((r.end.block, r.end.index, r.end.off), (b, i, o));
        // An apply that answers false ends the log before that record (the 6th after the cut).
        let mut n = 0;
        let r = replay(&m, cut, 3, &mut |_, _| {
            n += 1;
            Ok(n < 6)
        })
        .unwrap();
        assert_eq!(r.records, 5);
        let (b, i, o) = ends[17 + 4];
        assert_eq!(
            (r.end.block, r.end.index, r.end.off, r.end.seq),
            (b, i, o, 100 + 22)
        );
    }
}
