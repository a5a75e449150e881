//! Synthetic FIU-format traces with a chosen duplication ratio and duplicate-run shape.
//!
//! Model: every record is one 4 KiB request (like the FIU mail trace). Writes go to consecutive
//! LBAs of device 8:0 (a file being filled), so no content is ever overwritten and the
//! duplication ratio seen by `trace stats` equals what a dedup file system reports after replay.
//! Writes alternate between *unique runs* (fresh contents, digest = MD5(seed, counter)) and
//! *duplicate runs* that copy a consecutive stretch of earlier unique contents; duplicate run
//! lengths follow `--run-length`, unique run lengths are geometric with the mean that yields the
//! target ratio, and each next run type is chosen to steer the running ratio to the target, so the
//! result lands within about one run length of it. Reads (a `--read-ratio` fraction of records)
//! re-read a random written block and carry its digest.
//!
//! Where a duplicate run copies from is `--popularity` (uniform start, or Zipf over the contents
//! ranked by creation so a few are referenced very often) and `--phases` (the pool of sources
//! restarts at each phase boundary, so the hot set changes); see `crate::popularity`.

use crate::error::{Result, TraceError};
use crate::format::fiu::format_line;
use crate::popularity::{phase_of, Popularity};
use crate::record::{Digest, DigestUnit, Op, Record, BLOCK_BYTES, SECTORS_PER_BLOCK};
use md5::{Digest as _, Md5};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::str::FromStr;

/// Distribution of duplicate run lengths, in blocks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RunLength {
    /// Always N blocks (`fixed:N`).
    Fixed(u64),
    /// Geometric with the given mean (`geom:MEAN`).
    Geom(f64),
    /// Uniform between A and B inclusive (`uniform:A-B`).
    Uniform(u64, u64),
}

impl FromStr for RunLength {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            TraceError::Invalid(format!(
                "run length {s:?}: expected fixed:N, geom:MEAN or uniform:A-B"
            ))
        };
        let (kind, arg) = s.split_once(':').ok_or_else(bad)?;
        let d = match kind {
            "fixed" => RunLength::Fixed(arg.parse().map_err(|_| bad())?),
            "geom" => RunLength::Geom(arg.parse().map_err(|_| bad())?),
            "uniform" => {
                let (a, b) = arg.split_once('-').ok_or_else(bad)?;
                RunLength::Uniform(a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?)
            }
            _ => return Err(bad()),
        };
        let ok = match d {
            RunLength::Fixed(n) => n >= 1,
            RunLength::Geom(m) => m.is_finite() && m >= 1.0,
            RunLength::Uniform(a, b) => a >= 1 && a <= b,
        };
        if ok {
            Ok(d)
        } else {
            Err(bad())
        }
    }
}

impl RunLength {
    /// Mean run length.
    pub fn mean(&self) -> f64 {
        match *self {
            RunLength::Fixed(n) => n as f64,
            RunLength::Geom(m) => m,
            RunLength::Uniform(a, b) => (a + b) as f64 / 2.0,
        }
    }

    /// Draw one run length (>= 1).
    pub fn sample(&self, rng: &mut StdRng) -> u64 {
        match *self {
            RunLength::Fixed(n) => n,
            RunLength::Geom(m) => geometric(rng, m),
            RunLength::Uniform(a, b) => rng.gen_range(a..=b),
        }
    }
}

/// A geometric draw on {1, 2, ...} with the given mean (inverse transform).
fn geometric(rng: &mut StdRng, mean: f64) -> u64 {
    if mean <= 1.0 {
        return 1;
    }
    let p = 1.0 / mean;
    let u: f64 = 1.0 - rng.gen::<f64>(); // in (0, 1]
    1 + (u.ln() / (1.0 - p).ln()).floor() as u64
}

/// Parameters of `nodup trace gen`.
#[derive(Debug, Clone)]
pub struct GenOptions {
    /// Total bytes of all requests (reads + writes).
    pub size: u64,
    /// Target fraction of written blocks whose content is a duplicate (0..=1).
    pub dup_ratio: f64,
    /// Duplicate run-length distribution.
    pub run_length: RunLength,
    /// Fraction of records that are reads (0..1).
    pub read_ratio: f64,
    /// Random seed (same seed, same trace).
    pub seed: u64,
    /// Which earlier contents duplicate runs copy (uniform: today's flat choice).
    pub popularity: Popularity,
    /// Equal parts of the trace, each with its own pool of sources (its own hot set); >= 1.
    pub phases: u64,
}

impl GenOptions {
    /// Records (4 KiB requests) the trace will hold.
    pub fn records(&self) -> u64 {
        (self.size / BLOCK_BYTES).max(1)
    }

