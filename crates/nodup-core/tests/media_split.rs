//! Separate data and metadata handles ([`Media`]): data blocks go through the data handle only,
//! everything else through the metadata handle, and an image written that way reopens.

use std::sync::Arc;

use nodup_core::engine::{FormatOptions, OpenOptions, OpenState};
use nodup_core::media::{Medium, MemMedium};
use nodup_core::{Engine, Error, Media, Result, WriteCtx, BLOCK_SIZE};
use parking_lot::Mutex;

/// Forwards to a medium and records the offsets written through it.
struct Tap {
    inner: Arc<MemMedium>,
    writes: Mutex<Vec<(u64, usize)>>,
}

impl Medium for Tap {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read(off, buf)
    }
    fn write(&self, off: u64, data: &[u8]) -> Result<()> {
        self.writes.lock().push((off, data.len()));
        self.inner.write(off, data)
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
    fn kind(&self) -> &'static str {
        "tap"
    }
}

fn block(seed: u8) -> Vec<u8> {
    vec![seed; BLOCK_SIZE]
}

#[test]
fn data_blocks_use_the_data_handle_only() {
    let mem = Arc::new(MemMedium::new(16 << 20));
    let data = Arc::new(Tap {
        inner: mem.clone(),
        writes: Mutex::new(Vec::new()),
    });
    let meta = Arc::new(Tap {
        inner: mem.clone(),
        writes: Mutex::new(Vec::new()),
    });
    let media = Media::split(data.clone(), meta.clone());
    let e = Engine::format_media(
        media.clone(),
        &FormatOptions::default(),
        &OpenOptions::default(),
    )
    .unwrap();
    let (start, len) = e.data_area();
    meta.writes.lock().clear();
    let mut ctx = WriteCtx::default();
    let (a, b) = (block(1), block(2));
    let got = e.write(&mut ctx, &[&a, &b, &a]).unwrap();
    assert_eq!(got[0], got[2]);
    let w = data.writes.lock().clone();
    let blocks: Vec<u64> = w.iter().map(|&(off, _)| off / BLOCK_SIZE as u64).collect();
    assert_eq!(w.len(), 2, "two new blocks through the data handle: {w:?}");
    for &(off, n) in &w {
        assert_eq!((off % BLOCK_SIZE as u64, n), (0, BLOCK_SIZE));
    }
    assert!(blocks.iter().all(|&x| x >= start && x < start + len));
    let m = meta.writes.lock().clone();
    assert!(
        !m.is_empty(),
        "entries and reverse map go through the metadata handle"
    );
    for &(off, _) in &m {
        assert!(
            !blocks.contains(&(off / BLOCK_SIZE as u64)),
            "metadata write at {off} lands in a data block"
        );
    }
    e.shutdown().unwrap();
    drop(e);
    let (e, st) = Engine::open_media(media, &OpenOptions::default()).unwrap();
    assert_eq!(st, OpenState::Clean);
    let mut buf = vec![0u8; BLOCK_SIZE];
    e.read(got[1], &mut buf).unwrap();
    assert_eq!(buf, b);
    assert_eq!(e.block_refcount(got[0]).unwrap(), Some(2));
}

#[test]
fn handles_of_different_lengths_are_refused() {
    let media = Media::split(
        Arc::new(MemMedium::new(16 << 20)),
        Arc::new(MemMedium::new(8 << 20)),
    );
    match Engine::format_media(media, &FormatOptions::default(), &OpenOptions::default()) {
        Err(Error::Invalid(m)) => assert!(m.contains("same image"), "{m}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("formatted over handles of different lengths"),
    }
}
