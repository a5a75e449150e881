//! Selective deduplication with an ECC fingerprint (ESD §3.3-3.4, FSDedup §3.5), the common core
//! of [`super::esd`] and [`super::fsdedup`].
//!
//! The fingerprint is the line's SECDED check bytes, which the memory controller computes for
//! every line anyway (nodup-core's `ecc::line_code`), so it costs no time on the write path. Only
//! hot fingerprints are kept, in the EFIT, an LRCU cache (nodup-core's `cache::Lrcu`) of 512 KiB;
//! there is no fingerprint store in PCM. Per write:
//! 1. EFIT lookup (Algorithm 1's `get`). A miss: the line is unique; encrypt, write, and `put` its
//!    fingerprint (Algorithm 2; the least frequent entry may be evicted).
//! 2. A hit names one physical line with that fingerprint, a candidate. With a prefetch cache
//!    (FSDedup), the cached contents of that fingerprint are compared first: a match is a
//!    duplicate without any PCM read (possibly at another location than the EFIT's, a content
//!    that collided earlier), and a cached copy of the candidate that differs is a collision
//!    known without a read.
//! 3. Otherwise the candidate is read from PCM and compared byte by byte: equal = duplicate (the
//!    logical line is remapped, an AMT update); different = collision, written as unique, the
//!    EFIT entry kept. With a prefetch cache, a confirmed duplicate's content enters it, and so
//!    does a colliding line whose fingerprint already has content cached (the paper keeps "all
//!    similar data" of a confirmed fingerprint).
//!
//! A physical line referenced `max_refs` times (referH is one byte, §3.2) takes no more duplicates:
//! the line is written as a new copy that the EFIT entry then names.
//! When a physical line's content is gone, its EFIT entry and prefetch item go too.

use super::Common;
use crate::model::config::entry;
use crate::model::timing::Request;
use crate::trace::Line;
use nodup_core::cache::{Lrcu, PrefetchCache, Refresh};
use nodup_core::fingerprint::ecc::line_code;

/// The write being handled.
struct Incoming<'a> {
    lid: u32,
    data: &'a Line,
    fp: u64,
    now: u64,
}

/// ESD / FSDedup state.
pub struct Selective {
    /// The EFIT (fingerprint -> physical line), an LRCU cache.
    pub efit: Lrcu<u32>,
    /// FSDedup's prefetch cache (None for ESD).
    pub prefetch: Option<PrefetchCache<u32, Line>>,
    /// ECC of each physical line's content, to drop its EFIT entry when the content goes.
    by_pid: super::PidFp,
}

impl Selective {
    /// EFIT of `efit_bytes` with `refresh`, and a prefetch cache of `prefetch_bytes` (0 = none).
    pub fn new(efit_bytes: usize, refresh: Refresh, prefetch_bytes: usize) -> Self {
        Selective {
            efit: Lrcu::with_budget(efit_bytes, entry::EFIT, refresh),
            prefetch: (prefetch_bytes > 0)
                .then(|| PrefetchCache::with_budget(prefetch_bytes, entry::PREFETCH, 64)),
            by_pid: super::PidFp::default(),
        }
    }

    /// Metadata of physical line `pid` is stale: its content was overwritten or freed.
    fn forget(&mut self, pid: u32) {
        if let Some(fp) = self.by_pid.remove(pid) {
            if self.efit.peek(fp).map(|(&p, _)| p) == Some(pid) {
                self.efit.remove(fp);
            }
        }
        if let Some(pf) = self.prefetch.as_mut() {
            pf.remove_loc(pid);
        }
    }

    fn dedup(&mut self, c: &mut Common, req: &mut Request, lid: u32, target: u32) {
        c.eliminated += 1;
        let st = c.mem.store_dup(lid, target);
        if let Some(g) = st.gone {
            self.forget(g);
        }
        if st.amt_changed {
            c.amt_update(req, lid);
        }
    }

