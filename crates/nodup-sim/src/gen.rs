//! Synthetic cache-line traces with a target duplicate rate and reference-count skew, shaped after
//! the paper's workload analysis (§2.1, Table 1): a few lines referenced thousands of times carry
//! a large share of the volume, many lines are referenced a few times, most are unique, and the
//! duplicates are mostly non-zero besides the zero line.
//!
//! Each write is, with probability `dup_rate`, a duplicate pick and otherwise a fresh random line
//! (unique). A duplicate pick is the zero line (`zero_share` of picks), a re-write of one of the
//! last 65,536 fresh lines (`recent_share`: content copied around shortly after it was made, the
//! source of lines referenced 2..10 times), or a line of the hot set: `hot_lines` fixed contents
//! chosen by a Zipf law of exponent `skew` (0 = uniform). The hot set's ranking rotates `phases`
//! times over the trace, so the hottest contents change (program phases; this is what the LRCU
//! refresh is for). Writes go to runs of consecutive lines (mean 8) at random places in a
//! footprint of `footprint_lines`; reads (`read_ratio` of the events) go to runs of consecutive
//! lines too, half of them starting where a recent write run started, half at random. Everything derives from `seed`; state is bounded (the hot set is computed, not
//! stored), so traces of any length can be generated.

use crate::error::{Result, SimError};
use crate::trace::{Event, Line, TraceWriter, FLAG_SYNTHETIC, ZERO_LINE};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// Generator parameters (see the module doc).
#[derive(Debug, Clone, serde::Serialize)]
pub struct GenOptions {
    /// Events (reads + writes).
    pub lines: u64,
    /// Fraction of writes that are duplicate picks.
    pub dup_rate: f64,
    /// Zipf exponent of the hot set (0 = uniform).
    pub skew: f64,
    /// Random seed.
    pub seed: u64,
    /// Fraction of events that are reads.
    pub read_ratio: f64,
    /// Lines of address space the trace touches.
    pub footprint_lines: u64,
    /// Distinct contents of the hot set.
    pub hot_lines: u64,
    /// Share of duplicate picks that are the zero line.
    pub zero_share: f64,
    /// Share of duplicate picks that repeat a recent fresh line.
    pub recent_share: f64,
    /// Times the hot set's ranking rotates.
    pub phases: u32,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            lines: 1_000_000,
            dup_rate: 0.62,
            skew: 1.2,
            seed: 1,
            read_ratio: 0.5,
            footprint_lines: 1 << 20,
            hot_lines: 1 << 20,
            zero_share: 0.05,
            recent_share: 0.1,
            phases: 4,
        }
    }
}

/// What was generated.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GenSummary {
    /// Events written.
    pub events: u64,
    /// Writes.
    pub writes: u64,
    /// Reads.
    pub reads: u64,
    /// Writes picked as duplicates (hot, recent or zero).
    pub duplicate_picks: u64,
    /// Writes whose content was written before in the trace (picks minus first uses).
    pub duplicate_writes: u64,
    /// `duplicate_writes / writes`.
    pub duplicate_rate: f64,
    /// Zero-line writes.
    pub zero_writes: u64,
    /// Trace file bytes.
    pub bytes: u64,
}

