//! Per-file block map: file block number -> physical block (0 = hole), kept sparse in DRAM as
//! fixed-size chunks so files with huge holes (or > 4 GiB) cost memory only where data lives.

use crate::persist::ChunkSet;
use nodup_core::BlockNr;
use std::collections::BTreeMap;

/// File blocks per chunk (2 MiB of file per chunk) beyond the direct part.
pub const CHUNK: u64 = 512;
/// File blocks kept in the direct vector (grown on demand, so a small file costs 8 bytes a block).
pub const DIRECT: u64 = 512;

/// A sparse map from file block to physical block; 0 means hole.
///
/// Blocks below [`DIRECT`] live in a vector sized to the highest one mapped (most files are
/// small); blocks above live in fixed-size chunks keyed by chunk number, so huge sparse files
/// cost memory only where data is.
///
/// Checkpoints persist a map in units of [`CHUNK`] file blocks (unit 0 is the direct part), so
/// the map remembers which units changed since the last checkpoint took them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockMap {
    direct: Vec<BlockNr>,
    chunks: BTreeMap<u64, Box<[BlockNr; CHUNK as usize]>>,
    mapped: u64,
    /// Checkpoint units changed since the last checkpoint took them.
    pub(crate) dirty: ChunkSet,
}

/// Checkpoint unit of file block `fb`.
pub fn unit_of(fb: u64) -> u64 {
    if fb < DIRECT {
        0
    } else {
        1 + (fb - DIRECT) / CHUNK
    }
}

/// First file block of checkpoint unit `u`.
pub fn unit_start(u: u64) -> u64 {
    if u == 0 {
        0
    } else {
        DIRECT + (u - 1) * CHUNK
    }
}

impl BlockMap {
    /// Units that map at least one block, ascending.
    pub fn units(&self) -> Vec<u64> {
        let mut v = Vec::with_capacity(self.chunks.len() + 1);
        if !self.direct.is_empty() {
            v.push(0);
        }
        v.extend(self.chunks.keys().map(|k| k + 1));
        v
    }

    /// The slots of unit `u` (0 = hole; shorter than the unit when its tail is unmapped).
    pub fn unit_slots(&self, u: u64) -> &[BlockNr] {
        if u == 0 {
            &self.direct
        } else {
            match self.chunks.get(&(u - 1)) {
                Some(c) => &c[..],
                None => &[],
            }
        }
    }

    /// True when unit `u` maps at least one block.
    pub fn unit_mapped(&self, u: u64) -> bool {
        if u == 0 {
            !self.direct.is_empty()
        } else {
            self.chunks.contains_key(&(u - 1))
        }
    }

    /// Physical block of file block `fb` (0 = hole).
    pub fn get(&self, fb: u64) -> BlockNr {
        if fb < DIRECT {
            return self.direct.get(fb as usize).copied().unwrap_or(0);
        }
        let k = fb - DIRECT;
        self.chunks
            .get(&(k / CHUNK))
            .map_or(0, |c| c[(k % CHUNK) as usize])
    }

    /// Map `fb` to `phys` (0 unmaps); returns the previous block (0 if it was a hole).
    pub fn set(&mut self, fb: u64, phys: BlockNr) -> BlockNr {
        let old = self.set_inner(fb, phys);
        if old != phys {
            self.dirty.insert(unit_of(fb));
        }
        old
    }

    /// Map `first + i` to `blocks[i]` for every `i`, as [`BlockMap::set`] block by block would,
    /// pushing every block a mapping replaced onto `released`; one chunk lookup and one dirty
    /// mark per unit rather than per block (a 1 MiB write maps 256 blocks).
    pub fn set_run(&mut self, first: u64, blocks: &[BlockNr], released: &mut Vec<BlockNr>) {
        let mut i = 0;
        while i < blocks.len() {
            let fb = first + i as u64;
            let u = unit_of(fb);
            // Blocks left in `fb`'s unit (not `unit_start(u + 1) - fb`: the last unit of the
            // u64 range ends at 2^64).
            let room = if u == 0 {
                DIRECT - fb
            } else {
                CHUNK - (fb - DIRECT) % CHUNK
            };
            let n = (room as usize).min(blocks.len() - i);
            let run = &blocks[i..i + n];
            i += n;
            if run.contains(&0) {
                // Unmapping may drop a chunk or shrink the direct part: the general path.
                for (k, &b) in run.iter().enumerate() {
                    let old = self.set(fb + k as u64, b);
                    if old != 0 {
                        released.push(old);
                    }
                }
                continue;
            }
            let slots: &mut [BlockNr] = if u == 0 {
                let end = fb as usize + n;
                if self.direct.len() < end {
                    self.direct.resize(end, 0);
                }
                &mut self.direct[fb as usize..end]
            } else {
                let c = self
                    .chunks
                    .entry(u - 1)
                    .or_insert_with(|| Box::new([0; CHUNK as usize]));
                let s = ((fb - DIRECT) % CHUNK) as usize;
                &mut c[s..s + n]
            };
            let mut changed = false;
            for (slot, &b) in slots.iter_mut().zip(run) {
                let old = std::mem::replace(slot, b);
                if old == 0 {
                    self.mapped += 1;
                } else {
                    released.push(old);
                }
                changed |= old != b;
            }
            if changed {
                self.dirty.insert(u);
            }
        }
    }