    /// Check every value before anything is written (the CLI calls it before creating the file).
    pub fn validate(&self) -> Result<()> {
        // Each record is one 4 KiB request: a smaller size would still give one (`records`
        // rounds up to 1), a trace of a size nobody asked for.
        if self.size < BLOCK_BYTES {
            return Err(TraceError::Invalid(format!(
                "size {}: too small, a trace needs at least one {} KiB request",
                self.size,
                BLOCK_BYTES >> 10
            )));
        }
        if !(0.0..=1.0).contains(&self.dup_ratio) {
            return Err(TraceError::Invalid(format!(
                "dup ratio {} not in 0..=1",
                self.dup_ratio
            )));
        }
        if !(0.0..1.0).contains(&self.read_ratio) {
            return Err(TraceError::Invalid(format!(
                "read ratio {} not in 0..1",
                self.read_ratio
            )));
        }
        let total = self.records();
        if self.phases == 0 || self.phases > total {
            return Err(TraceError::Invalid(format!(
                "phases {}: must be between 1 and the trace's {total} records",
                self.phases
            )));
        }
        Ok(())
    }
}

/// What the generator produced.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GenSummary {
    /// Records written.
    pub records: u64,
    /// Written blocks.
    pub write_blocks: u64,
    /// Written blocks that duplicate earlier content.
    pub dup_blocks: u64,
    /// Read blocks.
    pub read_blocks: u64,
}

fn unique_digest(seed: u64, k: u64) -> Digest {
    let mut h = Md5::new();
    h.update(b"nodup-gen");
    h.update(seed.to_le_bytes());
    h.update(k.to_le_bytes());
    h.finalize().into()
}

