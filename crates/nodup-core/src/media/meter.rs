//! `AccessMeter`: counts the bytes a medium with coarse access granularity would really read and
//! write, so that metadata I/O amplification (Light-Dedup Tables 2 and 4) is measured.
//!
//! The model, in the spirit of Optane DCPMM's on-DIMM buffers (Xiang et al., EuroSys'22):
//!
//! - the media is accessed in *granules* of `granularity` bytes (64 B cache line, 256 B XPLine,
//!   4 KiB page);
//! - a **read buffer** of `read_buffer_bytes` (default 16 KiB) holds the granules read last,
//!   LRU; a **write-combining buffer** of `wc_buffer_bytes` (default 16 KiB) holds granules being
//!   written, LRU, with a byte mask of what was written in each;
//! - a read of a granule present in either buffer costs nothing; a miss costs one granule read
//!   and puts the granule in the read buffer (LRU eviction, no cost);
//! - a write merges into the WC buffer (allocating a slot on a miss, no cost yet); evicting a
//!   granule from it costs one granule write, plus one granule read when the granule was only
//!   partly written (read-modify-write, as Optane does). [`BufferModel::drain`] writes back
//!   everything still buffered (call it at the end of a measured phase).
//!
//! Plain logical counters (bytes and operations asked for) are kept beside the media ones.
//!
//! [`BufferModel`] is the accounting alone (no data), usable by code that wants to meter only
//! some of its accesses; [`AccessMeter`] wraps a [`Medium`] and meters every access through it.
//! `direct` views count as reads of the viewed range, `prefetch`es as reads (they pull granules
//! into the buffers); `flush` and `fence` cost nothing.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::Medium;
use crate::{Error, Result};

/// Configuration of the buffer model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeterConfig {
    /// Media access granularity in bytes (a power of two, >= 8): 64, 256 (XPLine) or 4096.
    pub granularity: usize,
    /// Read buffer size in bytes (0 = no read buffer).
    pub read_buffer_bytes: usize,
    /// Write-combining buffer size in bytes (0 = every write goes to the media at once).
    pub wc_buffer_bytes: usize,
}

impl Default for MeterConfig {
    fn default() -> Self {
        MeterConfig {
            granularity: 256,
            read_buffer_bytes: 16 * 1024,
            wc_buffer_bytes: 16 * 1024,
        }
    }
}

impl MeterConfig {
    /// Default buffers at `granularity`.
    pub fn with_granularity(granularity: usize) -> MeterConfig {
        MeterConfig {
            granularity,
            ..MeterConfig::default()
        }
    }

    fn validate(&self) -> Result<()> {
        if !self.granularity.is_power_of_two() || self.granularity < 8 {
            return Err(Error::Invalid(format!(
                "meter granularity {} is not a power of two >= 8",
                self.granularity
            )));
        }
        Ok(())
    }
}

/// What the meter counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeterCounters {
    /// Bytes asked for by reads (including `direct` views and prefetches).
    pub logical_read_bytes: u64,
    /// Bytes asked for by writes.
    pub logical_write_bytes: u64,
    /// Read / write calls.
    pub read_ops: u64,
    pub write_ops: u64,
    /// Bytes read from / written to the modeled media (granule reads and write-backs).
    pub media_read_bytes: u64,
    pub media_write_bytes: u64,
    /// Granule reads served by a buffer / from the media.
    pub read_hits: u64,
    pub read_misses: u64,
    /// Granule writes merged into a granule already in the WC buffer.
    pub wc_hits: u64,
    /// Granules written back from the WC buffer (evictions and drains).
    pub write_backs: u64,
    /// Of those, partly written granules that needed a read-modify-write.
    pub rmw_reads: u64,
}

/// A fixed-capacity LRU set of granules (slab + doubly linked list + map), O(1) per operation.
struct Lru<V> {
    map: HashMap<u64, usize>,
    keys: Vec<u64>,
    vals: Vec<V>,
    prev: Vec<usize>,
    next: Vec<usize>,
    head: usize, // most recent
    tail: usize, // least recent
    cap: usize,
}

const NIL: usize = usize::MAX;

impl<V> Lru<V> {
    fn new(cap: usize) -> Lru<V> {
        Lru {
            map: HashMap::with_capacity(cap),
            keys: Vec::with_capacity(cap),
            vals: Vec::with_capacity(cap),
            prev: Vec::with_capacity(cap),
            next: Vec::with_capacity(cap),
            head: NIL,
            tail: NIL,
            cap,
        }
    }

    fn unlink(&mut self, i: usize) {
        let (p, n) = (self.prev[i], self.next[i]);
        if p != NIL {
            self.next[p] = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            self.prev[n] = p;
        } else {
            self.tail = p;
        }
    }

