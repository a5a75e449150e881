//! Parameters of the memory model: per-event latencies and energies, the bank/queue model, the
//! encryption, and the metadata budgets. Defaults are the paper's where it gives one (Table 2,
//! §3.2, §3.3, §3.5.2); the others are stated assumptions, all settable with `--set NAME=VALUE`.

use crate::error::{Result, SimError};
use serde::{Deserialize, Serialize};

/// Latency (ns) and energy (nJ) of each modeled event.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Costs {
    /// PCM line read (Table 2: 75 ns).
    pub pcm_read_ns: u64,
    /// PCM line write (Table 2: 150 ns).
    pub pcm_write_ns: u64,
    /// PCM line read energy (Table 2: 1.49 nJ).
    pub pcm_read_nj: f64,
    /// PCM line write energy (Table 2: 6.75 nJ).
    pub pcm_write_nj: f64,
    /// Counter-mode pad generation for one line (assumption: 40 ns, 4 AES blocks pipelined).
    pub aes_ns: u64,
    /// Energy of one line's pad (assumption: 0.5 nJ).
    pub aes_nj: f64,
    /// SHA-1 of one line (paper §3.3: 321 ns).
    pub sha1_ns: u64,
    /// SHA-1 energy per line (assumption: 3.0 nJ).
    pub sha1_nj: f64,
    /// CRC-32 of one line (assumption: 15 ns).
    pub crc_ns: u64,
    /// CRC-32 energy per line (assumption: 0.15 nJ).
    pub crc_nj: f64,
    /// One access to an on-chip metadata cache (EFIT, AMT, fingerprint or prefetch cache;
    /// assumption: 2 ns).
    pub meta_ns: u64,
    /// Its energy (assumption: 0.02 nJ).
    pub meta_nj: f64,
    /// Byte-by-byte comparison of two lines (assumption: 1 ns).
    pub compare_ns: u64,
    /// Its energy (assumption: 0.01 nJ).
    pub compare_nj: f64,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            pcm_read_ns: 75,
            pcm_write_ns: 150,
            pcm_read_nj: 1.49,
            pcm_write_nj: 6.75,
            aes_ns: 40,
            aes_nj: 0.5,
            sha1_ns: 321,
            sha1_nj: 3.0,
            crc_ns: 15,
            crc_nj: 0.15,
            meta_ns: 2,
            meta_nj: 0.02,
            compare_ns: 1,
            compare_nj: 0.01,
        }
    }
}

/// The whole model configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Event costs.
    pub costs: Costs,
    /// PCM banks (lines interleaved across them by line number).
    pub banks: u32,
    /// Time between two requests the processor issues (ns), when the window allows.
    pub issue_gap_ns: u64,
    /// Requests in flight at most (the controller's queue slots): request i issues only after
    /// request i - window completed.
    pub window: u32,
    /// AES key size: 128 or 256.
    pub aes_bits: u32,
    /// Seed of the encryption key.
    pub key_seed: u64,
    /// ECC-based fingerprint index table (LRCU) of ESD/FSDedup (Table 2: 512 KiB).
    pub efit_bytes: usize,
    /// Address mapping table cache (Table 2: 512 KiB).
    pub amt_bytes: usize,
    /// Prefetch cache of FSDedup (Table 2: 512 KiB).
    pub prefetch_bytes: usize,
    /// On-chip fingerprint cache of Dedup_SHA1 and DeWrite (same budget as the EFIT).
    pub fp_cache_bytes: usize,
    /// FSDedup refresh interval in simulated ns (§4.5: 10 s); 0 = off.
    pub refresh_interval_ns: u64,
    /// FSDedup refresh every N LRCU operations (get hits + puts); 0 = off.
    pub refresh_ops: u64,
    /// Largest reference count of a physical line in ESD/FSDedup (`referH` is 1 byte, §3.2).
    pub max_refs: u32,
    /// Charge a PCM write for every dirty AMT line evicted from its cache. Off by default: the AMT
    /// is co-located with the per-line encryption counters (as DeWrite does), whose write-backs
    /// every scheme, Baseline included, pays and this model leaves out for all.
    pub amt_writebacks: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            costs: Costs::default(),
            banks: 8,
            issue_gap_ns: 25,
            window: 32,
            aes_bits: 128,
            key_seed: 1,
            efit_bytes: 512 << 10,
            amt_bytes: 512 << 10,
            prefetch_bytes: 512 << 10,
            fp_cache_bytes: 512 << 10,
            refresh_interval_ns: 10_000_000_000,
            refresh_ops: 0,
            max_refs: 255,
            amt_writebacks: false,
        }
    }
}