/// Generate a trace into `out` (FIU text).
pub fn generate(o: &GenOptions, out: &mut impl Write) -> Result<GenSummary> {
    o.validate()?;
    let total = o.records();
    let mut rng = StdRng::seed_from_u64(o.seed);
    let unique_mean = if o.dup_ratio > 0.0 {
        o.run_length.mean() * (1.0 - o.dup_ratio) / o.dup_ratio
    } else {
        f64::INFINITY
    };
    let mut content_of: Vec<u64> = Vec::new(); // write index -> unique counter
    let mut uniques = 0u64; // unique contents created so far
    let (mut phase, mut phase_base) = (0u64, 0u64); // current phase, its first unique counter
    let mut sum = GenSummary::default();
    // Current run: (is_dup, next unique counter to copy or create, blocks left).
    let (mut dup, mut next_k, mut left) = (false, 0u64, 0u64);
    let mut rec = Record {
        ts: 0,
        pid: 4000,
        process: "nodupgen".into(),
        lba: 0,
        sectors: SECTORS_PER_BLOCK as u32,
        op: Op::Write,
        major: 8,
        minor: 0,
        unit: DigestUnit::Block,
        digests: vec![[0; 16]],
    };
    for i in 0..total {
        rec.ts = 1_000_000 + i * 1_000;
        let p = phase_of(i, total, o.phases);
        if p != phase {
            // New hot set: sources only among contents created from now on, so a duplicate run
            // ends here (a unique run may go on: its next contents belong to the new pool).
            phase = p;
            phase_base = uniques;
            if dup {
                left = 0;
            }
        }
        if !content_of.is_empty() && o.read_ratio > 0.0 && rng.gen::<f64>() < o.read_ratio {
            let idx = rng.gen_range(0..content_of.len());
            rec.op = Op::Read;
            rec.lba = idx as u64 * SECTORS_PER_BLOCK;
            rec.digests[0] = unique_digest(o.seed, content_of[idx]);
            sum.read_blocks += 1;
        } else {
            if left == 0 {
                let pool = uniques - phase_base;
                let want_dup = pool > 0
                    && o.dup_ratio > 0.0
                    && (sum.dup_blocks as f64) < o.dup_ratio * (sum.write_blocks as f64 + 1.0);
                if want_dup {
                    let len = o.run_length.sample(&mut rng).min(pool);
                    dup = true;
                    next_k = phase_base + o.popularity.run_start(&mut rng, pool, len);
                    left = len;
                } else {
                    dup = false;
                    next_k = uniques;
                    left = if unique_mean.is_finite() {
                        geometric(&mut rng, unique_mean.max(1.0))
                    } else {
                        u64::MAX
                    };
                }
            }
            let k = next_k;
            next_k += 1;
            left -= 1;
            if dup {
                sum.dup_blocks += 1;
            } else {
                uniques += 1;
            }
            rec.op = Op::Write;
            rec.lba = content_of.len() as u64 * SECTORS_PER_BLOCK;
            rec.digests[0] = unique_digest(o.seed, k);
            content_of.push(k);
            sum.write_blocks += 1;
        }
        sum.records += 1;
        writeln!(out, "{}", format_line(&rec))
            .map_err(|e| TraceError::io("writing generated trace", e))?;
    }
    out.flush()
        .map_err(|e| TraceError::io("writing generated trace", e))?;
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fiu::FiuReader;
    use crate::stats::StatsBuilder;

    fn gen(size: u64, dup: f64, rl: &str, rr: f64, seed: u64) -> (Vec<u8>, GenSummary) {
        let o = GenOptions {
            size,
            dup_ratio: dup,
            run_length: rl.parse().unwrap(),
            read_ratio: rr,
            seed,
            popularity: Popularity::Uniform,
            phases: 1,
        };
        let mut v = Vec::new();
        let s = generate(&o, &mut v).unwrap();
        (v, s)
    }

    fn stats(v: &[u8]) -> crate::stats::TraceStats {
        let mut b = StatsBuilder::default();
        for r in FiuReader::new(v) {
            b.add(&r.unwrap().1).unwrap();
        }
        b.finish(0)
    }

    #[test]
    fn hits_the_target_ratio_and_run_shape() {
        for (dup, rl) in [
            (0.75, "fixed:64"),
            (0.5, "geom:8"),
            (0.3, "uniform:1-4"),
            (0.0, "fixed:1"),
        ] {
            let (v, sum) = gen(32 << 20, dup, rl, 0.0, 7);
            let s = stats(&v);
            assert_eq!(s.writes, 8192);
            assert_eq!(s.duplicate_writes, sum.dup_blocks, "{rl}");
            assert!(
                (s.dedup_ratio - dup).abs() < 0.02,
                "{rl}: ratio {} vs {dup}",
                s.dedup_ratio
            );
        }
        // fixed:64 runs: almost every duplicate lies in a run of >= 64 (adjacent runs may merge).
        let (v, _) = gen(32 << 20, 0.75, "fixed:64", 0.0, 1);
        assert!(stats(&v).cdf_at(63) < 0.05);
        let (v, _) = gen(32 << 20, 0.75, "fixed:1", 0.0, 1);
        assert!(stats(&v).cdf_at(3) > 0.3);
    }

    #[test]
    fn reads_and_determinism() {
        let (a, sa) = gen(4 << 20, 0.5, "geom:4", 0.25, 3);
        let (b, _) = gen(4 << 20, 0.5, "geom:4", 0.25, 3);
        let (c, _) = gen(4 << 20, 0.5, "geom:4", 0.25, 4);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let s = stats(&a);
        assert_eq!(s.reads, sa.read_blocks);
        assert!(
            (s.reads as f64 / 1024.0 - 0.25).abs() < 0.06,
            "reads {}",
            s.reads
        );
    }

    /// MD5 of the output, hex.
    fn md5_hex(v: &[u8]) -> String {
        let d: [u8; 16] = Md5::digest(v).into();
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn default_popularity_and_one_phase_keep_old_traces() {
        // Digests computed with the generator before --popularity and --phases existed.
        for (size, dup, rl, rr, seed, want) in [
            (
                32 << 20,
                0.5,
                "geom:16",
                0.0,
                1,
                "82ff6760ecee7dcd87d2232467a5ea96",
            ),
            (
                8 << 20,
                0.75,
                "fixed:64",
                0.2,
                42,
                "02211212e3e9a098ba3bc77b11e8d7a0",
            ),
            (
                4 << 20,
                0.3,
                "uniform:1-4",
                0.1,
                7,
                "f3ea16ed81f2501035fb65ac0d4f5609",
            ),
            (
                2 << 20,
                1.0,
                "fixed:4",
                0.0,
                3,
                "0f8054eed817f9a81c90a9f0e4534500",
            ),
            (
                2 << 20,
                0.0,
                "geom:16",
                0.5,
                9,
                "f92435d17004f342074fb590d3835758",
            ),
        ] {
            let (v, _) = gen(size, dup, rl, rr, seed);
            assert_eq!(md5_hex(&v), want, "{size} {dup} {rl} {rr} {seed}");
        }
    }

    #[test]
    fn rejects_a_size_below_one_request() {
        for size in [0, BLOCK_BYTES - 1] {
            let o = GenOptions {
                size,
                dup_ratio: 0.5,
                run_length: RunLength::Fixed(4),
                read_ratio: 0.0,
                seed: 1,
                popularity: Popularity::Uniform,
                phases: 1,
            };
            let e = o.validate().unwrap_err().to_string();
            assert!(e.contains("too small"), "{size}: {e}");
        }
    }

    #[test]
    fn rejects_bad_phase_counts() {
        for phases in [0, 257] {
            let o = GenOptions {
                size: 1 << 20,
                dup_ratio: 0.5,
                run_length: RunLength::Fixed(4),
                read_ratio: 0.0,
                seed: 1,
                popularity: Popularity::Uniform,
                phases,
            };
            let e = generate(&o, &mut Vec::new()).unwrap_err().to_string();
            assert!(e.contains("phases"), "{e}");
        }
    }

    #[test]
    fn parses_distributions() {
        assert_eq!(
            "uniform:2-9".parse::<RunLength>().unwrap(),
            RunLength::Uniform(2, 9)
        );
        assert!("uniform:9-2".parse::<RunLength>().is_err());
        assert!("fixed:0".parse::<RunLength>().is_err());
        assert!("zipf:3".parse::<RunLength>().is_err());
    }
}
