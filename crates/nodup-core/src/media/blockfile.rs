//! `BlockFile`: a medium over a regular file or block device through `pread`/`pwrite`.
//!
//! Persistence follows the block-device model: `flush` is a no-op and `fence` is `fdatasync`
//! (a write is durable once a fence follows it, as in ext4 after fsync).
//!
//! With [`BlockFileOptions::direct`] the file is opened with `O_DIRECT`: every transfer goes
//! through a bounce buffer aligned to [`DIRECT_ALIGN`] and covering whole aligned sectors, so
//! callers may still read and write at any offset and length. An unaligned write becomes a
//! read-modify-write of the aligned sectors it touches; those are serialized by a lock so that
//! two concurrent unaligned writes to disjoint byte ranges of the same sector do not lose each
//! other's bytes (aligned writes never need it). File systems without `O_DIRECT` support (tmpfs)
//! make `open`/`create` fail with an I/O error (EINVAL).

use std::alloc::{self, Layout};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::preallocate::Preallocated;
use super::write_back::WriteBack;
use super::{check_range, Medium};
use crate::{Error, Result};

/// Alignment (buffer address, file offset and length) used for `O_DIRECT` transfers.
pub const DIRECT_ALIGN: usize = 4096;

/// Options of a [`BlockFile`] medium.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockFileOptions {
    /// Open with `O_DIRECT` (bypass the page cache).
    pub direct: bool,
    /// Open for reading only (checks that must leave the image byte-identical).
    pub read_only: bool,
    /// Keep the file's cached pages at open unless a failed write-back is reported to it; the
    /// caller drops them when the image was not closed cleanly
    /// ([`BlockFile::forget_cached_pages`], `media/write_back.rs`).
    pub keep_cache: bool,
}

