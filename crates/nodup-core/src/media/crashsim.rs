//! `CrashSim`: a medium that knows which stores are durable, to test crash consistency.
//!
//! It keeps two images:
//! - the **volatile view**: what reads see (every write lands here at once);
//! - the **durable image**: what survives a crash for sure.
//!
//! Each `write` is recorded as a *pending store*. `flush(off, len)` captures the current content
//! of the 64-byte lines of the range (like `clwb`: the line is written back as it is at flush
//! time); `fence()` makes the captured lines durable. A pending store leaves the pending list
//! once every line it touched was flushed after it and a fence followed; a store whose lines
//! were only partly covered that way stays pending for the remaining lines.
//!
//! On a real machine any pending store may also have reached the medium (cache eviction), whole
//! or in 8-byte pieces. A [`CrashPoint`] is the durable image plus the pending stores at one
//! moment; [`CrashPoint::materialize`] builds one possible post-crash image from it:
//! drop every pending store, keep them all, keep a random (seeded) subset, or a random subset
//! with 8-byte tearing, or a per-line prefix (what cache-line write-back can really produce).
//!
//! # Cheap capture, lazy materialisation
//!
//! A systematic crash tester captures thousands of points, so capture must be cheap: the
//! durable image is held as copy-on-write 4 KiB pages (`Arc`s; a capture clones the page table,
//! and a page is copied only when the durable image changes it after a capture), and pending
//! stores are immutable `Arc`s shared between the live simulator and every capture. Nothing is
//! assembled until `materialize` is called.
//!
//! Capture points: [`CrashSim::crash_point`] at any moment, or automatically at fences —
//! [`CrashSim::capture_at_fences`] (a set of fence numbers) or
//! [`CrashSim::set_capture_filter`] (a closure deciding per fence). An automatic capture at fence
//! `n` is taken when the fence is called, *before* its flushed lines become durable, so it
//! includes the states where the fence did not complete (the state right after fence `n` is
//! the `DropAll` materialisation of the capture at fence `n + 1`). Fences are numbered from 1;
//! `sync_all` counts as a fence.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};

use super::{check_range, Medium, CACHE_LINE};
use crate::Result;

const PAGE: usize = 4096;

/// How [`CrashPoint::materialize`] chooses what of the pending stores reached the medium.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrashMode {
    /// Only the durable image: every pending store is lost.
    DropAll,
    /// Every pending store reached the medium (the volatile view at the capture).
    KeepAll,
    /// Each pending store is kept whole or lost, with probability 1/2 each (seeded).
    Random { seed: u64 },
    /// Each pending store is kept, lost, or torn (each aligned 8-byte word of it kept or lost
    /// independently), with probability 1/3 each (seeded).
    Torn { seed: u64 },
    /// Per 64-byte line, a random prefix (in store order) of the pending stores to that line
    /// reached the medium: exactly the states cache-line write-back can produce (seeded).
    LinePrefix { seed: u64 },
    /// As [`CrashMode::LinePrefix`], but each line reached the medium whole with probability
    /// 3/4 (else a uniform prefix): the states where most of what was written landed and a
    /// few lines did not, which uniform prefixes rarely give a point with many lines (seeded).
    LinePrefixKeep { seed: u64 },
    /// Keep exactly the pending stores whose index in [`CrashPoint::pending`] is `true`
    /// (missing indices are lost): for exhaustive enumeration of small pending sets.
    Subset(Vec<bool>),
}

/// One recorded store (or the part of it not yet durable).
#[derive(Debug)]
pub struct PendingStore {
    /// Global order of the store (increasing).
    pub seq: u64,
    /// Medium offset.
    pub off: u64,
    /// The bytes written.
    pub data: Vec<u8>,
}

impl PendingStore {
    fn end(&self) -> u64 {
        self.off + self.data.len() as u64
    }
    fn lines(&self) -> impl Iterator<Item = u64> {
        let first = self.off / CACHE_LINE;
        let last = (self.end() - 1) / CACHE_LINE;
        first..=last
    }
}