/// Modeled entry sizes (bytes) of the metadata structures.
pub mod entry {
    /// EFIT: ECC 8 + Addr_base 4 + Addr_offsets 1 + referH 1 (§3.2).
    pub const EFIT: usize = 14;
    /// AMT: initAddr 5 + Addr_base 4 + Addr_offsets 1 (§3.2).
    pub const AMT: usize = 10;
    /// Prefetch cache item: the 64-byte line + its ECC and address.
    pub const PREFETCH: usize = 64 + 8;
    /// Dedup_SHA1 fingerprint entry: SHA-1 20 + address 5 + reference count 1.
    pub const SHA1: usize = 26;
    /// DeWrite metadata per line: 16 bytes + 3 bits (§4.5), rounded to 16 for cache entries.
    pub const DEWRITE: usize = 16;
    /// DeWrite's exact per-line metadata in bits, for the space overhead (16 B + 3 bits).
    pub const DEWRITE_BITS: usize = 16 * 8 + 3;
}

impl ModelConfig {
    /// Set one parameter by name (`pcm_read_ns`, `aes_nj`, `banks`, ...).
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let bad = || SimError::Invalid(format!("--set {name}={value}: not a valid value"));
        let int = || value.parse::<u64>().map_err(|_| bad());
        let float = || {
            value
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(bad)
        };
        let c = &mut self.costs;
        match name {
            "pcm_read_ns" => c.pcm_read_ns = int()?,
            "pcm_write_ns" => c.pcm_write_ns = int()?,
            "pcm_read_nj" => c.pcm_read_nj = float()?,
            "pcm_write_nj" => c.pcm_write_nj = float()?,
            "aes_ns" => c.aes_ns = int()?,
            "aes_nj" => c.aes_nj = float()?,
            "sha1_ns" => c.sha1_ns = int()?,
            "sha1_nj" => c.sha1_nj = float()?,
            "crc_ns" => c.crc_ns = int()?,
            "crc_nj" => c.crc_nj = float()?,
            "meta_ns" => c.meta_ns = int()?,
            "meta_nj" => c.meta_nj = float()?,
            "compare_ns" => c.compare_ns = int()?,
            "compare_nj" => c.compare_nj = float()?,
            "banks" => self.banks = int()?.try_into().map_err(|_| bad())?,
            "issue_gap_ns" => self.issue_gap_ns = int()?,
            "window" => self.window = int()?.try_into().map_err(|_| bad())?,
            "max_refs" => self.max_refs = int()?.try_into().map_err(|_| bad())?,
            "key_seed" => self.key_seed = int()?,
            "amt_writebacks" => self.amt_writebacks = int()? != 0,
            _ => {
                return Err(SimError::Invalid(format!(
                    "--set {name}: unknown parameter (see `nodup sim run --help`)"
                )))
            }
        }
        self.validate()
    }

    /// Reject configurations the model cannot run.
    pub fn validate(&self) -> Result<()> {
        if !(1..=1024).contains(&self.banks) {
            return Err(SimError::Invalid("banks must be 1..=1024".into()));
        }
        if !(1..=4096).contains(&self.window) {
            return Err(SimError::Invalid("window must be 1..=4096".into()));
        }
        if self.aes_bits != 128 && self.aes_bits != 256 {
            return Err(SimError::Invalid("AES key size must be 128 or 256".into()));
        }
        if self.max_refs == 0 {
            return Err(SimError::Invalid("max_refs must be at least 1".into()));
        }
        Ok(())
    }
}