/// A heap buffer aligned to [`DIRECT_ALIGN`].
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        assert!(len > 0 && len.is_multiple_of(DIRECT_ALIGN));
        let layout = Layout::from_size_align(len, DIRECT_ALIGN).expect("aligned layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }
    fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` owns `len` initialized (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, DIRECT_ALIGN).expect("aligned layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr, layout) };
    }
}

/// A file or block device as a medium.
pub struct BlockFile {
    file: File,
    path: PathBuf,
    len: u64,
    opts: BlockFileOptions,
    /// Serializes read-modify-write of partially written sectors under `O_DIRECT`.
    rmw: Mutex<()>,
    /// After a failed `fdatasync`, no fence succeeds (see [`WriteBack`]).
    write_back: WriteBack,
    /// A regular file opened for writing: holes are allocated before they are written, so a
    /// full disk fails a write before any byte of it lands (see [`Preallocated`]).
    prealloc: Option<Preallocated>,
}

impl std::fmt::Debug for BlockFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockFile")
            .field("path", &self.path)
            .field("len", &self.len)
            .field("opts", &self.opts)
            .finish()
    }
}

impl Drop for BlockFile {
    /// After a failed write-back the page cache may hold bytes the disk never got: the next
    /// open of the file on this boot must not read them (`media/write_back.rs`).
    fn drop(&mut self) {
        if self.write_back.failure().is_some() {
            self.write_back.forget_cached_pages();
        }
    }
}

fn open_opts_for(opts: &BlockFileOptions) -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(!opts.read_only);
    if opts.direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o
}

impl BlockFile {
    /// Create (or truncate) a regular file of `len` bytes (zero-filled).
    pub fn create(path: impl AsRef<Path>, len: u64, opts: BlockFileOptions) -> Result<BlockFile> {
        if len == 0 {
            return Err(Error::Invalid("block file size must be > 0".into()));
        }
        if opts.direct && !len.is_multiple_of(DIRECT_ALIGN as u64) {
            return Err(Error::Invalid(format!(
                "O_DIRECT block file size must be a multiple of {DIRECT_ALIGN}"
            )));
        }
        let path = path.as_ref();
        let file = open_opts_for(&opts)
            .create(true)
            .truncate(true)
            .open(path)?;
        // Over an old image: a failure of its last write-back is not this medium's.
        let write_back = WriteBack::open(&file, false);
        file.set_len(len)?;
        super::sync_dir_of(path)?;
        Ok(BlockFile {
            file,
            path: path.to_path_buf(),
            len,
            opts,
            rmw: Mutex::new(()),
            write_back,
            prealloc: (!opts.read_only).then(|| Preallocated::new(len)),
        })
    }

    /// Open an existing file or block device at its current size.
    pub fn open(path: impl AsRef<Path>, opts: BlockFileOptions) -> Result<BlockFile> {
        let path = path.as_ref();
        let file = open_opts_for(&opts).open(path)?;
        let write_back = WriteBack::open(&file, opts.keep_cache);
        let meta = file.metadata()?;
        let regular = meta.file_type().is_file();
        let len = if regular {
            meta.len()
        } else {
            // Block device: its size is where a seek to the end lands.
            use std::io::{Seek, SeekFrom};
            (&file).seek(SeekFrom::End(0))?
        };
        if len == 0 {
            return Err(Error::Invalid(format!("{}: empty medium", path.display())));
        }
        Ok(BlockFile {
            file,
            path: path.to_path_buf(),
            len,
            opts,
            rmw: Mutex::new(()),
            write_back,
            // A block device has no holes to fill.
            prealloc: (regular && !opts.read_only).then(|| Preallocated::new(len)),
        })
    }

    /// Drop the file's cached pages, so what is read next comes from the disk: for a caller
    /// that opened with [`BlockFileOptions::keep_cache`] and found the image not closed
    /// cleanly (`media/write_back.rs`).
    pub fn forget_cached_pages(&self) {
        self.write_back.forget_cached_pages();
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A write-back of the file that failed before this open, unreported until then.
    ///
    /// A run that died before its next fence: its last stores may not all be in the file, which
    /// this open reads as the disk holds it (`media/write_back.rs`).
    pub fn write_back_failed_before_open(&self) -> Option<&str> {
        self.write_back.failed_before_open()
    }

    /// The options this medium was opened with.
    pub fn options(&self) -> BlockFileOptions {
        self.opts
    }

    /// Aligned window `[a_start, a_end)` covering `[off, off+len)`.
    fn aligned(off: u64, len: usize) -> (u64, u64) {
        let a = DIRECT_ALIGN as u64;
        let start = off / a * a;
        let end = (off + len as u64).div_ceil(a) * a;
        (start, end)
    }

    fn direct_read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        let (s, e) = Self::aligned(off, buf.len());
        let mut bounce = AlignedBuf::new((e - s) as usize);
        self.file.read_exact_at(bounce.as_mut_slice(), s)?;
        let d = (off - s) as usize;
        buf.copy_from_slice(&bounce.as_slice()[d..d + buf.len()]);
        Ok(())
    }

    fn direct_write(&self, off: u64, data: &[u8]) -> Result<()> {
        let (s, e) = Self::aligned(off, data.len());
        let mut bounce = AlignedBuf::new((e - s) as usize);
        let d = (off - s) as usize;
        let partial = d != 0 || data.len() != (e - s) as usize;
        let _guard = partial.then(|| self.rmw.lock());
        if partial {
            self.file.read_exact_at(bounce.as_mut_slice(), s)?;
        }
        bounce.as_mut_slice()[d..d + data.len()].copy_from_slice(data);
        self.file.write_all_at(bounce.as_slice(), s)?;
        Ok(())
    }
}

/// `pwritev` of all of `pieces` from `off`, resumed after a short write.
fn write_all_vectored_at(file: &File, off: u64, pieces: &[&[u8]]) -> Result<()> {
    use std::os::unix::io::AsRawFd;
    // The kernel takes at most IOV_MAX (1024) pieces per call.
    const MAX_IOV: usize = 1024;
    let mut iov: Vec<libc::iovec> = pieces
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    let (mut first, mut at) = (0usize, off);
    while first < iov.len() {
        let n = (iov.len() - first).min(MAX_IOV);
        let offset = libc::off_t::try_from(at)
            .map_err(|_| Error::Invalid(format!("offset {at} past what pwritev takes")))?;
        // SAFETY: `iov[first..first + n]` describe live, readable slices of `pieces` (or the
        // unwritten tail of one, below), which outlive the call.
        let r = unsafe { libc::pwritev(file.as_raw_fd(), iov[first..].as_ptr(), n as i32, offset) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e.into());
        }
        if r == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into());
        }
        let mut left = r as usize;
        at += left as u64;
        while left > 0 {
            let v = &mut iov[first];
            if left >= v.iov_len {
                left -= v.iov_len;
                first += 1;
            } else {
                // SAFETY: still inside the same slice (`left < iov_len`).
                v.iov_base = unsafe { (v.iov_base as *mut u8).add(left) } as *mut libc::c_void;
                v.iov_len -= left;
                left = 0;
            }
        }
    }
    Ok(())
}

impl Medium for BlockFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        check_range(off, buf.len(), self.len)?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.opts.direct {
            return self.direct_read(off, buf);
        }
        self.file.read_exact_at(buf, off)?;
        Ok(())
    }

    fn write(&self, off: u64, data: &[u8]) -> Result<()> {
        check_range(off, data.len(), self.len)?;
        if data.is_empty() {
            return Ok(());
        }
        if let Some(p) = &self.prealloc {
            if !p.ensure(&self.file, off, data)? {
                return Ok(());
            }
        }
        if self.opts.direct {
            return self.direct_write(off, data);
        }
        self.file.write_all_at(data, off)?;
        Ok(())
    }

    fn gathers(&self) -> bool {
        true
    }

    fn write_gather(&self, off: u64, pieces: &[&[u8]]) -> Result<()> {
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        check_range(off, total, self.len)?;
        // O_DIRECT goes through the bounce buffer piece by piece; a range whose space cannot
        // be had whole goes piece by piece too, so each piece keeps `write`'s handling (zeros
        // into a hole need no space).
        let whole = self
            .prealloc
            .as_ref()
            .is_none_or(|p| p.reserve(&self.file, off, total as u64).is_ok());
        if pieces.len() < 2 || self.opts.direct || !whole {
            let mut at = off;
            for p in pieces {
                self.write(at, p)?;
                at += p.len() as u64;
            }
            return Ok(());
        }
        write_all_vectored_at(&self.file, off, pieces)
    }

    fn flush(&self, _off: u64, _len: u64) {}

    fn fence(&self) -> Result<()> {
        self.write_back.run(|| Ok(self.file.sync_data()?))
    }

    fn sync_all(&self) -> Result<()> {
        self.write_back.run(|| Ok(self.file.sync_all()?))
    }

    fn write_back_failed(&self) -> Option<String> {
        self.write_back.failure().map(str::to_owned)
    }

    fn known_zero(&self, off: u64, len: u64) -> bool {
        use std::os::unix::io::AsRawFd;
        super::file_hole(self.file.as_raw_fd(), off, len)
    }

    fn discard(&self, off: u64, len: u64) -> Result<bool> {
        use std::os::unix::io::AsRawFd;
        if self.opts.read_only {
            return Ok(false);
        }
        check_range(off, len as usize, self.len)?;
        // A file gets a hole; a block device a discard (the kernel refuses, and we stop, where
        // the device cannot unmap without writing).
        let punch = || super::punch_hole(self.file.as_raw_fd(), off, len);
        match &self.prealloc {
            Some(p) => p.punch(off, len, punch),
            None => punch(),
        }
    }

    fn reserve(&self, off: u64, len: u64) -> Result<()> {
        check_range(off, len as usize, self.len)?;
        match &self.prealloc {
            Some(p) => p.reserve(&self.file, off, len),
            None => Ok(()),
        }
    }

    fn kind(&self) -> &'static str {
        "blockfile"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(m: &BlockFile) {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        m.write(1234, &data).unwrap();
        m.write(8192, &[0xAB; 4096]).unwrap();
        m.fence().unwrap();
        let mut back = vec![0; data.len()];
        m.read(1234, &mut back).unwrap();
        // the aligned write overwrote part of the first one
        let mut expect = data.clone();
        for (i, b) in expect.iter_mut().enumerate() {
            let o = 1234 + i as u64;
            if (8192..12288).contains(&o) {
                *b = 0xAB;
            }
        }
        assert_eq!(back, expect);
        let mut b = [0u8; 8];
        assert!(matches!(
            m.read(m.len() - 4, &mut b),
            Err(Error::Invalid(_))
        ));
        assert!(matches!(m.write(m.len(), &b), Err(Error::Invalid(_))));
        assert!(matches!(m.write(u64::MAX, &b), Err(Error::Invalid(_))));
        m.read(m.len() - 8, &mut b).unwrap();
        // A gathered write: more pieces than one pwritev takes (1024), of uneven sizes.
        let pieces: Vec<Vec<u8>> = (0..1500u32)
            .map(|i| vec![(i % 253) as u8 + 1; 1 + (i % 7) as usize])
            .collect();
        let refs: Vec<&[u8]> = pieces.iter().map(|p| &p[..]).collect();
        m.write_gather(300_000, &refs).unwrap();
        let want: Vec<u8> = pieces.concat();
        let mut back = vec![0; want.len() + 1];
        m.read(300_000, &mut back).unwrap();
        assert_eq!(&back[..want.len()], &want[..]);
        assert_eq!(back[want.len()], 0, "nothing past the pieces");
        assert!(matches!(
            m.write_gather(m.len() - 4, &[&b[..2], &b[..3]]),
            Err(Error::Invalid(_))
        ));
    }

    #[test]
    fn buffered_round_trip_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        {
            let m = BlockFile::create(&p, 1 << 20, BlockFileOptions::default()).unwrap();
            exercise(&m);
            m.sync_all().unwrap();
        }
        let m = BlockFile::open(&p, BlockFileOptions::default()).unwrap();
        assert_eq!(m.len(), 1 << 20);
        let mut b = [0u8; 4];
        m.read(8192, &mut b).unwrap();
        assert_eq!(b, [0xAB; 4]);
    }

    #[test]
    fn direct_round_trip_and_reopen() {
        // O_DIRECT needs a real file system; tmpfs refuses it (then the test has nothing to prove).
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        let opts = BlockFileOptions {
            direct: true,
            ..BlockFileOptions::default()
        };
        let m = match BlockFile::create(&p, 1 << 20, opts) {
            Ok(m) => m,
            Err(Error::Io(e)) if e.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!("O_DIRECT unsupported here, skipped");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        exercise(&m);
        drop(m);
        let m = BlockFile::open(&p, opts).unwrap();
        let mut b = [0u8; 3];
        m.read(8191, &mut b).unwrap();
        assert_eq!(b[1..], [0xAB, 0xAB]);
        assert!(matches!(
            BlockFile::create(&p, 1000, opts),
            Err(Error::Invalid(_))
        ));
    }
}