    /// Write `w` as unique; returns the physical line written. `index`: enter its fingerprint
    /// in the EFIT even when the fingerprint already has an entry (false after a collision).
    fn unique(&mut self, c: &mut Common, req: &mut Request, w: &Incoming, index: bool) -> u32 {
        let (lid, data, fp, now) = (w.lid, w.data, w.fp, w.now);
        let st = c.mem.store_unique(lid, data);
        if let Some(g) = st.gone {
            self.forget(g);
        }
        c.encrypt_and_write(req, st.pid);
        self.by_pid.insert(st.pid, fp);
        if index || !self.efit.contains(fp) {
            c.counts.meta += 1;
            self.efit.put(fp, st.pid, now);
        }
        if st.amt_changed {
            c.amt_update(req, lid);
        }
        st.pid
    }

    /// The candidate's line is referenced `max_refs` times (its one-byte referH is full): the
    /// line is written as a new copy and the EFIT entry re-pointed to it, so later duplicates
    /// share the copy (the frequency stays with the fingerprint).
    fn full_copy(&mut self, c: &mut Common, req: &mut Request, w: &Incoming) {
        c.dedup.refcount_full += 1;
        let n = self.unique(c, req, w, false);
        self.efit.update(w.fp, n);
        if let Some(pf) = self.prefetch.as_mut() {
            if pf.contains_key(w.fp) {
                pf.insert(w.fp, n, *w.data);
            }
        }
    }

    /// Handle one write issued at simulated time `now` (the refresh clock).
    pub fn write(&mut self, c: &mut Common, req: &mut Request, lid: u32, data: &Line, now: u64) {
        let fp = line_code(data);
        let w = Incoming { lid, data, fp, now };
        c.meta_access(req);
        let Some(p) = self.efit.get(fp, now).copied() else {
            self.unique(c, req, &w, true);
            return;
        };
        c.dedup.candidates += 1;
        let max_refs = c.cfg.max_refs;
        if let Some(pf) = self.prefetch.as_mut() {
            c.meta_access(req);
            c.counts.compares += 1;
            req.push(crate::model::timing::Step::Compute(c.cfg.costs.compare_ns));
            if let Some(q) = pf.find(fp, |content| content == data) {
                c.dedup.prefetch_hits += 1;
                if q != p {
                    c.dedup.prefetch_other_location += 1;
                }
                if c.mem.refs(q) < max_refs || c.mem.mapped(lid) == q {
                    self.dedup(c, req, lid, q);
                } else {
                    self.full_copy(c, req, &w);
                }
                return;
            }
            if pf.contains_loc(p) {
                // The candidate's content is cached and differs: a collision, no read needed.
                c.dedup.prefetch_hits += 1;
                c.dedup.collisions += 1;
                let n = self.unique(c, req, &w, false);
                if let Some(pf) = self.prefetch.as_mut() {
                    pf.insert(fp, n, *data);
                }
                return;
            }
            c.dedup.prefetch_misses += 1;
        }
        if c.mem.refs(p) >= max_refs && c.mem.mapped(lid) != p {
            self.full_copy(c, req, &w);
            return;
        }
        if c.verify(req, p, data) {
            self.dedup(c, req, lid, p);
            if let Some(pf) = self.prefetch.as_mut() {
                pf.insert(fp, p, *data);
            }
            return;
        }
        c.dedup.collisions += 1;
        let keep = self.prefetch.as_ref().is_some_and(|pf| pf.contains_key(fp));
        let stored = if keep { c.mem.plain(p) } else { *data };
        let n = self.unique(c, req, &w, false);
        if let Some(pf) = self.prefetch.as_mut() {
            if keep {
                // Keep all similar data of a confirmed fingerprint: the one just read and the new.
                if c.mem.mapped(lid) != p {
                    pf.insert(fp, p, stored);
                }
                pf.insert(fp, n, *data);
            }
        }
    }

    /// EFIT and prefetch counters into the run's dedup stats.
    pub fn fill_stats(&self, c: &mut Common) {
        let s = self.efit.stats();
        c.dedup.efit_hits = s.hits;
        c.dedup.efit_misses = s.misses;
        c.dedup.efit_evictions = s.evictions;
        c.dedup.efit_refreshes = s.refreshes;
    }
}
