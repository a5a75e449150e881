//! `Pmem`: a memory-mapped image file used as (emulated or real) persistent memory.
//!
//! On tmpfs (`/dev/shm`) the mapping plays emulated pmem; on a file of a DAX file system it is
//! real pmem. Persistence follows the x86 pmem model:
//!
//! - `write` is a plain store (`memcpy` into the mapping);
//! - `flush(off, len)` writes back every 64-byte line of the range with the best cache-line
//!   write-back instruction the CPU has — `clwb`, else `clflushopt`, else `clflush` — chosen once
//!   per process from CPUID (leaf 7 EBX bit 24 = clwb, bit 23 = clflushopt; leaf 1 EDX bit 19 =
//!   clflush);
//! - `fence()` is `sfence`. With [`PmemOptions::sync_on_fence`] the fence also `msync`s the pages
//!   flushed since the previous fence (and `flush` issues no cache-line instructions: the
//!   `msync` writes the pages whole). An open turns it on for a file on a file system with a
//!   page cache in front of a disk (not tmpfs, ramfs or DAX), where a flushed line is only in
//!   that cache;
//! - `sync_all()` `msync`s the whole mapping.
//!
//! Builds for other architectures have no cache-line instructions: there `flush` remembers the
//! range and `fence` `msync`s it (always, whatever `sync_on_fence` says).
//!
//! # Safety argument for the raw-pointer accesses
//!
//! The mapping is owned by `Pmem` (a [`memmap2::MmapRaw`], which hands out only a raw pointer,
//! never a `&mut [u8]`), lives as long as the `Pmem`, and its length never changes. Every access
//! is bounds-checked against that length first. Writes copy through `ptr::copy_nonoverlapping`
//! into the mapping without ever forming a `&mut` reference to it, so two threads writing
//! disjoint ranges concurrently do not alias any Rust reference and are not a data race.
//! Overlapping concurrent writes (or a read concurrent with a write of the same bytes) are the
//! caller's business, exactly like concurrent stores to pmem: the engine never does them for
//! data it reads (a data block is immutable while referenced; metadata entries are updated under
//! the engine's locks). [`Medium::direct`] returns a shared slice over the mapping; the caller
//! must likewise not read through it bytes that another thread is writing at that moment.
//!
//! The file must not be truncated by another process while it is mapped (that would turn an
//! access into SIGBUS); nodup's images are only opened by one process at a time.
//!
//! # Backing store
//!
//! Before the first store into each chunk of the image, the chunk is allocated in the file
//! system holding it (a store into a page that cannot be allocated is a SIGBUS); see
//! [`super::backing`]. On tmpfs a load from a hole allocates a page as well, so a range that
//! may hold a hole is read from the file instead (`pread`), and [`Medium::direct`] lends no
//! view of it.

use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use memmap2::MmapRaw;
use parking_lot::Mutex;

use super::backing::Backing;
#[cfg(target_arch = "x86_64")]
use super::cacheline::flush_line;
pub use super::cacheline::FlushInstr;
use super::write_back::WriteBack;
use super::{check_range, FillDst, Medium, CACHE_LINE};
use crate::{Error, Result};

/// Options of a [`Pmem`] medium.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PmemOptions {
    /// Also `msync` the flushed pages at every `fence`.
    ///
    /// Whatever this says, an open turns it on for a file on a disk's file system (any but
    /// tmpfs, ramfs or DAX), where a flushed line reaches only the page cache.
    pub sync_on_fence: bool,
    /// Pre-fault the whole mapping at open (`MAP_POPULATE`), so that page-fault costs of a fresh
    /// tmpfs file do not land in measurements (real pmem has none).
    pub populate: bool,
    /// Write whole blocks ([`Medium::write_stream`]) with non-temporal stores, as NOVA and
    /// PMDK do, instead of ordinary stores + cache-line flush. Off by default for the engine:
    /// on DRAM-backed images it doubles plain-write speed, but the rewrite of deduplicated data
    /// then reads every compared block from memory (measured: light's rewrite fell below its
    /// first write). `nodup mount` turns it on for unencrypted images (`--stream-data`): through
    /// FUSE, new data gained 8-11 % and rewrites stayed level (docs/choices.md).
    pub stream_data: bool,
}

