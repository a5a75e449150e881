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
//! prefixes in one streaming pass once the image is opened for writing
//! ([`FpStore::begin_writes`]; a read-only open keeps the saved width). After a crash the
//! groups are not trusted at all: failure recovery rebuilds them from the entries
//! ([`FpStore::load`]).

use std::collections::HashSet;

use parking_lot::Mutex;

use super::inner::{Inner, BUCKETS, TOMB_SLOT_BYTES};
use super::ondisk::{blocks_for, Group, GroupIo, MergeBuf, Rec, PER_BLOCK};
use super::slab::{List, Slab, PROVISIONAL};
use super::tree::{PrefixTree, NIL};
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
/// Damaged groups [`FpStore::check_media`] describes one by one (the rest are counted).
const MAX_GROUP_MESSAGES: usize = 16;

const DIR_MAGIC: u64 = u64::from_le_bytes(*b"NDSMDIR1");

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

/// The store (one mutex: `smart` trades lookup concurrency for a fixed memory footprint).
pub struct SmartStore {
    inner: Mutex<Inner>,
    budget: u64,
    /// Prefix bits the budget gives (the tree has others between a restore of groups saved
    /// with another width and [`FpStore::begin_writes`]).
    bits: u32,
}

impl SmartStore {
    /// A store keeping to `budget` bytes with `bits`-bit prefixes, evicting by `eviction`,
    /// with its on-media groups through `io` (none: evicted fingerprints are forgotten);
    /// [`Error::NoMemory`] when this machine cannot reserve the budget's node slab.
    pub(crate) fn new(
        budget: u64,
        bits: u32,
        eviction: Eviction,
        io: Option<GroupIo>,
    ) -> Result<Self> {
        let tree = PrefixTree::new(bits);
        let bits = tree.bits();
        let tree_max = PrefixTree::max_memory_bytes(tree.bits());
        let fixed = (std::mem::size_of::<Inner>() + BUCKETS * std::mem::size_of::<List>()) as u64;
        // A thirty-second of the budget for tombstones (hash-set slots at 7/8 load).
        let tomb_max = ((budget / 32 / TOMB_SLOT_BYTES) * 7 / 8).clamp(64, 1 << 20) as usize;
        let tombs = HashSet::with_capacity(tomb_max);
        // The table behind the set: std's hash set holds 7/8 of its power-of-two slot count,
        // each slot a record and a control byte, plus one group of trailing control bytes.
        let slots = (tombs.capacity() as u64 * 8 / 7).next_power_of_two();
        // Plus the prefix list a flush sorts them into, kept for reuse.
        let tomb_bytes = slots * TOMB_SLOT_BYTES + 16 + tomb_max as u64 * 4;
        let node = std::mem::size_of::<super::slab::Node>() as u64;
        let nodes =
            (budget.saturating_sub(tree_max + fixed + tomb_bytes) / node).clamp(64, 1 << 31);
        let slab = Slab::with_capacity(nodes as u32).map_err(|e| {
            Error::NoMemory(format!(
                "smart: the memory budget of {budget} bytes needs {} bytes for its fingerprint nodes ({e}); open with a smaller budget",
                nodes * node
            ))
        })?;
        Ok(SmartStore {
            inner: Mutex::new(Inner {
                tree,
                slab,
                eviction,
                glru_head: NIL,
                glru_tail: NIL,
                lru: List::default(),
                buckets: vec![List::default(); BUCKETS],
                tombs,
                tomb_max,
                tomb_bytes,
                io,
                merge: MergeBuf::new(),
                evicted: Vec::with_capacity(PER_BLOCK),
                prefixes: Vec::with_capacity(tomb_max),
                disk_total: 0,
                st: SmartCounters::default(),
            }),
            budget,
            bits,
        })
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

    /// Tombstones held and the room their set has left before it would grow (tests).
    #[cfg(test)]
    pub(super) fn tomb_room(&self) -> (usize, usize) {
        let g = self.inner.lock();
        (g.tombs.len(), g.tombs.capacity())
    }

    /// Capacity of the reused merge buffers (tests).
    #[cfg(test)]
    pub(super) fn scratch_bytes(&self) -> u64 {
        self.inner.lock().scratch_bytes()
    }

    /// Fingerprints in memory and records on the medium.
    pub fn held(&self) -> (u64, u64) {
        let g = self.inner.lock();
        (g.slab.live() as u64, g.disk_total)
    }
}

/// Blocks of the data area held by the on-media groups (under the store's lock).
fn group_blocks(g: &Inner) -> u64 {
    g.tree.leaves().map(|(_, l)| l.disk_blocks as u64).sum()
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
        let cands = self.inner.lock().disk_candidates(h);
        let loc = cands.into_iter().find(|&loc| check(loc))?;
        let mut g = self.inner.lock();
        g.st.disk_hits += 1;
        if promote {
            g.st.promotions += 1;
            g.insert(h, loc, false);
        }
        Some(loc)
    }

    fn holds(&self, fp: u64, loc: u64) -> bool {
        let h = mix(fp);
        let mut g = self.inner.lock();
        let p = g.tree.prefix_of(h);
        if g.node_of(p, h, loc).is_some() {
            return true;
        }
        // Read-only: a damaged group is not dropped here (`check_media` reports it).
        g.uncounted(|g| g.search_disk(h))
            .is_ok_and(|locs| locs.contains(&loc))
    }

