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
//!
//! On tmpfs (where /dev/shm images live, and where a page in the file's page cache is a page
//! allocated to it), a chunk that holds both data and holes (free blocks given back to the
//! holder: a punch, see [`Backing::punch`], at this mount or an earlier one) is not allocated
//! whole, which would take the given-back space again at its first store: its pages are
//! allocated a few at a time as stores need them, and a bit per page remembers which are.
//! Whether a chunk is all data, all hole or both is read with `mincore` when it is first
//! needed (SEEK_HOLE would scan on past the chunk, through every page of data after it).
//! Elsewhere chunks are allocated whole, as before.
//!
//! On a full disk a chunk, or the pages after a store, may fail to allocate where the store's
//! own pages hold data or were reserved ([`Backing::reserve`]): then only those pages are
//! asked for, which needs no space, so rewrites of what the image holds go through.
//!
//! On tmpfs a load from a hole through the mapping allocates a page too (a SIGBUS on a full
//! tmpfs, measured on 6.18, even through a read-only mapping). The engine reads what it
//! wrote, which holds its space, but an image copied with its zero blocks made holes (`cp
//! --sparse=always`) has holes where it reads zeros: its save area, zero data blocks. So a
//! load asks first whether its range can hold a hole ([`Backing::loadable`]): a bit per chunk
//! known to have none, or per page known allocated; else whether the tmpfs has room for a
//! page (then the load goes through and its pages are marked: a hole takes a page, as a
//! load always did); else `mincore` of the pages around it. Where the range may still hold
//! a hole, the medium reads it with `pread`, which returns zeros for one and allocates
//! nothing. `MADV_POPULATE_READ` (which fails where a load would fault) would need no trust
//! in the room, but cost a system call per page a mount or a reader first touches: cold
//! reads 0.80 ×, recovery 1.10 × (`docs/results/load-guard-ab.md`). Elsewhere a load from a
//! hole maps zeros and every range is loadable. As for stores, a range being given back
//! ([`Backing::punch`]) is not read meanwhile: the engine discards only blocks nothing
//! references.

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

/// Bytes per bit of the page map (a block, and a page).
pub(super) const PAGE: u64 = 4096;

/// Pages of a chunk with holes allocated at least, from the first one a store needs: the
/// allocator hands out free blocks in address order, so the next stores land in those, and
/// one `fallocate` serves them (it takes back at most 124 KiB of holes early).
pub(super) const PAGES_AHEAD: u64 = 32;

/// Pages around a load not known to be loadable that `mincore` looks at (aligned): as many
/// as the kernel maps around a fault.
const PROBE_PAGES: u64 = 16;

/// Free space on the tmpfs holding the image from which loads take no care of holes
/// ([`Shared::room`]): a load from a hole then takes a page, as it always did.
const ROOM: u64 = 64 << 20;

/// How long a look at the free space holds, in nanoseconds. What it trusts: that 64 MiB are
/// not taken within it while a load from a hole is under way. Writes would need 64 GB/s; a
/// concurrent `fallocate` (or a huge-page tmpfs, where a hole takes 2 MiB) can do it, and
/// then such a load is a SIGBUS: the one gap left (see `docs/results/load-guard-ab.md`).
const ROOM_HOLDS_NS: u64 = 1_000_000;

