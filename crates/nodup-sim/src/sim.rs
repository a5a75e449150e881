//! One scheme simulated over a stream of events, and its results.

use crate::model::config::entry;
use crate::model::hist::{cdf, CdfPoint};
use crate::model::meter::Counts;
use crate::model::timing::{Kind, Request};
use crate::model::ModelConfig;
use crate::schemes::dedup_sha1::DedupSha1;
use crate::schemes::dewrite::DeWrite;
use crate::schemes::selective::Selective;
use crate::schemes::{baseline, esd, fsdedup, Common, DedupStats, Metadata, SchemeKind};
use crate::trace::{Event, Line, Op};
use serde::{Deserialize, Serialize};

enum State {
    Baseline,
    Sha1(Box<DedupSha1>),
    DeWrite(Box<DeWrite>),
    Selective(Box<Selective>),
}

/// A scheme and the memory it runs on.
pub struct Sim {
    kind: SchemeKind,
    c: Common,
    state: State,
}

/// Results of one scheme over one trace (`nodup sim run --json` prints one per scheme).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SchemeResult {
    /// Trace writes.
    pub writes: u64,
    /// Trace reads.
    pub reads: u64,
    /// Writes that did not reach PCM.
    pub writes_eliminated: u64,
    /// `writes_eliminated / writes`.
    pub writes_eliminated_fraction: f64,
    /// Mean write latency (issue to completion).
    pub mean_write_latency_ns: f64,
    /// Median write latency.
    pub p50_write_latency_ns: u64,
    /// 99th percentile write latency.
    pub p99_write_latency_ns: u64,
    /// Largest write latency.
    pub max_write_latency_ns: u64,
    /// Mean read latency.
    pub mean_read_latency_ns: f64,
    /// 99th percentile read latency.
    pub p99_read_latency_ns: u64,
    /// Mean time a write waited for banks.
    pub mean_write_wait_ns: f64,
    /// Mean time a read waited for banks.
    pub mean_read_wait_ns: f64,
    /// Sum of write latencies, of their service parts and of their waits (sum = service + wait).
    pub write_latency_sum_ns: u128,
    /// See `write_latency_sum_ns`.
    pub write_service_sum_ns: u128,
    /// See `write_latency_sum_ns`.
    pub write_wait_sum_ns: u128,
    /// Sum of read latencies.
    pub read_latency_sum_ns: u128,
    /// Simulated time until the last request completed.
    pub runtime_ns: u64,
    /// Total energy: the event counts times their per-event energies.
    pub energy_nj: f64,
    /// On-chip plus PCM metadata.
    pub metadata_bytes: u64,
    /// The two parts of `metadata_bytes`.
    pub metadata: Metadata,
    /// PCM metadata over the PCM bytes of live data lines (the paper's space overhead).
    pub metadata_nvmm_fraction: f64,
    /// Physical lines holding live data at the end.
    pub live_lines: u64,
    /// Logical lines the trace touched.
    pub logical_lines: u64,
    /// Event counts.
    pub counts: Counts,
    /// Dedup counters.
    pub dedup: DedupStats,
    /// Write latency CDF.
    pub write_latency_cdf: Vec<CdfPoint>,
    /// Read latency CDF.
    pub read_latency_cdf: Vec<CdfPoint>,
}

impl Sim {
    /// A fresh simulation of `kind` under `cfg`.
    pub fn new(kind: SchemeKind, cfg: &ModelConfig) -> Self {
        let state = match kind {
            SchemeKind::Baseline => State::Baseline,
            SchemeKind::Sha1 => State::Sha1(Box::new(DedupSha1::new(cfg))),
            SchemeKind::DeWrite => State::DeWrite(Box::new(DeWrite::new(cfg))),
            SchemeKind::Esd => State::Selective(Box::new(esd::new(cfg))),
            SchemeKind::FsDedup => State::Selective(Box::new(fsdedup::new(cfg))),
        };
        Sim {
            kind,
            c: Common::new(cfg, kind != SchemeKind::Baseline),
            state,
        }
    }

    /// Which scheme.
    pub fn kind(&self) -> SchemeKind {
        self.kind
    }

