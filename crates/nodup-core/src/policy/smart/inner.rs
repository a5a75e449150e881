//! The state behind `smart`'s store mutex (`store.rs`): the prefix tree, the node slab, the
//! eviction lists, the tombstones and the group I/O, with the operations on them — insertion
//! with eviction, group and fingerprint eviction, and the read-merge-write of on-media groups.

use std::collections::HashSet;

use super::ondisk::{blocks_for, GroupIo, GroupWriter, MergeBuf, MergeError, OldGroup, Rec};
use super::slab::{List, Slab, PROVISIONAL};
use super::store::{Eviction, SmartCounters};
use super::tree::{Leaf, PrefixTree, NIL};

/// Reference-count buckets (counts at or above the last share it).
pub(super) const BUCKETS: usize = 64;
/// Bytes of the hash set per tombstone slot (record and control byte).
pub(super) const TOMB_SLOT_BYTES: u64 = 17;

pub(super) struct Inner {
    pub(super) tree: PrefixTree,
    pub(super) slab: Slab,
    pub(super) eviction: Eviction,
    /// Group-LRU list of prefixes with in-memory nodes (head = most recent).
    pub(super) glru_head: u32,
    pub(super) glru_tail: u32,
    /// Per-fingerprint recency list (LRU eviction).
    pub(super) lru: List,
    /// Per-fingerprint reference-count buckets (reference-count eviction).
    pub(super) buckets: Vec<List>,
    pub(super) tombs: HashSet<Rec>,
    pub(super) tomb_max: usize,
    /// Bytes of the tombstone set's table, fixed at creation: it is flushed before it would
    /// grow (its `capacity()` shrinks as deleted slots use up room, its table does not).
    pub(super) tomb_bytes: u64,
    pub(super) io: Option<GroupIo>,
    /// Reused buffers of the read-merge-write, kept from open (buffers allocated per merge, in
    /// whichever thread evicts, left free chunks in every thread's malloc arena): the streaming
    /// merge's queue and output block, and the records an eviction moves (both grow only with
    /// the largest in-memory group, which the budget bounds); the prefixes a tombstone flush
    /// visits (sized for the most tombstones, counted with them).
    pub(super) merge: MergeBuf,
    pub(super) evicted: Vec<Rec>,
    pub(super) prefixes: Vec<u32>,
    /// Records on the medium (sum of the leaves' `disk_len`).
    pub(super) disk_total: u64,
    pub(super) st: SmartCounters,
}

impl Inner {
    pub(super) fn leaf(&self, p: u32) -> Leaf {
        self.tree.get(p).copied().unwrap_or(Leaf::EMPTY)
    }

    /// The in-memory node holding `(h, loc)`, if any.
    pub(super) fn node_of(&self, p: u32, h: u64, loc: u64) -> Option<u32> {
        let mut i = self.leaf(p).mem_head;
        while i != NIL {
            let n = self.slab.get(i);
            if n.h > h {
                break;
            }
            if n.h == h && n.loc == loc {
                return Some(i);
            }
            i = n.gnext;
        }
        None
    }

    /// Locations of the in-memory nodes of `h`.
    pub(super) fn mem_candidates(&self, h: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut i = self.leaf(self.tree.prefix_of(h)).mem_head;
        while i != NIL {
            let n = self.slab.get(i);
            if n.h > h {
                break;
            }
            if n.h == h {
                out.push(n.loc);
            }
            i = n.gnext;
        }
        out
    }

    pub(super) fn glru_unlink(&mut self, p: u32) {
        let l = self.leaf(p);
        if l.lru_prev != NIL {
            self.tree.get_mut(l.lru_prev).lru_next = l.lru_next;
        } else if self.glru_head == p {
            self.glru_head = l.lru_next;
        }
        if l.lru_next != NIL {
            self.tree.get_mut(l.lru_next).lru_prev = l.lru_prev;
        } else if self.glru_tail == p {
            self.glru_tail = l.lru_prev;
        }
        let m = self.tree.get_mut(p);
        m.lru_prev = NIL;
        m.lru_next = NIL;
    }