/// What a chunk of the image file holds, as `mincore` tells on tmpfs.
enum Layout {
    /// No hole: nothing to allocate.
    Data,
    /// No data (or not on tmpfs, or `mincore` failed): allocate it whole.
    Hole,
    /// Both: allocate page by page. A byte per page of the chunk, bit 0 set where it holds
    /// data.
    Mixed(Vec<u8>),
}

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
    /// The file is on tmpfs: chunks with holes are backed page by page.
    tmpfs: bool,
    /// One bit per [`BACK_CHUNK`]: allocated in the file system holding the image.
    backed: Box<[AtomicU64]>,
    /// One bit per chunk: handed to the background thread (cleared again if it failed).
    asked: Box<[AtomicU64]>,
    /// One bit per chunk: holds data and holes, so it is backed page by page (`pages`).
    mixed: Box<[AtomicU64]>,
    /// One bit per page of the image: known allocated (backed page by page in a chunk in
    /// `mixed`, found holding data by `mincore`, about to be loaded with room, or allocated
    /// alone on a full disk); what stores into a chunk in `mixed` and loads from one not in
    /// `loadable` ask.
    pages: Box<[AtomicU64]>,
    /// One bit per chunk: known to hold no hole, so a load from it cannot fault (every
    /// chunk off tmpfs, where a load from a hole maps zeros).
    loadable: Box<[AtomicU64]>,
    /// What [`Shared::room`] measures time from.
    epoch: std::time::Instant,
    /// The last look at the room: when (nanoseconds from `epoch`, shifted left by one) and
    /// what it found (the lowest bit); 0 before the first.
    room_look: AtomicU64,
    /// Shared by every backing of a chunk (allocation, population and marking it backed),
    /// held alone by a punch ([`Backing::punch`]) across its hole and the clearing of its
    /// chunks' marks: a chunk is never marked backed while a punch left a hole in it, and
    /// backings do not wait for one another (only for a punch).
    punching: RwLock<()>,
}

fn test_bit(bits: &[AtomicU64], c: u64) -> bool {
    bits[(c / 64) as usize].load(Ordering::Relaxed) & (1 << (c % 64)) != 0
}

pub(super) fn atomic_bits(n: u64) -> Box<[AtomicU64]> {
    (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect()
}

/// The words of bits `[from, to)`, each as (word index, mask of its bits in the range).
fn word_masks(from: u64, to: u64) -> impl Iterator<Item = (usize, u64)> {
    let mut i = from;
    std::iter::from_fn(move || {
        if i >= to {
            return None;
        }
        let hi = to.min((i / 64 + 1) * 64);
        let n = hi - i;
        let mask = if n == 64 {
            u64::MAX
        } else {
            ((1u64 << n) - 1) << (i % 64)
        };
        let w = (i / 64) as usize;
        i = hi;
        Some((w, mask))
    })
}

/// Set (or clear) bits `[from, to)` of `bits`.
pub(super) fn set_bits(bits: &[AtomicU64], from: u64, to: u64, on: bool) {
    for (w, mask) in word_masks(from, to) {
        if on {
            bits[w].fetch_or(mask, Ordering::SeqCst);
        } else {
            bits[w].fetch_and(!mask, Ordering::SeqCst);
        }
    }
}

/// True when bits `[from, to)` of `bits` are all set.
pub(super) fn all_set(bits: &[AtomicU64], from: u64, to: u64) -> bool {
    word_masks(from, to).all(|(w, mask)| bits[w].load(Ordering::Relaxed) & mask == mask)
}

/// `fallocate` mode 0 (allocate, size unchanged) of `[start, start+n)` of `file`. ENOSPC when
/// there is no room (a file system's "over quota" too: a full disk for this image); a file
/// system without it is no error (nothing better can be done up front: its writes then meet
/// a full disk themselves).
pub(super) fn allocate(file: &File, start: u64, n: u64) -> Result<()> {
    // SAFETY: fallocate on a descriptor owned by `file`; the range is inside the file, so its
    // size does not change.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, start as i64, n as i64) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {}
            Some(libc::EDQUOT) => {
                return Err(Error::Io(std::io::Error::from_raw_os_error(libc::ENOSPC)))
            }
            _ => return Err(Error::Io(e)),
        }
    }
    Ok(())
}

/// Allocate the pages `[off, off+len)` touches, in a file of `file_len` bytes: what both media
/// over files fall back to when a larger allocation around them fails (a full disk), since
/// pages that already have their space need none.
pub(super) fn allocate_pages(file: &File, off: u64, len: u64, file_len: u64) -> Result<()> {
    let (p0, p1) = (off / PAGE * PAGE, (off + len).div_ceil(PAGE) * PAGE);
    allocate(file, p0, p1.min(file_len) - p0)
}

