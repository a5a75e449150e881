//! Log records held back on a block-file image until a fence has made the data they name
//! durable.
//!
//! On a block file a write's data, entries and counts are not fenced by the engine
//! (`OpenOptions::fenced_by_caller`), so a record naming new data must not reach the disk
//! before one fence has passed after that data was written: the page cache may write any dirty
//! page back at any time, in any order. The log writer therefore keeps each append's stores
//! (frame, block headers, links) in memory, in order, and [`HeldBack::write_out`] fences once,
//! then writes them all (the fence only when the engine stored new data since the last one:
//! records of duplicates and of metadata changes name nothing unfenced). A sync writes them out and fences again (records durable); the
//! maintenance tick writes them out every half second without the second fence (where the
//! records went at once before, durable at the next sync or when the kernel writes them back);
//! so does an append that finds [`HELD_LIMIT`] bytes waiting, and a checkpoint before its cut.
//! A crash loses what was held, which is what a crash before the next sync could lose anyway.

use std::sync::Mutex;

use nodup_core::media::Medium;

use crate::error::Result;

/// Bytes of held stores at which an append writes them out first (one fence per this much
/// record: about 512 MiB of 1 MiB writes, or some thousands of small changes).
pub const HELD_LIMIT: usize = 1 << 20;

/// Stores of appended records not yet written to the medium, in store order.
#[derive(Debug, Default)]
pub struct HeldBack {
    stores: Vec<(u64, Vec<u8>)>,
    bytes: usize,
}

impl HeldBack {
    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.stores.is_empty()
    }

    /// Bytes waiting.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// With `fence`, fence `m` first (for data the records name that no fence has covered
    /// yet); then write every held store, in order. On an error the stores not written stay
    /// held, to be written by the next call (a store that failed may have landed in part; it
    /// is written whole again); the fence's failure is the medium's to remember
    /// (`media/write_back.rs`).
    pub fn write_out(&mut self, m: &dyn Medium, fence: bool) -> Result<()> {
        if self.stores.is_empty() {
            return Ok(());
        }
        if fence {
            m.fence()?;
        }
        let mut done = 0;
        let mut res = Ok(());
        for (off, data) in &self.stores {
            if let Err(e) = m.write(*off, data) {
                res = Err(e.into());
                break;
            }
            m.flush(*off, data.len() as u64);
            done += 1;
        }
        let gone: usize = self.stores.drain(..done).map(|(_, d)| d.len()).sum();
        self.bytes -= gone;
        res
    }

    /// Run `append` against a medium that keeps its stores here instead of writing them.
    pub fn hold<T>(
        &mut self,
        m: &dyn Medium,
        append: impl FnOnce(&dyn Medium) -> Result<T>,
    ) -> Result<T> {
        let overlay = Overlay {
            inner: m,
            held: &self.stores,
            stores: Mutex::new(Vec::new()),
        };
        let r = append(&overlay);
        let stores = overlay
            .stores
            .into_inner()
            .unwrap_or_else(|p| p.into_inner());
        // A failed append's stores are dropped: nothing of its frame ever reaches the medium
        // (the chain's bookkeeping has rolled back, and the next record goes where it was).
        if r.is_ok() {
            self.bytes += stores.iter().map(|(_, d)| d.len()).sum::<usize>();
            self.stores.extend(stores);
        }
        r
    }
}

/// A medium whose writes are collected, not made: reads see the medium with every held and
/// collected store applied in order, so the chain code works on it unchanged. It cannot be
/// fenced (the records are not to be durable before [`HeldBack::write_out`]).
struct Overlay<'a> {
    inner: &'a dyn Medium,
    held: &'a [(u64, Vec<u8>)],
    stores: Mutex<Vec<(u64, Vec<u8>)>>,
}