    fn set_inner(&mut self, fb: u64, phys: BlockNr) -> BlockNr {
        let old = if fb < DIRECT {
            let i = fb as usize;
            if phys == 0 {
                if i >= self.direct.len() {
                    return 0;
                }
                let old = std::mem::replace(&mut self.direct[i], 0);
                while self.direct.last() == Some(&0) {
                    self.direct.pop();
                }
                if self.direct.is_empty() {
                    self.direct = Vec::new();
                }
                old
            } else {
                if i >= self.direct.len() {
                    self.direct.resize(i + 1, 0);
                }
                std::mem::replace(&mut self.direct[i], phys)
            }
        } else {
            let k = fb - DIRECT;
            let ci = k / CHUNK;
            let i = (k % CHUNK) as usize;
            if phys == 0 {
                let Some(c) = self.chunks.get_mut(&ci) else {
                    return 0;
                };
                let old = std::mem::replace(&mut c[i], 0);
                if old != 0 && c.iter().all(|&b| b == 0) {
                    self.chunks.remove(&ci);
                }
                old
            } else {
                let c = self
                    .chunks
                    .entry(ci)
                    .or_insert_with(|| Box::new([0; CHUNK as usize]));
                std::mem::replace(&mut c[i], phys)
            }
        };
        match (old != 0, phys != 0) {
            (false, true) => self.mapped += 1,
            (true, false) => self.mapped -= 1,
            _ => {}
        }
        old
    }

    /// Unmap every file block in `[start, end)`; returns the blocks that were mapped.
    pub fn remove_range(&mut self, start: u64, end: u64) -> Vec<BlockNr> {
        let mut out = Vec::new();
        if start >= end {
            return out;
        }
        let dend = end.min(self.direct.len() as u64);
        for fb in start..dend {
            let old = self.set(fb, 0);
            if old != 0 {
                out.push(old);
            }
        }
        if end <= DIRECT {
            return out;
        }
        let ks = start.max(DIRECT) - DIRECT;
        let ke = end - DIRECT;
        let keys: Vec<u64> = self
            .chunks
            .range(ks / CHUNK..=(ke - 1) / CHUNK)
            .map(|(&k, _)| k)
            .collect();
        for ci in keys {
            let lo = (ci * CHUNK).max(ks);
            let hi = ((ci + 1) * CHUNK).min(ke);
            for k in lo..hi {
                let old = self.set(k + DIRECT, 0);
                if old != 0 {
                    out.push(old);
                }
            }
        }
        out
    }

    /// The first mapped file block at or after `from`, if any (SEEK_DATA).
    pub fn next_mapped(&self, from: u64) -> Option<u64> {
        if from < DIRECT {
            let i = from as usize;
            if let Some(k) = self
                .direct
                .get(i..)
                .and_then(|s| s.iter().position(|&b| b != 0))
            {
                return Some((i + k) as u64);
            }
        }
        let k0 = from.max(DIRECT) - DIRECT;
        for (&ci, c) in self.chunks.range(k0 / CHUNK..) {
            let lo = if ci == k0 / CHUNK {
                (k0 % CHUNK) as usize
            } else {
                0
            };
            if let Some(i) = c[lo..].iter().position(|&b| b != 0) {
                return Some(DIRECT + ci * CHUNK + (lo + i) as u64);
            }
        }
        None
    }

    /// The first unmapped file block at or after `from` (SEEK_HOLE; every block past the last
    /// mapped one is a hole).
    pub fn next_hole(&self, from: u64) -> u64 {
        let mut fb = from;
        loop {
            if self.get(fb) == 0 {
                return fb;
            }
            if fb < DIRECT {
                // Inside the direct part: scan it.
                let i = fb as usize;
                match self.direct[i..].iter().position(|&b| b == 0) {
                    Some(k) => return (i + k) as u64,
                    None => fb = self.direct.len() as u64,
                }
                continue;
            }
            let k = fb - DIRECT;
            let Some(c) = self.chunks.get(&(k / CHUNK)) else {
                return fb;
            };
            let lo = (k % CHUNK) as usize;
            match c[lo..].iter().position(|&b| b == 0) {
                Some(i) => return fb + i as u64,
                None => fb = DIRECT + (k / CHUNK + 1) * CHUNK,
            }
        }
    }

    /// Heap bytes of the map (direct array and chunks; B-tree nodes estimated at one
    /// pointer-sized key and child per chunk).
    pub fn heap_bytes(&self) -> u64 {
        (self.direct.capacity() * std::mem::size_of::<BlockNr>()
            + self.chunks.len()
                * (std::mem::size_of::<[BlockNr; CHUNK as usize]>()
                    + 3 * std::mem::size_of::<u64>())) as u64
    }