    pub(super) fn glru_front(&mut self, p: u32) {
        if self.glru_head == p {
            return;
        }
        self.glru_unlink(p);
        let old = self.glru_head;
        {
            let m = self.tree.get_mut(p);
            m.lru_prev = NIL;
            m.lru_next = old;
        }
        if old != NIL {
            self.tree.get_mut(old).lru_prev = p;
        } else {
            self.glru_tail = p;
        }
        self.glru_head = p;
    }

    pub(super) fn bucket_of(refs: u32) -> usize {
        ((refs & !PROVISIONAL) as usize).min(BUCKETS - 1)
    }

    /// Take node `i` out of the per-fingerprint list it is in.
    pub(super) fn fp_list_unlink(&mut self, i: u32) {
        match self.eviction {
            Eviction::GroupLru => {}
            Eviction::Lru => self.slab.unlink(&mut self.lru, i),
            Eviction::RefCount => {
                let b = Self::bucket_of(self.slab.get(i).refs);
                self.slab.unlink(&mut self.buckets[b], i);
            }
        }
    }

    /// Put node `i` where its eviction policy wants a fresh or touched fingerprint.
    pub(super) fn fp_list_front(&mut self, i: u32) {
        match self.eviction {
            Eviction::GroupLru => {}
            Eviction::Lru => self.slab.push_front(&mut self.lru, i),
            Eviction::RefCount => {
                let b = Self::bucket_of(self.slab.get(i).refs);
                self.slab.push_front(&mut self.buckets[b], i);
            }
        }
    }

    /// A verified match on the node of `(h, loc)`: recency or count goes up.
    pub(super) fn touch(&mut self, h: u64, loc: u64) {
        let p = self.tree.prefix_of(h);
        let Some(i) = self.node_of(p, h, loc) else {
            return;
        };
        match self.eviction {
            Eviction::GroupLru => self.glru_front(p),
            Eviction::Lru => {
                self.slab.unlink(&mut self.lru, i);
                self.slab.push_front(&mut self.lru, i);
            }
            Eviction::RefCount => {
                self.fp_list_unlink(i);
                let n = self.slab.get_mut(i);
                let flag = n.refs & PROVISIONAL;
                n.refs = ((n.refs & !PROVISIONAL) + 1).min(!PROVISIONAL) | flag;
                self.fp_list_front(i);
            }
        }
    }

    /// Insert `(h, loc)` into memory (`provisional`: created by an inline miss), evicting
    /// first when the slab is full.
    pub(super) fn insert(&mut self, h: u64, loc: u64, provisional: bool) {
        self.tombs.remove(&(h, loc));
        let p = self.tree.prefix_of(h);
        if self.node_of(p, h, loc).is_some() {
            return;
        }
        while self.slab.is_full() {
            if !self.evict_one() {
                break;
            }
        }
        let Some(i) = self.slab.alloc(h, loc) else {
            self.st.dropped += 1;
            return;
        };
        self.slab.get_mut(i).refs = 1 | if provisional { PROVISIONAL } else { 0 };
        // Link into the group, ascending by h.
        let mut prev = NIL;
        let mut cur = self.leaf(p).mem_head;
        while cur != NIL && self.slab.get(cur).h < h {
            prev = cur;
            cur = self.slab.get(cur).gnext;
        }
        self.slab.get_mut(i).gnext = cur;
        if prev == NIL {
            self.tree.get_mut(p).mem_head = i;
        } else {
            self.slab.get_mut(prev).gnext = i;
        }
        self.tree.get_mut(p).mem_len += 1;
        match self.eviction {
            Eviction::GroupLru => self.glru_front(p),
            _ => self.fp_list_front(i),
        }
    }

    /// Unlink node `i` of prefix `p` from its group and lists and free it.
    pub(super) fn drop_node(&mut self, p: u32, i: u32) {
        let mut prev = NIL;
        let mut cur = self.leaf(p).mem_head;
        while cur != NIL && cur != i {
            prev = cur;
            cur = self.slab.get(cur).gnext;
        }
        if cur != i {
            return;
        }
        let next = self.slab.get(i).gnext;
        if prev == NIL {
            self.tree.get_mut(p).mem_head = next;
        } else {
            self.slab.get_mut(prev).gnext = next;
        }
        self.fp_list_unlink(i);
        self.slab.free(i);
        let l = self.tree.get_mut(p);
        l.mem_len -= 1;
        if l.mem_len == 0 && self.eviction == Eviction::GroupLru {
            self.glru_unlink(p);
        }
        if self.leaf(p).is_empty() {
            self.tree.release_if_empty(p);
        }
    }

