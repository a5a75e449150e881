//! The complete fingerprint store of the full-deduplication schemes (Dedup_SHA1, DeWrite): every
//! stored line's fingerprint lives in PCM, a set-associative on-chip cache holds part of it.
//! A lookup that misses the cache reads PCM (the paper's "NVMM_lookup", §2.3), whether or not
//! the fingerprint exists; a new entry is written into the cache and reaches PCM when evicted.

use super::Common;
use crate::model::nvmm::Stored;
use crate::model::setcache::SetCache;
use crate::model::timing::{Request, Step};
use crate::trace::Line;
use rustc_hash::FxHashMap;

/// Fingerprint -> physical line, for every live line, with its on-chip cache.
pub struct FullStore {
    map: FxHashMap<u64, u32>,
    cache: SetCache,
    /// Fingerprint of each physical line that has one in the store.
    by_pid: super::PidFp,
    entry_bits: usize,
}

impl FullStore {
    /// A store whose cache has `cache_bytes` of `entry_bytes` entries; `entry_bits` is the PCM
    /// size of one entry for the space overhead.
    pub fn new(cache_bytes: usize, entry_bytes: usize, entry_bits: usize) -> Self {
        FullStore {
            map: FxHashMap::default(),
            cache: SetCache::new(cache_bytes, entry_bytes),
            by_pid: super::PidFp::default(),
            entry_bits,
        }
    }

    fn bank(c: &Common, fp: u64) -> u32 {
        (fp.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as u32 % c.cfg.banks
    }

    /// Look `fp` up on the request's path: the cache, else a PCM read of its bucket.
    pub fn lookup(&mut self, c: &mut Common, req: &mut Request, fp: u64) -> Option<u32> {
        let a = self.cache.access(fp, false);
        c.meta_access(req);
        if !a.hit {
            c.dedup.fp_pcm_lookups += 1;
            c.counts.meta_reads += 1;
            req.push(Step::Read(Self::bank(c, fp)));
        }
        if a.evicted_dirty {
            c.write_back(Self::bank(c, fp));
        }
        self.map.get(&fp).copied()
    }

    /// Record `fp -> pid` (cache entry made dirty; off the critical path).
    pub fn insert(&mut self, c: &mut Common, fp: u64, pid: u32) {
        self.map.insert(fp, pid);
        self.by_pid.insert(pid, fp);
        c.counts.meta += 1;
        if self.cache.access(fp, true).evicted_dirty {
            c.write_back(Self::bank(c, fp));
        }
    }

    /// A verified duplicate: map `lid` to physical line `p` (the write is eliminated).
    pub fn share(&mut self, c: &mut Common, req: &mut Request, lid: u32, p: u32) {
        c.eliminated += 1;
        let st = c.mem.store_dup(lid, p);
        if let Some(g) = st.gone {
            self.forget(g);
        }
        if st.amt_changed {
            c.amt_update(req, lid);
        }
    }

    /// Store `data` for `lid` as unique content (the caller encrypts and writes it).
    pub fn store_unique(&mut self, c: &mut Common, lid: u32, data: &Line) -> Stored {
        let st = c.mem.store_unique(lid, data);
        if let Some(g) = st.gone {
            self.forget(g);
        }
        st
    }

    /// Forget the entry of physical line `pid` (its content is gone).
    pub fn forget(&mut self, pid: u32) {
        if let Some(fp) = self.by_pid.remove(pid) {
            if self.map.get(&fp) == Some(&pid) {
                self.map.remove(&fp);
                self.cache.invalidate(fp);
            }
        }
    }

    /// Whether `fp` has an entry.
    pub fn contains(&self, fp: u64) -> bool {
        self.map.contains_key(&fp)
    }

    /// Entries stored.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// PCM bytes of the stored entries.
    pub fn nvmm_bytes(&self) -> u64 {
        (self.map.len() * self.entry_bits).div_ceil(8) as u64
    }

    /// On-chip cache bytes.
    pub fn cache_bytes(&self) -> u64 {
        self.cache.budget_bytes() as u64
    }
}
