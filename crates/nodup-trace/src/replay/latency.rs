//! Log-linear latency histogram: constant memory, ~1.6 % resolution, mergeable across threads.
//!
//! Values below 64 ns get one bucket each; above, each power of two is split into 64 buckets, so
//! the whole u64 range fits in 3776 counters whatever the trace length.

use serde::Serialize;

const SUB: u32 = 6; // log2 of buckets per power of two
const LINEAR: u64 = 1 << SUB;
const BUCKETS: usize = (63 - SUB as usize + 2) * LINEAR as usize;

/// Latency percentiles in microseconds (the `latency_us` JSON object).
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

/// A histogram of nanosecond samples.
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    n: u64,
    max: u64,
    sum: u128,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            n: 0,
            max: 0,
            sum: 0,
        }
    }
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    let m = (v >> (e - SUB)) & (LINEAR - 1);
    (e - SUB + 1) as usize * LINEAR as usize + m as usize
}

/// Smallest value that falls in bucket `i`.
fn lower(i: usize) -> u64 {
    if (i as u64) < LINEAR {
        return i as u64;
    }
    let e = (i as u64 / LINEAR) as u32 + SUB - 1;
    let m = i as u64 % LINEAR;
    (LINEAR + m) << (e - SUB)
}

impl Histogram {
    /// Record one sample (nanoseconds).
    pub fn record(&mut self, ns: u64) {
        self.counts[index(ns)] += 1;
        self.n += 1;
        self.max = self.max.max(ns);
        self.sum += ns as u128;
    }

    /// Add another histogram's samples.
    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.n += o.n;
        self.max = self.max.max(o.max);
        self.sum += o.sum;
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.n
    }

    /// Sum of all samples (exact).
    pub fn sum(&self) -> u128 {
        self.sum
    }

    /// Largest sample.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Arithmetic mean (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum as f64 / self.n as f64
        }
    }

    /// The value (ns) below which a fraction `q` of the samples lie (bucket midpoint, capped at max).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let lo = lower(i);
                let hi = if i + 1 < BUCKETS {
                    lower(i + 1)
                } else {
                    u64::MAX
                };
                return (lo + (hi - lo) / 2).min(self.max);
            }
        }
        self.max
    }

    /// Percentiles in microseconds.
    pub fn percentiles(&self) -> Percentiles {
        let us = |ns: u64| ns as f64 / 1000.0;
        Percentiles {
            p50: us(self.quantile(0.50)),
            p90: us(self.quantile(0.90)),
            p99: us(self.quantile(0.99)),
            p999: us(self.quantile(0.999)),
            max: us(self.max),
            mean: if self.n > 0 {
                self.sum as f64 / self.n as f64 / 1000.0
            } else {
                0.0
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_monotonic() {
        for i in 0..BUCKETS - 1 {
            assert!(lower(i) < lower(i + 1), "bucket {i}");
            assert_eq!(index(lower(i)), i);
            assert_eq!(index(lower(i + 1) - 1), i);
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_within_two_percent() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        for (q, want) in [
            (0.5, 500_000.0),
            (0.9, 900_000.0),
            (0.99, 990_000.0),
            (0.999, 999_000.0),
        ] {
            let got = h.quantile(q) as f64;
            assert!((got - want).abs() / want < 0.02, "q{q}: {got} vs {want}");
        }
        assert_eq!(h.percentiles().max, 1000.0);
        let mut g = Histogram::default();
        g.record(5_000_000);
        h.merge(&g);
        assert_eq!(h.count(), 100_001);
        assert_eq!(h.percentiles().max, 5000.0);
    }
}