    fn push_front(&mut self, i: usize) {
        self.prev[i] = NIL;
        self.next[i] = self.head;
        if self.head != NIL {
            self.prev[self.head] = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    fn contains(&self, k: u64) -> bool {
        self.map.contains_key(&k)
    }

    /// Look `k` up, marking it most recent.
    fn touch(&mut self, k: u64) -> Option<&mut V> {
        let i = *self.map.get(&k)?;
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
        Some(&mut self.vals[i])
    }

    /// Insert `k` (absent) as most recent; returns the evicted entry when full.
    fn insert(&mut self, k: u64, v: V) -> Option<(u64, V)> {
        debug_assert!(!self.map.contains_key(&k));
        if self.cap == 0 {
            return Some((k, v));
        }
        if self.keys.len() < self.cap {
            let i = self.keys.len();
            self.keys.push(k);
            self.vals.push(v);
            self.prev.push(NIL);
            self.next.push(NIL);
            self.map.insert(k, i);
            self.push_front(i);
            return None;
        }
        let i = self.tail;
        self.unlink(i);
        let old_k = std::mem::replace(&mut self.keys[i], k);
        let old_v = std::mem::replace(&mut self.vals[i], v);
        self.map.remove(&old_k);
        self.map.insert(k, i);
        self.push_front(i);
        Some((old_k, old_v))
    }

    fn drain(&mut self) -> Vec<(u64, V)> {
        self.map.clear();
        self.prev.clear();
        self.next.clear();
        self.head = NIL;
        self.tail = NIL;
        self.keys.drain(..).zip(self.vals.drain(..)).collect()
    }
}

/// Byte mask of a granule in the WC buffer: bit per byte.
type Mask = Vec<u64>;

struct ModelState {
    read_buf: Lru<()>,
    wc_buf: Lru<Mask>,
    counters: MeterCounters,
}

/// The buffer model alone: feed it accesses, read the counters.
pub struct BufferModel {
    cfg: MeterConfig,
    state: Mutex<ModelState>,
}

impl BufferModel {
    /// A model with empty buffers.
    pub fn new(cfg: MeterConfig) -> Result<BufferModel> {
        cfg.validate()?;
        let g = cfg.granularity;
        Ok(BufferModel {
            cfg,
            state: Mutex::new(ModelState {
                read_buf: Lru::new(cfg.read_buffer_bytes / g),
                wc_buf: Lru::new(cfg.wc_buffer_bytes / g),
                counters: MeterCounters::default(),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> MeterConfig {
        self.cfg
    }

    fn granules(&self, off: u64, len: usize) -> std::ops::Range<u64> {
        let g = self.cfg.granularity as u64;
        if len == 0 {
            return 0..0;
        }
        off / g..(off + len as u64).div_ceil(g)
    }

    /// Account a read of `[off, off+len)`.
    pub fn on_read(&self, off: u64, len: usize) {
        let mut st = self.state.lock();
        let st = &mut *st;
        st.counters.read_ops += 1;
        st.counters.logical_read_bytes += len as u64;
        for gr in self.granules(off, len) {
            if st.wc_buf.contains(gr) || st.read_buf.touch(gr).is_some() {
                st.counters.read_hits += 1;
            } else {
                st.counters.read_misses += 1;
                st.counters.media_read_bytes += self.cfg.granularity as u64;
                st.read_buf.insert(gr, ());
            }
        }
    }

    /// Account a write of `[off, off+len)`.
    pub fn on_write(&self, off: u64, len: usize) {
        let g = self.cfg.granularity as u64;
        let words = (self.cfg.granularity / 64).max(1);
        let mut st = self.state.lock();
        let st = &mut *st;
        st.counters.write_ops += 1;
        st.counters.logical_write_bytes += len as u64;
        let end = off + len as u64;
        for gr in self.granules(off, len) {
            let (gs, ge) = (gr * g, (gr + 1) * g);
            let (s, e) = ((off.max(gs) - gs) as usize, (end.min(ge) - gs) as usize);
            if st.wc_buf.cap == 0 {
                // No WC buffer at all: the write goes straight to the media.
                let mut m = vec![0u64; words];
                set_bits(&mut m, s, e);
                Self::write_back(&self.cfg, &mut st.counters, &m);
                continue;
            }
            if st.wc_buf.touch(gr).is_some() {
                st.counters.wc_hits += 1;
            } else if let Some((_, old)) = st.wc_buf.insert(gr, vec![0u64; words]) {
                Self::write_back(&self.cfg, &mut st.counters, &old);
            }
            let mask = st.wc_buf.touch(gr).expect("granule just inserted");
            set_bits(mask, s, e);
        }
    }

    fn write_back(cfg: &MeterConfig, c: &mut MeterCounters, mask: &Mask) {
        c.write_backs += 1;
        c.media_write_bytes += cfg.granularity as u64;
        let written: u32 = mask.iter().map(|w| w.count_ones()).sum();
        if (written as usize) < cfg.granularity {
            c.rmw_reads += 1;
            c.media_read_bytes += cfg.granularity as u64;
        }
    }

    /// Write back every granule still in the WC buffer (counted) and empty the read buffer.
    pub fn drain(&self) {
        let mut st = self.state.lock();
        let st = &mut *st;
        for (_, m) in st.wc_buf.drain() {
            Self::write_back(&self.cfg, &mut st.counters, &m);
        }
        st.read_buf.drain();
    }

    /// The counters so far (granules still buffered are not yet counted as written: see `drain`).
    pub fn counters(&self) -> MeterCounters {
        self.state.lock().counters
    }

    /// Zero the counters and empty both buffers without counting their content.
    pub fn reset(&self) {
        let mut st = self.state.lock();
        st.read_buf.drain();
        st.wc_buf.drain();
        st.counters = MeterCounters::default();
    }
}

fn set_bits(mask: &mut [u64], s: usize, e: usize) {
    if mask.len() == 1 && e - s <= 64 && e <= 64 {
        // Granules of 8..=64 bytes use one word.
        let n = e - s;
        let bits = if n == 64 {
            u64::MAX
        } else {
            ((1u64 << n) - 1) << s
        };
        mask[0] |= bits;
        return;
    }
    for b in s..e {
        mask[b / 64] |= 1 << (b % 64);
    }
}

/// A [`Medium`] wrapper metering every access through a [`BufferModel`].
pub struct AccessMeter {
    inner: Arc<dyn Medium>,
    model: BufferModel,
}

impl AccessMeter {
    /// Meter `inner` with `cfg`.
    pub fn new(inner: Arc<dyn Medium>, cfg: MeterConfig) -> Result<AccessMeter> {
        Ok(AccessMeter {
            inner,
            model: BufferModel::new(cfg)?,
        })
    }

    /// The wrapped medium (accesses through it are not metered).
    pub fn inner(&self) -> &Arc<dyn Medium> {
        &self.inner
    }

    /// The buffer model.
    pub fn model(&self) -> &BufferModel {
        &self.model
    }

    /// See [`BufferModel::counters`].
    pub fn counters(&self) -> MeterCounters {
        self.model.counters()
    }

    /// See [`BufferModel::drain`].
    pub fn drain(&self) {
        self.model.drain()
    }

    /// See [`BufferModel::reset`].
    pub fn reset(&self) {
        self.model.reset()
    }
}

impl Medium for AccessMeter {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read(off, buf)?;
        self.model.on_read(off, buf.len());
        Ok(())
    }
    fn write(&self, off: u64, data: &[u8]) -> Result<()> {
        self.inner.write(off, data)?;
        self.model.on_write(off, data.len());
        Ok(())
    }
    fn flush(&self, off: u64, len: u64) {
        self.inner.flush(off, len)
    }
    fn fence(&self) -> Result<()> {
        self.inner.fence()
    }
    fn sync_all(&self) -> Result<()> {
        self.inner.sync_all()
    }
    fn discard(&self, off: u64, len: u64) -> Result<bool> {
        self.inner.discard(off, len)
    }
    fn reserve(&self, off: u64, len: u64) -> Result<()> {
        self.inner.reserve(off, len)
    }
    fn write_back_failed(&self) -> Option<String> {
        self.inner.write_back_failed()
    }
    fn direct(&self, off: u64, len: usize) -> Option<&[u8]> {
        let d = self.inner.direct(off, len)?;
        self.model.on_read(off, len);
        Some(d)
    }
    fn prefetch(&self, off: u64, len: usize, stride: usize) {
        self.inner.prefetch(off, len, stride);
        self.model.on_read(off, len);
    }
    fn kind(&self) -> &'static str {
        "meter"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::MemMedium;

    fn meter(g: usize) -> AccessMeter {
        AccessMeter::new(
            Arc::new(MemMedium::new(64 << 20)),
            MeterConfig::with_granularity(g),
        )
        .unwrap()
    }

    #[test]
    fn sequential_vs_scattered_entry_writes() {
        // 1024 entries of 32 B at 256 B granularity, 16 KiB WC buffer = 64 granules.
        let m = meter(256);
        for i in 0..1024u64 {
            m.write(i * 32, &[1; 32]).unwrap();
        }
        // 128 granules, each written whole by 8 consecutive entries; 64 evicted so far.
        let c = m.counters();
        assert_eq!(c.write_backs, 64);
        m.drain();
        let c = m.counters();
        assert_eq!(c.logical_write_bytes, 32 * 1024);
        assert_eq!(c.media_write_bytes, 128 * 256); // = logical: no amplification
        assert_eq!(c.rmw_reads, 0);
        assert_eq!(c.media_read_bytes, 0);
        assert_eq!(c.wc_hits, 1024 - 128);

        // The same entries scattered one per 4 KiB: every entry is its own partial granule.
        m.reset();
        for i in 0..1024u64 {
            m.write(i * 4096, &[1; 32]).unwrap();
        }
        m.drain();
        let c = m.counters();
        assert_eq!(c.logical_write_bytes, 32 * 1024);
        assert_eq!(c.media_write_bytes, 1024 * 256); // 8x amplification
        assert_eq!(c.rmw_reads, 1024);
        assert_eq!(c.media_read_bytes, 1024 * 256); // read-modify-write of each
    }

    #[test]
    fn sequential_vs_scattered_entry_reads() {
        let m = meter(256);
        for i in 0..1024u64 {
            let mut b = [0; 32];
            m.read(i * 32, &mut b).unwrap();
        }
        let c = m.counters();
        assert_eq!((c.read_misses, c.read_hits), (128, 1024 - 128));
        assert_eq!(c.media_read_bytes, 128 * 256);
        m.reset();
        for i in 0..1024u64 {
            let mut b = [0; 32];
            m.read(i * 4096, &mut b).unwrap();
        }
        assert_eq!(m.counters().media_read_bytes, 1024 * 256);
    }

    #[test]
    fn lru_read_buffer_and_wc_hits() {
        let m = meter(256);
        let mut b = [0u8; 8];
        // 64 granules fill the read buffer; granule 0 is still there.
        for gr in 0..64u64 {
            m.read(gr * 256, &mut b).unwrap();
        }
        m.read(0, &mut b).unwrap();
        assert_eq!(m.counters().read_misses, 64);
        // Touching 0 made granule 1 the least recent: granule 64 evicts it.
        m.read(64 * 256, &mut b).unwrap();
        m.read(0, &mut b).unwrap();
        assert_eq!(m.counters().read_misses, 65);
        m.read(256, &mut b).unwrap();
        assert_eq!(m.counters().read_misses, 66);
        // A read of a granule sitting in the WC buffer costs nothing.
        m.write(1 << 20, &[0; 8]).unwrap();
        m.read(1 << 20, &mut b).unwrap();
        assert_eq!(m.counters().read_misses, 66);
        // A full-granule write needs no read-modify-write.
        m.reset();
        m.write(4096, &[0; 256]).unwrap();
        m.write(8192 + 8, &[0; 8]).unwrap();
        m.drain();
        let c = m.counters();
        assert_eq!((c.write_backs, c.rmw_reads), (2, 1));
    }

    #[test]
    fn granularities() {
        for (g, expect) in [(64usize, 64u64), (256, 256), (4096, 4096)] {
            let m = meter(g);
            m.write(100_000, &[1; 8]).unwrap();
            m.drain();
            assert_eq!(m.counters().media_write_bytes, expect, "g={g}");
        }
        // A write straddling two 64 B lines touches both.
        let m = meter(64);
        m.write(60, &[1; 8]).unwrap();
        m.drain();
        assert_eq!(m.counters().write_backs, 2);
        // Without a WC buffer every write goes straight to the media.
        let m = AccessMeter::new(
            Arc::new(MemMedium::new(1 << 20)),
            MeterConfig {
                granularity: 64,
                read_buffer_bytes: 0,
                wc_buffer_bytes: 0,
            },
        )
        .unwrap();
        m.write(0, &[1; 64]).unwrap();
        m.write(0, &[1; 8]).unwrap();
        let c = m.counters();
        assert_eq!((c.write_backs, c.rmw_reads), (2, 1));
        assert!(AccessMeter::new(
            Arc::new(MemMedium::new(64)),
            MeterConfig::with_granularity(100)
        )
        .is_err());
    }

    #[test]
    fn data_passes_through() {
        let m = meter(64);
        m.write(10, b"abc").unwrap();
        let mut b = [0; 3];
        m.read(10, &mut b).unwrap();
        assert_eq!(&b, b"abc");
        assert!(m.read(64 << 20, &mut b).is_err());
        assert_eq!(m.counters().logical_read_bytes, 3);
    }
}