/// Copy the part of the store `(off, data)` that falls in `[at, at + buf.len())` into `buf`.
fn patch(buf: &mut [u8], at: u64, off: u64, data: &[u8]) {
    let (s, e) = (
        off.max(at),
        (off + data.len() as u64).min(at + buf.len() as u64),
    );
    if s < e {
        buf[(s - at) as usize..(e - at) as usize]
            .copy_from_slice(&data[(s - off) as usize..(e - off) as usize]);
    }
}

impl Medium for Overlay<'_> {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> nodup_core::Result<()> {
        self.inner.read(off, buf)?;
        for (o, d) in self.held {
            patch(buf, off, *o, d);
        }
        for (o, d) in self.stores.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            patch(buf, off, *o, d);
        }
        Ok(())
    }

    fn write(&self, off: u64, data: &[u8]) -> nodup_core::Result<()> {
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > self.len())
        {
            return Err(nodup_core::Error::Invalid(format!(
                "held store of {} bytes at {off} past the medium",
                data.len()
            )));
        }
        self.stores
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((off, data.to_vec()));
        Ok(())
    }

    fn flush(&self, _off: u64, _len: u64) {}

    fn fence(&self) -> nodup_core::Result<()> {
        Err(nodup_core::Error::Invalid(
            "a held-back log record cannot be fenced before it is written out".into(),
        ))
    }

    fn sync_all(&self) -> nodup_core::Result<()> {
        self.fence()
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodup_core::media::{CrashMode, CrashSim};

    #[test]
    fn held_stores_are_read_back_and_reach_the_medium_only_after_a_fence() {
        let m = CrashSim::new(1 << 16);
        // Data a record will name: written and flushed, not fenced (as the engine leaves it).
        m.write(0, &[9u8; 64]).unwrap();
        m.flush(0, 64);
        let mut h = HeldBack::default();
        h.hold(&m, |o| {
            o.write(4096, b"record")?;
            o.write(4099, b"ORD")?;
            let mut b = [0u8; 8];
            o.read(4094, &mut b)?;
            assert_eq!(&b, b"\0\0recORD", "reads see the collected stores in order");
            assert!(o.fence().is_err());
            Ok(())
        })
        .unwrap();
        h.hold(&m, |o| {
            let mut b = [0u8; 6];
            o.read(4096, &mut b)?;
            assert_eq!(&b, b"recORD", "and the held ones");
            o.write(8192, b"next")?;
            Ok(())
        })
        .unwrap();
        assert_eq!(h.bytes(), 6 + 3 + 4);
        let mut b = [0u8; 6];
        m.read(4096, &mut b).unwrap();
        assert_eq!(b, [0; 6], "nothing written to the medium yet");
        let before = m.fence_count();
        h.write_out(&m, true).unwrap();
        assert!(h.is_empty() && h.bytes() == 0);
        assert_eq!(m.fence_count() - before, 1, "one fence, before the stores");
        // The fence made the data durable before any record store was made.
        let p = m.crash_point();
        let img = p.materialize(&CrashMode::DropAll);
        assert_eq!(&img[..64], &[9u8; 64]);
        assert_eq!(&img[4096..4102], &[0; 6], "the records are not durable yet");
        let img = p.materialize(&CrashMode::KeepAll);
        assert_eq!(&img[4096..4102], b"recORD");
        assert_eq!(&img[8192..8196], b"next");
        // Nothing held: no fence.
        let before = m.fence_count();
        h.write_out(&m, true).unwrap();
        assert_eq!(m.fence_count(), before);
        // Held, but no data waits for a fence (the caller says so): written without one.
        h.hold(&m, |o| Ok(o.write(12288, b"dup")?)).unwrap();
        h.write_out(&m, false).unwrap();
        assert_eq!(m.fence_count(), before);
        assert!(h.is_empty());
    }

    #[test]
    fn a_store_past_the_medium_is_refused() {
        let m = CrashSim::new(8192);
        let mut h = HeldBack::default();
        assert!(h.hold(&m, |o| Ok(o.write(8190, b"abc")?)).is_err());
        assert!(h.is_empty());
    }
}
