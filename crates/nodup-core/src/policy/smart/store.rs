//! `smart`'s two-level fingerprint store (SmartDedup §3.2): a prefix tree whose leaves point to
//! an in-memory group and an on-media group of the same prefix. Inline lookups search only the
//! in-memory group ([`FpStore::find`]: a miss costs no I/O); the out-of-line worker also searches
//! the on-media group ([`FpStore::find_deep`]) and promotes the one fingerprint it matched.
//! When the node slab (sized from the budget) is full, the least recently used *group* is
//! evicted whole into its on-media group with one read-merge-write (group LRU); per-fingerprint
//! LRU and CAFTL's reference-count eviction are selectable for comparison (§4.2).
//!
//! Everything here is a finding aid (see `crate::store`): the engine confirms every candidate.
//! Frees are remembered as tombstones (bounded) and applied to the on-media groups in batches
//! or at the next merge of the group; until then a stale record only costs a failed check.
//!
//! Clean shutdown ([`FpStore::save_words`]) merges every in-memory group to the medium and
//! saves the directory of on-media groups in the engine's save area:
//!
//! | word | field                                                        |
//! |-----:|--------------------------------------------------------------|
//! | 0    | magic `NDSMDIR1` (little-endian)                             |
//! | 1    | prefix bits (low 32), number of groups `n` (high 32)         |
//! | 2+2k | group k: prefix (low 32), records (high 32); prefixes ascend |
//! | 3+2k | group k: first block of its chain                            |
//!
//! Opened with other prefix bits (a different budget), the groups are rewritten for the new
//! prefixes in one streaming pass. After a crash the groups are not trusted at all: failure
//! recovery rebuilds them from the entries ([`FpStore::load`]).

use std::collections::HashSet;

use parking_lot::Mutex;

use super::ondisk::{blocks_for, GroupIo, Rec};
use super::slab::{List, Slab, PROVISIONAL};
use super::tree::{Leaf, PrefixTree, NIL};
use crate::index::mix;
use crate::store::FpStore;
use crate::{Error, Result};

crate::named_enum! {
    /// Which in-memory fingerprints make room for a new one (§3.2, §4.2).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
    pub enum Eviction {
        /// The least recently used group, whole (SmartDedup's G-LRU, the default).
        #[default]
        GroupLru = 1 => "group-lru",
        /// The least recently used fingerprint, one at a time (per-fingerprint LRU).
        Lru = 2 => "lru",
        /// The fingerprint with the fewest references (CAFTL's replacement).
        RefCount = 3 => "refcount",
    }
}

/// Directory magic in the save area.
const DIR_MAGIC: u64 = u64::from_le_bytes(*b"NDSMDIR1");
/// Reference-count buckets (counts at or above the last share it).
const BUCKETS: usize = 64;
/// Bytes of the hash set per tombstone slot (record and control byte).
const TOMB_SLOT_BYTES: u64 = 17;

/// Counters of the store (reported by `nodup stats`).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct SmartCounters {
    /// Verified duplicates found in memory (inline).
    pub mem_hits: u64,
    /// Matches found on the medium by the worker.
    pub disk_hits: u64,
    /// Fingerprints moved from the medium to memory on a match.
    pub promotions: u64,
    /// Whole groups evicted (group LRU).
    pub group_evictions: u64,
    /// Fingerprints moved out of memory.
    pub fp_evictions: u64,
    /// Read-merge-writes of on-media groups.
    pub merges: u64,
    /// Tombstone batches applied.
    pub tomb_flushes: u64,
    /// Fingerprints lost to a failed group read or write (no longer found; never wrong).
    pub dropped: u64,
}

struct Inner {
    tree: PrefixTree,
    slab: Slab,
    eviction: Eviction,
    /// Group-LRU list of prefixes with in-memory nodes (head = most recent).
    glru_head: u32,
    glru_tail: u32,
    /// Per-fingerprint recency list (LRU eviction).
    lru: List,
    /// Per-fingerprint reference-count buckets (reference-count eviction).
    buckets: Vec<List>,
    tombs: HashSet<Rec>,
    tomb_max: usize,
    io: Option<GroupIo>,
    /// Records on the medium (sum of the leaves' `disk_len`).
    disk_total: u64,
    st: SmartCounters,
}