/// A captured crash state: the durable image and the stores not yet durable.
#[derive(Clone)]
pub struct CrashPoint {
    fence: u64,
    len: u64,
    pages: Vec<Arc<[u8; PAGE]>>,
    pending: Vec<Arc<PendingStore>>,
}

impl std::fmt::Debug for CrashPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrashPoint")
            .field("fence", &self.fence)
            .field("len", &self.len)
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl CrashPoint {
    /// Number of fences completed before this point (an automatic capture at fence `n` has `n - 1`).
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The stores not yet durable at this point, in store order.
    pub fn pending(&self) -> &[Arc<PendingStore>] {
        &self.pending
    }

    /// The durable image alone (same as `materialize(&CrashMode::DropAll)`).
    pub fn durable_image(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len as usize);
        for p in &self.pages {
            out.extend_from_slice(&p[..]);
        }
        out.truncate(self.len as usize);
        out
    }

    /// Build one possible post-crash image (open it with `MemMedium::from_bytes` or `CrashSim::from_bytes`).
    pub fn materialize(&self, mode: &CrashMode) -> Vec<u8> {
        let mut img = self.durable_image();
        let apply = |img: &mut Vec<u8>, off: u64, data: &[u8]| {
            img[off as usize..off as usize + data.len()].copy_from_slice(data);
        };
        match mode {
            CrashMode::DropAll => {}
            CrashMode::KeepAll => {
                for s in &self.pending {
                    apply(&mut img, s.off, &s.data);
                }
            }
            CrashMode::Subset(keep) => {
                for (i, s) in self.pending.iter().enumerate() {
                    if keep.get(i).copied().unwrap_or(false) {
                        apply(&mut img, s.off, &s.data);
                    }
                }
            }
            CrashMode::Random { seed } => {
                let mut rng = rand::rngs::StdRng::seed_from_u64(*seed);
                for s in &self.pending {
                    if rng.gen_bool(0.5) {
                        apply(&mut img, s.off, &s.data);
                    }
                }
            }
            CrashMode::Torn { seed } => {
                let mut rng = rand::rngs::StdRng::seed_from_u64(*seed);
                for s in &self.pending {
                    match rng.gen_range(0..3) {
                        0 => {}
                        1 => apply(&mut img, s.off, &s.data),
                        _ => {
                            // Aligned 8-byte words of the store, each kept or lost on its own.
                            let mut o = s.off;
                            while o < s.end() {
                                let word_end = ((o / 8) + 1) * 8;
                                let e = word_end.min(s.end());
                                if rng.gen_bool(0.5) {
                                    let d = (o - s.off) as usize..(e - s.off) as usize;
                                    apply(&mut img, o, &s.data[d]);
                                }
                                o = e;
                            }
                        }
                    }
                }
            }
            CrashMode::LinePrefix { seed } | CrashMode::LinePrefixKeep { seed } => {
                let keep = matches!(mode, CrashMode::LinePrefixKeep { .. });
                let mut rng = rand::rngs::StdRng::seed_from_u64(*seed);
                // line -> indices of pending stores touching it, in store order.
                let mut by_line: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
                for (i, s) in self.pending.iter().enumerate() {
                    for l in s.lines() {
                        by_line.entry(l).or_default().push(i);
                    }
                }
                for (line, stores) in by_line {
                    let cut = if keep && rng.gen_bool(0.75) {
                        stores.len()
                    } else {
                        rng.gen_range(0..=stores.len())
                    };
                    let (ls, le) = (line * CACHE_LINE, (line + 1) * CACHE_LINE);
                    for &i in &stores[..cut] {
                        let s = &self.pending[i];
                        let (o, e) = (s.off.max(ls), s.end().min(le));
                        apply(
                            &mut img,
                            o,
                            &s.data[(o - s.off) as usize..(e - s.off) as usize],
                        );
                    }
                }
            }
        }
        img
    }
}

/// Decides, per fence number, whether to capture a crash point there.
pub type CaptureFilter = Box<dyn FnMut(u64) -> bool + Send>;