pub use super::backing::BACK_CHUNK;

/// A memory-mapped image file as a persistent medium.
pub struct Pmem {
    /// Backing-store bookkeeping (and which ranges loads may read through the mapping);
    /// declared before `map` so its thread stops before the mapping goes.
    backing: Backing,
    map: MmapRaw,
    file: File,
    /// Mapped read-only: every store is refused.
    read_only: bool,
    path: PathBuf,
    len: u64,
    opts: PmemOptions,
    instr: FlushInstr,
    /// Line-aligned ranges flushed since the last fence, msynced by the next fence
    /// (only kept when msync is needed: `sync_on_fence` or no cache-line instruction).
    pending_sync: Mutex<Vec<(u64, u64)>>,
    /// After a failed msync, no fence succeeds (see [`WriteBack`]).
    write_back: WriteBack,
}

impl std::fmt::Debug for Pmem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pmem")
            .field("path", &self.path)
            .field("len", &self.len)
            .field("opts", &self.opts)
            .field("instr", &self.instr)
            .finish()
    }
}

impl Pmem {
    /// Create (or truncate) the image file at `path`, size it to `len` bytes (zero-filled) and map it.
    pub fn create(path: impl AsRef<Path>, len: u64) -> Result<Pmem> {
        Pmem::create_with(path, len, PmemOptions::default())
    }

    /// [`Pmem::create`] with options.
    pub fn create_with(path: impl AsRef<Path>, len: u64, opts: PmemOptions) -> Result<Pmem> {
        if len == 0 {
            return Err(Error::Invalid("pmem image size must be > 0".into()));
        }
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.set_len(len)?;
        super::sync_dir_of(path)?;
        Pmem::map(file, path, opts)
    }

    /// Map an existing image file at its current size.
    pub fn open(path: impl AsRef<Path>) -> Result<Pmem> {
        Pmem::open_with(path, PmemOptions::default())
    }

    /// Map an existing image file read-only (checks that must leave it byte-identical).
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Pmem> {
        let path = path.as_ref();
        let file = OpenOptions::new().read(true).open(path)?;
        Pmem::map_file(file, path, PmemOptions::default(), true)
    }

    /// [`Pmem::open`] with options.
    pub fn open_with(path: impl AsRef<Path>, opts: PmemOptions) -> Result<Pmem> {
        let path = path.as_ref();
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Pmem::map(file, path, opts)
    }

    fn map(file: File, path: &Path, opts: PmemOptions) -> Result<Pmem> {
        Pmem::map_file(file, path, opts, false)
    }

    fn map_file(file: File, path: &Path, opts: PmemOptions, read_only: bool) -> Result<Pmem> {
        // A process's mapped pages cannot be dropped at its close, so a failed msync's may
        // stay cached: every open drops the cache.
        let write_back = WriteBack::open(&file, false);
        let opts = PmemOptions {
            sync_on_fence: opts.sync_on_fence || !flushed_lines_suffice(&file),
            ..opts
        };
        let len = file.metadata()?.len();
        if len == 0 {
            return Err(Error::Invalid(format!(
                "{}: empty image cannot be mapped",
                path.display()
            )));
        }
        if usize::try_from(len).is_err() {
            return Err(Error::Invalid(format!(
                "{}: image too large to map",
                path.display()
            )));
        }
        let mut mo = memmap2::MmapOptions::new();
        if opts.populate {
            mo.populate();
        }
        let map = if read_only {
            mo.map_raw_read_only(&file)?
        } else {
            mo.map_raw(&file)?
        };
        let instr = FlushInstr::detect();
        // Populating pages where durability is msync would dirty every one of them; a
        // mapping populated at open has them already.
        let populate = !needs_msync(&opts, instr) && !opts.populate;
        let backing = Backing::new(&file, map.as_mut_ptr(), len, populate, !read_only)?;
        Ok(Pmem {
            backing,
            map,
            file,
            read_only,
            path: path.to_path_buf(),
            len,
            opts,
            instr,
            pending_sync: Mutex::new(Vec::new()),
            write_back,
        })
    }

