//! The workloads of Freewrite §4.1: 8-byte keys, values of 128–1024 bytes (512 by default),
//! about 4 % of PUTs overwriting a key written before, and three key distributions:
//! uniform keys; clustered keys (runs of 20 consecutive keys, as an object split into items
//! with its locality kept); mixed (five uniform keys between every two clusters). An overwrite
//! repeats a whole earlier unit (a cluster, or a single uniform key), so it keeps the
//! distribution's locality. Values are random bytes, unique per PUT, so no two values dedup.

use crate::error::{Error, Result};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// Keys in a cluster (§4.1).
pub const CLUSTER: u64 = 20;
/// Uniform keys between two clusters in the mixed distribution (§4.1).
pub const MIXED_SINGLES: u64 = 5;
/// Share of units that overwrite an earlier one (§4.1: about 4 % of PUTs).
pub const OVERWRITE: f64 = 0.04;
/// Bytes of a key (§4.1).
pub const KEY_BYTES: usize = 8;
/// Value sizes of the experiments (§4.2); 512 is the default.
pub const VALUE_SIZES: [usize; 4] = [128, 256, 512, 1024];

nodup_core::named_enum! {
    /// How keys are drawn.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum KeyDist {
        /// Uniform over the 64-bit key space.
        Uniform = 1 => "uniform",
        /// Clusters of 20 consecutive keys at uniform places.
        Clustered = 2 => "clustered",
        /// A cluster, then five uniform keys, then a cluster...
        Mixed = 3 => "mixed",
    }
}

/// A unit of keys written together.
#[derive(Debug, Clone, Copy)]
enum Unit {
    Single(u64),
    Cluster(u64),
}

/// A stream of PUTs.
pub struct Workload {
    dist: KeyDist,
    value_size: usize,
    rng: StdRng,
    singles: Vec<u64>,
    clusters: Vec<u64>,
    /// Keys of the current unit not yet returned, and whether it is an overwrite.
    queue: std::collections::VecDeque<u64>,
    overwriting: bool,
    /// Units issued in the current mixed cycle (0: the cluster).
    cycle: u64,
    puts: u64,
    overwrites: u64,
}

impl Workload {
    /// A workload of `dist` keys with values of `value_size` bytes, reproducible from `seed`.
    pub fn new(dist: KeyDist, value_size: usize, seed: u64) -> Result<Self> {
        if value_size == 0 || value_size > crate::record::MAX_VALUE {
            return Err(Error::Invalid(format!("value size {value_size}")));
        }
        Ok(Workload {
            dist,
            value_size,
            rng: StdRng::seed_from_u64(seed),
            singles: Vec::new(),
            clusters: Vec::new(),
            queue: Default::default(),
            overwriting: false,
            cycle: 0,
            puts: 0,
            overwrites: 0,
        })
    }

    /// Bytes a PUT carries (key and value).
    pub fn put_bytes(&self) -> u64 {
        (KEY_BYTES + self.value_size) as u64
    }

    /// PUTs issued.
    pub fn puts(&self) -> u64 {
        self.puts
    }

    /// PUTs of keys written before.
    pub fn overwrites(&self) -> u64 {
        self.overwrites
    }

    fn next_unit(&mut self) -> Unit {
        let cluster = match self.dist {
            KeyDist::Uniform => false,
            KeyDist::Clustered => true,
            KeyDist::Mixed => {
                let c = self.cycle == 0;
                self.cycle = (self.cycle + 1) % (MIXED_SINGLES + 1);
                c
            }
        };
        let pool = if cluster {
            &self.clusters
        } else {
            &self.singles
        };
        self.overwriting = !pool.is_empty() && self.rng.gen_bool(OVERWRITE);
        if self.overwriting {
            let i = self.rng.gen_range(0..pool.len());
            return if cluster {
                Unit::Cluster(pool[i])
            } else {
                Unit::Single(pool[i])
            };
        }
        if cluster {
            let base = self.rng.gen_range(0..u64::MAX - CLUSTER);
            self.clusters.push(base);
            Unit::Cluster(base)
        } else {
            let k = self.rng.gen::<u64>();
            self.singles.push(k);
            Unit::Single(k)
        }
    }

    /// The next PUT: its key, and its value written into `value`.
    pub fn next(&mut self, value: &mut Vec<u8>) -> [u8; KEY_BYTES] {
        if self.queue.is_empty() {
            match self.next_unit() {
                Unit::Single(k) => self.queue.push_back(k),
                Unit::Cluster(b) => self.queue.extend(b..b + CLUSTER),
            }
        }
        let k = self.queue.pop_front().unwrap_or_default();
        self.puts += 1;
        if self.overwriting {
            self.overwrites += 1;
        }
        value.resize(self.value_size, 0);
        self.rng.fill_bytes(value);
        k.to_be_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn keys(d: KeyDist, n: usize) -> (Vec<u64>, Workload) {
        let mut w = Workload::new(d, 16, 7).unwrap();
        let mut v = Vec::new();
        let k = (0..n).map(|_| u64::from_be_bytes(w.next(&mut v))).collect();
        (k, w)
    }

    #[test]
    fn about_four_percent_overwrites_in_every_distribution() {
        for d in KeyDist::ALL {
            let (k, w) = keys(d, 200_000);
            let distinct = k.iter().collect::<HashSet<_>>().len() as u64;
            assert_eq!(w.puts() - distinct, w.overwrites(), "{d:?}");
            let share = w.overwrites() as f64 / w.puts() as f64;
            assert!((0.03..0.05).contains(&share), "{d:?}: {share}");
        }
    }

    #[test]
    fn clusters_are_runs_of_twenty_consecutive_keys_and_mixed_puts_five_between() {
        let (k, _) = keys(KeyDist::Clustered, 200);
        for c in k.chunks(20) {
            assert!(c.windows(2).all(|w| w[1] == w[0] + 1));
        }
        let (k, _) = keys(KeyDist::Mixed, 250);
        for c in k.chunks(25) {
            assert!(c[..20].windows(2).all(|w| w[1] == w[0] + 1));
        }
    }
}