/// Run `punch` with `punching` held alone, then forget what was known to be allocated in the
/// range (`forget`, for a non-empty one), also when the punch failed partway: the discard of
/// both media over files, so no allocation marks a range while a punch left a hole in it.
pub(super) fn punch_and_forget(
    punching: &RwLock<()>,
    len: u64,
    punch: impl FnOnce() -> Result<bool>,
    forget: impl FnOnce(),
) -> Result<bool> {
    let _alone = punching.write();
    let punched = punch();
    if len != 0 {
        forget();
    }
    punched
}

impl Shared {
    fn is_backed(&self, c: u64) -> bool {
        test_bit(&self.backed, c)
    }

    /// What chunk `[start, start+n)` of the file holds.
    fn layout(&self, start: u64, n: u64) -> Layout {
        let Some(v) = self.resident(start, n) else {
            return Layout::Hole;
        };
        let pages = v.len();
        let resident = v.iter().filter(|&&b| b & 1 != 0).count();
        if resident == pages {
            Layout::Data
        } else if resident == 0 {
            Layout::Hole
        } else {
            Layout::Mixed(v)
        }
    }

    /// A byte per page of `[start, start+n)` (`start` page aligned), bit 0 set where the
    /// page holds data, as `mincore` tells on tmpfs; `None` elsewhere or when it fails.
    fn resident(&self, start: u64, n: u64) -> Option<Vec<u8>> {
        if !self.tmpfs {
            return None;
        }
        let mut v = vec![0u8; n.div_ceil(PAGE) as usize];
        // SAFETY: `[start, start+n)` lies inside the mapping, whose start is page aligned, as
        // is `start`; `v` has a byte per page of it.
        let r = unsafe {
            libc::mincore(
                (self.base + start as usize) as *mut libc::c_void,
                n as usize,
                v.as_mut_ptr(),
            )
        };
        (r == 0).then_some(v)
    }

    /// Mark the pages from `first` on that `resident` (a byte per page) says hold data as
    /// known allocated. Called with `punching` held (shared).
    fn mark_pages(&self, first: u64, resident: &[u8]) {
        for (i, _) in resident.iter().enumerate().filter(|(_, &b)| b & 1 != 0) {
            let p = first + i as u64;
            set_bits(&self.pages, p, p + 1, true);
        }
    }

    /// Mark chunk `c`, found to hold data and holes (`resident`, a byte per page), mixed,
    /// with its pages of data known allocated. Called with `punching` held (shared).
    fn mark_mixed(&self, c: u64, resident: &[u8]) {
        self.mark_pages(self.chunk_pages(c).0, resident);
        set_bits(&self.mixed, c, c + 1, true);
    }

    /// Pages `[first, last)` of chunk `c` (the last chunk may be short).
    fn chunk_pages(&self, c: u64) -> (u64, u64) {
        let last = ((c + 1) * BACK_CHUNK).min(self.len).div_ceil(PAGE);
        (c * BACK_CHUNK / PAGE, last)
    }

    /// Mark chunk `c` known whole for loads once every page of it is known allocated.
    fn loadable_if_all_pages(&self, c: u64) {
        let (first, last) = self.chunk_pages(c);
        if all_set(&self.pages, first, last) {
            set_bits(&self.loadable, c, c + 1, true);
        }
    }

    /// Mark chunk `c` allocated whole: stores into it and loads from it need nothing more.
    fn mark_backed(&self, c: u64) {
        set_bits(&self.loadable, c, c + 1, true);
        set_bits(&self.backed, c, c + 1, true);
    }

    /// Whether `[lo, hi)`, inside chunk `c`, is known to hold no hole: the chunk is known
    /// whole, or each page of the range allocated.
    fn known_loadable(&self, c: u64, lo: u64, hi: u64) -> bool {
        test_bit(&self.loadable, c) || all_set(&self.pages, lo / PAGE, hi.div_ceil(PAGE))
    }