    /// Make room for one fingerprint; false when memory holds nothing to evict.
    pub(super) fn evict_one(&mut self) -> bool {
        match self.eviction {
            Eviction::GroupLru => {
                let p = self.glru_tail;
                if p == NIL {
                    return false;
                }
                self.st.group_evictions += 1;
                self.evict_group(p);
                true
            }
            Eviction::Lru | Eviction::RefCount => {
                let i = if self.eviction == Eviction::Lru {
                    self.lru.tail
                } else {
                    self.buckets
                        .iter()
                        .find(|l| l.tail != NIL)
                        .map_or(NIL, |l| l.tail)
                };
                if i == NIL {
                    return false;
                }
                let n = *self.slab.get(i);
                let p = self.tree.prefix_of(n.h);
                self.drop_node(p, i);
                self.st.fp_evictions += 1;
                self.merge_to_disk(p, &[(n.h, n.loc)]);
                true
            }
        }
    }

    /// Move every in-memory fingerprint of `p` to its on-media group.
    pub(super) fn evict_group(&mut self, p: u32) {
        let mut recs = std::mem::take(&mut self.evicted);
        recs.clear();
        let mut i = self.leaf(p).mem_head;
        while i != NIL {
            let n = *self.slab.get(i);
            recs.push((n.h, n.loc));
            let next = n.gnext;
            self.fp_list_unlink(i);
            self.slab.free(i);
            i = next;
        }
        if self.eviction == Eviction::GroupLru {
            self.glru_unlink(p);
        }
        {
            let l = self.tree.get_mut(p);
            l.mem_head = NIL;
            l.mem_len = 0;
        }
        self.st.fp_evictions += recs.len() as u64;
        recs.sort_unstable();
        self.merge_to_disk(p, &recs);
        self.evicted = recs;
    }

    /// Forget the on-media group of `p` after it failed validation (the error already noted):
    /// its fingerprints are counted lost but for the `deleted` ones (a merge met their
    /// tombstones before the damage), and its blocks stay allocated (their chain is not
    /// trustworthy) until the next failure recovery or fsck --repair rebuilds the allocator.
    fn drop_disk(&mut self, p: u32, deleted: u64) {
        self.st.dropped += (self.leaf(p).disk_len as u64).saturating_sub(deleted);
        self.set_disk(p, &[], 0);
    }

    /// Locations of the on-media records of `h` not yet tombstoned, reading only as far along
    /// the group's chain as `h` can be (a damaged group is dropped, [`Inner::drop_disk`]).
    pub(super) fn disk_candidates(&mut self, h: u64) -> Vec<u64> {
        match self.search_disk(h) {
            Ok(out) => out,
            Err((p, e)) => {
                if let Some(io) = self.io.as_mut() {
                    io.note(&e);
                }
                self.drop_disk(p, 0);
                Vec::new()
            }
        }
    }

    /// Locations of `h` in its on-media group, tombstoned ones left out; a damaged group is
    /// an error naming its prefix (the caller decides whether to drop it).
    pub(super) fn search_disk(&mut self, h: u64) -> Result<Vec<u64>, (u32, crate::Error)> {
        let p = self.tree.prefix_of(h);
        let l = self.leaf(p);
        let bits = self.tree.bits();
        let mut out = Vec::new();
        let Some(io) = self.io.as_mut() else {
            return Ok(out);
        };
        if l.disk_head == 0 {
            return Ok(out);
        }
        io.find(bits, p, l.disk_head, l.disk_blocks, h, &mut out)
            .map_err(|e| (p, e))?;
        out.retain(|&loc| !self.tombs.contains(&(h, loc)));
        Ok(out)
    }