    /// A write-back of the file that failed before this open, unreported until then.
    ///
    /// See [`super::BlockFile::write_back_failed_before_open`].
    pub fn write_back_failed_before_open(&self) -> Option<&str> {
        self.write_back.failed_before_open()
    }

    /// Every fence `msync`s what was flushed since the last one.
    ///
    /// The file is on a disk's file system, [`PmemOptions::sync_on_fence`] asked for it, or the
    /// CPU has no cache-line instruction.
    pub fn syncs_on_fence(&self) -> bool {
        self.needs_msync()
    }

    /// Whether a pmem image file at `path` would fence by `msync` for want of a memory or DAX
    /// file system under it (what an open decides; false when the file cannot be opened).
    pub fn would_sync_on_fence(path: &Path) -> bool {
        File::open(path).is_ok_and(|f| !flushed_lines_suffice(&f))
    }

    /// The flush instruction in use.
    pub fn flush_instr(&self) -> FlushInstr {
        self.instr
    }

    /// The options this medium was opened with.
    pub fn options(&self) -> PmemOptions {
        self.opts
    }

    /// Path of the image file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Make sure stores into `[off, off+len)` cannot fault for lack of backing store (see
    /// [`super::backing`]). ENOSPC (or another error of the file system holding the image)
    /// when that fails.
    #[inline]
    fn ensure_backed(&self, off: u64, len: u64) -> Result<()> {
        if self.read_only {
            return Err(Error::Invalid("the image was opened read-only".into()));
        }
        self.backing.ensure(off, len)
    }

    /// Copy the bytes at `off` into `buf` (every read of this medium; inlined, so a constant
    /// length becomes loads rather than a copy call).
    #[inline]
    fn load(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        let r = check_range(off, buf.len(), self.len)?;
        if !self.backing.loadable(off, buf.len() as u64) {
            return self.read_file(off, buf);
        }
        // SAFETY: `r` is inside the mapping (checked); `buf` is a distinct Rust allocation.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.as_ptr().add(r.start),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        Ok(())
    }

    /// Read `[off, off+buf.len())` from the file rather than the mapping: a range that may
    /// hold a hole, which reads as zeros this way and allocates nothing (see
    /// [`super::backing`]).
    #[inline(never)]
    fn read_file(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        Ok(self.file.read_exact_at(buf, off)?)
    }

    /// The `N` bytes at `off`, copied with a constant length.
    #[inline]
    fn read_array<const N: usize>(&self, off: u64) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.load(off, &mut b)?;
        Ok(b)
    }

    /// Where `len` bytes at `off` may be stored: the range checked against the image and its
    /// backing store ensured, which every store of this medium needs first.
    #[inline]
    fn store_dst(&self, off: u64, len: usize) -> Result<*mut u8> {
        let r = check_range(off, len, self.len)?;
        self.ensure_backed(off, len as u64)?;
        Ok(self.map.as_mut_ptr().wrapping_add(r.start))
    }

    /// Copy `data` into the image at `off` (every plain store of this medium; inlined, so a
    /// constant length becomes stores rather than a copy call).
    #[inline]
    fn store(&self, off: u64, data: &[u8]) -> Result<()> {
        let dst = self.store_dst(off, data.len())?;
        // SAFETY: see the module doc: `dst` is checked and backed for `data.len()` bytes
        // (`store_dst`), raw-pointer copy, no `&mut` to the mapping.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Whether whole data blocks are written with non-temporal stores: asked for
    /// ([`PmemOptions::stream_data`]), on x86_64, on a mapping whose durability comes from the
    /// CPU (not msync). What a mount reports, rather than what it asked for.
    pub fn streams_data(&self) -> bool {
        cfg!(target_arch = "x86_64") && self.opts.stream_data && !self.needs_msync()
    }

    /// Streaming stores can replace store + flush at `[off, off+len)`: [`Pmem::streams_data`],
    /// whole cache lines.
    fn streams(&self, off: u64, len: usize) -> bool {
        self.streams_data()
            && off.is_multiple_of(CACHE_LINE)
            && (len as u64).is_multiple_of(CACHE_LINE)
    }

    fn needs_msync(&self) -> bool {
        needs_msync(&self.opts, self.instr)
    }

    /// msync every range flushed since the last fence. On a failure the ranges not synced yet
    /// are dropped with the rest: [`WriteBack`] fails every later fence anyway.
    fn msync_pending(&self) -> Result<()> {
        let mut ranges = std::mem::take(&mut *self.pending_sync.lock());
        ranges.sort_unstable();
        // Merge ranges that overlap or touch the same page, then msync each run.
        let page = 4096u64;
        let mut cur: Option<(u64, u64)> = None;
        for (o, l) in ranges {
            let (s, e) = (o & !(page - 1), o + l);
            cur = match cur {
                Some((cs, ce)) if s <= ce.next_multiple_of(page) => Some((cs, ce.max(e))),
                Some((cs, ce)) => {
                    self.msync(cs, ce - cs)?;
                    Some((s, e))
                }
                None => Some((s, e)),
            };
        }
        if let Some((cs, ce)) = cur {
            self.msync(cs, ce - cs)?;
        }
        Ok(())
    }

    /// msync `[off, off+len)` (page-aligned by memmap2).
    fn msync(&self, off: u64, len: u64) -> Result<()> {
        self.map.flush_range(off as usize, len as usize)?;
        Ok(())
    }
}

