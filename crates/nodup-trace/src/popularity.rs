//! Content popularity of generated duplicates (`nodup trace gen --popularity`, `--phases`).
//!
//! FSDedup (TOS'24 §2.1) motivates selective dedup with *content locality*: a few contents are
//! referenced very often (cache lines with 1000+ references are ~0.08 % of the unique lines but
//! ~42.6 % of the volume) and a long tail is referenced rarely. This module decides where a
//! duplicate run of the generator copies from, so traces can have that shape or the flat one.
//!
//! Design:
//! - The *pool* is the unique contents created so far in the current phase, ranked by creation
//!   order (rank 1 = the phase's first new content). A duplicate run of `len` blocks copies the
//!   `len` contents of consecutive ranks starting at a chosen rank, i.e. a consecutive stretch of
//!   earlier unique writes, exactly as uniform runs do; only the choice of the start differs.
//! - `uniform`: the start is uniform over the ranks where the run fits (the generator's original
//!   behaviour, same random draws, so traces are byte-identical to before).
//! - `zipf:S`: the start rank is drawn from Zipf(S) over the whole pool (`rand_distr::Zipf`, pool
//!   size = current pool, so the pool grows as the phase writes new contents); a start too close
//!   to the end is moved back so the run fits. The first few run lengths' worth of contents of a
//!   phase thus receive most duplicate references and every later content a long tail. Popularity
//!   attaches to run starts, not single blocks, so the head is about one mean run length wide and
//!   `--run-length fixed:1` gives the pure per-content Zipf law.
//! - Phases: the trace's records are split into N equal parts; at each boundary the pool restarts
//!   empty (a run in progress ends), so the new phase's hot set is made of contents first written
//!   in that phase and the earlier phases' contents get no further duplicate references (reads may
//!   still touch them). With one phase the pool is every unique content. A phase starts with a
//!   unique run, so phases should be long compared to the run lengths for `--dup-ratio` to hold.
//!
//! Measured (tests/gen_popularity.rs; 32 MiB, dup ratio 0.5, geom:16, seeds 1-3): the top 1 % of
//! contents get 59-64 % of the duplicate references with zipf:1.2 and 7-8 % with uniform; with
//! fixed:1 runs the top 0.1 % alone get 45-47 %.

use crate::error::{Result, TraceError};
use rand::rngs::StdRng;
use rand::Rng;
use rand_distr::{Distribution, Zipf};
use std::str::FromStr;

/// How a duplicate run picks its source among the pool's contents.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Popularity {
    /// Every start equally likely (`uniform`, the default).
    #[default]
    Uniform,
    /// Start rank drawn from Zipf with exponent S > 0 (`zipf:S`); larger S, more skew.
    Zipf(f64),
}

impl FromStr for Popularity {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            TraceError::Invalid(format!(
                "popularity {s:?}: expected uniform or zipf:S with S a number > 0"
            ))
        };
        if s == "uniform" {
            return Ok(Popularity::Uniform);
        }
        let arg = s.strip_prefix("zipf:").ok_or_else(bad)?;
        let e: f64 = arg.parse().map_err(|_| bad())?;
        if e.is_finite() && e > 0.0 {
            Ok(Popularity::Zipf(e))
        } else {
            Err(bad())
        }
    }
}

impl Popularity {
    /// Offset (0-based rank) of the first content a run of `len` blocks copies from a pool of
    /// `pool` contents; needs 1 <= len <= pool.
    pub fn run_start(&self, rng: &mut StdRng, pool: u64, len: u64) -> u64 {
        debug_assert!(len >= 1 && len <= pool);
        match *self {
            Popularity::Uniform => rng.gen_range(0..=pool - len),
            Popularity::Zipf(e) => match Zipf::new(pool, e) {
                // A rank in 1..=pool, as a float; moved back when the run would not fit.
                Ok(z) => ((z.sample(rng) as u64).saturating_sub(1)).min(pool - len),
                // Unreachable after parsing (e > 0, pool >= 1); the head is the safe answer.
                Err(_) => 0,
            },
        }
    }
}

/// Which of `phases` equal parts of a `total`-record trace record `i` belongs to (0-based).
pub fn phase_of(i: u64, total: u64, phases: u64) -> u64 {
    if total == 0 {
        return 0;
    }
    (i as u128 * phases as u128 / total as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn parses_and_rejects() {
        assert_eq!(
            "uniform".parse::<Popularity>().unwrap(),
            Popularity::Uniform
        );
        assert_eq!(
            "zipf:1.2".parse::<Popularity>().unwrap(),
            Popularity::Zipf(1.2)
        );
        for bad in [
            "zipf:-1", "zipf:x", "zipf:0", "zipf:", "zipf:NaN", "zipf:inf", "zipf", "",
        ] {
            let e = bad.parse::<Popularity>().unwrap_err().to_string();
            assert!(e.contains("expected uniform or zipf:S"), "{bad}: {e}");
            assert!(!e.contains('\n'));
        }
    }

    #[test]
    fn zipf_starts_follow_the_law_and_fit() {
        let mut rng = StdRng::seed_from_u64(5);
        let z = Popularity::Zipf(1.0);
        let (n, draws) = (1000u64, 200_000);
        let mut hist = vec![0u64; n as usize];
        for _ in 0..draws {
            let s = z.run_start(&mut rng, n, 1);
            hist[s as usize] += 1;
        }
        // Zipf(1) over 1000 ranks: P(rank 1) = 1 / H(1000) ~ 0.1336, P(rank 2) half of it.
        let h: f64 = (1..=n).map(|k| 1.0 / k as f64).sum();
        let p1 = hist[0] as f64 / draws as f64;
        assert!((p1 - 1.0 / h).abs() < 0.005, "p1 {p1}");
        let r12 = hist[0] as f64 / hist[1] as f64;
        assert!((r12 - 2.0).abs() < 0.1, "ratio {r12}");
        // Runs always fit in the pool, also when the pool is exactly the run.
        for _ in 0..10_000 {
            assert!(z.run_start(&mut rng, 50, 20) <= 30);
            assert_eq!(Popularity::Zipf(3.0).run_start(&mut rng, 7, 7), 0);
        }
    }

    #[test]
    fn phases_split_records_evenly() {
        assert_eq!(phase_of(0, 10, 1), 0);
        assert_eq!(phase_of(9, 10, 1), 0);
        assert_eq!(phase_of(4, 10, 2), 0);
        assert_eq!(phase_of(5, 10, 2), 1);
        assert_eq!(phase_of(9, 10, 3), 2);
        assert_eq!(phase_of(u64::MAX - 1, u64::MAX, 4), 3);
        // More phases than records: each record its own phase, none past the last.
        assert_eq!(phase_of(2, 3, 100), 66);
    }
}