    /// Run `f` without counting its group I/O as the store's (checks and audits).
    pub(super) fn uncounted<T>(&mut self, f: impl FnOnce(&mut Inner) -> T) -> T {
        let saved = self.io.as_ref().map(|io| (io.read_bytes, io.errors));
        let r = f(self);
        if let (Some(io), Some((read, errors))) = (self.io.as_mut(), saved) {
            (io.read_bytes, io.errors) = (read, errors);
        }
        r
    }

    /// Every in-memory group merged to the medium and the tombstones applied (clean shutdown,
    /// and before the groups are rewritten for another prefix width).
    pub(super) fn merge_all_to_media(&mut self) {
        let resident: Vec<u32> = self
            .tree
            .leaves()
            .filter(|(_, l)| l.mem_len > 0)
            .map(|(p, _)| p)
            .collect();
        for p in resident {
            self.evict_group(p);
        }
        self.flush_tombs();
    }

    /// Every prefix with an on-media group, with its leaf.
    pub(super) fn media_groups(&self) -> Vec<(u32, Leaf)> {
        self.tree
            .leaves()
            .filter(|(_, l)| l.disk_head != 0)
            .map(|(p, l)| (p, *l))
            .collect()
    }

    pub(super) fn set_disk(&mut self, p: u32, chain: &[u64], len: u32) {
        let old = self.leaf(p).disk_len as u64;
        self.disk_total = self.disk_total - old + len as u64;
        let l = self.tree.get_mut(p);
        l.disk_head = chain.first().copied().unwrap_or(0);
        l.disk_len = len;
        l.disk_blocks = chain.len() as u32;
        if self.leaf(p).is_empty() {
            self.tree.release_if_empty(p);
        }
    }

    /// Read-merge-write: merge `add` (sorted) into the on-media group of `p`, applying the
    /// tombstones of `p` on the way (streamed block by block, `ondisk/merge.rs`).
    pub(super) fn merge_to_disk(&mut self, p: u32, add: &[Rec]) {
        let bits = self.tree.bits();
        let l = self.leaf(p);
        let Some(io) = self.io.as_mut() else {
            self.st.dropped += add.len() as u64;
            return;
        };
        self.st.merges += 1;
        let old = (l.disk_head != 0).then_some(OldGroup {
            head: l.disk_head,
            len: l.disk_len,
            nblocks: l.disk_blocks,
        });
        let mut buf = std::mem::take(&mut self.merge);
        let tombs_before = self.tombs.len();
        let r = io.merge(bits, p, old, add, &mut self.tombs, &mut buf);
        // Records the merge found tombstoned (and took the tombstones out for) were deleted,
        // not lost, whatever happened after.
        let deleted = (tombs_before - self.tombs.len()) as u64;
        match r {
            Ok(len) => self.set_disk(p, &buf.chain, len),
            Err(MergeError::Damaged(e)) => {
                // As a whole-group read that fails: the group is forgotten, the records added
                // make a new one.
                io.note(&e);
                self.drop_disk(p, deleted);
                let mut chain = std::mem::take(&mut buf.chain);
                chain.clear();
                self.store_group(p, &mut chain, add);
                buf.chain = chain;
            }
            Err(MergeError::Failed(e)) => {
                io.note(&e);
                self.st.dropped += (l.disk_len as u64).saturating_sub(deleted) + add.len() as u64;
                self.set_disk(p, &[], 0);
            }
        }
        self.merge = buf;
    }

    /// Write `recs` as the group of `p` over `chain` (its current blocks; the new chain on
    /// return), dropping the group when the write fails.
    pub(super) fn write_disk(&mut self, p: u32, chain: &mut Vec<u64>, recs: &[Rec]) {
        self.st.merges += 1;
        self.store_group(p, chain, recs);
    }

    /// [`Inner::write_disk`] without counting a merge.
    fn store_group(&mut self, p: u32, chain: &mut Vec<u64>, recs: &[Rec]) {
        let Some(io) = self.io.as_mut() else {
            return;
        };
        match io.write(p, chain, recs) {
            Ok(()) => self.set_disk(p, chain, recs.len() as u32),
            Err(e) => {
                io.note(&e);
                self.st.dropped += recs.len() as u64;
                self.set_disk(p, &[], 0);
            }
        }
    }

