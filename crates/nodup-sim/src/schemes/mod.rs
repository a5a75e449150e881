//! The five schemes of the paper's evaluation (§4.1), each a module, over shared machinery
//! ([`Common`]: memory, timing, counts, the AMT cache). A scheme turns one trace write into the
//! steps of its request (see `model::timing`) and updates its metadata; reads are the same for
//! all dedup schemes (an AMT lookup for remapped lines, then the PCM read with the counter-mode
//! pad generated in parallel).

pub mod baseline;
pub mod dedup_sha1;
pub mod dewrite;
pub mod esd;
pub mod fpstore;
pub mod fsdedup;
pub mod selective;

use crate::model::config::{entry, ModelConfig};
use crate::model::crypt::LineCipher;
use crate::model::meter::Counts;
use crate::model::nvmm::Nvmm;
use crate::model::setcache::SetCache;
use crate::model::timing::{Request, Step, Timing};
use crate::trace::Line;
use serde::{Deserialize, Serialize};

nodup_core::named_enum! {
    /// The schemes `nodup sim run --scheme` knows.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum SchemeKind {
        /// Encrypt and write every line.
        Baseline = 1 => "baseline",
        /// SHA-1 of every line, full fingerprint store (cached + in PCM), trusted matches.
        Sha1 = 2 => "sha1",
        /// CRC-32 similarity + read-and-compare, full store, parallel encryption by prediction.
        DeWrite = 3 => "dewrite",
        /// ECC fingerprint, LRCU cache of hot fingerprints only, selective dedup.
        Esd = 4 => "esd",
        /// ESD + LRCU refresh + prefetch cache.
        FsDedup = 5 => "fsdedup",
    }
}

/// AMT entries per 64-byte PCM line.
const AMT_PER_LINE: u32 = (64 / entry::AMT) as u32;

/// Dedup-side counters of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupStats {
    /// Writes whose fingerprint matched a stored one.
    pub candidates: u64,
    /// Candidates whose content differed (written as unique).
    pub collisions: u64,
    /// Candidates not deduplicated because the target's reference count was at its maximum.
    pub refcount_full: u64,
    /// Fingerprint-store lookups that missed the on-chip cache and read PCM.
    pub fp_pcm_lookups: u64,
    /// AMT lookups or updates that missed the on-chip cache.
    pub amt_misses: u64,
    /// LRCU (EFIT) lookups that hit / missed.
    pub efit_hits: u64,
    /// See `efit_hits`.
    pub efit_misses: u64,
    /// LRCU entries evicted.
    pub efit_evictions: u64,
    /// LRCU refreshes performed.
    pub efit_refreshes: u64,
    /// Verifications answered by the prefetch cache (duplicates found there, or a collision
    /// known from the cached content), i.e. PCM reads avoided.
    pub prefetch_hits: u64,
    /// Verifications the prefetch cache could not answer.
    pub prefetch_misses: u64,
    /// Duplicates found in the prefetch cache at another location than the EFIT's.
    pub prefetch_other_location: u64,
}

/// State every scheme uses.
pub struct Common {
    /// Model parameters.
    pub cfg: ModelConfig,
    /// PCM contents and mapping.
    pub mem: Nvmm,
    /// Bank/queue timing.
    pub timing: Timing,
    /// Event counts (energy).
    pub counts: Counts,
    /// AMT cache (None for Baseline, which never remaps).
    pub amt: Option<SetCache>,
    /// Dedup counters.
    pub dedup: DedupStats,
    /// Trace writes / reads seen.
    pub writes: u64,
    /// See `writes`.
    pub reads: u64,
    /// Writes that did not reach PCM.
    pub eliminated: u64,
}

impl Common {
    /// Fresh state for a scheme (with an AMT cache when `remaps`).
    pub fn new(cfg: &ModelConfig, remaps: bool) -> Self {
        let c = &cfg.costs;
        Common {
            mem: Nvmm::new(cfg.banks, LineCipher::new(cfg.aes_bits, cfg.key_seed)),
            timing: Timing::new(
                cfg.banks,
                c.pcm_read_ns,
                c.pcm_write_ns,
                cfg.issue_gap_ns,
                cfg.window,
            ),
            counts: Counts::default(),
            amt: remaps.then(|| SetCache::new(cfg.amt_bytes, 64)),
            dedup: DedupStats::default(),
            writes: 0,
            reads: 0,
            eliminated: 0,
            cfg: cfg.clone(),
        }
    }

    /// The PCM line holding `lid`'s AMT entry (6 entries of 10 bytes per 64-byte line); the AMT
    /// cache holds such lines, so neighbouring entries share a miss and a write-back.
    fn amt_line(lid: u32) -> u64 {
        (lid / AMT_PER_LINE) as u64
    }