/// The store (one mutex: `smart` trades lookup concurrency for a fixed memory footprint).
pub struct SmartStore {
    inner: Mutex<Inner>,
    budget: u64,
}

impl SmartStore {
    /// A store keeping to `budget` bytes with `bits`-bit prefixes, evicting by `eviction`,
    /// with its on-media groups through `io` (none: evicted fingerprints are forgotten).
    pub(crate) fn new(budget: u64, bits: u32, eviction: Eviction, io: Option<GroupIo>) -> Self {
        let tree = PrefixTree::new(bits);
        let tree_max = PrefixTree::max_memory_bytes(tree.bits());
        let fixed = (std::mem::size_of::<Inner>() + BUCKETS * std::mem::size_of::<List>()) as u64;
        // A thirty-second of the budget for tombstones (hash-set slots at 7/8 load).
        let tomb_max = ((budget / 32 / TOMB_SLOT_BYTES) * 7 / 8).clamp(64, 1 << 20) as usize;
        let tombs = HashSet::with_capacity(tomb_max);
        let tomb_bytes = tombs.capacity() as u64 * TOMB_SLOT_BYTES;
        let node = std::mem::size_of::<super::slab::Node>() as u64;
        let nodes =
            (budget.saturating_sub(tree_max + fixed + tomb_bytes) / node).clamp(64, 1 << 31);
        SmartStore {
            inner: Mutex::new(Inner {
                tree,
                slab: Slab::with_capacity(nodes as u32),
                eviction,
                glru_head: NIL,
                glru_tail: NIL,
                lru: List::default(),
                buckets: vec![List::default(); BUCKETS],
                tombs,
                tomb_max,
                io,
                disk_total: 0,
                st: SmartCounters::default(),
            }),
            budget,
        }
    }

    /// Prefix bits of the tree.
    pub fn prefix_bits(&self) -> u32 {
        self.inner.lock().tree.bits()
    }

    /// In-memory fingerprints the slab can hold.
    pub fn node_capacity(&self) -> u64 {
        let g = self.inner.lock();
        (g.slab.memory_bytes() / std::mem::size_of::<super::slab::Node>() as u64).max(1)
    }

    /// Counters so far.
    pub fn counters(&self) -> SmartCounters {
        self.inner.lock().st.clone()
    }

    /// Fingerprints in memory and records on the medium.
    pub fn held(&self) -> (u64, u64) {
        let g = self.inner.lock();
        (g.slab.live() as u64, g.disk_total)
    }
}

impl Inner {
    fn leaf(&self, p: u32) -> Leaf {
        self.tree.get(p).copied().unwrap_or(Leaf::EMPTY)
    }

