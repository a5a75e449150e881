//! Backing store of a mapped image: a store into a page the file system holding the image
//! cannot allocate (a full tmpfs, a full disk under a sparse image) is a SIGBUS, which would
//! kill the process. So before the first store into each [`BACK_CHUNK`] of the image, the
//! chunk is allocated with `fallocate`; when that fails, the store fails with ENOSPC (an
//! ordinary error the engine undoes) and nothing is written. A bitmap remembers the chunks
//! known to be allocated.
//!
//! Allocating a chunk (and, where durability does not come from msync, mapping its pages in
//! one `madvise(MADV_POPULATE_WRITE)` rather than a page fault per page; on tmpfs that also
//! zeroes them) costs about as much as writing it. A writer filling fresh space would pay it
//! on every 2 MiB, so after backing a chunk the writer also asks a background thread to back
//! the next [`AHEAD`] chunks: the allocator hands out blocks in address order, so a stream of
//! new data finds its chunks ready. What the thread fails to back (ENOSPC) stays unmarked,
//! and the writer then gets the error itself.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use parking_lot::{Mutex, RwLock};

use crate::{Error, Result};

/// Bytes of the image allocated at a time before stores reach them.
pub const BACK_CHUNK: u64 = 2 << 20;

/// Chunks backed ahead of the last one a writer needed.
const AHEAD: u64 = 4;

/// What the writers and the background thread share.
struct Shared {
    /// The image file (its own descriptor).
    file: File,
    /// Start of the mapping (an address: the thread never outlives the mapping, see
    /// [`Backing`]'s drop).
    base: usize,
    len: u64,
    /// Chunks in the mapping.
    chunks: u64,
    /// Map pages in one call after allocating them.
    populate: bool,
    /// One bit per [`BACK_CHUNK`]: allocated in the file system holding the image.
    backed: Box<[AtomicU64]>,
    /// One bit per chunk: handed to the background thread (cleared again if it failed).
    asked: Box<[AtomicU64]>,
    /// Shared by every backing of a chunk (allocation, population and marking it backed),
    /// held alone by a punch ([`Backing::punch`]) across its hole and the clearing of its
    /// chunks' marks: a chunk is never marked backed while a punch left a hole in it, and
    /// backings do not wait for one another (only for a punch).
    punching: RwLock<()>,
}

fn test_bit(bits: &[AtomicU64], c: u64) -> bool {
    bits[(c / 64) as usize].load(Ordering::Relaxed) & (1 << (c % 64)) != 0
}

impl Shared {
    fn is_backed(&self, c: u64) -> bool {
        test_bit(&self.backed, c)
    }

    /// Allocate (and populate) chunk `c`.
    fn back(&self, c: u64) -> Result<()> {
        let _no_punch = self.punching.read();
        let start = c * BACK_CHUNK;
        let n = BACK_CHUNK.min(self.len - start);
        // SAFETY: fallocate on a descriptor owned by `self.file`; mode 0 only allocates
        // (the range is inside the file, so its size does not change).
        let r = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, start as i64, n as i64) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                // A file system without fallocate: nothing better can be done up front.
                Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {}
                _ => return Err(Error::Io(e)),
            }
        }
        if self.populate {
            // Failure (an old kernel) only leaves the page faults to happen.
            // SAFETY: `[start, start+n)` lies inside the mapping (n is clipped to the image
            // length), which is live while `Backing` is; populating changes no byte of it.
            unsafe {
                libc::madvise(
                    (self.base + start as usize) as *mut libc::c_void,
                    n as usize,
                    libc::MADV_POPULATE_WRITE,
                );
            }
        }
        self.backed[(c / 64) as usize].fetch_or(1u64 << (c % 64), Ordering::SeqCst);
        Ok(())
    }
}

