//! Latency histogram: exact below 1024 ns, then 512 sub-buckets per power of two (< 0.2 % error),
//! so percentiles and CDFs of any trace length cost a fixed 130 KiB.

use serde::Serialize;

const EXACT: u64 = 1024;
const SUB: u64 = 512;
const OCTAVES: u64 = 44;

/// Counts of latencies (ns).
#[derive(Clone)]
pub struct Hist {
    counts: Vec<u64>,
    n: u64,
    sum: u128,
    max: u64,
}

impl Default for Hist {
    fn default() -> Self {
        Hist {
            counts: vec![0; (EXACT + SUB * OCTAVES) as usize],
            n: 0,
            sum: 0,
            max: 0,
        }
    }
}

fn bucket(v: u64) -> usize {
    if v < EXACT {
        return v as usize;
    }
    let e = 63 - v.leading_zeros() as u64; // >= 10
    let e = e.min(10 + OCTAVES - 1);
    let shift = e - 9;
    let sub = ((v >> shift) - SUB).min(SUB - 1);
    (EXACT + (e - 10) * SUB + sub) as usize
}

fn lower(b: usize) -> u64 {
    let b = b as u64;
    if b < EXACT {
        return b;
    }
    let e = (b - EXACT) / SUB + 10;
    let sub = (b - EXACT) % SUB;
    (SUB + sub) << (e - 9)
}

/// One point of a latency CDF.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, PartialEq)]
pub struct CdfPoint {
    /// Latency (ns).
    pub ns: u64,
    /// Fraction of requests at or below it.
    pub frac: f64,
}

impl Hist {
    /// Count one latency.
    pub fn record(&mut self, v: u64) {
        self.counts[bucket(v)] += 1;
        self.n += 1;
        self.sum += v as u128;
        self.max = self.max.max(v);
    }

    /// Latencies recorded.
    pub fn count(&self) -> u64 {
        self.n
    }

    /// Sum of all latencies (exact).
    pub fn sum(&self) -> u128 {
        self.sum
    }

    /// Mean latency (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum as f64 / self.n as f64
        }
    }

    /// Largest latency.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The latency at quantile `q` (0..=1): the lower edge of the bucket holding it.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut acc = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            acc += c;
            if acc >= rank {
                return lower(b).min(self.max);
            }
        }
        self.max
    }

    /// CDF sampled at `points` quantiles plus the maximum.
    pub fn cdf(&self, points: usize) -> Vec<CdfPoint> {
        if self.n == 0 {
            return Vec::new();
        }
        let mut out: Vec<CdfPoint> = (1..=points)
            .map(|i| {
                let q = i as f64 / points as f64;
                CdfPoint {
                    ns: self.quantile(q),
                    frac: q,
                }
            })
            .collect();
        out.dedup_by(|b, a| {
            if a.ns == b.ns {
                a.frac = b.frac;
                true
            } else {
                false
            }
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotone_and_close() {
        let mut prev = 0;
        for v in (0..5000).chain([1 << 20, (1 << 20) + 12345, 1 << 40, (1 << 50) + 7]) {
            let b = bucket(v);
            assert!(b >= prev || v > 5000, "v {v}");
            prev = b;
            let lo = lower(b);
            assert!(lo <= v, "v {v} lower {lo}");
            assert!(
                (v - lo) as f64 <= v as f64 * 0.002 + 1.0,
                "v {v} lower {lo}"
            );
        }
        let mut h = Hist::default();
        for v in 1..=100 {
            h.record(v);
        }
        assert_eq!(h.quantile(0.99), 99);
        assert_eq!(h.quantile(0.5), 50);
        assert_eq!(h.mean(), 50.5);
        assert_eq!(h.cdf(4).last().map(|p| p.ns), Some(100));
    }
}