/// A cache-line flush is all a store to `file`'s mapping needs: the file lives in memory
/// (tmpfs, ramfs: nothing behind it to reach) or on DAX (the flush reaches the media). Any
/// other file system keeps the mapping's pages in its page cache, written back to its disk only
/// by `msync` (or whenever the kernel likes). Unknown (a failed `fstatfs`/`statx`) counts as
/// not enough.
fn flushed_lines_suffice(file: &File) -> bool {
    use super::fs_magic::{RAMFS, TMPFS};
    let fd = file.as_raw_fd();
    let in_memory = matches!(super::file_system_type(file), Some(TMPFS | RAMFS));
    // SAFETY: statx of the descriptor itself (empty path, AT_EMPTY_PATH) into a zeroed struct.
    let dax = unsafe {
        let mut st: libc::statx = std::mem::zeroed();
        libc::statx(fd, c"".as_ptr(), libc::AT_EMPTY_PATH, 0, &mut st) == 0
            && st.stx_attributes_mask & libc::STATX_ATTR_DAX as u64 != 0
            && st.stx_attributes & libc::STATX_ATTR_DAX as u64 != 0
    };
    in_memory || dax
}

/// Durability on this mapping comes from msync (asked for, or no cache-line instruction).
fn needs_msync(opts: &PmemOptions, instr: FlushInstr) -> bool {
    opts.sync_on_fence || instr == FlushInstr::Msync
}

