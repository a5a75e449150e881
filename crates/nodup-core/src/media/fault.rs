//! `FaultMedium`: a wrapper that injects I/O errors and short writes on chosen operations,
//! for reliability tests (the engine must turn every medium failure into an error, never a
//! panic, and never a silently wrong answer).
//!
//! A fault is described by a [`FaultRule`]: which operations it watches (read, write, fence,
//! sync, discard), optionally only those touching an offset range, optionally only the Nth such
//! operation, with a probability (from the medium's seeded RNG, so a failing run replays), and
//! how many times it may fire. Its effect is an I/O error or, for writes and discards, a short
//! one (a prefix of the data reaches the medium, or of the range is given back, then the call
//! fails). Rules are checked in the order
//! they were added; the first that fires wins.
//!
//! ```
//! use std::sync::Arc;
//! use nodup_core::media::{FaultMedium, FaultRule, FaultOp, MemMedium, Medium};
//! let m = FaultMedium::new(Arc::new(MemMedium::new(4096)), 1);
//! m.add_rule(FaultRule::new(FaultOp::Write).nth(2));
//! assert!(m.write(0, b"a").is_ok());
//! assert!(m.write(0, b"b").is_err());
//! assert!(m.write(0, b"c").is_ok());
//! ```

use std::sync::Arc;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};

use super::Medium;
use crate::{Error, Result};

/// Operations a rule can watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    Read,
    Write,
    Fence,
    SyncAll,
    /// Giving a range back to what holds the medium (`Medium::discard`).
    Discard,
    /// Taking space from what holds the medium (`Medium::reserve`): a firing rule fails it
    /// with ENOSPC, as a full disk under an image file does. Not part of [`FaultOp::Any`],
    /// whose faults are I/O errors: what a failed reservation gives the caller is ENOSPC.
    Reserve,
    /// Every operation above but [`FaultOp::Reserve`].
    Any,
}

/// What a firing rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultEffect {
    /// The call fails with an I/O error; nothing is transferred.
    IoError,
    /// Writes: the first `bytes` bytes (at most the whole write) reach the medium, then the call
    /// fails; discards: the first `bytes` bytes of the range are given back, then it fails. On
    /// other operations it acts as `IoError`.
    ShortWrite { bytes: usize },
}

/// One injected fault; build with [`FaultRule::new`] and the chained setters.
#[derive(Debug, Clone)]
pub struct FaultRule {
    op: FaultOp,
    range: Option<(u64, u64)>,
    thread: Option<std::thread::ThreadId>,
    nth: Option<u64>,
    probability: f64,
    max_fires: Option<u64>,
    effect: FaultEffect,
    seen: u64,
    fired: u64,
}