    /// Whether the file system holding the image has room enough that a load from a hole,
    /// which takes a page there, finds one: at least [`ROOM`] free (or no size limit) when
    /// last looked, less than [`ROOM_HOLDS_NS`] ago. One `fstatfs` per that time at most,
    /// whatever it found.
    fn room(&self) -> bool {
        let now = (self.epoch.elapsed().as_nanos() as u64).max(1);
        let last = self.room_look.load(Ordering::Relaxed);
        if last != 0 && now < (last >> 1) + ROOM_HOLDS_NS {
            return last & 1 == 1;
        }
        // SAFETY: fstatfs fills the zeroed struct for a descriptor `file` owns.
        let roomy = unsafe {
            let mut st: libc::statfs = std::mem::zeroed();
            libc::fstatfs(self.file.as_raw_fd(), &mut st) == 0
                && (st.f_blocks == 0
                    || (st.f_bavail as u64).saturating_mul(st.f_bsize as u64) >= ROOM)
        };
        self.room_look
            .store((now << 1) | u64::from(roomy), Ordering::Relaxed);
        roomy
    }

    /// Whether a load from `[off, off+len)` (`len > 0`) may go through the mapping because
    /// the file system has room ([`Shared::room`]); its pages are then marked allocated,
    /// which the load makes them (a page where there was a hole), so the next loads there
    /// ask nothing. Marked before the load, under `punching`: a punch after it clears the
    /// marks again. (`Pmem::direct` loads a byte of each page of the view it lends, so its
    /// marks hold too.)
    fn load_with_room(&self, off: u64, len: u64) -> bool {
        if !self.room() {
            return false;
        }
        let _no_punch = self.punching.read();
        let end = off + len;
        set_bits(&self.pages, off / PAGE, end.div_ceil(PAGE), true);
        for c in off / BACK_CHUNK..end.div_ceil(BACK_CHUNK) {
            self.loadable_if_all_pages(c);
        }
        true
    }

    /// Whether `[lo, hi)`, inside chunk `c`, holds no hole, by `mincore` of the
    /// [`PROBE_PAGES`] pages around it (about 2 µs here; of a whole chunk about 34, and a
    /// mount reads a word or a block of hundreds of chunks), whose pages of data are marked
    /// allocated; once every page of the chunk is known so, the chunk is known whole.
    fn probe(&self, c: u64, lo: u64, hi: u64) -> bool {
        if self.known_loadable(c, lo, hi) {
            return true;
        }
        let (p0, p1) = (lo / PAGE, hi.div_ceil(PAGE));
        let _no_punch = self.punching.read();
        let w0 = p0 / PROBE_PAGES * PROBE_PAGES;
        let w1 = p1.next_multiple_of(PROBE_PAGES).min(self.chunk_pages(c).1);
        // None off tmpfs (where every chunk is known whole anyway) or when mincore fails.
        let Some(v) = self.resident(w0 * PAGE, (w1 * PAGE).min(self.len) - w0 * PAGE) else {
            return false;
        };
        self.mark_pages(w0, &v);
        let all = |v: &[u8]| v.iter().all(|&b| b & 1 != 0);
        if all(&v) {
            self.loadable_if_all_pages(c);
        }
        all(&v[(p0 - w0) as usize..(p1 - w0) as usize])
    }