    fn promote(&self, fp: u64, loc: u64) {
        let h = mix(fp);
        let mut g = self.inner.lock();
        let p = g.tree.prefix_of(h);
        if g.node_of(p, h, loc).is_none() {
            g.st.disk_hits += 1;
            g.st.promotions += 1;
            g.insert(h, loc, false);
        }
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
            // Flush before the set would grow: records taken back out (a re-insert) leave
            // deleted slots that use up its room, so it can be full below `tomb_max`.
            if g.tombs.len() >= g.tombs.capacity() {
                g.flush_tombs();
            }
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
            g.write_disk(p, &mut Vec::new(), &recs[s..e]);
            s = e;
        }
    }

    fn save_words(&self) -> Result<Option<Vec<u64>>> {
        let mut g = self.inner.lock();
        g.merge_all_to_media();
        if let Some(io) = g.io.as_ref() {
            io.fence()?;
        }
        let groups = g.media_groups();
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
        // Saved with other prefix bits (another budget): the groups are kept at the width they
        // were written with until the image is opened for writing (`begin_writes`), so that a
        // read-only open (fsck, the stats of an image) sees them all and writes nothing.
        if old_bits != g.tree.bits() {
            g.tree = PrefixTree::new(old_bits);
        }
        for (p, len, head) in groups {
            let l = g.tree.get_mut(p);
            l.disk_head = head;
            l.disk_len = len;
            l.disk_blocks = blocks_for(len as usize) as u32;
            g.disk_total += len as u64;
        }
        Ok(())
    }

    fn begin_writes(&self) {
        let mut g = self.inner.lock();
        if g.tree.bits() == self.bits {
            return;
        }
        // Nothing is in memory after a read-only open, but should anything be, it goes to the
        // medium first: the rebucketing pass reads only on-media groups.
        g.merge_all_to_media();
        g.rebucket(self.bits);
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

    fn check_media(&self) -> Vec<String> {
        let mut g = self.inner.lock();
        let bits = g.tree.bits();
        let groups = g.media_groups();
        let mut bad = 0usize;
        let mut out = Vec::new();
        g.uncounted(|g| {
            let Some(io) = g.io.as_mut() else {
                return;
            };
            let mut grp = Group::default();
            for (p, l) in groups {
                if let Err(e) = io.read(bits, p, l.disk_head, l.disk_len, l.disk_blocks, &mut grp)
                {
                    bad += 1;
                    if out.len() < MAX_GROUP_MESSAGES {
                        out.push(format!(
                            "{e} (its fingerprints are not found until failure recovery or fsck --repair rebuilds the groups)"
                        ));
                    }
                }
            }
        });
        if bad > out.len() {
            out.push(format!(
                "{} more damaged fingerprint groups",
                bad - out.len()
            ));
        }
        out
    }

    fn owned_blocks(&self) -> u64 {
        // Group blocks are taken and given back only under this lock.
        group_blocks(&self.inner.lock())
    }

    fn list_owned_blocks(&self, mut out: Vec<u64>, f: &mut dyn FnMut(&[u64], u64)) {
        // Group blocks are taken and given back only under this lock, held until `f` returns.
        let mut g = self.inner.lock();
        let bits = g.tree.bits();
        let owned = group_blocks(&g);
        let groups = g.media_groups();
        let listed = g.uncounted(|g| {
            let Some(io) = g.io.as_mut() else {
                return 0;
            };
            let before = out.len();
            for (p, l) in groups {
                // A damaged chain is listed up to its damage; the rest stays unlisted.
                io.list_chain(bits, p, l.disk_head, l.disk_blocks, &mut out);
            }
            (out.len() - before) as u64
        });
        f(&out, owned.saturating_sub(listed));
    }

    fn clear(&self) {
        let mut g = self.inner.lock();
        // Back to the budget's width (a read-only open may have left the saved one).
        g.tree = PrefixTree::new(self.bits);
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
        let last_error = g.io.as_ref().and_then(|io| io.last_error.clone());
        Some(serde_json::json!({
            "eviction": g.eviction.name(),
            "prefix_bits": g.tree.bits(),
            "budget_bytes": self.budget,
            "memory": {
                "tree_bytes": g.tree.memory_bytes(),
                "nodes_bytes": g.slab.memory_bytes(),
                "tombstones_bytes": g.tomb_bytes,
                "total_bytes": g.memory_bytes(),
                "merge_scratch_bytes": g.scratch_bytes(),
            },
            "fingerprints_in_memory": g.slab.live(),
            "node_capacity": g.slab.memory_bytes() / std::mem::size_of::<super::slab::Node>() as u64,
            "fingerprints_on_media": g.disk_total,
            "media_groups": g.tree.leaves().filter(|(_, l)| l.disk_head != 0).count(),
            "tombstones": g.tombs.len(),
            "store_io_read_bytes": read,
            "store_io_written_bytes": written,
            "store_io_errors": errors,
            "store_io_last_error": last_error,
            "counters": g.st,
        }))
    }
}
