//! DeWrite (Zuo et al., MICRO'18, as §2.3 and §3.3 of the paper describe it): CRC-32 of every
//! line as a similarity fingerprint, full deduplication against the complete store, a matching
//! candidate read from PCM and compared byte by byte, and encryption run in parallel with the
//! detection when a predictor says the line is not a duplicate.
//!
//! The predictor is the last outcome (a line is predicted duplicate when the previous write was
//! one). Predicted unique: the pad is generated from issue in parallel with detection, so a
//! unique line waits only for the longer of the two, and a duplicate wastes that encryption's
//! energy. Predicted duplicate: detection first; a unique line is then encrypted serially.

use super::fpstore::FullStore;
use super::Common;
use crate::model::config::{entry, ModelConfig};
use crate::model::timing::{Request, Step};
use crate::trace::Line;

/// DeWrite's state.
pub struct DeWrite {
    /// The CRC-32 store.
    pub store: FullStore,
    last_dup: bool,
    /// Predictions that were wrong.
    pub mispredictions: u64,
}

impl DeWrite {
    /// Empty store with the configured cache.
    pub fn new(cfg: &ModelConfig) -> Self {
        DeWrite {
            store: FullStore::new(cfg.fp_cache_bytes, entry::DEWRITE, entry::DEWRITE_BITS),
            last_dup: false,
            mispredictions: 0,
        }
    }

    /// Handle one write.
    pub fn write(&mut self, c: &mut Common, req: &mut Request, lid: u32, data: &Line) {
        let predict_dup = self.last_dup;
        if !predict_dup {
            // Speculative encryption started at issue, in parallel with detection.
            c.counts.aes += 1;
        }
        c.counts.crc += 1;
        req.push(Step::Compute(c.cfg.costs.crc_ns));
        let fp = crc32c::crc32c(data) as u64;
        let cand = self.store.lookup(c, req, fp);
        let mut dup = None;
        if let Some(p) = cand {
            c.dedup.candidates += 1;
            if c.verify(req, p, data) {
                dup = Some(p);
            } else {
                c.dedup.collisions += 1;
            }
        }
        self.last_dup = dup.is_some();
        if self.last_dup != predict_dup {
            self.mispredictions += 1;
        }
        if let Some(p) = dup {
            self.store.share(c, req, lid, p);
            return;
        }
        let st = self.store.store_unique(c, lid, data);
        if predict_dup {
            c.encrypt_and_write(req, st.pid);
        } else {
            req.push(Step::After(c.cfg.costs.aes_ns));
            c.write_data(req, st.pid);
        }
        if cand.is_none() || !self.store.contains(fp) {
            // A collision keeps the stored entry: one line per CRC value.
            self.store.insert(c, fp, st.pid);
        }
        if st.amt_changed {
            c.amt_update(req, lid);
        }
    }
}