    /// Back chunk `c` whole: allocate it where it is all hole, then (with `populate`) map it
    /// in ([`Shared::populate`]). False (and
    /// nothing done) when it holds data and holes: it is then marked mixed and backed page by
    /// page ([`Shared::back_pages`]).
    fn back(&self, c: u64, mut populate: bool) -> Result<bool> {
        let _no_punch = self.punching.read();
        let start = c * BACK_CHUNK;
        let n = BACK_CHUNK.min(self.len - start);
        match self.layout(start, n) {
            Layout::Mixed(resident) => {
                self.mark_mixed(c, &resident);
                return Ok(false);
            }
            Layout::Data => {}
            Layout::Hole => {
                allocate(&self.file, start, n)?;
                // Mapped in even for a reservation: on tmpfs pages allocated but never
                // stored to read as holes to `mincore`, so the next mount's reservation
                // would allocate them over again (4 ms per 64 MiB here).
                populate = true;
            }
        }
        if populate {
            self.populate(start, n);
        }
        self.mark_backed(c);
        Ok(true)
    }

    /// Map the (allocated) pages of `[at, at+n)` in one call, where chunks are populated.
    fn populate(&self, at: u64, n: u64) {
        if self.populate {
            // Failure (an old kernel) only leaves the page faults to happen.
            // SAFETY: callers pass a range inside the mapping (clipped to the image length),
            // which is live while `Backing` is; populating changes no byte of it.
            unsafe {
                libc::madvise(
                    (self.base + at as usize) as *mut libc::c_void,
                    n as usize,
                    libc::MADV_POPULATE_WRITE,
                );
            }
        }
    }

