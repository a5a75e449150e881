//! ESD (HPCA'23, the paper's [14]): ECC fingerprint, LRCU EFIT of hot fingerprints without
//! refresh, selective deduplication, no PCM fingerprint store (the core is in [`super::selective`]).

use super::selective::Selective;
use crate::model::ModelConfig;
use nodup_core::cache::Refresh;

/// ESD: the LRCU never refreshes and there is no prefetch cache.
pub fn new(cfg: &ModelConfig) -> Selective {
    Selective::new(cfg.efit_bytes, Refresh::NEVER, 0)
}