struct State {
    volatile: Vec<u8>,
    /// Durable image as copy-on-write pages.
    durable: Vec<Arc<[u8; PAGE]>>,
    pending: Vec<Arc<PendingStore>>,
    /// Lines flushed since the last fence: line -> (store seq at flush time, content then).
    flushed: BTreeMap<u64, (u64, [u8; CACHE_LINE as usize])>,
    seq: u64,
    fences: u64,
    capture_at: BTreeSet<u64>,
    filter: Option<CaptureFilter>,
    captures: Vec<CrashPoint>,
}

impl State {
    fn point(&self) -> CrashPoint {
        CrashPoint {
            fence: self.fences,
            len: self.volatile.len() as u64,
            pages: self.durable.clone(),
            pending: self.pending.clone(),
        }
    }

    fn write_durable(&mut self, off: u64, data: &[u8]) {
        let mut o = off as usize;
        let mut d = data;
        while !d.is_empty() {
            let (p, in_page) = (o / PAGE, o % PAGE);
            let n = (PAGE - in_page).min(d.len());
            Arc::make_mut(&mut self.durable[p])[in_page..in_page + n].copy_from_slice(&d[..n]);
            o += n;
            d = &d[n..];
        }
    }

    /// A fence: maybe capture, then make the flushed lines durable and retire covered stores.
    fn fence(&mut self) {
        self.fences += 1;
        let n = self.fences;
        let wanted = self.capture_at.remove(&n) | self.filter.as_mut().is_some_and(|f| f(n));
        if wanted {
            let mut p = self.point();
            p.fence = n - 1;
            self.captures.push(p);
        }
        if self.flushed.is_empty() {
            return;
        }
        let flushed = std::mem::take(&mut self.flushed);
        for (&line, (_, content)) in &flushed {
            let off = line * CACHE_LINE;
            let len = (self.volatile.len() as u64 - off).min(CACHE_LINE) as usize;
            self.write_durable(off, &content[..len]);
        }
        // A store's line is covered when that line was flushed after the store.
        let covered = |s: &PendingStore, l: u64| flushed.get(&l).is_some_and(|&(fs, _)| fs > s.seq);
        let old = std::mem::take(&mut self.pending);
        for s in old {
            let n_cov = s.lines().filter(|&l| covered(&s, l)).count();
            if n_cov == 0 {
                self.pending.push(s);
            } else if n_cov < s.lines().count() {
                // Split: keep the uncovered lines' part, in runs of consecutive lines.
                let mut run: Option<(u64, u64)> = None;
                let push = |pending: &mut Vec<Arc<PendingStore>>, o: u64, e: u64| {
                    pending.push(Arc::new(PendingStore {
                        seq: s.seq,
                        off: o,
                        data: s.data[(o - s.off) as usize..(e - s.off) as usize].to_vec(),
                    }));
                };
                for l in s.lines() {
                    let (o, e) = (
                        (l * CACHE_LINE).max(s.off),
                        ((l + 1) * CACHE_LINE).min(s.end()),
                    );
                    if covered(&s, l) {
                        if let Some((ro, re)) = run.take() {
                            push(&mut self.pending, ro, re);
                        }
                    } else {
                        run = Some(run.map_or((o, e), |(ro, _)| (ro, e)));
                    }
                }
                if let Some((ro, re)) = run {
                    push(&mut self.pending, ro, re);
                }
            }
        }
    }
}

/// A medium recording which stores are durable; see the module doc.
pub struct CrashSim {
    state: Mutex<State>,
    len: u64,
    /// What [`Medium::gathers`] answers: set for a block-file workload, so the engine's write
    /// path takes the stores it makes on a block file ([`CrashSim::set_gathers`]).
    gathers: std::sync::atomic::AtomicBool,
}

impl CrashSim {
    /// A zero-filled simulator of `len` bytes (all durable).
    pub fn new(len: u64) -> CrashSim {
        CrashSim::from_bytes(vec![0; len as usize])
    }