    /// Bank of that line.
    fn amt_bank(&self, lid: u32) -> u32 {
        (lid / AMT_PER_LINE) % self.cfg.banks
    }

    /// Write a dirty metadata entry back to PCM in the background.
    pub fn write_back(&mut self, bank: u32) {
        self.counts.meta_writes += 1;
        let mut r = Request::default();
        r.push(Step::Write(bank));
        self.timing.background(r);
    }

    /// One on-chip metadata cache access on the request's path.
    pub fn meta_access(&mut self, req: &mut Request) {
        self.counts.meta += 1;
        req.push(Step::Compute(self.cfg.costs.meta_ns));
    }

    /// Record `lid`'s new mapping in the AMT (write-allocate in the cache, written back later).
    pub fn amt_update(&mut self, req: &mut Request, lid: u32) {
        let bank = self.amt_bank(lid);
        let Some(amt) = self.amt.as_mut() else { return };
        let a = amt.access(Self::amt_line(lid), true);
        if !a.hit {
            self.dedup.amt_misses += 1;
        }
        self.meta_access(req);
        if a.evicted_dirty && self.cfg.amt_writebacks {
            self.write_back(bank);
        }
    }

    /// Encrypt and write a line to physical line `pid` (serial encryption).
    pub fn encrypt_and_write(&mut self, req: &mut Request, pid: u32) {
        self.counts.aes += 1;
        req.push(Step::Compute(self.cfg.costs.aes_ns));
        self.write_data(req, pid);
    }

    /// The PCM write of a data line.
    pub fn write_data(&mut self, req: &mut Request, pid: u32) {
        self.counts.data_writes += 1;
        req.push(Step::Write(self.mem.bank(pid)));
    }

    /// Read physical line `pid` and compare it with `data` byte by byte (the pad is generated
    /// while the line is read).
    pub fn verify(&mut self, req: &mut Request, pid: u32, data: &Line) -> bool {
        self.counts.verify_reads += 1;
        self.counts.aes += 1;
        self.counts.compares += 1;
        req.push(Step::Read(self.mem.bank(pid)));
        req.push(Step::Compute(self.cfg.costs.compare_ns));
        self.mem.matches(pid, data)
    }

    /// A trace read of `line`: AMT lookup when remapped, PCM read, pad in parallel.
    pub fn read(&mut self, req: &mut Request, line: u64) {
        let lid = self.mem.lid(line);
        let pid = self.mem.mapped(lid);
        if self.mem.is_remapped(lid) {
            let bank = self.amt_bank(lid);
            if let Some(amt) = self.amt.as_mut() {
                let a = amt.access(Self::amt_line(lid), false);
                self.meta_access(req);
                if !a.hit {
                    self.dedup.amt_misses += 1;
                    self.counts.meta_reads += 1;
                    req.push(Step::Read(bank));
                }
                if a.evicted_dirty && self.cfg.amt_writebacks {
                    self.write_back(bank);
                }
            }
        }
        self.counts.data_reads += 1;
        self.counts.aes += 1;
        req.push(Step::Read(self.mem.bank(pid)));
        req.push(Step::After(self.cfg.costs.aes_ns));
    }
}

/// Fingerprint of each physical line's content, for dropping its index entry when the content
/// goes; dense by physical line number (a hash map here cost ~10 % of the simulation time).
#[derive(Default)]
pub struct PidFp {
    fp: Vec<u64>,
    set: Vec<bool>,
}

impl PidFp {
    /// Record that physical line `pid` holds content of fingerprint `fp`.
    pub fn insert(&mut self, pid: u32, fp: u64) {
        let i = pid as usize;
        if i >= self.fp.len() {
            self.fp.resize(i + 1, 0);
            self.set.resize(i + 1, false);
        }
        self.fp[i] = fp;
        self.set[i] = true;
    }

    /// Forget physical line `pid`; its fingerprint if one was recorded.
    pub fn remove(&mut self, pid: u32) -> Option<u64> {
        let i = pid as usize;
        if i < self.set.len() && self.set[i] {
            self.set[i] = false;
            Some(self.fp[i])
        } else {
            None
        }
    }
}

/// Modeled metadata space of a scheme at the end of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// On-chip caches provisioned (EFIT, AMT, fingerprint, prefetch).
    pub on_chip_bytes: u64,
    /// Metadata kept in PCM (fingerprint store entries, AMT entries).
    pub nvmm_bytes: u64,
}

#[cfg(test)]
mod tests;