const RECENT: usize = 1 << 16;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Content of hot slot `slot` (never the zero line, never equal to another slot's).
fn hot_content(seed: u64, slot: u64) -> Line {
    let mut l = ZERO_LINE;
    let base = splitmix(seed ^ 0x5107) ^ slot.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    for (i, w) in l.chunks_exact_mut(8).enumerate() {
        let v = if i == 0 {
            slot | 1 << 63
        } else {
            splitmix(base.wrapping_add(i as u64))
        };
        w.copy_from_slice(&v.to_le_bytes());
    }
    l
}

impl GenOptions {
    /// Reject parameters outside their ranges.
    pub fn validate(&self) -> Result<()> {
        let frac = |v: f64| (0.0..=1.0).contains(&v);
        if !frac(self.dup_rate) || !frac(self.read_ratio) || !frac(self.zero_share) {
            return Err(SimError::Invalid(
                "--dup-rate, --read-ratio and --zero-share must be within 0..1".into(),
            ));
        }
        if !frac(self.recent_share) || self.zero_share + self.recent_share > 1.0 {
            return Err(SimError::Invalid(
                "--recent-share must be within 0..1 and, with --zero-share, at most 1".into(),
            ));
        }
        if !(self.skew >= 0.0 && self.skew.is_finite()) {
            return Err(SimError::Invalid("--skew must be >= 0".into()));
        }
        if self.footprint_lines == 0 || self.hot_lines == 0 || self.phases == 0 {
            return Err(SimError::Invalid(
                "--footprint-lines, --hot-lines and --phases must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Generate a trace into `path`; `progress` gets the events written so far now and then.
pub fn generate(
    o: &GenOptions,
    path: &std::path::Path,
    progress: &dyn Fn(u64),
) -> Result<GenSummary> {
    o.validate()?;
    let mut w = TraceWriter::create(path, FLAG_SYNTHETIC)?;
    let mut rng = SmallRng::seed_from_u64(o.seed);
    let zipf = (o.skew > 0.0)
        .then(|| Zipf::new(o.hot_lines, o.skew))
        .transpose()
        .map_err(|e| SimError::Invalid(format!("--skew: {e}")))?;
    let mut seen_hot = vec![0u64; o.hot_lines.div_ceil(64) as usize];
    let mut seen_zero = false;
    let mut recent: Vec<Line> = Vec::with_capacity(RECENT);
    let mut recent_next = 0usize;
    let mut s = GenSummary::default();
    let expected_writes = ((o.lines as f64) * (1.0 - o.read_ratio)).max(1.0) as u64;
    let mut addr = 0u64;
    let mut raddr = 0u64;
    // Starts of recent write runs: half the read runs start at one of them.
    let mut written: Vec<u64> = Vec::with_capacity(RECENT);
    for i in 0..o.lines {
        if i % (1 << 20) == 0 {
            progress(i);
        }
        if rng.gen_bool(o.read_ratio) {
            raddr = if rng.gen_ratio(1, 8) {
                if rng.gen_bool(0.5) && !written.is_empty() {
                    written[rng.gen_range(0..written.len())]
                } else {
                    rng.gen_range(0..o.footprint_lines)
                }
            } else {
                (raddr + 1) % o.footprint_lines
            };
            w.write(&Event::read(raddr))?;
            s.reads += 1;
            continue;
        }
        addr = if rng.gen_ratio(1, 8) {
            let a = rng.gen_range(0..o.footprint_lines);
            if written.len() < RECENT {
                written.push(a);
            } else {
                written[(s.writes as usize) % RECENT] = a;
            }
            a
        } else {
            (addr + 1) % o.footprint_lines
        };
        let data = if rng.gen_bool(o.dup_rate) {
            s.duplicate_picks += 1;
            let r: f64 = rng.gen();
            if r < o.zero_share {
                s.duplicate_writes += seen_zero as u64;
                seen_zero = true;
                ZERO_LINE
            } else if r < o.zero_share + o.recent_share && !recent.is_empty() {
                s.duplicate_writes += 1;
                recent[rng.gen_range(0..recent.len())]
            } else {
                let rank = match &zipf {
                    Some(z) => z.sample(&mut rng) as u64 - 1,
                    None => rng.gen_range(0..o.hot_lines),
                };
                let phase = (s.writes * o.phases as u64 / expected_writes).min(o.phases as u64 - 1);
                let slot = (rank + phase * (o.hot_lines / o.phases as u64)) % o.hot_lines;
                let (word, bit) = ((slot / 64) as usize, slot % 64);
                if seen_hot[word] & (1 << bit) != 0 {
                    s.duplicate_writes += 1;
                }
                seen_hot[word] |= 1 << bit;
                hot_content(o.seed, slot)
            }
        } else {
            let mut l = ZERO_LINE;
            rng.fill(&mut l[..]);
            if recent.len() < RECENT {
                recent.push(l);
            } else {
                recent[recent_next] = l;
                recent_next = (recent_next + 1) % RECENT;
            }
            l
        };
        if data == ZERO_LINE {
            s.zero_writes += 1;
        }
        s.writes += 1;
        w.write(&Event::write(addr, data))?;
    }
    let c = w.finish()?;
    s.events = c.events;
    s.bytes = std::fs::metadata(path)
        .map_err(|e| SimError::io(format!("reading the size of {}", path.display()), e))?
        .len();
    s.duplicate_rate = if s.writes == 0 {
        0.0
    } else {
        s.duplicate_writes as f64 / s.writes as f64
    };
    progress(o.lines);
    Ok(s)
}