    /// Number of mapped (non-hole) file blocks.
    pub fn mapped(&self) -> u64 {
        self.mapped
    }

    /// Every mapping `(file block, physical block)` in file order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, BlockNr)> + '_ {
        let direct = self
            .direct
            .iter()
            .enumerate()
            .filter(|(_, &b)| b != 0)
            .map(|(i, &b)| (i as u64, b));
        let chunked = self.chunks.iter().flat_map(|(&ci, c)| {
            c.iter()
                .enumerate()
                .filter(|(_, &b)| b != 0)
                .map(move |(i, &b)| (DIRECT + ci * CHUNK + i as u64, b))
        });
        direct.chain(chunked)
    }

    /// Every physical block referenced, once per reference.
    pub fn blocks(&self) -> impl Iterator<Item = BlockNr> + '_ {
        self.iter().map(|(_, b)| b)
    }

    /// Unmap everything; returns the blocks that were mapped.
    pub fn clear(&mut self) -> Vec<BlockNr> {
        for u in self.units() {
            self.dirty.insert(u);
        }
        let out: Vec<BlockNr> = self.blocks().collect();
        self.direct = Vec::new();
        self.chunks.clear();
        self.mapped = 0;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap as Model;

    proptest! {
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec((0u8..3, prop_oneof![0u64..700, 0u64..5000], 0u64..3000, 1u64..100), 1..200)) {
            let mut m = BlockMap::default();
            let mut model: Model<u64, u64> = Model::new();
            for (op, fb, len, phys) in ops {
                match op {
                    0 => {
                        let old = m.set(fb, phys);
                        prop_assert_eq!(old, model.insert(fb, phys).unwrap_or(0));
                    }
                    1 => {
                        let old = m.set(fb, 0);
                        prop_assert_eq!(old, model.remove(&fb).unwrap_or(0));
                    }
                    _ => {
                        let mut got = m.remove_range(fb, fb + len);
                        let keys: Vec<u64> = model.range(fb..fb + len).map(|(&k, _)| k).collect();
                        let mut want: Vec<u64> = keys.iter().map(|k| model.remove(k).unwrap()).collect();
                        got.sort_unstable();
                        want.sort_unstable();
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(m.mapped(), model.len() as u64);
            }
            let pairs: Vec<(u64, u64)> = m.iter().collect();
            let want: Vec<(u64, u64)> = model.into_iter().collect();
            prop_assert_eq!(pairs, want);
        }
    }

    proptest! {
        #[test]
        fn set_run_is_set_block_by_block(runs in proptest::collection::vec((
            prop_oneof![0u64..700, 0u64..3000, (u64::MAX - 3000)..(u64::MAX - 1100)],
            prop_oneof![
                // Runs without holes take the unit-at-a-time path whole.
                proptest::collection::vec(1u64..50, 0..1100),
                proptest::collection::vec(prop_oneof![4 => 1u64..50, 1 => Just(0u64)], 0..1100),
            ],
        ), 1..12)) {
            let mut a = BlockMap::default();
            let mut b = BlockMap::default();
            for (first, blocks) in runs {
                let mut ra = Vec::new();
                a.set_run(first, &blocks, &mut ra);
                let mut rb = Vec::new();
                for (i, &p) in blocks.iter().enumerate() {
                    let old = b.set(first + i as u64, p);
                    if old != 0 {
                        rb.push(old);
                    }
                }
                prop_assert_eq!(ra, rb);
                prop_assert_eq!(a.mapped(), b.mapped());
                prop_assert_eq!(a.dirty.take(), b.dirty.take());
                prop_assert_eq!(a.direct.len(), b.direct.len());
                prop_assert_eq!(a.chunks.len(), b.chunks.len());
            }
            prop_assert_eq!(a.iter().collect::<Vec<_>>(), b.iter().collect::<Vec<_>>());
        }
    }

    proptest! {
        #[test]
        fn seek_data_and_hole_match_a_scan(fbs in proptest::collection::btree_set(0u64..3000, 0..60), from in 0u64..3100) {
            let mut m = BlockMap::default();
            for &fb in &fbs {
                m.set(fb, fb + 1);
            }
            prop_assert_eq!(m.next_mapped(from), fbs.range(from..).next().copied());
            let hole = (from..).find(|f| !fbs.contains(f)).unwrap();
            prop_assert_eq!(m.next_hole(from), hole);
        }
    }

    #[test]
    fn far_offsets_are_sparse() {
        let mut m = BlockMap::default();
        m.set(10 << 20, 5); // 40 GiB into the file
        assert_eq!(m.get(10 << 20), 5);
        assert_eq!(m.get((10 << 20) - 1), 0);
        assert_eq!(m.chunks.len(), 1);
        assert!(m.direct.is_empty());
        m.set(0, 9);
        assert_eq!(m.direct.len(), 1);
        assert_eq!(m.remove_range(0, u64::MAX), vec![9, 5]);
        assert_eq!(m.mapped(), 0);
    }
}