/// The backing-store bookkeeping of one mapping, with its background thread.
///
/// Must be dropped before the mapping it was made for (declare it before the map in the
/// owning struct): dropping it stops and joins the thread.
pub(super) struct Backing {
    shared: Arc<Shared>,
    /// Chunks for the background thread; `None` once stopped (or when it could not start).
    ahead: Mutex<Option<mpsc::Sender<u64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Backing {
    /// Bookkeeping for a mapping at `base` of `len` bytes of `file`; `populate` maps pages
    /// in one call after allocating them (not where durability is msync: every page would
    /// be dirty and written back).
    pub(super) fn new(file: &File, base: *mut u8, len: u64, populate: bool) -> Result<Backing> {
        let chunks = len.div_ceil(BACK_CHUNK);
        let shared = Arc::new(Shared {
            file: file.try_clone()?,
            base: base as usize,
            len,
            chunks,
            populate,
            backed: (0..chunks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            asked: (0..chunks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            punching: RwLock::new(()),
        });
        let (tx, rx) = mpsc::channel::<u64>();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("nodup-backing".into())
            .spawn(move || {
                for c in rx {
                    if !s.is_backed(c) && s.back(c).is_err() {
                        // The writer meets the error when it gets there; a later request
                        // may try again.
                        s.asked[(c / 64) as usize].fetch_and(!(1 << (c % 64)), Ordering::Relaxed);
                    }
                }
            })
            .ok();
        Ok(Backing {
            shared,
            ahead: Mutex::new(thread.as_ref().map(|_| tx)),
            thread,
        })
    }

    /// Make sure stores into `[off, off+len)` cannot fault for lack of backing store, and
    /// have the chunks after it backed in the background. ENOSPC (or another error of the
    /// file system holding the image) when that fails.
    ///
    /// Every store of the write path comes here (several per block), so the usual case — one
    /// chunk, backed, and the farthest chunk wanted ahead backed or asked for — is a few loads
    /// inlined into the caller; the rest is out of line.
    #[inline]
    pub(super) fn ensure(&self, off: u64, len: u64) -> Result<()> {
        let s = &*self.shared;
        if len != 0 {
            let c = off / BACK_CHUNK;
            let far = c + AHEAD;
            if c == (off + len - 1) / BACK_CHUNK
                && s.is_backed(c)
                && (far >= s.chunks || s.is_backed(far) || test_bit(&s.asked, far))
            {
                return Ok(());
            }
        }
        self.ensure_slow(off, len)
    }

    /// Punch `[off, off+len)` out of the file with `punch` ([`super::Medium::discard`]) and
    /// forget the backing of its chunks (also when the punch fails partway), with no backing
    /// running meanwhile ([`Shared::punching`]). The next store into one of them allocates it
    /// again.
    pub(super) fn punch(
        &self,
        off: u64,
        len: u64,
        punch: impl FnOnce() -> Result<bool>,
    ) -> Result<bool> {
        let s = &*self.shared;
        let _alone = s.punching.write();
        let punched = punch();
        if len != 0 {
            for c in off / BACK_CHUNK..=(off + len - 1) / BACK_CHUNK {
                let (w, bit) = ((c / 64) as usize, 1u64 << (c % 64));
                s.backed[w].fetch_and(!bit, Ordering::SeqCst);
                s.asked[w].fetch_and(!bit, Ordering::Relaxed);
            }
        }
        punched
    }

    #[cold]
    #[inline(never)]
    fn ensure_slow(&self, off: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let s = &*self.shared;
        let first = off / BACK_CHUNK;
        let last = (off + len - 1) / BACK_CHUNK;
        for c in first..=last {
            if !s.is_backed(c) {
                s.back(c)?;
            }
        }
        let far = last + AHEAD;
        if far < s.chunks && !s.is_backed(far) && !test_bit(&s.asked, far) {
            if let Some(tx) = &*self.ahead.lock() {
                for c in last + 1..=far {
                    let (w, bit) = ((c / 64) as usize, 1u64 << (c % 64));
                    if !s.is_backed(c) && s.asked[w].fetch_or(bit, Ordering::Relaxed) & bit == 0 {
                        let _ = tx.send(c);
                    }
                }
            }
        }
        Ok(())
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop; it must be gone before the mapping.
        self.ahead.lock().take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