impl FaultRule {
    /// A rule firing on every `op`, with an I/O error, until changed by the setters.
    pub fn new(op: FaultOp) -> FaultRule {
        FaultRule {
            op,
            range: None,
            thread: None,
            nth: None,
            probability: 1.0,
            max_fires: None,
            effect: FaultEffect::IoError,
            seen: 0,
            fired: 0,
        }
    }
    /// Only operations touching `[off, off+len)` (reads, writes and discards; fences never
    /// match a range).
    pub fn range(mut self, off: u64, len: u64) -> FaultRule {
        self.range = Some((off, off.saturating_add(len)));
        self
    }
    /// Only operations made by the calling thread (a fault aimed at one thread's work while
    /// others run on the same medium).
    pub fn this_thread(mut self) -> FaultRule {
        self.thread = Some(std::thread::current().id());
        self
    }
    /// Only the `n`th matching operation (1-based), counted by this rule.
    pub fn nth(mut self, n: u64) -> FaultRule {
        self.nth = Some(n);
        self
    }
    /// Fire with probability `p` (drawn from the medium's seeded RNG).
    pub fn probability(mut self, p: f64) -> FaultRule {
        self.probability = p.clamp(0.0, 1.0);
        self
    }
    /// Fire at most `n` times.
    pub fn max_fires(mut self, n: u64) -> FaultRule {
        self.max_fires = Some(n);
        self
    }
    /// Fire once, then never again.
    pub fn once(self) -> FaultRule {
        self.max_fires(1)
    }
    /// Make writes and discards short (`bytes` written or given back, then an error) instead
    /// of failing whole.
    pub fn short_write(mut self, bytes: usize) -> FaultRule {
        self.effect = FaultEffect::ShortWrite { bytes };
        self
    }
    /// How many times this rule fired.
    pub fn fired(&self) -> u64 {
        self.fired
    }
    /// How many operations this rule matched (fired or not): a rule that never fires counts
    /// the operations a piece of code takes, for a test to fail each in turn.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    fn matches(&self, op: FaultOp, off: u64, len: u64) -> bool {
        let any = self.op == FaultOp::Any && op != FaultOp::Reserve;
        if !any && self.op != op {
            return false;
        }
        if self
            .thread
            .is_some_and(|t| t != std::thread::current().id())
        {
            return false;
        }
        match self.range {
            None => true,
            Some((s, e)) => {
                matches!(
                    op,
                    FaultOp::Read | FaultOp::Write | FaultOp::Discard | FaultOp::Reserve
                ) && off < e
                    && off.saturating_add(len.max(1)) > s
            }
        }
    }
}

struct State {
    rules: Vec<FaultRule>,
    rng: rand::rngs::StdRng,
    injected: u64,
    ops: u64,
}

/// A [`Medium`] wrapper injecting faults; see the module doc.
pub struct FaultMedium {
    inner: Arc<dyn Medium>,
    state: Mutex<State>,
    /// What [`Medium::gathers`] answers ([`FaultMedium::set_gathers`]).
    gathers: std::sync::atomic::AtomicBool,
}

