//! Dedup_SHA1 (§4.1): SHA-1 of every line (321 ns on the write path), full deduplication against
//! the complete fingerprint store, matches trusted without comparison, unique lines encrypted
//! after detection.

use super::fpstore::FullStore;
use super::Common;
use crate::model::config::{entry, ModelConfig};
use crate::model::timing::{Request, Step};
use crate::trace::Line;
use sha1::{Digest, Sha1};

/// Dedup_SHA1's state.
pub struct DedupSha1 {
    /// The fingerprint store (64-bit prefix of the SHA-1 as key).
    pub store: FullStore,
}

impl DedupSha1 {
    /// Empty store with the configured cache.
    pub fn new(cfg: &ModelConfig) -> Self {
        DedupSha1 {
            store: FullStore::new(cfg.fp_cache_bytes, entry::SHA1, entry::SHA1 * 8),
        }
    }

    /// Handle one write.
    pub fn write(&mut self, c: &mut Common, req: &mut Request, lid: u32, data: &Line) {
        c.counts.sha1 += 1;
        req.push(Step::Compute(c.cfg.costs.sha1_ns));
        let d = Sha1::digest(data);
        let fp = u64::from_le_bytes(d[..8].try_into().expect("SHA-1 has 20 bytes"));
        if let Some(p) = self.store.lookup(c, req, fp) {
            c.dedup.candidates += 1;
            self.store.share(c, req, lid, p);
            return;
        }
        let st = self.store.store_unique(c, lid, data);
        c.encrypt_and_write(req, st.pid);
        self.store.insert(c, fp, st.pid);
        if st.amt_changed {
            c.amt_update(req, lid);
        }
    }
}
