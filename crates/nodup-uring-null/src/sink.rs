//! Where WRITE data goes with `--sink`: reference data paths that put a number on what a
//! storing daemon costs on top of the transport (issue 20).
//!
//! - `discard`: the null file system (the ceiling);
//! - `copy`: read the request into a buffer, then fingerprint (xxh3) and copy each 4 KiB block
//!   into memory already backed (a mapped /dev/shm file recycled every [`RECYCLED`] bytes):
//!   a dedup daemon's CPU work on new data, without the cost of new memory;
//! - `land`: readv(2) the request so its data lands straight in that mapping, then fingerprint
//!   it in place: one copy fewer than `copy` (what reading requests into the image would save;
//!   fuser's read loop cannot do it);
//! - `store`: fingerprint, then pwrite(2) the data at increasing offsets of a sparse /dev/shm
//!   file, so every byte goes into memory the kernel has to provide: the cheapest way to keep
//!   new data in /dev/shm (whole pages written through the page cache are not zeroed first,
//!   as pages faulted into a mapping are).

use memmap2::MmapMut;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// The data path under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SinkKind {
    /// Accept and discard.
    Discard,
    /// Buffer, then fingerprint and copy into backed memory.
    Copy,
    /// Read straight into backed memory, then fingerprint in place.
    Land,
    /// Fingerprint, then pwrite into new memory.
    Store,
}

/// Bytes of backed mapping each serving thread cycles through with `copy` and `land` (larger
/// than the last-level cache, so the copies reach memory).
pub const RECYCLED: usize = 64 << 20;

/// Bytes of the sparse file of each serving thread with `store` (a run writes less: nothing is
/// overwritten).
pub const STORE_LEN: u64 = 16 << 30;

/// One serving thread's sink.
pub struct Sink {
    kind: SinkKind,
    file: File,
    /// The backed mapping (`copy`, `land`).
    map: Option<MmapMut>,
    at: usize,
}

/// The fingerprints of `data`'s 4 KiB blocks (the last may be shorter) XORed together: what a
/// sink reports for the data it took, so a test can check each path saw every byte, in any
/// order and on any thread.
pub fn fold(data: &[u8]) -> u64 {
    data.chunks(4096)
        .fold(0, |h, b| h ^ xxhash_rust::xxh3::xxh3_64(b))
}

impl Sink {
    /// A sink for one serving thread: an unlinked file under /dev/shm; for `copy` and `land`
    /// mapped and every page touched once (memory the daemon has backed already). `None` for
    /// `discard`.
    pub fn new(kind: SinkKind) -> io::Result<Option<Sink>> {
        if kind == SinkKind::Discard {
            return Ok(None);
        }
        let file = tempfile_in_shm()?;
        let map = if kind == SinkKind::Store {
            file.set_len(STORE_LEN)?;
            None
        } else {
            file.set_len(RECYCLED as u64)?;
            // Allocated first: a full /dev/shm is then an error here, not a SIGBUS below.
            // SAFETY: fallocate on our own descriptor, mode 0, inside the file's length.
            let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, RECYCLED as libc::off_t) };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: the file is unlinked and ours alone; nothing else maps or truncates it.
            let mut map = unsafe { MmapMut::map_mut(&file)? };
            for page in map.chunks_mut(4096) {
                page[0] = 1;
            }
            Some(map)
        };
        Ok(Some(Sink {
            kind,
            file,
            map,
            at: 0,
        }))
    }

    /// The data path this sink runs.
    pub(crate) fn kind(&self) -> SinkKind {
        self.kind
    }

    /// The next `len` bytes of the mapping (wrapping to its start); empty without one.
    pub(crate) fn slot(&mut self, len: usize) -> &mut [u8] {
        let Some(map) = self.map.as_mut() else {
            return &mut [];
        };
        if self.at + len > map.len() {
            self.at = 0;
        }
        &mut map[self.at..self.at + len]
    }

    /// `land`: fingerprint the `len` bytes that arrived at the slot and move past them; their
    /// [`fold`].
    pub(crate) fn landed(&mut self, len: usize) -> u64 {
        let Some(map) = self.map.as_ref() else {
            return 0;
        };
        let h = fold(&map[self.at..self.at + len]);
        self.at += len.next_multiple_of(4096);
        h
    }

    /// `copy` and `store`: take one WRITE's data; its [`fold`].
    pub(crate) fn take(&mut self, data: &[u8]) -> io::Result<u64> {
        let mut h = 0;
        match self.kind {
            SinkKind::Copy => {
                let slot = self.slot(data.len());
                for (dst, src) in slot.chunks_mut(4096).zip(data.chunks(4096)) {
                    h ^= xxhash_rust::xxh3::xxh3_64(src);
                    dst[..src.len()].copy_from_slice(src);
                }
            }
            SinkKind::Store => {
                h = fold(data);
                if self.at as u64 + data.len() as u64 > STORE_LEN {
                    self.at = 0;
                }
                self.file.write_all_at(data, self.at as u64)?;
            }
            SinkKind::Discard | SinkKind::Land => return Ok(0),
        }
        self.at += data.len().next_multiple_of(4096);
        Ok(h)
    }
}

/// A new file under /dev/shm, unlinked at once (freed when the process ends).
fn tempfile_in_shm() -> io::Result<File> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let path = std::path::PathBuf::from(format!(
        "/dev/shm/nodup-uring-null-sink-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}
