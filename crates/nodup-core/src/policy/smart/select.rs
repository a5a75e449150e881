//! Adaptive selectivity of `smart` (SmartDedup §3.4, §4.4): inline dedup fingerprints n of
//! every N blocks. After each window of [`WINDOW`] fingerprinted blocks, the window's
//! duplication ratio is compared with the mean of the last [`HISTORY`] windows: lower, and the
//! inline share drops by [`STEP_DOWN`] (not below [`FLOOR`]); higher, and it rises by
//! [`STEP_UP`] (up to 100 %). Resources scale the adaptive share: the battery level
//! proportionally, a fully busy CPU or device by half. Low-power mode switches inline dedup off
//! in either mode (blocks not fingerprinted inline go to the out-of-line worker); a fixed share
//! is otherwise not scaled.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;

/// Fingerprinted blocks per window (the paper's 150 write requests).
pub const WINDOW: u64 = 150;
/// Windows the last one is compared with.
pub const HISTORY: usize = 30;
/// Lowest adaptive share.
pub const FLOOR: f64 = 0.30;
/// Share removed after a window below the mean.
pub const STEP_DOWN: f64 = 0.10;
/// Share added after a window above the mean.
pub const STEP_UP: f64 = 0.30;
/// CPU or device utilisation counted as fully busy.
pub const BUSY: f64 = 0.95;

/// Resource state the share is scaled by (sampled by the worker, or set by an operator).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Resources {
    /// Battery level 0..=100, when the machine has one (or it was set).
    pub battery: Option<f64>,
    /// Low-power mode: no inline dedup.
    pub low_power: bool,
    /// CPU utilisation 0..=1 over the last sample.
    pub cpu_busy: f64,
    /// Device utilisation 0..=1 over the last sample.
    pub device_busy: f64,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            battery: None,
            low_power: false,
            cpu_busy: 0.0,
            device_busy: 0.0,
        }
    }
}

impl Resources {
    /// Factor the inline share (and the worker's rate) is scaled by.
    pub fn factor(&self) -> f64 {
        if self.low_power {
            return 0.0;
        }
        let mut f = self.battery.map_or(1.0, |b| (b / 100.0).clamp(0.0, 1.0));
        if self.cpu_busy >= BUSY || self.device_busy >= BUSY {
            f *= 0.5;
        }
        f
    }
}

#[derive(Debug)]
struct State {
    /// The adaptive share before resource scaling.
    share: f64,
    win_blocks: u64,
    win_hits: u64,
    history: VecDeque<f64>,
    res: Resources,
    windows: u64,
}

/// The selectivity controller.
#[derive(Debug)]
pub struct Selectivity {
    /// None: adaptive; Some(s): fixed share s.
    fixed: Option<f64>,
    /// Effective share in millionths (read per block without a lock).
    effective: AtomicU32,
    counter: AtomicU64,
    offered: AtomicU64,
    taken: AtomicU64,
    st: Mutex<State>,
}

impl Selectivity {
    /// Adaptive (`fixed` None) or a fixed share in (0, 1].
    pub fn new(fixed: Option<f64>) -> Selectivity {
        let share = fixed.unwrap_or(1.0).clamp(0.0, 1.0);
        Selectivity {
            fixed,
            effective: AtomicU32::new((share * 1e6) as u32),
            counter: AtomicU64::new(0),
            offered: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            st: Mutex::new(State {
                share,
                win_blocks: 0,
                win_hits: 0,
                history: VecDeque::with_capacity(HISTORY + 1),
                res: Resources::default(),
                windows: 0,
            }),
        }
    }