    /// A simulator whose volatile and durable images are both `bytes` (e.g. a materialised crash
    /// image, to crash again during recovery).
    pub fn from_bytes(bytes: Vec<u8>) -> CrashSim {
        let len = bytes.len() as u64;
        let durable = bytes
            .chunks(PAGE)
            .map(|c| {
                let mut p = [0u8; PAGE];
                p[..c.len()].copy_from_slice(c);
                Arc::new(p)
            })
            .collect();
        CrashSim {
            state: Mutex::new(State {
                volatile: bytes,
                durable,
                pending: Vec::new(),
                flushed: BTreeMap::new(),
                seq: 0,
                fences: 0,
                capture_at: BTreeSet::new(),
                filter: None,
                captures: Vec::new(),
            }),
            len,
            gathers: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Answer [`Medium::gathers`] with `on` (before an engine opens it): a block-file
    /// workload's engine then gathers its stores as it does on a `BlockFile`.
    pub fn set_gathers(&self, on: bool) {
        self.gathers.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The current crash state: durable image + pending stores (cheap; see the module doc).
    pub fn crash_point(&self) -> CrashPoint {
        self.state.lock().point()
    }

    /// Fences executed so far (`sync_all` included).
    pub fn fence_count(&self) -> u64 {
        self.state.lock().fences
    }

    /// Stores not yet durable.
    pub fn pending_count(&self) -> usize {
        self.state.lock().pending.len()
    }

    /// Capture a crash point when each of these fence numbers is reached (before it takes effect).
    pub fn capture_at_fences(&self, fences: impl IntoIterator<Item = u64>) {
        self.state.lock().capture_at.extend(fences);
    }

    /// Capture a crash point at every fence for which `filter(fence_number)` is true
    /// (e.g. `|_| true` for all, `|n| n % 10 == 0` for a sample). The closure runs under the
    /// simulator's lock: it must not call back into this medium.
    pub fn set_capture_filter(&self, filter: CaptureFilter) {
        self.state.lock().filter = Some(filter);
    }

    /// Remove the capture filter.
    pub fn clear_capture_filter(&self) {
        self.state.lock().filter = None;
    }

    /// Take the crash points captured so far, in fence order.
    pub fn take_captures(&self) -> Vec<CrashPoint> {
        std::mem::take(&mut self.state.lock().captures)
    }

    /// A copy of the volatile view.
    pub fn snapshot(&self) -> Vec<u8> {
        self.state.lock().volatile.clone()
    }
}

impl Medium for CrashSim {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        let r = check_range(off, buf.len(), self.len)?;
        buf.copy_from_slice(&self.state.lock().volatile[r]);
        Ok(())
    }

    fn write(&self, off: u64, data: &[u8]) -> Result<()> {
        let r = check_range(off, data.len(), self.len)?;
        if data.is_empty() {
            return Ok(());
        }
        let mut st = self.state.lock();
        st.volatile[r].copy_from_slice(data);
        st.seq += 1;
        let seq = st.seq;
        st.pending.push(Arc::new(PendingStore {
            seq,
            off,
            data: data.to_vec(),
        }));
        Ok(())
    }

    fn flush(&self, off: u64, len: u64) {
        if len == 0 || off >= self.len {
            return;
        }
        let end = off.saturating_add(len).min(self.len);
        let mut st = self.state.lock();
        // Stores with seq <= st.seq are captured by this flush: record seq + 1 as the flush time.
        let at = st.seq + 1;
        for line in off / CACHE_LINE..end.div_ceil(CACHE_LINE) {
            let o = (line * CACHE_LINE) as usize;
            let e = (o + CACHE_LINE as usize).min(self.len as usize);
            let mut content = [0u8; CACHE_LINE as usize];
            content[..e - o].copy_from_slice(&st.volatile[o..e]);
            st.flushed.insert(line, (at, content));
        }
    }

    fn fence(&self) -> Result<()> {
        self.state.lock().fence();
        Ok(())
    }

    fn sync_all(&self) -> Result<()> {
        let mut st = self.state.lock();
        let len = self.len;
        let at = st.seq + 1;
        // Everything pending is flushed, then fenced.
        let lines: BTreeSet<u64> = st.pending.iter().flat_map(|s| s.lines()).collect();
        for line in lines {
            let o = (line * CACHE_LINE) as usize;
            let e = (o + CACHE_LINE as usize).min(len as usize);
            let mut content = [0u8; CACHE_LINE as usize];
            content[..e - o].copy_from_slice(&st.volatile[o..e]);
            st.flushed.insert(line, (at, content));
        }
        st.fence();
        debug_assert!(st.pending.is_empty());
        Ok(())
    }

    /// A durable overwrite with [`super::DISCARDED`] bytes, so crash states see it as any
    /// other store and a recovered image that reads such a block shows it.
    fn discard(&self, off: u64, len: u64) -> Result<bool> {
        check_range(off, len as usize, self.len)?;
        self.write(off, &vec![super::DISCARDED; len as usize])?;
        self.flush(off, len);
        self.fence()?;
        Ok(true)
    }

    fn kind(&self) -> &'static str {
        "crashsim"
    }

    fn gathers(&self) -> bool {
        self.gathers.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::MemMedium;

    #[test]
    fn flushed_and_fenced_store_always_survives() {
        let m = CrashSim::new(16 * 1024);
        m.write(100, &[7u8; 300]).unwrap();
        m.flush(100, 300);
        m.fence().unwrap();
        m.write(5000, &[9u8; 10]).unwrap(); // never flushed
        let p = m.crash_point();
        assert_eq!(p.pending().len(), 1);
        let mut modes = vec![
            CrashMode::DropAll,
            CrashMode::KeepAll,
            CrashMode::Subset(vec![]),
        ];
        for seed in 0..50 {
            modes.push(CrashMode::Random { seed });
            modes.push(CrashMode::Torn { seed });
            modes.push(CrashMode::LinePrefix { seed });
            modes.push(CrashMode::LinePrefixKeep { seed });
        }
        for mode in &modes {
            let img = MemMedium::from_bytes(p.materialize(mode));
            let mut b = vec![0u8; 300];
            img.read(100, &mut b).unwrap();
            assert!(b.iter().all(|&x| x == 7), "{mode:?}");
        }
    }

    #[test]
    fn unflushed_or_unfenced_store_can_be_lost() {
        let m = CrashSim::new(8192);
        m.write(0, b"flushed, not fenced").unwrap();
        m.flush(0, 19);
        m.write(4096, b"not flushed").unwrap();
        let p = m.crash_point();
        assert_eq!(p.pending().len(), 2);
        let lost = p.materialize(&CrashMode::DropAll);
        assert!(lost.iter().all(|&b| b == 0));
        let kept = p.materialize(&CrashMode::KeepAll);
        assert_eq!(&kept[..19], b"flushed, not fenced");
        assert_eq!(&kept[4096..4107], b"not flushed");
        assert_eq!(kept, m.snapshot());
        let one = p.materialize(&CrashMode::Subset(vec![false, true]));
        assert_eq!(&one[..19], &[0u8; 19]);
        assert_eq!(&one[4096..4107], b"not flushed");
        // A fence without a flush does not make the unflushed store durable.
        m.fence().unwrap();
        let p = m.crash_point();
        assert_eq!(p.pending().len(), 1);
        assert_eq!(&p.durable_image()[..19], b"flushed, not fenced");
        assert_eq!(&p.durable_image()[4096..4107], &[0u8; 11]);
    }

    #[test]
    fn store_after_flush_stays_pending_and_partial_cover_splits() {
        let m = CrashSim::new(4096);
        // One store over lines 0..=2; a later store on line 1; flush only lines 0 and 1.
        m.write(0, &[1u8; 192]).unwrap();
        m.flush(0, 128);
        m.write(64, &[2u8; 8]).unwrap();
        m.fence().unwrap();
        let p = m.crash_point();
        // Remaining: line 2 of the first store, and the second store (issued after the flush).
        assert_eq!(p.pending().len(), 2);
        assert_eq!((p.pending()[0].off, p.pending()[0].data.len()), (128, 64));
        assert_eq!(p.pending()[1].off, 64);
        let d = p.materialize(&CrashMode::DropAll);
        assert!(d[..128].iter().all(|&b| b == 1));
        assert!(d[128..192].iter().all(|&b| b == 0));
        // Keeping the split part does not undo the later store.
        let k = p.materialize(&CrashMode::KeepAll);
        assert_eq!(k, m.snapshot());
        m.sync_all().unwrap();
        assert_eq!(m.pending_count(), 0);
        assert_eq!(m.crash_point().durable_image(), m.snapshot());
    }

    #[test]
    fn tearing_is_at_8_byte_granularity() {
        let m = CrashSim::new(4096);
        // An unaligned 61-byte store covering words [8,16) .. [64,72).
        let data: Vec<u8> = (1..=61).collect();
        m.write(10, &data).unwrap();
        let p = m.crash_point();
        let mut saw_partial = false;
        for seed in 0..200 {
            let img = p.materialize(&CrashMode::Torn { seed });
            let mut kept_words = 0;
            let mut words = 0;
            for w in (8..72).step_by(8) {
                let old = img[w..w + 8]
                    .iter()
                    .enumerate()
                    .all(|(i, &b)| !(10..71).contains(&(w + i)) || b == 0);
                let new = img[w..w + 8]
                    .iter()
                    .enumerate()
                    .all(|(i, &b)| !(10..71).contains(&(w + i)) || b == data[w + i - 10]);
                assert!(old || new, "seed {seed}: word at {w} torn inside");
                words += 1;
                if new {
                    kept_words += 1;
                }
            }
            saw_partial |= kept_words > 0 && kept_words < words;
            assert!(img[..10].iter().chain(&img[71..]).all(|&b| b == 0));
        }
        assert!(saw_partial, "some seed must tear the store");
    }

    #[test]
    fn captures_at_fences_are_cheap_snapshots() {
        let m = CrashSim::new(64 * 1024);
        m.capture_at_fences([2]);
        m.set_capture_filter(Box::new(|n| n % 2 == 1));
        for i in 0..6u8 {
            m.write(i as u64 * 4096, &[i + 1; 4096]).unwrap();
            m.flush(i as u64 * 4096, 4096);
            m.fence().unwrap();
        }
        assert_eq!(m.fence_count(), 6);
        let caps = m.take_captures();
        // Fences 1,3,5 by the filter and 2 by number.
        assert_eq!(
            caps.iter().map(|c| c.fence()).collect::<Vec<_>>(),
            [0, 1, 2, 4]
        );
        // The capture at fence 3 (fence() == 2) holds blocks 0,1 durable and block 2 pending.
        let c = &caps[2];
        assert_eq!(c.pending().len(), 1);
        let img = c.materialize(&CrashMode::DropAll);
        assert!(img[..4096].iter().all(|&b| b == 1));
        assert!(img[4096..8192].iter().all(|&b| b == 2));
        assert!(img[8192..12288].iter().all(|&b| b == 0));
        let img = c.materialize(&CrashMode::KeepAll);
        assert!(img[8192..12288].iter().all(|&b| b == 3));
        // Later durable writes did not leak into the earlier capture (copy-on-write pages).
        assert!(caps[0].durable_image().iter().all(|&b| b == 0));
    }

    #[test]
    fn line_prefix_respects_store_order_within_a_line() {
        let m = CrashSim::new(4096);
        m.write(0, &[1u8; 8]).unwrap();
        m.write(8, &[2u8; 8]).unwrap();
        let p = m.crash_point();
        let (mut whole, mut whole_keep) = (0, 0);
        for seed in 0..200 {
            for keep in [false, true] {
                let mode = if keep {
                    CrashMode::LinePrefixKeep { seed }
                } else {
                    CrashMode::LinePrefix { seed }
                };
                let img = p.materialize(&mode);
                // The second store never persists without the first one (same line).
                assert!(!(img[8] == 2 && img[0] == 0), "{mode:?}");
                if img[8] == 2 {
                    *if keep { &mut whole_keep } else { &mut whole } += 1;
                }
            }
        }
        // Uniform prefixes keep the line whole 1 time in 3; the keep-biased ones 3/4 + 1/12.
        assert!(
            (40..95).contains(&whole),
            "uniform kept it whole {whole} times"
        );
        assert!(
            whole_keep > 140,
            "keep-biased kept it whole {whole_keep} times"
        );
    }

    #[test]
    fn bounds_are_errors() {
        let m = CrashSim::new(100);
        assert!(m.write(96, &[0; 8]).is_err());
        let mut b = [0; 8];
        assert!(m.read(u64::MAX, &mut b).is_err());
        m.flush(90, 1000);
        m.fence().unwrap();
    }
}