    /// Apply every tombstone to the on-media groups (one read-merge-write per group touched).
    pub(super) fn flush_tombs(&mut self) {
        if self.tombs.is_empty() {
            return;
        }
        let mut prefixes = std::mem::take(&mut self.prefixes);
        prefixes.clear();
        prefixes.extend(self.tombs.iter().map(|r| self.tree.prefix_of(r.0)));
        prefixes.sort_unstable();
        prefixes.dedup();
        for &p in &prefixes {
            if self.leaf(p).disk_head != 0 {
                self.merge_to_disk(p, &[]);
            }
        }
        self.prefixes = prefixes;
        // Merges took the applied tombstones out one by one, which may leave deleted slots that
        // `clear` (a no-op on an empty set) does not reset: a fresh table of the same size
        // gives the set its full room back.
        if self.tombs.is_empty() && self.tombs.capacity() < self.tomb_max {
            self.tombs = HashSet::new();
            self.tombs.reserve(self.tomb_max);
        }
        self.tombs.clear();
        self.st.tomb_flushes += 1;
    }

    /// Rewrite every on-media group for `bits`-bit prefixes (the tree takes that width),
    /// streaming in fingerprint order (prefix order is fingerprint order for both widths;
    /// `ondisk/stream.rs`). An old group's blocks go back once it has been read; a damaged one
    /// keeps what its validated blocks held.
    pub(super) fn rebucket(&mut self, bits: u32) {
        let old_bits = self.tree.bits();
        let groups = self.media_groups();
        self.tree = PrefixTree::new(bits);
        self.disk_total = 0;
        // Taken out so that finished groups can be recorded while blocks are read through it.
        let Some(mut io) = self.io.take() else {
            return;
        };
        let bits = self.tree.bits();
        let mut w: Option<GroupWriter> = None;
        for (op, l) in groups {
            let (len, head) = (l.disk_len, l.disk_head);
            let nb = blocks_for(len as usize) as u32;
            let mut got = 0u64;
            let read = io.read_each(old_bits, op, head, nb, |io, recs| {
                for &r in recs {
                    let np = (r.0 >> (64 - bits)) as u32;
                    if let Some(done) = w.take_if(|w| w.prefix() != np) {
                        self.finish_group(io, done);
                    }
                    w.get_or_insert_with(|| GroupWriter::new(np)).push(io, r);
                    got += 1;
                }
            });
            match read {
                Ok(chain) if got == len as u64 => io.give_back(&chain),
                Ok(chain) => {
                    // Validated blocks, a directory that disagrees: the records are kept.
                    io.note(&crate::Error::Corrupt(format!(
                        "fingerprint group {op}: {got} records, expected {len}"
                    )));
                    self.st.dropped += (len as u64).saturating_sub(got);
                    io.give_back(&chain);
                }
                Err(e) => {
                    io.note(&e);
                    self.st.dropped += (len as u64).saturating_sub(got);
                }
            }
        }
        if let Some(done) = w.take() {
            self.finish_group(&mut io, done);
        }
        self.io = Some(io);
    }

    /// Record a group [`Inner::rebucket`] wrote (or count its records lost).
    fn finish_group(&mut self, io: &mut GroupIo, w: GroupWriter) {
        self.st.merges += 1;
        let p = w.prefix();
        match w.finish(io) {
            Ok((chain, len)) => self.set_disk(p, &chain, len),
            Err((e, lost)) => {
                io.note(&e);
                self.st.dropped += lost as u64;
            }
        }
    }

    /// Capacity of the reused merge buffers and the block buffer of the group I/O (they count
    /// against the budget's transient share).
    pub(super) fn scratch_bytes(&self) -> u64 {
        let block = self.io.as_ref().map_or(0, |_| crate::BLOCK_SIZE) as u64;
        block + self.merge.bytes() + (self.evicted.capacity() * std::mem::size_of::<Rec>()) as u64
    }

    pub(super) fn memory_bytes(&self) -> u64 {
        (std::mem::size_of::<Inner>() + self.buckets.capacity() * std::mem::size_of::<List>())
            as u64
            + self.tree.memory_bytes()
            + self.slab.memory_bytes()
            + self.tomb_bytes
    }
}
