//! Trace statistics: request counts, duplication ratio (Light-Dedup Table 3) and the
//! duplication-continuousness distribution (Light-Dedup Fig. 8).
//!
//! Definitions (all in 4 KiB blocks of the device LBA space, writes in trace order):
//! - a written block is a *duplicate* when its content (after the write, at sector granularity,
//!   never-written sectors as zeros) is present at that moment in some live block of any device
//!   — including the block being overwritten and earlier blocks of the same request. Content that
//!   was overwritten everywhere is no longer present. Reads do not make content present: the
//!   replayer never writes what a trace only reads, so no file system under replay could dedup
//!   against it;
//! - `dedup_ratio` = duplicate written blocks / written blocks;
//! - `unique_blocks` = written blocks that were not duplicates (what a dedup FS stores anew);
//! - a *duplicate run* is a maximal sequence of duplicate blocks consecutive in the stream of
//!   written blocks; the continuousness CDF at length L is the fraction of duplicate blocks that
//!   lie in runs of length <= L (Fig. 8: "30 % of duplicates in runs > 10" is the point (10, 0.70));
//! - *popularity* (content locality, FSDedup §2.1): each duplicate write is one reference to its
//!   content; the contents are ranked by references and the top X % of `unique_blocks` (at least
//!   one content) is reported with its share of all duplicate references. With overwrites a
//!   content written anew after it vanished counts again in `unique_blocks`.

use crate::error::Result;
use crate::format::{for_each_record, BadLinePolicy, TraceReader};
use crate::model::{touches, BlockKey, LbaModel};
use crate::record::{Op, SECTORS_PER_BLOCK};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// One point of the continuousness CDF.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CdfPoint {
    /// Run length in blocks.
    pub len: u64,
    /// Fraction of duplicate blocks in runs of at most `len` blocks.
    pub cdf: f64,
}

/// Share of duplicate references that go to the most referenced contents.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PopularityPoint {
    /// The top fraction of contents, in percent of `unique_blocks` (0.1, 1, 10).
    pub top_percent: f64,
    /// How many contents that is.
    pub contents: u64,
    /// Fraction of all duplicate writes that reference those contents.
    pub share: f64,
}

/// Top fractions of contents (percent) tabulated in `TraceStats::popularity`.
const POPULARITY_TOPS: [f64; 3] = [0.1, 1.0, 10.0];

/// Statistics of one trace (the `nodup trace stats --json` object).
#[derive(Debug, Clone, Serialize, Default)]
pub struct TraceStats {
    /// Parsed records.
    pub records: u64,
    /// Write requests.
    pub write_requests: u64,
    /// Read requests.
    pub read_requests: u64,
    /// Written 4 KiB blocks (a partially written block counts once).
    pub writes: u64,
    /// Read 4 KiB blocks.
    pub reads: u64,
    /// Bytes written by the requests.
    pub write_bytes: u64,
    /// Bytes read by the requests.
    pub read_bytes: u64,
    /// Written blocks whose content was already present.
    pub duplicate_writes: u64,
    /// duplicate_writes / writes.
    pub dedup_ratio: f64,
    /// Written blocks that were not duplicates.
    pub unique_blocks: u64,
    /// Blocks holding data at the end of the trace.
    pub live_blocks: u64,
    /// Distinct contents among the live blocks at the end of the trace.
    pub distinct_live_contents: u64,
    /// 1 - distinct_live_contents / live_blocks: what a dedup FS reports after the replay.
    pub final_dedup_ratio: f64,
    /// Requests not aligned to 4 KiB (start or length).
    pub unaligned_requests: u64,
    /// Distinct devices (major, minor).
    pub devices: u64,
    /// Lines that did not parse (skipped).
    pub bad_lines: u64,
    /// Number of duplicate runs.
    pub dup_runs: u64,
    /// Mean duplicate run length in blocks.
    pub mean_dup_run: f64,
    /// Longest duplicate run in blocks.
    pub max_dup_run: u64,
    /// Continuousness CDF at lengths 1, 2, 4, 8, 10, 16, ... up to the longest run.
    pub continuity_cdf: Vec<CdfPoint>,
    /// Share of duplicate references going to the top 0.1 %, 1 % and 10 % of contents.
    pub popularity: Vec<PopularityPoint>,
    /// Most duplicate references to a single content.
    pub max_content_refs: u64,
    /// Number of runs per run length (the full distribution behind the CDF).
    #[serde(skip)]
    pub run_hist: BTreeMap<u64, u64>,
}