impl FaultMedium {
    /// Wrap `inner`; `seed` drives the probabilistic rules.
    pub fn new(inner: Arc<dyn Medium>, seed: u64) -> FaultMedium {
        FaultMedium {
            inner,
            state: Mutex::new(State {
                rules: Vec::new(),
                rng: rand::rngs::StdRng::seed_from_u64(seed),
                injected: 0,
                ops: 0,
            }),
            gathers: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Answer [`Medium::gathers`] with `on` (before an engine or layout uses it), so a test
    /// drives the paths a block file takes, with faults (false by default: the campaigns'
    /// wrapped media keep their measured stores).
    pub fn set_gathers(&self, on: bool) {
        self.gathers.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Add a rule; returns its index (for [`FaultMedium::rule`]).
    pub fn add_rule(&self, rule: FaultRule) -> usize {
        let mut st = self.state.lock();
        st.rules.push(rule);
        st.rules.len() - 1
    }

    /// A copy of rule `i` (with its counters).
    pub fn rule(&self, i: usize) -> Option<FaultRule> {
        self.state.lock().rules.get(i).cloned()
    }

    /// Remove every rule (the medium behaves normally again).
    pub fn clear_rules(&self) {
        self.state.lock().rules.clear();
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.state.lock().injected
    }

    /// Operations seen so far that [`FaultOp::Any`] matches (reads, writes, fences, syncs,
    /// discards): what a rule aimed at the nth of them can hit.
    pub fn ops(&self) -> u64 {
        self.state.lock().ops
    }

    /// The wrapped medium.
    pub fn inner(&self) -> &Arc<dyn Medium> {
        &self.inner
    }

    /// Which effect (if any) fires for this operation.
    fn check(&self, op: FaultOp, off: u64, len: u64) -> Option<FaultEffect> {
        let mut st = self.state.lock();
        let st = &mut *st;
        st.ops += u64::from(op != FaultOp::Reserve);
        for r in st.rules.iter_mut() {
            if !r.matches(op, off, len) {
                continue;
            }
            r.seen += 1;
            if r.nth.is_some_and(|n| n != r.seen) {
                continue;
            }
            if r.max_fires.is_some_and(|m| r.fired >= m) {
                continue;
            }
            if r.probability < 1.0 && !st.rng.gen_bool(r.probability) {
                continue;
            }
            r.fired += 1;
            st.injected += 1;
            if std::env::var_os("NODUP_FAULT_BACKTRACE").is_some() {
                eprintln!(
                    "fault {op:?} at {off}+{len}:\n{}",
                    std::backtrace::Backtrace::force_capture()
                );
            }
            return Some(r.effect);
        }
        None
    }

    fn err(what: &str, off: u64, len: u64) -> Error {
        Error::Io(std::io::Error::other(format!(
            "injected fault: {what} at {off}+{len}"
        )))
    }
}

impl Medium for FaultMedium {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn gathers(&self) -> bool {
        self.gathers.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        if self.check(FaultOp::Read, off, buf.len() as u64).is_some() {
            return Err(Self::err("read error", off, buf.len() as u64));
        }
        self.inner.read(off, buf)
    }
    fn write(&self, off: u64, data: &[u8]) -> Result<()> {
        match self.check(FaultOp::Write, off, data.len() as u64) {
            None => self.inner.write(off, data),
            Some(FaultEffect::IoError) => Err(Self::err("write error", off, data.len() as u64)),
            Some(FaultEffect::ShortWrite { bytes }) => {
                let n = bytes.min(data.len());
                self.inner.write(off, &data[..n])?;
                Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    format!(
                        "injected fault: short write at {off}: {n} of {} bytes",
                        data.len()
                    ),
                )))
            }
        }
    }
    fn flush(&self, off: u64, len: u64) {
        self.inner.flush(off, len)
    }
    fn fence(&self) -> Result<()> {
        if self.check(FaultOp::Fence, 0, 0).is_some() {
            return Err(Self::err("fence error", 0, 0));
        }
        self.inner.fence()
    }
    fn sync_all(&self) -> Result<()> {
        if self.check(FaultOp::SyncAll, 0, 0).is_some() {
            return Err(Self::err("sync error", 0, 0));
        }
        self.inner.sync_all()
    }
    fn discard(&self, off: u64, len: u64) -> Result<bool> {
        match self.check(FaultOp::Discard, off, len) {
            None => self.inner.discard(off, len),
            Some(FaultEffect::IoError) => Err(Self::err("discard error", off, len)),
            Some(FaultEffect::ShortWrite { bytes }) => {
                let n = (bytes as u64).min(len);
                if n > 0 {
                    self.inner.discard(off, n)?;
                }
                Err(Self::err("discard error after a prefix", off + n, len - n))
            }
        }
    }
    fn reserve(&self, off: u64, len: u64) -> Result<()> {
        if self.check(FaultOp::Reserve, off, len).is_some() {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::ENOSPC)));
        }
        self.inner.reserve(off, len)
    }
    fn write_back_failed(&self) -> Option<String> {
        self.inner.write_back_failed()
    }
    /// No direct view: every read goes through the fault check.
    fn direct(&self, _off: u64, _len: usize) -> Option<&[u8]> {
        None
    }
    fn prefetch(&self, off: u64, len: usize, stride: usize) {
        self.inner.prefetch(off, len, stride)
    }
    fn kind(&self) -> &'static str {
        "fault"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::MemMedium;

    fn medium(seed: u64) -> (Arc<MemMedium>, FaultMedium) {
        let mem = Arc::new(MemMedium::new(1 << 16));
        let f = FaultMedium::new(mem.clone(), seed);
        (mem, f)
    }

    #[test]
    fn nth_write_fails_once() {
        let (mem, f) = medium(0);
        let r = f.add_rule(FaultRule::new(FaultOp::Write).nth(3));
        for i in 0..5u64 {
            let res = f.write(i * 8, &[i as u8 + 1; 8]);
            assert_eq!(res.is_err(), i == 2, "write {i}");
        }
        assert_eq!(f.rule(r).unwrap().fired(), 1);
        assert_eq!(f.injected(), 1);
        // The failed write did not reach the medium.
        let mut b = [0u8; 8];
        mem.read(16, &mut b).unwrap();
        assert_eq!(b, [0; 8]);
        mem.read(24, &mut b).unwrap();
        assert_eq!(b, [4; 8]);
    }

    #[test]
    fn range_rule_and_short_write() {
        let (mem, f) = medium(0);
        f.add_rule(
            FaultRule::new(FaultOp::Write)
                .range(4096, 4096)
                .short_write(10),
        );
        f.write(0, &[1; 100]).unwrap();
        f.write(8192, &[1; 100]).unwrap();
        let e = f.write(4000, &[2; 200]).unwrap_err();
        assert!(e.to_string().contains("short write"), "{e}");
        let mut b = [0u8; 12];
        mem.read(4000, &mut b).unwrap();
        assert_eq!(&b[..10], &[2; 10]);
        assert_eq!(&b[10..], &[0; 2]);
        // Reads of the range are not affected by a write rule.
        let mut b = [0u8; 8];
        f.read(5000, &mut b).unwrap();
    }

    /// A discard rule fails the discard whole, or gives back a prefix of its range first.
    #[test]
    fn discards_fail_whole_or_after_a_prefix() {
        let (mem, f) = medium(0);
        f.write(0, &[7; 3 * 4096]).unwrap();
        f.add_rule(FaultRule::new(FaultOp::Discard).once());
        let held = |at: u64| {
            let mut b = [0u8; 1];
            mem.read(at, &mut b).unwrap();
            b[0] == 7
        };
        assert!(f.discard(0, 3 * 4096).is_err());
        assert!(held(0) && held(8192), "a failed discard gave nothing back");
        f.add_rule(FaultRule::new(FaultOp::Discard).short_write(4096).once());
        assert!(f.discard(0, 3 * 4096).is_err());
        assert!(
            !held(0) && held(4096) && held(8192),
            "a short discard gave back its prefix"
        );
        assert!(f.discard(4096, 4096).unwrap());
        assert!(!held(4096));
        // A write rule ignores discards, and `Any` sees them.
        f.clear_rules();
        f.add_rule(FaultRule::new(FaultOp::Write));
        assert!(f.discard(8192, 4096).is_ok());
        f.add_rule(FaultRule::new(FaultOp::Any).range(8192, 1));
        assert!(f.discard(8192, 4096).is_err());
    }

    #[test]
    fn probability_is_seeded_and_bounded() {
        let run = |seed| {
            let (_, f) = medium(seed);
            f.add_rule(FaultRule::new(FaultOp::Any).probability(0.25).max_fires(20));
            let mut b = [0u8; 8];
            (0..400)
                .map(|i| {
                    if i % 3 == 0 {
                        f.fence().is_err()
                    } else {
                        f.read(0, &mut b).is_err()
                    }
                })
                .collect::<Vec<bool>>()
        };
        let a = run(42);
        assert_eq!(a, run(42), "same seed, same faults");
        assert_ne!(a, run(43));
        assert_eq!(a.iter().filter(|&&x| x).count(), 20, "capped by max_fires");
    }

    #[test]
    fn clear_rules_and_fences() {
        let (_, f) = medium(0);
        f.add_rule(FaultRule::new(FaultOp::Fence).once());
        f.add_rule(FaultRule::new(FaultOp::SyncAll));
        assert!(f.fence().is_err());
        assert!(f.fence().is_ok());
        assert!(f.sync_all().is_err());
        f.clear_rules();
        assert!(f.sync_all().is_ok());
        assert!(f.direct(0, 8).is_none());
        assert!(f.ops() >= 4);
    }
}
