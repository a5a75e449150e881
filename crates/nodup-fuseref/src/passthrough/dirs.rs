//! Open directories of the passthrough file system: a `DIR` stream per handle, positioned by
//! the source's own `d_off` cookies so a listing resumes where the kernel's last one stopped.

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::ffi::{CStr, OsString};
use std::io;
use std::os::fd::{IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One directory entry as the source lists it.
pub struct DirEntry {
    /// The source's inode number.
    pub ino: u64,
    /// The cookie after this entry (where the next listing resumes).
    pub next: i64,
    /// `d_type` (DT_*).
    pub kind: u8,
    pub name: OsString,
}

/// A directory stream.
pub struct Stream {
    dir: NonNull<libc::DIR>,
    /// The cookie the stream is at.
    pos: i64,
}

// SAFETY: the stream is only used under its handle's mutex, one thread at a time.
unsafe impl Send for Stream {}

impl Stream {
    fn open(fd: OwnedFd) -> io::Result<Stream> {
        let raw = fd.into_raw_fd();
        // SAFETY: `raw` is an open directory fd whose ownership passes to the stream.
        match NonNull::new(unsafe { libc::fdopendir(raw) }) {
            Some(dir) => Ok(Stream { dir, pos: 0 }),
            None => {
                let e = io::Error::last_os_error();
                // SAFETY: fdopendir failed, so `raw` is still ours to close.
                unsafe { libc::close(raw) };
                Err(e)
            }
        }
    }

    /// The fd of the stream, for `*at` calls relative to the directory.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the stream is open.
        unsafe { libc::dirfd(self.dir.as_ptr()) }
    }

    /// The cookie the stream is at.
    pub fn pos(&self) -> i64 {
        self.pos
    }

    /// Position the stream at cookie `offset` (0: the start).
    pub fn seek(&mut self, offset: i64) {
        if offset == self.pos {
            return;
        }
        // SAFETY: the stream is open; cookies come from its own `d_off` values.
        unsafe {
            if offset == 0 {
                libc::rewinddir(self.dir.as_ptr());
            } else {
                libc::seekdir(self.dir.as_ptr(), offset as libc::c_long);
            }
        }
        self.pos = offset;
    }

    /// The next entry, or None at the end.
    pub fn next_entry(&mut self) -> io::Result<Option<DirEntry>> {
        // SAFETY: errno is thread-local; readdir64 returns null with errno set on error.
        unsafe {
            *libc::__errno_location() = 0;
            let d = libc::readdir64(self.dir.as_ptr());
            if d.is_null() {
                let errno = *libc::__errno_location();
                return if errno == 0 {
                    Ok(None)
                } else {
                    Err(io::Error::from_raw_os_error(errno))
                };
            }
            let d = &*d;
            let name = CStr::from_ptr(d.d_name.as_ptr()).to_bytes().to_vec();
            self.pos = d.d_off;
            Ok(Some(DirEntry {
                ino: d.d_ino,
                next: d.d_off,
                kind: d.d_type,
                name: OsString::from_vec(name),
            }))
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the stream is open and closed only here.
        unsafe { libc::closedir(self.dir.as_ptr()) };
    }
}

/// The open directory handles.
#[derive(Default)]
pub struct Dirs {
    open: Mutex<FxHashMap<u64, Arc<Mutex<Stream>>>>,
    next: AtomicU64,
}

impl Dirs {
    /// A handle on the directory opened as `fd`.
    pub fn open(&self, fd: OwnedFd) -> io::Result<u64> {
        let s = Stream::open(fd)?;
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.open.lock().insert(fh, Arc::new(Mutex::new(s)));
        Ok(fh)
    }

    /// The stream of handle `fh`.
    pub fn get(&self, fh: u64) -> io::Result<Arc<Mutex<Stream>>> {
        self.open
            .lock()
            .get(&fh)
            .cloned()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    /// Close handle `fh`.
    pub fn close(&self, fh: u64) {
        self.open.lock().remove(&fh);
    }
}

/// The kernel's file type of a `d_type`.
pub fn file_type(d_type: u8) -> fuser::FileType {
    use fuser::FileType as T;
    match d_type {
        libc::DT_DIR => T::Directory,
        libc::DT_LNK => T::Symlink,
        libc::DT_FIFO => T::NamedPipe,
        libc::DT_CHR => T::CharDevice,
        libc::DT_BLK => T::BlockDevice,
        libc::DT_SOCK => T::Socket,
        _ => T::RegularFile,
    }
}