    /// Back the pages of `[lo, hi)`, inside mixed chunk `c`, that are not known to be (and up
    /// to [`PAGES_AHEAD`] from the first); once every page of the chunk is, the chunk counts
    /// as backed whole.
    fn back_pages(&self, c: u64, lo: u64, hi: u64) -> Result<()> {
        let (p0, p1) = (lo / PAGE, hi.div_ceil(PAGE));
        if all_set(&self.pages, p0, p1) {
            return Ok(());
        }
        let (first, last) = self.chunk_pages(c);
        let p1 = p1.max(p0 + PAGES_AHEAD).min(last);
        let _no_punch = self.punching.read();
        let (at, n) = (p0 * PAGE, (p1 * PAGE).min(self.len) - p0 * PAGE);
        allocate(&self.file, at, n)?;
        self.populate(at, n);
        set_bits(&self.pages, p0, p1, true);
        if all_set(&self.pages, first, last) {
            self.mark_backed(c);
        }
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
    /// be dirty and written back). A read-only mapping (`stores` false) only asks
    /// [`Backing::loadable`], and gets no background thread.
    pub(super) fn new(
        file: &File,
        base: *mut u8,
        len: u64,
        populate: bool,
        stores: bool,
    ) -> Result<Backing> {
        let chunks = len.div_ceil(BACK_CHUNK);
        let tmpfs = super::file_system_type(file) == Some(super::fs_magic::TMPFS);
        let shared = Arc::new(Shared {
            file: file.try_clone()?,
            base: base as usize,
            len,
            chunks,
            populate,
            tmpfs,
            backed: atomic_bits(chunks),
            asked: atomic_bits(chunks),
            mixed: atomic_bits(chunks),
            pages: atomic_bits(len.div_ceil(PAGE)),
            loadable: atomic_bits(chunks),
            epoch: std::time::Instant::now(),
            room_look: AtomicU64::new(0),
            punching: RwLock::new(()),
        });
        if !tmpfs {
            set_bits(&shared.loadable, 0, chunks, true);
        }
        if !stores {
            return Ok(Backing {
                shared,
                ahead: Mutex::new(None),
                thread: None,
            });
        }
        let (tx, rx) = mpsc::channel::<u64>();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("nodup-backing".into())
            .spawn(move || {
                // A mixed chunk is left to the writers, page by page (it stays asked for).
                for c in rx {
                    if !s.is_backed(c) && s.back(c, true).is_err() {
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

    /// Whether a load from `[off, off+len)` may go through the mapping: every page of the
    /// range is known allocated, or the file system has room for those that are holes (see
    /// the module doc); an empty range always. False means: read it another way.
    ///
    /// Every load of the medium asks (metadata words, entries, blocks), so the usual cases —
    /// one chunk known whole, or one page known allocated — are a load or two and a test
    /// inlined into the caller.
    #[inline]
    pub(super) fn loadable(&self, off: u64, len: u64) -> bool {
        self.known(off, len) || self.loadable_slow(off, len)
    }

    /// [`Backing::loadable`]'s inline part: the range is empty, or lies in one chunk known
    /// whole, or in one page known allocated.
    #[inline]
    pub(super) fn known(&self, off: u64, len: u64) -> bool {
        let s = &*self.shared;
        let (c, last) = (off / BACK_CHUNK, off.wrapping_add(len).wrapping_sub(1));
        len == 0
            || (c == last / BACK_CHUNK
                && (test_bit(&s.loadable, c)
                    || (off / PAGE == last / PAGE && test_bit(&s.pages, off / PAGE))))
    }

    #[inline(never)]
    fn loadable_slow(&self, off: u64, len: u64) -> bool {
        let s = &*self.shared;
        let end = off + len;
        let each = |f: &dyn Fn(u64, u64, u64) -> bool| {
            (off / BACK_CHUNK..end.div_ceil(BACK_CHUNK))
                .all(|c| f(c, off.max(c * BACK_CHUNK), end.min((c + 1) * BACK_CHUNK)))
        };
        each(&|c, lo, hi| s.known_loadable(c, lo, hi))
            || (s.tmpfs && s.load_with_room(off, len))
            || each(&|c, lo, hi| s.probe(c, lo, hi))
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
        punch_and_forget(&s.punching, len, punch, || {
            // Its chunks are read again from the file when next needed (all hole, or mixed
            // now), and its pages are not backed.
            let (c0, c1) = (off / BACK_CHUNK, (off + len - 1) / BACK_CHUNK + 1);
            set_bits(&s.backed, c0, c1, false);
            set_bits(&s.asked, c0, c1, false);
            set_bits(&s.mixed, c0, c1, false);
            if s.tmpfs {
                set_bits(&s.loadable, c0, c1, false);
            }
            set_bits(&s.pages, off / PAGE, (off + len).div_ceil(PAGE), false);
        })
    }

    /// Allocate `[off, off+len)` now, without mapping its pages in (stores may be far off,
    /// or never come) nor asking for chunks ahead: what [`super::Medium::reserve`] asks of a
    /// mapped image.
    pub(super) fn reserve(&self, off: u64, len: u64) -> Result<()> {
        if len != 0 {
            self.back_range(off, len, false)?;
        }
        Ok(())
    }

    /// Back every chunk `[off, off+len)` (`len > 0`) touches: whole, or page by page where it
    /// holds data and holes; `populate` maps whole chunks in too. When that fails (a full
    /// disk, most likely, and the chunk or the pages after the range have holes) only the
    /// range's own pages are asked for, and marked allocated (which counts in a mixed chunk),
    /// so that a store into what already has its space still goes through.
    fn back_range(&self, off: u64, len: u64, populate: bool) -> Result<()> {
        let s = &*self.shared;
        let first = off / BACK_CHUNK;
        let last = (off + len - 1) / BACK_CHUNK;
        for c in first..=last {
            if s.is_backed(c) {
                continue;
            }
            let lo = off.max(c * BACK_CHUNK);
            let hi = (off + len).min((c + 1) * BACK_CHUNK);
            let backed = match test_bit(&s.mixed, c) {
                false => s.back(c, populate).and_then(|whole| match whole {
                    true => Ok(()),
                    false => s.back_pages(c, lo, hi),
                }),
                true => s.back_pages(c, lo, hi),
            };
            if let Err(e) = backed {
                let _no_punch = s.punching.read();
                if allocate_pages(&s.file, lo, hi - lo, s.len).is_err() {
                    return Err(e);
                }
                set_bits(&s.pages, lo / PAGE, hi.div_ceil(PAGE), true);
            }
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn ensure_slow(&self, off: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.back_range(off, len, true)?;
        let s = &*self.shared;
        let last = (off + len - 1) / BACK_CHUNK;
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