    /// Whether the next block is fingerprinted inline (n of every N, evenly spread).
    #[inline]
    pub fn take(&self) -> bool {
        let s = self.effective.load(Ordering::Relaxed) as u64;
        self.offered.fetch_add(1, Ordering::Relaxed);
        if s >= 1_000_000 {
            self.taken.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let k = self.counter.fetch_add(1, Ordering::Relaxed);
        let yes = (k + 1) * s / 1_000_000 > k * s / 1_000_000;
        if yes {
            self.taken.fetch_add(1, Ordering::Relaxed);
        }
        yes
    }

    /// One call's inline results: `fingerprinted` blocks looked up, `hits` of them duplicates.
    pub fn observe(&self, fingerprinted: u64, hits: u64) {
        if fingerprinted == 0 {
            return;
        }
        let mut st = self.st.lock();
        st.win_blocks += fingerprinted;
        st.win_hits += hits;
        while st.win_blocks >= WINDOW {
            // A call larger than a window closes it with its own ratio.
            let ratio = st.win_hits as f64 / st.win_blocks as f64;
            let take = WINDOW.min(st.win_blocks);
            let hits_in =
                ((st.win_hits as f64) * take as f64 / st.win_blocks as f64).round() as u64;
            st.win_blocks -= take;
            st.win_hits -= hits_in.min(st.win_hits);
            self.close_window(&mut st, ratio);
        }
    }

    fn close_window(&self, st: &mut State, ratio: f64) {
        st.windows += 1;
        if self.fixed.is_none() && !st.history.is_empty() {
            let mean = st.history.iter().sum::<f64>() / st.history.len() as f64;
            if ratio < mean - 1e-9 {
                st.share = (st.share - STEP_DOWN).max(FLOOR);
            } else if ratio > mean + 1e-9 {
                st.share = (st.share + STEP_UP).min(1.0);
            }
        }
        st.history.push_back(ratio);
        if st.history.len() > HISTORY {
            st.history.pop_front();
        }
        self.publish(st);
    }

    fn publish(&self, st: &State) {
        let f = match self.fixed {
            None => st.res.factor(),
            Some(_) if st.res.low_power => 0.0,
            Some(_) => 1.0,
        };
        let e = (st.share * f).clamp(0.0, 1.0);
        self.effective
            .store((e * 1e6).round() as u32, Ordering::Relaxed);
    }

    /// New resource readings.
    pub fn set_resources(&self, r: Resources) {
        let mut st = self.st.lock();
        st.res = r;
        self.publish(&st);
    }

    /// The resource readings in force.
    pub fn resources(&self) -> Resources {
        self.st.lock().res
    }

    /// The adaptive share and the effective one (after resources).
    pub fn shares(&self) -> (f64, f64) {
        let st = self.st.lock();
        (
            st.share,
            self.effective.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }

    /// Report for `nodup stats`.
    pub fn report(&self) -> serde_json::Value {
        let st = self.st.lock();
        serde_json::json!({
            "mode": if self.fixed.is_some() { "fixed" } else { "adaptive" },
            "share": st.share,
            "effective_share": self.effective.load(Ordering::Relaxed) as f64 / 1e6,
            "windows": st.windows,
            "blocks_offered": self.offered.load(Ordering::Relaxed),
            "blocks_fingerprinted_inline": self.taken.load(Ordering::Relaxed),
            "resources": st.res,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(s: &Selectivity) -> f64 {
        (s.shares().0 * 100.0).round() / 100.0
    }

    #[test]
    fn n_of_every_n_is_spread_evenly() {
        let s = Selectivity::new(Some(0.3));
        let got: Vec<bool> = (0..10).map(|_| s.take()).collect();
        assert_eq!(got.iter().filter(|&&b| b).count(), 3);
        // Never two in a row at 30 %.
        assert!(got.windows(2).all(|w| !(w[0] && w[1])));
    }

    #[test]
    fn falls_slowly_to_the_floor_and_rises_fast() {
        let s = Selectivity::new(None);
        // Thirty windows at 75 % duplicates: the ratio never changes, the share stays.
        for _ in 0..30 {
            s.observe(WINDOW, WINDOW * 3 / 4);
        }
        assert_eq!(share(&s), 1.0);
        // A phase of unique data: -10 points per window, down to 30 %.
        let mut seen = Vec::new();
        for _ in 0..9 {
            s.observe(WINDOW, 0);
            seen.push(share(&s));
        }
        assert_eq!(seen, vec![0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.3, 0.3]);
        // Duplicates return: +30 points per window, up to 100 %.
        s.observe(WINDOW, WINDOW);
        assert_eq!(share(&s), 0.6);
        s.observe(WINDOW, WINDOW);
        assert_eq!(share(&s), 0.9);
        s.observe(WINDOW, WINDOW);
        assert_eq!(share(&s), 1.0);
    }

    #[test]
    fn resources_scale_an_adaptive_share_and_low_power_stops_inline_dedup() {
        let fixed = Selectivity::new(Some(1.0));
        fixed.set_resources(Resources {
            battery: Some(50.0),
            cpu_busy: 0.99,
            ..Default::default()
        });
        assert_eq!(fixed.shares().1, 1.0);
        fixed.set_resources(Resources {
            low_power: true,
            ..Default::default()
        });
        assert_eq!(fixed.shares().1, 0.0);
        let s = Selectivity::new(None);
        s.set_resources(Resources {
            battery: Some(50.0),
            ..Default::default()
        });
        assert_eq!(s.shares().1, 0.5);
        s.set_resources(Resources {
            battery: Some(50.0),
            cpu_busy: 0.99,
            ..Default::default()
        });
        assert_eq!(s.shares().1, 0.25);
        s.set_resources(Resources {
            low_power: true,
            ..Default::default()
        });
        assert!((0..100).all(|_| !s.take()));
    }
}
