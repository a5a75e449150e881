//! The prefix tree of `smart` (SmartDedup §3.2, Figure 1): one leaf per fingerprint prefix,
//! shared by the in-memory and the on-media store. A leaf points to the in-memory group (a list
//! of nodes sorted by the mixed fingerprint) and to the on-media group (a chain of blocks holding
//! a sorted array), and links the group into the group-LRU list. Leaves live in chunks of
//! [`CHUNK`] allocated when the first leaf of a chunk is used and freed when its last one empties
//! (a two-level radix tree), so a prefix nobody uses costs one null pointer, and a lookup whose
//! leaf is absent or empty knows without any I/O that the fingerprint is stored nowhere.

/// "No node / no leaf" in the u32 links.
pub(crate) const NIL: u32 = u32::MAX;
/// Leaves per chunk (the second level of the tree).
pub(crate) const CHUNK: usize = 64;

/// One prefix: its in-memory and on-media groups and its place in the group-LRU list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Leaf {
    /// First node of the in-memory group (sorted by mixed fingerprint), [`NIL`] when none.
    pub(crate) mem_head: u32,
    /// Nodes in the in-memory group.
    pub(crate) mem_len: u32,
    /// First block of the on-media group, 0 when the prefix has none.
    pub(crate) disk_head: u64,
    /// Records in the on-media group.
    pub(crate) disk_len: u32,
    /// Blocks in the on-media group's chain.
    pub(crate) disk_blocks: u32,
    /// Group-LRU neighbours (prefixes, [`NIL`] at the ends); only while `mem_len > 0`.
    pub(crate) lru_prev: u32,
    pub(crate) lru_next: u32,
}

impl Leaf {
    /// An unused leaf.
    pub(crate) const EMPTY: Leaf = Leaf {
        mem_head: NIL,
        mem_len: 0,
        disk_head: 0,
        disk_len: 0,
        disk_blocks: 0,
        lru_prev: NIL,
        lru_next: NIL,
    };

    /// True when the prefix holds nothing, in memory or on the medium.
    pub(crate) fn is_empty(&self) -> bool {
        self.mem_len == 0 && self.disk_head == 0
    }
}

type Chunk = Box<[Leaf; CHUNK]>;

/// The tree: `1 << bits` leaves in chunks allocated on demand.
#[derive(Debug)]
pub(crate) struct PrefixTree {
    bits: u32,
    chunks: Vec<Option<Chunk>>,
    live_chunks: usize,
}

impl PrefixTree {
    /// A tree over `bits`-bit prefixes (6 ≤ bits ≤ 26).
    pub(crate) fn new(bits: u32) -> PrefixTree {
        let bits = bits.clamp(6, 26);
        let n = (1usize << bits) / CHUNK;
        PrefixTree {
            bits,
            chunks: (0..n).map(|_| None).collect(),
            live_chunks: 0,
        }
    }

    /// Prefix bits.
    pub(crate) fn bits(&self) -> u32 {
        self.bits
    }

    /// Number of prefixes (leaves the tree can have).
    #[cfg(test)]
    pub(crate) fn prefixes(&self) -> u32 {
        1u32 << self.bits
    }

    /// The prefix of a mixed fingerprint (its top `bits` bits).
    #[inline]
    pub(crate) fn prefix_of(&self, h: u64) -> u32 {
        (h >> (64 - self.bits)) as u32
    }

    /// The leaf of `prefix`, if its chunk exists.
    #[inline]
    pub(crate) fn get(&self, prefix: u32) -> Option<&Leaf> {
        let p = prefix as usize;
        self.chunks.get(p / CHUNK)?.as_ref().map(|c| &c[p % CHUNK])
    }

    /// The leaf of `prefix` for changing, creating its chunk when needed.
    pub(crate) fn get_mut(&mut self, prefix: u32) -> &mut Leaf {
        let p = prefix as usize;
        let slot = &mut self.chunks[p / CHUNK];
        if slot.is_none() {
            *slot = Some(Box::new([Leaf::EMPTY; CHUNK]));
            self.live_chunks += 1;
        }
        match slot {
            Some(c) => &mut c[p % CHUNK],
            None => unreachable!("chunk created above"),
        }
    }

    /// Free the chunk of `prefix` when every leaf in it is empty (called after a leaf emptied).
    pub(crate) fn release_if_empty(&mut self, prefix: u32) {
        let i = prefix as usize / CHUNK;
        if let Some(c) = &self.chunks[i] {
            if c.iter().all(Leaf::is_empty) {
                self.chunks[i] = None;
                self.live_chunks -= 1;
            }
        }
    }

    /// Every non-empty leaf with its prefix, in prefix order.
    pub(crate) fn leaves(&self) -> impl Iterator<Item = (u32, &Leaf)> {
        self.chunks.iter().enumerate().flat_map(|(ci, c)| {
            c.iter().flat_map(move |c| {
                c.iter()
                    .enumerate()
                    .filter(|(_, l)| !l.is_empty())
                    .map(move |(i, l)| ((ci * CHUNK + i) as u32, l))
            })
        })
    }

    /// Heap bytes now: the chunk pointers and the live chunks.
    pub(crate) fn memory_bytes(&self) -> u64 {
        (self.chunks.capacity() * std::mem::size_of::<Option<Chunk>>()
            + self.live_chunks * std::mem::size_of::<[Leaf; CHUNK]>()) as u64
    }

    /// Heap bytes with every chunk allocated (what a budget must leave room for).
    pub(crate) fn max_memory_bytes(bits: u32) -> u64 {
        let bits = bits.clamp(6, 26);
        let n = (1u64 << bits) / CHUNK as u64;
        n * (std::mem::size_of::<Option<Chunk>>() + std::mem::size_of::<[Leaf; CHUNK]>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_are_32_bytes_and_chunks_come_and_go() {
        assert_eq!(std::mem::size_of::<Leaf>(), 32);
        let mut t = PrefixTree::new(10);
        assert_eq!(t.prefixes(), 1024);
        assert_eq!(t.prefix_of(u64::MAX), 1023);
        assert_eq!(t.prefix_of(0), 0);
        assert!(t.get(5).is_none());
        let base = t.memory_bytes();
        t.get_mut(5).mem_len = 1;
        assert!(t.memory_bytes() > base);
        assert_eq!(t.leaves().map(|(p, _)| p).collect::<Vec<_>>(), vec![5]);
        t.get_mut(5).mem_len = 0;
        t.release_if_empty(5);
        assert_eq!(t.memory_bytes(), base);
        assert!(t.get(5).is_none());
        assert!(PrefixTree::max_memory_bytes(10) >= t.memory_bytes());
    }
}
