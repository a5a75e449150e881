//! Content statistics of a trace, as the paper's Table 1: reference counts of the written
//! contents before deduplication (share of the written volume) and after (share of the unique
//! lines), the duplicate rate and the zero-line share. Unlike `run`, this keeps one entry per
//! distinct content (a 128-bit hash and a count), so its memory grows with the unique lines.

use crate::error::Result;
use crate::trace::{Op, TraceReader, ZERO_LINE};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// One row of Table 1.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RcRow {
    /// Reference-count range.
    pub range: String,
    /// Share of written lines whose content has a reference count in the range.
    pub volume_share: f64,
    /// Share of unique contents with a reference count in the range.
    pub unique_share: f64,
}

/// Statistics of one trace.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TraceStats {
    /// Events.
    pub events: u64,
    /// Writes.
    pub writes: u64,
    /// Reads.
    pub reads: u64,
    /// Distinct line addresses written.
    pub written_lines: u64,
    /// Distinct contents written.
    pub unique_contents: u64,
    /// `1 - unique_contents / writes`: what full deduplication could eliminate at most.
    pub duplicate_rate: f64,
    /// Share of writes that are the zero line.
    pub zero_share: f64,
    /// Share of duplicate writes (beyond each content's first) that are non-zero.
    pub nonzero_duplicate_share: f64,
    /// Table 1.
    pub rc_table: Vec<RcRow>,
}

const RANGES: [(u64, u64, &str); 5] = [
    (1, 1, "RC = 1"),
    (2, 10, "1 < RC <= 10"),
    (11, 100, "10 < RC <= 100"),
    (101, 1000, "100 < RC <= 1,000"),
    (1001, u64::MAX, "1,000 < RC"),
];

/// Read the whole trace at `path` and compute its statistics.
pub fn trace_stats(path: &std::path::Path, progress: &dyn Fn(u64)) -> Result<TraceStats> {
    let mut r = TraceReader::open(path)?;
    let mut counts: FxHashMap<u128, u64> = FxHashMap::default();
    let mut addrs: rustc_hash::FxHashSet<u64> = Default::default();
    let mut zero = 0u64;
    let mut batch = Vec::with_capacity(1 << 16);
    loop {
        batch.clear();
        if r.next_batch(&mut batch, 1 << 16)? == 0 {
            break;
        }
        for e in &batch {
            if e.op == Op::Write {
                *counts
                    .entry(xxhash_rust::xxh3::xxh3_128(&e.data))
                    .or_default() += 1;
                addrs.insert(e.line);
                zero += (e.data == ZERO_LINE) as u64;
            }
        }
        progress(r.bytes_read());
    }
    let c = r.counts();
    let unique = counts.len() as u64;
    let zero_key = xxhash_rust::xxh3::xxh3_128(&ZERO_LINE);
    let zero_dups = counts.get(&zero_key).map_or(0, |&n| n.saturating_sub(1));
    let dups = c.writes - unique;
    let rc_table = RANGES
        .iter()
        .map(|&(lo, hi, name)| {
            let (mut vol, mut n) = (0u64, 0u64);
            for &rc in counts.values() {
                if (lo..=hi).contains(&rc) {
                    vol += rc;
                    n += 1;
                }
            }
            RcRow {
                range: name.to_string(),
                volume_share: vol as f64 / c.writes.max(1) as f64,
                unique_share: n as f64 / unique.max(1) as f64,
            }
        })
        .collect();
    Ok(TraceStats {
        events: c.events,
        writes: c.writes,
        reads: c.reads,
        written_lines: addrs.len() as u64,
        unique_contents: unique,
        duplicate_rate: dups as f64 / c.writes.max(1) as f64,
        zero_share: zero as f64 / c.writes.max(1) as f64,
        nonzero_duplicate_share: if dups == 0 {
            0.0
        } else {
            (dups - zero_dups) as f64 / dups as f64
        },
        rc_table,
    })
}