impl Medium for Pmem {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.load(off, buf)
    }

    fn read_u64(&self, off: u64) -> Result<u64> {
        Ok(u64::from_le_bytes(self.read_array(off)?))
    }

    fn write_u64(&self, off: u64, v: u64) -> Result<()> {
        // `store` is inlined: the length is the constant 8, so one store, not a copy call.
        self.store(off, &v.to_le_bytes())
    }

    fn read_32(&self, off: u64) -> Result<[u8; 32]> {
        self.read_array(off)
    }

    fn write(&self, off: u64, data: &[u8]) -> Result<()> {
        self.store(off, data)
    }

    fn flush(&self, off: u64, len: u64) {
        if len == 0 || off >= self.len {
            return;
        }
        let end = off.saturating_add(len).min(self.len);
        let start = off & !(CACHE_LINE - 1);
        #[cfg(target_arch = "x86_64")]
        if self.instr != FlushInstr::Msync && !self.opts.sync_on_fence {
            let base = self.map.as_ptr();
            let mut line = start;
            while line < end {
                // SAFETY: `line < end <= len`, so the line start is inside the mapping.
                unsafe { flush_line(self.instr, base.add(line as usize)) };
                line += CACHE_LINE;
            }
        }
        if self.needs_msync() {
            self.pending_sync.lock().push((start, end - start));
        }
    }

    fn fence(&self) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: sfence has no memory-safety preconditions (SSE is baseline on x86_64).
        unsafe {
            core::arch::x86_64::_mm_sfence()
        };
        #[cfg(not(target_arch = "x86_64"))]
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if self.needs_msync() {
            self.write_back.run(|| self.msync_pending())?;
        }
        Ok(())
    }

    fn sync_all(&self) -> Result<()> {
        self.fence()?;
        self.write_back.run(|| Ok(self.map.flush()?))?;
        self.pending_sync.lock().clear();
        Ok(())
    }

    fn write_back_failed(&self) -> Option<String> {
        self.write_back.failure().map(str::to_owned)
    }

    fn write_stream(&self, off: u64, data: &[u8]) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        if self.streams(off, data.len()) {
            let dst = self.store_dst(off, data.len())?;
            // SAFETY: `dst` is checked and backed for `data.len()` bytes (`store_dst`); 16-byte
            // aligned destination and length (`streams`); raw-pointer stores as in `write`
            // (module doc).
            unsafe { super::stream_copy(data, dst) };
            return Ok(());
        }
        self.store(off, data)?;
        self.flush(off, data.len() as u64);
        Ok(())
    }

    fn fill_with(&self, off: u64, len: usize, fill: &mut dyn FnMut(FillDst)) -> Result<bool> {
        let r = check_range(off, len, self.len)?;
        if len == 0 {
            // A probe for direct stores (no data).
            return Ok(!self.read_only);
        }
        self.ensure_backed(off, len as u64)?;
        let streaming = self.streams(off, len);
        // The pointer stays inside the mapping for `len` bytes (checked just above); `fill`
        // writes through it under the same rules as `write` (module doc).
        fill(FillDst {
            ptr: self.map.as_mut_ptr().wrapping_add(r.start),
            streaming,
        });
        if !streaming {
            self.flush(off, len as u64);
        }
        Ok(true)
    }

    fn direct(&self, off: u64, len: usize) -> Option<&[u8]> {
        let r = check_range(off, len, self.len).ok()?;
        // SAFETY: inside the mapping, which lives as long as `&self`; see the module doc for the
        // no-concurrent-writer rule the caller follows.
        let view = unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(r.start), len) };
        if self.backing.known(off, len as u64) {
            return Some(view);
        }
        if !self.backing.loadable(off, len as u64) {
            return None;
        }
        // The range was let through with its pages marked allocated before any load of
        // them: a byte of each is loaded now, so the marks hold whatever the caller goes on
        // to read of the view.
        let page = super::backing::PAGE;
        let page_starts = ((page - off % page) as usize..len).step_by(page as usize);
        for p in std::iter::once(0).chain(page_starts) {
            // SAFETY: `p < len` (`len > 0`: an empty range is known), inside the view.
            unsafe { std::ptr::read_volatile(view.as_ptr().add(p)) };
        }
        Some(view)
    }

    fn prefetch(&self, off: u64, len: usize, stride: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            if off >= self.len || len == 0 {
                return;
            }
            let end = off.saturating_add(len as u64).min(self.len);
            let stride = if stride == 0 {
                CACHE_LINE
            } else {
                stride as u64
            };
            let base = self.map.as_ptr();
            let mut p = off;
            while p < end {
                // SAFETY: `p < len`, inside the mapping; prefetch never faults anyway.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(p as usize) as *const i8) };
                p += stride;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (off, len, stride);
    }

    fn known_zero(&self, off: u64, len: u64) -> bool {
        super::file_hole(self.file.as_raw_fd(), off, len)
    }

    fn discard(&self, off: u64, len: u64) -> Result<bool> {
        if self.read_only {
            return Ok(false);
        }
        check_range(off, len as usize, self.len)?;
        // The pages leave the mapping too; a later store faults in a zeroed one, after the
        // backing store has allocated its chunk again, as for any hole.
        self.backing.punch(off, len, || {
            super::punch_hole(self.file.as_raw_fd(), off, len)
        })
    }

    fn reserve(&self, off: u64, len: u64) -> Result<()> {
        check_range(off, len as usize, self.len)?;
        if self.read_only {
            return Ok(());
        }
        self.backing.reserve(off, len)
    }

    fn kind(&self) -> &'static str {
        "pmem"
    }
}

#[cfg(test)]
mod tests;