impl TraceStats {
    /// CDF value at run length `len`.
    pub fn cdf_at(&self, len: u64) -> f64 {
        if self.duplicate_writes == 0 {
            return 1.0;
        }
        let below: u64 = self.run_hist.range(..=len).map(|(l, n)| l * n).sum();
        below as f64 / self.duplicate_writes as f64
    }

    /// Lengths at which the CDF is tabulated.
    pub fn cdf_lengths(&self) -> Vec<u64> {
        let mut v = vec![];
        let mut l = 1u64;
        while l < self.max_dup_run.max(1) {
            v.push(l);
            if l == 8 {
                v.push(10);
            }
            l *= 2;
        }
        v.push(self.max_dup_run.max(1));
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Streaming computation of `TraceStats`, one record at a time.
#[derive(Default)]
pub struct StatsBuilder {
    model: LbaModel,
    live: HashMap<BlockKey, u32>,
    /// Duplicate references per content (only contents referenced at least once).
    refs: HashMap<BlockKey, u32>,
    run: u64,
    s: TraceStats,
}

impl StatsBuilder {
    /// Account one record.
    pub fn add(&mut self, r: &crate::record::Record) -> Result<()> {
        let s = &mut self.s;
        s.records += 1;
        if r.lba % SECTORS_PER_BLOCK != 0 || r.sectors as u64 % SECTORS_PER_BLOCK != 0 {
            s.unaligned_requests += 1;
        }
        let dev = self.model.device_index(r.device())?;
        let blocks = r.end_block() - r.first_block();
        match r.op {
            Op::Read => {
                s.read_requests += 1;
                s.reads += blocks;
                s.read_bytes += r.bytes();
            }
            Op::Write => {
                s.write_requests += 1;
                s.writes += blocks;
                s.write_bytes += r.bytes();
                for t in touches(r) {
                    let (old, new) = self.model.write(dev, r, t)?;
                    let dup = self.live.get(&new).is_some_and(|&n| n > 0);
                    if dup {
                        self.s.duplicate_writes += 1;
                        self.run += 1;
                        let n = self.refs.entry(new).or_insert(0);
                        *n = n.saturating_add(1);
                    } else {
                        self.close_run();
                    }
                    if old != BlockKey::default() {
                        if let Some(n) = self.live.get_mut(&old) {
                            *n -= 1;
                            if *n == 0 {
                                self.live.remove(&old);
                            }
                        }
                    }
                    *self.live.entry(new).or_insert(0) += 1;
                }
            }
        }
        Ok(())
    }

    fn close_run(&mut self) {
        if self.run > 0 {
            *self.s.run_hist.entry(self.run).or_insert(0) += 1;
            self.run = 0;
        }
    }

    /// Finish: close the last run and derive ratios and the CDF.
    pub fn finish(mut self, bad_lines: u64) -> TraceStats {
        self.close_run();
        let mut s = self.s;
        s.bad_lines = bad_lines;
        s.devices = self.model.device_index_count();
        s.unique_blocks = s.writes - s.duplicate_writes;
        s.dedup_ratio = if s.writes > 0 {
            s.duplicate_writes as f64 / s.writes as f64
        } else {
            0.0
        };
        s.live_blocks = self.model.live_blocks() as u64;
        s.distinct_live_contents = self.live.len() as u64;
        s.final_dedup_ratio = if s.live_blocks > 0 {
            1.0 - s.distinct_live_contents as f64 / s.live_blocks as f64
        } else {
            0.0
        };
        s.dup_runs = s.run_hist.values().sum();
        s.max_dup_run = s.run_hist.keys().next_back().copied().unwrap_or(0);
        s.mean_dup_run = if s.dup_runs > 0 {
            s.duplicate_writes as f64 / s.dup_runs as f64
        } else {
            0.0
        };
        s.continuity_cdf = s
            .cdf_lengths()
            .into_iter()
            .map(|len| CdfPoint {
                len,
                cdf: s.cdf_at(len),
            })
            .collect();
        let mut counts: Vec<u32> = self.refs.into_values().collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        s.max_content_refs = counts.first().map_or(0, |&n| n as u64);
        s.popularity = popularity(&counts, s.unique_blocks, s.duplicate_writes);
        s
    }
}

/// The popularity table from reference counts sorted in descending order.
fn popularity(sorted: &[u32], contents: u64, dup_writes: u64) -> Vec<PopularityPoint> {
    POPULARITY_TOPS
        .iter()
        .map(|&pct| {
            let k = if contents == 0 {
                0
            } else {
                ((contents as f64 * pct / 100.0).ceil() as u64).max(1)
            };
            let top: u64 = sorted.iter().take(k as usize).map(|&n| n as u64).sum();
            PopularityPoint {
                top_percent: pct,
                contents: k,
                share: if dup_writes > 0 {
                    top as f64 / dup_writes as f64
                } else {
                    0.0
                },
            }
        })
        .collect()
}

/// Compute the statistics of a whole trace, streaming it.
pub fn trace_stats(
    reader: &mut TraceReader,
    policy: &BadLinePolicy<'_>,
    progress: impl FnMut(u64),
) -> Result<TraceStats> {
    let mut b = StatsBuilder::default();
    let bad = for_each_record(reader, policy, progress, |_, r| b.add(&r))?;
    Ok(b.finish(bad))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{DigestUnit, Record};

    fn w(lba: u64, digests: &[u8]) -> Record {
        Record {
            ts: 0,
            pid: 1,
            process: "t".into(),
            lba,
            sectors: 8 * digests.len() as u32,
            op: Op::Write,
            major: 6,
            minor: 0,
            unit: DigestUnit::Block,
            digests: digests.iter().map(|&x| [x; 16]).collect(),
        }
    }

    fn run(recs: &[Record]) -> TraceStats {
        let mut b = StatsBuilder::default();
        for r in recs {
            b.add(r).unwrap();
        }
        b.finish(0)
    }

    #[test]
    fn duplicates_within_and_across_requests() {
        // A B A | C A B : duplicates are the 3rd, 5th and 6th blocks.
        let s = run(&[w(0, &[1, 2, 1]), w(24, &[3, 1, 2])]);
        assert_eq!(s.writes, 6);
        assert_eq!(s.duplicate_writes, 3);
        assert_eq!(s.unique_blocks, 3);
        assert!((s.dedup_ratio - 0.5).abs() < 1e-12);
        // Runs: [3rd] length 1, [5th, 6th] length 2.
        assert_eq!(s.run_hist, BTreeMap::from([(1, 1), (2, 1)]));
        assert!((s.cdf_at(1) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.cdf_at(2), 1.0);
        // References: A twice, B once; the top content (ceil of 0.1 % of 3 = 1) holds 2 of 3.
        assert_eq!(s.max_content_refs, 2);
        assert_eq!(s.popularity[0].contents, 1);
        assert!((s.popularity[0].share - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.popularity[2].contents, 1);
    }

    #[test]
    fn popularity_against_a_counting_model() {
        // 1000 unique contents 1..=1000, then content c referenced (1000 / c) times: a Zipf(1)
        // law. The table must match counting the same references directly.
        let mut recs = vec![];
        let mut lba = 0;
        let key = |c: u32| c.to_le_bytes().repeat(4);
        let wr = |lba: u64, c: u32| {
            let mut r = w(lba, &[0]);
            r.digests[0].copy_from_slice(&key(c));
            r
        };
        for c in 1..=1000u32 {
            recs.push(wr(lba, c));
            lba += 8;
        }
        let mut refs: Vec<u64> = vec![];
        for c in 1..=1000u32 {
            let n = 1000 / c;
            refs.push(n as u64);
            for _ in 0..n {
                recs.push(wr(lba, c));
                lba += 8;
            }
        }
        let s = run(&recs);
        let total: u64 = refs.iter().sum();
        assert_eq!(s.duplicate_writes, total);
        assert_eq!(s.unique_blocks, 1000);
        assert_eq!(s.max_content_refs, 1000);
        for (p, k) in s.popularity.iter().zip([1usize, 10, 100]) {
            assert_eq!(p.contents, k as u64);
            let want = refs[..k].iter().sum::<u64>() as f64 / total as f64;
            assert!((p.share - want).abs() < 1e-12, "{p:?} vs {want}");
        }
    }

    #[test]
    fn overwritten_content_is_no_longer_present() {
        // Write A at 0, overwrite with B, then A elsewhere: A is gone, so not a duplicate.
        let s = run(&[w(0, &[1]), w(0, &[2]), w(8, &[1])]);
        assert_eq!(s.duplicate_writes, 0);
        // Rewriting B in place finds B present (itself).
        let s = run(&[w(0, &[2]), w(0, &[2])]);
        assert_eq!(s.duplicate_writes, 1);
        assert_eq!(s.live_blocks, 1);
        assert_eq!(s.final_dedup_ratio, 0.0);
    }
}