    /// Simulate one event.
    pub fn event(&mut self, e: &Event) {
        let now = self.c.timing.begin();
        let mut req = Request::default();
        match e.op {
            Op::Read => {
                self.c.reads += 1;
                self.c.read(&mut req, e.line);
                self.c.timing.submit(Kind::Read, req);
            }
            Op::Write => {
                self.c.writes += 1;
                let lid = self.c.mem.lid(e.line);
                let c = &mut self.c;
                match &mut self.state {
                    State::Baseline => baseline::write(c, &mut req, lid, &e.data),
                    State::Sha1(s) => s.write(c, &mut req, lid, &e.data),
                    State::DeWrite(s) => s.write(c, &mut req, lid, &e.data),
                    State::Selective(s) => s.write(c, &mut req, lid, &e.data, now),
                }
                self.c.timing.submit(Kind::Write, req);
            }
        }
    }

    /// What a read of trace line `line` returns now (decrypted): for checking that deduplication
    /// never loses data.
    pub fn read_logical(&self, line: u64) -> Line {
        self.c.mem.read_logical(line)
    }

    /// The selective state (ESD/FSDedup), for tests and sensitivity reports.
    pub fn selective(&self) -> Option<&Selective> {
        match &self.state {
            State::Selective(s) => Some(s),
            _ => None,
        }
    }

    fn metadata(&self) -> Metadata {
        let c = &self.c;
        let amt_cache = c.amt.as_ref().map_or(0, |a| a.budget_bytes() as u64);
        let amt_nvmm = c.mem.amt_entries() * entry::AMT as u64;
        match &self.state {
            State::Baseline => Metadata::default(),
            State::Sha1(s) => Metadata {
                on_chip_bytes: s.store.cache_bytes() + amt_cache,
                nvmm_bytes: s.store.nvmm_bytes() + amt_nvmm,
            },
            State::DeWrite(s) => Metadata {
                on_chip_bytes: s.store.cache_bytes() + amt_cache,
                nvmm_bytes: s.store.nvmm_bytes() + amt_nvmm,
            },
            State::Selective(s) => Metadata {
                on_chip_bytes: (s.efit.capacity() * entry::EFIT) as u64
                    + amt_cache
                    + s.prefetch
                        .as_ref()
                        .map_or(0, |p| (p.capacity() * entry::PREFETCH) as u64),
                nvmm_bytes: amt_nvmm,
            },
        }
    }

    /// Drain the pending requests and compute the results.
    pub fn finish(&mut self) -> SchemeResult {
        let runtime_ns = self.c.timing.finish();
        if let State::Selective(s) = &self.state {
            s.fill_stats(&mut self.c);
        }
        let metadata = self.metadata();
        let c = &self.c;
        let (w, r) = (&c.timing.writes, &c.timing.reads);
        let per = |sum: u128, n: u64| if n == 0 { 0.0 } else { sum as f64 / n as f64 };
        let live = c.mem.live_lines();
        SchemeResult {
            writes: c.writes,
            reads: c.reads,
            writes_eliminated: c.eliminated,
            writes_eliminated_fraction: if c.writes == 0 {
                0.0
            } else {
                c.eliminated as f64 / c.writes as f64
            },
            mean_write_latency_ns: w.hist.mean(),
            p50_write_latency_ns: w.hist.quantile(0.5),
            p99_write_latency_ns: w.hist.quantile(0.99),
            max_write_latency_ns: w.hist.max(),
            mean_read_latency_ns: r.hist.mean(),
            p99_read_latency_ns: r.hist.quantile(0.99),
            mean_write_wait_ns: per(w.wait_ns, w.hist.count()),
            mean_read_wait_ns: per(r.wait_ns, r.hist.count()),
            write_latency_sum_ns: w.hist.sum(),
            write_service_sum_ns: w.service_ns,
            write_wait_sum_ns: w.wait_ns,
            read_latency_sum_ns: r.hist.sum(),
            runtime_ns,
            energy_nj: c.counts.energy_nj(&c.cfg.costs),
            metadata_bytes: metadata.on_chip_bytes + metadata.nvmm_bytes,
            metadata,
            metadata_nvmm_fraction: if live == 0 {
                0.0
            } else {
                metadata.nvmm_bytes as f64 / (live * 64) as f64
            },
            live_lines: live,
            logical_lines: c.mem.logical_lines(),
            counts: c.counts,
            dedup: c.dedup,
            write_latency_cdf: cdf(&w.hist, 200),
            read_latency_cdf: cdf(&r.hist, 200),
        }
    }
}
