//! FSDedup (the paper): ESD plus the LRCU refresh of Algorithm 3 (§3.5.2, default every 10 s of
//! simulated time, or every N cache operations) and the 512 KiB prefetch cache (§3.5.1).

use super::selective::Selective;
use crate::model::ModelConfig;
use nodup_core::cache::Refresh;

/// The refresh policy the configuration asks for (0 = that trigger off).
pub fn refresh(cfg: &ModelConfig) -> Refresh {
    Refresh {
        interval: (cfg.refresh_interval_ns > 0).then_some(cfg.refresh_interval_ns),
        every_ops: (cfg.refresh_ops > 0).then_some(cfg.refresh_ops),
    }
}

/// FSDedup: refreshing LRCU and a prefetch cache.
pub fn new(cfg: &ModelConfig) -> Selective {
    Selective::new(cfg.efit_bytes, refresh(cfg), cfg.prefetch_bytes)
}