    /// The in-memory node holding `(h, loc)`, if any.
    fn node_of(&self, p: u32, h: u64, loc: u64) -> Option<u32> {
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
    fn mem_candidates(&self, h: u64) -> Vec<u64> {
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

    fn glru_unlink(&mut self, p: u32) {
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

    fn glru_front(&mut self, p: u32) {
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

    fn bucket_of(refs: u32) -> usize {
        ((refs & !PROVISIONAL) as usize).min(BUCKETS - 1)
    }

    /// Take node `i` out of the per-fingerprint list it is in.
    fn fp_list_unlink(&mut self, i: u32) {
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
    fn fp_list_front(&mut self, i: u32) {
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
    fn touch(&mut self, h: u64, loc: u64) {
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
    fn insert(&mut self, h: u64, loc: u64, provisional: bool) {
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
    fn drop_node(&mut self, p: u32, i: u32) {
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
    fn evict_one(&mut self) -> bool {
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
                self.merge_to_disk(p, vec![(n.h, n.loc)]);
                true
            }
        }
    }

    /// Move every in-memory fingerprint of `p` to its on-media group.
    fn evict_group(&mut self, p: u32) {
        let mut recs = Vec::with_capacity(self.leaf(p).mem_len as usize);
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
        self.merge_to_disk(p, recs);
    }

    /// Read the on-media group of `p` (empty when none; a damaged one is dropped and its
    /// fingerprints counted lost). Returns records and chain.
    fn read_disk(&mut self, p: u32) -> (Vec<Rec>, Vec<u64>) {
        let l = self.leaf(p);
        let bits = self.tree.bits();
        let Some(io) = self.io.as_mut() else {
            return (Vec::new(), Vec::new());
        };
        if l.disk_head == 0 {
            return (Vec::new(), Vec::new());
        }
        match io.read(bits, p, l.disk_head, l.disk_len, l.disk_blocks) {
            Ok(g) => (g.recs, g.chain),
            Err(_) => {
                // Its blocks stay allocated (their chain is not trustworthy) until the next
                // failure recovery or fsck --repair rebuilds the allocator.
                io.errors += 1;
                self.st.dropped += l.disk_len as u64;
                self.set_disk(p, &[], 0);
                (Vec::new(), Vec::new())
            }
        }
    }

    fn set_disk(&mut self, p: u32, chain: &[u64], len: u32) {
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
    /// tombstones of `p` on the way.
    fn merge_to_disk(&mut self, p: u32, add: Vec<Rec>) {
        if self.io.is_none() {
            self.st.dropped += add.len() as u64;
            return;
        }
        let (mut recs, chain) = self.read_disk(p);
        if !self.tombs.is_empty() {
            let tombs = &mut self.tombs;
            recs.retain(|r| !tombs.remove(r));
        }
        recs.extend(add);
        recs.sort_unstable();
        recs.dedup();
        self.write_disk(p, chain, &recs);
    }

    fn write_disk(&mut self, p: u32, chain: Vec<u64>, recs: &[Rec]) {
        self.st.merges += 1;
        let Some(io) = self.io.as_mut() else {
            return;
        };
        match io.write(p, chain, recs) {
            Ok(c) => self.set_disk(p, &c, recs.len() as u32),
            Err(_) => {
                io.errors += 1;
                self.st.dropped += recs.len() as u64;
                self.set_disk(p, &[], 0);
            }
        }
    }

    /// Apply every tombstone to the on-media groups (one read-merge-write per group touched).
    fn flush_tombs(&mut self) {
        if self.tombs.is_empty() {
            return;
        }
        let mut prefixes: Vec<u32> = self
            .tombs
            .iter()
            .map(|r| self.tree.prefix_of(r.0))
            .collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        for p in prefixes {
            if self.leaf(p).disk_head != 0 {
                self.merge_to_disk(p, Vec::new());
            }
        }
        self.tombs.clear();
        self.st.tomb_flushes += 1;
    }

    /// Rewrite the groups saved with `old_bits` for this tree's prefixes, streaming in
    /// fingerprint order (prefix order is fingerprint order for both widths).
    fn rebucket(&mut self, old_bits: u32, groups: &[(u32, u32, u64)]) {
        let bits = self.tree.bits();
        let mut cur: Option<u32> = None;
        let mut buf: Vec<Rec> = Vec::new();
        for &(op, len, head) in groups {
            let Some(io) = self.io.as_mut() else { return };
            let g = match io.read(old_bits, op, head, len, blocks_for(len as usize) as u32) {
                Ok(g) => g,
                Err(_) => {
                    io.errors += 1;
                    self.st.dropped += len as u64;
                    continue;
                }
            };
            io.give_back(&g.chain);
            for r in g.recs {
                let np = (r.0 >> (64 - bits)) as u32;
                if cur != Some(np) {
                    if let Some(cp) = cur {
                        let recs = std::mem::take(&mut buf);
                        self.write_disk(cp, Vec::new(), &recs);
                    }
                    cur = Some(np);
                }
                buf.push(r);
            }
        }
        if let Some(cp) = cur {
            self.write_disk(cp, Vec::new(), &buf);
        }
    }

    fn memory_bytes(&self) -> u64 {
        (std::mem::size_of::<Inner>() + self.buckets.capacity() * std::mem::size_of::<List>())
            as u64
            + self.tree.memory_bytes()
            + self.slab.memory_bytes()
            + self.tombs.capacity() as u64 * TOMB_SLOT_BYTES
    }
}

impl FpStore for SmartStore {
    fn find(&self, fp: u64, check: &mut dyn FnMut(u64) -> bool) -> Option<u64> {
        let cands = self.inner.lock().mem_candidates(mix(fp));
        cands.into_iter().find(|&loc| check(loc))
    }

    fn find_deep(&self, fp: u64, check: &mut dyn FnMut(u64) -> bool, promote: bool) -> Option<u64> {
        if let Some(l) = self.find(fp, check) {
            return Some(l);
        }
        let h = mix(fp);
        let cands: Vec<u64> = {
            let mut g = self.inner.lock();
            let p = g.tree.prefix_of(h);
            let (recs, _) = g.read_disk(p);
            let from = recs.partition_point(|r| r.0 < h);
            recs[from..]
                .iter()
                .take_while(|r| r.0 == h)
                .filter(|r| !g.tombs.contains(r))
                .map(|r| r.1)
                .collect()
        };
        let loc = cands.into_iter().find(|&loc| check(loc))?;
        let mut g = self.inner.lock();
        g.st.disk_hits += 1;
        if promote {
            g.st.promotions += 1;
            g.insert(h, loc, false);
        }
        Some(loc)
    }

    fn insert(&self, fp: u64, loc: u64) {
        self.inner.lock().insert(mix(fp), loc, true);
    }

    fn needs_recheck(&self, fp: u64, loc: u64) -> bool {
        let h = mix(fp);
        let g = self.inner.lock();
        let p = g.tree.prefix_of(h);
        g.node_of(p, h, loc)
            .is_some_and(|i| g.slab.get(i).refs & PROVISIONAL != 0)
    }

    fn confirm(&self, fp: u64, loc: u64) {
        let h = mix(fp);
        let mut g = self.inner.lock();
        let p = g.tree.prefix_of(h);
        if let Some(i) = g.node_of(p, h, loc) {
            g.slab.get_mut(i).refs &= !PROVISIONAL;
        }
    }

    fn remove(&self, fp: u64, loc: u64) {
        let h = mix(fp);
        let mut g = self.inner.lock();
        let p = g.tree.prefix_of(h);
        if let Some(i) = g.node_of(p, h, loc) {
            g.drop_node(p, i);
        }
        if g.leaf(p).disk_head != 0 {
            g.tombs.insert((h, loc));
            if g.tombs.len() >= g.tomb_max {
                g.flush_tombs();
            }
        }
    }

    fn on_hit(&self, fp: u64, loc: u64) {
        let mut g = self.inner.lock();
        g.st.mem_hits += 1;
        g.touch(mix(fp), loc);
    }

    fn on_release(&self, fp: u64, loc: u64, refs: u64) {
        let mut g = self.inner.lock();
        if g.eviction != Eviction::RefCount {
            return;
        }
        let h = mix(fp);
        let p = g.tree.prefix_of(h);
        if let Some(i) = g.node_of(p, h, loc) {
            g.fp_list_unlink(i);
            let flag = g.slab.get(i).refs & PROVISIONAL;
            g.slab.get_mut(i).refs = refs.min(!PROVISIONAL as u64) as u32 | flag;
            g.fp_list_front(i);
        }
    }

    /// Failure recovery's rebuild: every on-media group written anew from the entries (memory
    /// starts empty and warms up with use, as after any open).
    fn load(&self, pairs: &[(u64, u64)]) {
        let mut g = self.inner.lock();
        let mut recs: Vec<Rec> = pairs.iter().map(|&(fp, loc)| (mix(fp), loc)).collect();
        recs.sort_unstable();
        recs.dedup();
        let mut s = 0;
        while s < recs.len() {
            let p = g.tree.prefix_of(recs[s].0);
            let e = s + recs[s..].partition_point(|r| g.tree.prefix_of(r.0) == p);
            g.write_disk(p, Vec::new(), &recs[s..e]);
            s = e;
        }
    }

    fn save_words(&self) -> Result<Option<Vec<u64>>> {
        let mut g = self.inner.lock();
        let resident: Vec<u32> = g
            .tree
            .leaves()
            .filter(|(_, l)| l.mem_len > 0)
            .map(|(p, _)| p)
            .collect();
        for p in resident {
            g.evict_group(p);
        }
        g.flush_tombs();
        if let Some(io) = g.io.as_ref() {
            io.fence()?;
        }
        let groups: Vec<(u32, Leaf)> = g
            .tree
            .leaves()
            .filter(|(_, l)| l.disk_head != 0)
            .map(|(p, l)| (p, *l))
            .collect();
        let mut w = Vec::with_capacity(2 + 2 * groups.len());
        w.push(DIR_MAGIC);
        w.push(g.tree.bits() as u64 | (groups.len() as u64) << 32);
        for (p, l) in groups {
            w.push(p as u64 | (l.disk_len as u64) << 32);
            w.push(l.disk_head);
        }
        Ok(Some(w))
    }

    fn restore_words(&self, w: &[u64]) -> Result<()> {
        let bad = |m: &str| Error::Corrupt(format!("save area: smart directory: {m}"));
        if w.len() < 2 || w[0] != DIR_MAGIC {
            return Err(bad("bad magic"));
        }
        let old_bits = (w[1] & 0xffff_ffff) as u32;
        let n = (w[1] >> 32) as usize;
        if !(6..=26).contains(&old_bits) || n > 1 << old_bits || w.len() != 2 + 2 * n {
            return Err(bad("sizes out of range"));
        }
        let mut g = self.inner.lock();
        let mut groups = Vec::with_capacity(n);
        let mut last: Option<u32> = None;
        for k in 0..n {
            let (a, head) = (w[2 + 2 * k], w[3 + 2 * k]);
            let (p, len) = ((a & 0xffff_ffff) as u32, (a >> 32) as u32);
            let ok_block = g.io.as_ref().is_some_and(|io| io.valid_block(head));
            if p >= 1 << old_bits || last.is_some_and(|l| l >= p) || len == 0 || !ok_block {
                return Err(bad("group out of order, empty, or naming a free block"));
            }
            last = Some(p);
            groups.push((p, len, head));
        }
        if old_bits == g.tree.bits() {
            for (p, len, head) in groups {
                let l = g.tree.get_mut(p);
                l.disk_head = head;
                l.disk_len = len;
                l.disk_blocks = blocks_for(len as usize) as u32;
                g.disk_total += len as u64;
            }
        } else {
            g.rebucket(old_bits, &groups);
        }
        Ok(())
    }

    fn locations(&self) -> Vec<u64> {
        Vec::new()
    }

    fn len(&self) -> u64 {
        let g = self.inner.lock();
        g.slab.live() as u64 + g.disk_total
    }

    fn memory_bytes(&self) -> u64 {
        self.inner.lock().memory_bytes()
    }

    fn budget(&self) -> Option<u64> {
        Some(self.budget)
    }

    fn complete(&self) -> bool {
        false
    }

    fn exact_len(&self) -> bool {
        false
    }

    fn owned_blocks(&self) -> u64 {
        let g = self.inner.lock();
        g.tree.leaves().map(|(_, l)| l.disk_blocks as u64).sum()
    }

    fn clear(&self) {
        let mut g = self.inner.lock();
        g.tree.clear();
        g.slab.clear();
        g.glru_head = NIL;
        g.glru_tail = NIL;
        g.lru = List::default();
        for b in g.buckets.iter_mut() {
            *b = List::default();
        }
        g.tombs.clear();
        g.disk_total = 0;
    }

    fn report(&self) -> Option<serde_json::Value> {
        let g = self.inner.lock();
        let (read, written, errors) =
            g.io.as_ref()
                .map_or((0, 0, 0), |io| (io.read_bytes, io.written_bytes, io.errors));
        Some(serde_json::json!({
            "eviction": g.eviction.name(),
            "prefix_bits": g.tree.bits(),
            "budget_bytes": self.budget,
            "memory": {
                "tree_bytes": g.tree.memory_bytes(),
                "nodes_bytes": g.slab.memory_bytes(),
                "tombstones_bytes": g.tombs.capacity() as u64 * TOMB_SLOT_BYTES,
                "total_bytes": g.memory_bytes(),
            },
            "fingerprints_in_memory": g.slab.live(),
            "node_capacity": g.slab.memory_bytes() / std::mem::size_of::<super::slab::Node>() as u64,
            "fingerprints_on_media": g.disk_total,
            "media_groups": g.tree.leaves().filter(|(_, l)| l.disk_head != 0).count(),
            "tombstones": g.tombs.len(),
            "store_io_read_bytes": read,
            "store_io_written_bytes": written,
            "store_io_errors": errors,
            "counters": g.st,
        }))
    }
}
