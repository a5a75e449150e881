//! Event counts of one run and the energy they cost: energy is defined as the sum over event
//! kinds of count x per-event energy, nothing else, so totals can be checked by hand.

use super::config::Costs;
use serde::{Deserialize, Serialize};

/// How many of each modeled event a scheme caused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// PCM reads answering trace reads.
    pub data_reads: u64,
    /// PCM writes of trace data.
    pub data_writes: u64,
    /// PCM reads that verify a fingerprint candidate byte by byte.
    pub verify_reads: u64,
    /// PCM reads of metadata (fingerprint store, AMT) missing the on-chip caches.
    pub meta_reads: u64,
    /// PCM writes of metadata (dirty entries evicted from the on-chip caches).
    pub meta_writes: u64,
    /// Counter-mode pads generated (encryptions and decryptions).
    pub aes: u64,
    /// SHA-1 computations.
    pub sha1: u64,
    /// CRC-32 computations.
    pub crc: u64,
    /// On-chip metadata cache accesses.
    pub meta: u64,
    /// Byte-by-byte line comparisons.
    pub compares: u64,
}

impl Counts {
    /// All PCM reads.
    pub fn pcm_reads(&self) -> u64 {
        self.data_reads + self.verify_reads + self.meta_reads
    }

    /// All PCM writes.
    pub fn pcm_writes(&self) -> u64 {
        self.data_writes + self.meta_writes
    }

    /// Energy in nJ: each count times its per-event energy.
    pub fn energy_nj(&self, c: &Costs) -> f64 {
        self.pcm_reads() as f64 * c.pcm_read_nj
            + self.pcm_writes() as f64 * c.pcm_write_nj
            + self.aes as f64 * c.aes_nj
            + self.sha1 as f64 * c.sha1_nj
            + self.crc as f64 * c.crc_nj
            + self.meta as f64 * c.meta_nj
            + self.compares as f64 * c.compare_nj
    }
}
