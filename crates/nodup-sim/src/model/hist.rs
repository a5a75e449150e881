//! Latency distributions: nodup-trace's log-linear histogram (constant memory, ~1.6 % buckets,
//! exact sum and maximum), and the CDF points the reports plot from it.

use serde::{Deserialize, Serialize};

pub use nodup_trace::replay::latency::Histogram as Hist;

/// One point of a latency CDF.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct CdfPoint {
    /// Latency (ns).
    pub ns: u64,
    /// Fraction of requests at or below it.
    pub frac: f64,
}

/// The CDF of `h` sampled at `points` evenly spaced quantiles (equal latencies merged).
pub fn cdf(h: &Hist, points: usize) -> Vec<CdfPoint> {
    if h.count() == 0 {
        return Vec::new();
    }
    let mut out: Vec<CdfPoint> = (1..=points)
        .map(|i| {
            let q = i as f64 / points as f64;
            CdfPoint {
                ns: h.quantile(q),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_ends_at_the_maximum_and_rises() {
        let mut h = Hist::default();
        for v in 1..=1000 {
            h.record(v);
        }
        let c = cdf(&h, 10);
        assert_eq!(c.last().map(|p| (p.ns, p.frac)), Some((1000, 1.0)));
        assert!(c
            .windows(2)
            .all(|w| w[0].ns < w[1].ns && w[0].frac < w[1].frac));
        assert_eq!(h.sum(), 500_500);
        assert!((h.quantile(0.5) as f64 - 500.0).abs() < 10.0);
        assert!(cdf(&Hist::default(), 5).is_empty());
    }
}
