//! Failed write-back of an image held in a file. A [`BlockFile`](super::BlockFile) fence is
//! `fdatasync` and a [`Pmem`](super::Pmem) fence can be `msync`: both ask the kernel to write
//! back dirty pages. When that fails, Linux may have dropped the pages it could not write
//! (they are marked clean) and reports the error once per open file description (to each one
//! open when it happened, at its next sync; to an open made later only while nobody has heard
//! of it), so a fence after a failed one, or one that ran beside it, promises nothing about
//! the stores before it; retrying it and trusting the answer is how data goes missing.
//! [`WriteBack`] remembers the first failure and fails every later fence and sync the same way
//! for as long as the image stays open, and a fence that succeeded beside a failing one fails
//! too: the mount can still be read, but nothing it does is called durable, and its unmount
//! cannot be clean. The next open runs failure recovery from what did reach the image.
//!
//! "What did reach the image" needs one more step: the pages the kernel could not write back
//! stay in its page cache, clean, holding bytes the disk never got, so an open on the same boot
//! would read them (and a failure recovery would build on them; after the next reboot they are
//! gone). So the file's cached pages are dropped ([`forget_cached_pages`]) by:
//! - the close of a block file that learnt of a failure (its `Drop`; not at the failure
//!   itself, so the failed mount goes on reading what it wrote rather than a mix of that and
//!   the disk's older blocks, as far as the kernel keeps those clean pages: memory pressure
//!   or the file system may still evict some). A close that does not run (the daemon killed,
//!   or its serving threads outliving `main`) leaves the image unclean, which the next
//!   point covers;
//! - an open that the kernel tells of a failure nobody heard of (a run that died before its
//!   next fence), and every pmem open (a process's mapped pages cannot be dropped, so its
//!   close could not);
//! - an open, through its caller, of an image whose last close was not clean: a run killed
//!   after a failed fence and before its close, whose image is unclean, since a clean flag
//!   is stored only after fences that succeeded. (The one exception is the fence of the
//!   engine's clean flag itself: its cached block says clean, the disk's not, and every other
//!   block is on the disk; the next mount rewrites that block.)
//!
//! An open told of nothing may therefore keep the cache ([`WriteBack::open`] with
//! `keep_cache`) when the image says it was closed cleanly: a clean close ends with a fence
//! that succeeded, so its cached pages are what the disk holds. The drops assume the medium
//! is the file's only user (the image lock sees to it for the command line): the cache is
//! the inode's, so a second handle in the same process would lose it too. Another program
//! that fsyncs the image file, or a copy of it changed outside this machine's page cache (a
//! network file system), is beyond what this can see.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::OnceLock;

use parking_lot::RwLock;

use crate::{Error, Result};

/// The write-back state of one open image (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct WriteBack {
    /// The first failure, as it was reported.
    failed: OnceLock<String>,
    /// A failure of a write-back before this open, reported to it ([`WriteBack::open`]).
    before_open: Option<String>,
    /// Held shared by every write-back while it runs; taken alone by one that succeeded, to
    /// wait until those beside it are done and have recorded any failure.
    running: RwLock<()>,
    /// The image file, owned by the medium that owns this state (none in unit tests).
    fd: Option<RawFd>,
}

impl WriteBack {
    /// The state of an image file being opened: its earlier write-backs are finished (a
    /// failure nobody heard of is reported here), and its cached pages dropped when there was
    /// one, or unless `keep_cache` (the caller then decides: see the module doc).
    ///
    /// Call it before anything reads or maps the file.
    pub(crate) fn open(file: &File, keep_cache: bool) -> WriteBack {
        let before_open = earlier_failure(file);
        if before_open.is_some() || !keep_cache {
            forget_cached_pages(file.as_raw_fd());
        }
        WriteBack {
            before_open,
            fd: Some(file.as_raw_fd()),
            ..WriteBack::default()
        }
    }

    /// Drop the file's cached pages (see [`forget_cached_pages`]); the caller makes sure no
    /// write-back of this open runs.
    pub(crate) fn forget_cached_pages(&self) {
        if let Some(fd) = self.fd {
            forget_cached_pages(fd);
        }
    }

    /// A write-back of the file that failed before this open, unreported until then.
    pub(crate) fn failed_before_open(&self) -> Option<&str> {
        self.before_open.as_deref()
    }

    /// Run `sync` (a write-back of the image) unless an earlier one failed; a failure is
    /// remembered, and a success counts only when no write-back running beside it failed.
    pub(crate) fn run(&self, sync: impl FnOnce() -> Result<()>) -> Result<()> {
        self.check()?;
        {
            let _running = self.running.read();
            sync().inspect_err(|e| {
                let _ = self.failed.set(e.to_string());
            })?;
        }
        // The kernel may have told a write-back beside this one of a failure that covers
        // this one's pages too (or, for msync, that one may have taken this one's ranges).
        drop(self.running.write());
        self.check()
    }

    /// The error of every write-back after a failed one.
    fn check(&self) -> Result<()> {
        match self.failed.get() {
            Some(first) => Err(Error::Io(std::io::Error::other(format!(
                "an earlier write-back of the image failed ({first}); what reached it is \
                 unknown until it is opened again"
            )))),
            None => Ok(()),
        }
    }

    /// The first failure, if a write-back of this open image failed.
    pub(crate) fn failure(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }
}

/// Write back what an image file being opened still has dirty, and return a failure of that
/// write-back, or of a previous run's that nobody was told of (it died before its next
/// fence), as text: the kernel reports it once, to this call, and it says that run's last
/// stores may not all be on the disk.
fn earlier_failure(file: &File) -> Option<String> {
    // Only what a failed write-back gives: a file system without fsync (EINVAL) or one that is
    // read-only now (EROFS) lost nothing.
    file.sync_data()
        .err()
        .filter(|e| {
            matches!(
                e.raw_os_error(),
                Some(libc::EIO | libc::ENOSPC | libc::EDQUOT)
            )
        })
        .map(|e| e.to_string())
}

/// Drop the cached pages of the image file `fd` (module doc), so that what is read next comes
/// from the disk. The advice drops clean pages that nobody maps (tmpfs and DAX ignore it:
/// their pages are the only copy). Best effort: a file it cannot apply to has no page cache
/// to mislead.
fn forget_cached_pages(fd: RawFd) {
    // SAFETY: posix_fadvise on a descriptor the caller's medium owns; it reads no memory of ours.
    let _ = unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::small_disk::FailingExt4;
    use crate::media::{BlockFile, BlockFileOptions, Medium, Pmem};
    use std::sync::mpsc;

    /// An open on the same boot after a failed write-back reads what reached the disk, on both
    /// media over files: without dropping the cached pages it read the bytes that were lost,
    /// which a failure recovery would have built on. A block file opened with `keep_cache`
    /// (which the kernel tells nothing: the failed fence took the report) reads it too: the
    /// close of the medium whose fence failed dropped the cache.
    #[test]
    fn an_open_after_a_failed_write_back_reads_what_reached_the_disk() {
        let Some(ext4) = FailingExt4::mount(48) else {
            return;
        };
        let (kept, lost) = (vec![0x5au8; 64 << 10], vec![0xa5u8; 64 << 10]);
        for (pmem, keep_cache) in [(false, false), (false, true), (true, false)] {
            let path = ext4
                .dir
                .path()
                .join(if pmem { "pmem" } else { "blockfile" });
            let open = |create: bool| -> Box<dyn Medium> {
                let opts = BlockFileOptions {
                    keep_cache,
                    ..BlockFileOptions::default()
                };
                match (pmem, create) {
                    (true, true) => Box::new(Pmem::create(&path, 16 << 20).unwrap()),
                    (true, false) => Box::new(Pmem::open(&path).unwrap()),
                    (false, true) => Box::new(BlockFile::create(&path, 16 << 20, opts).unwrap()),
                    (false, false) => Box::new(BlockFile::open(&path, opts).unwrap()),
                }
            };
            // A whole sync: a mapped image's fence is a store fence unless it needs msync.
            let store = |m: &dyn Medium, off: u64, data: &[u8]| {
                m.write(off, data).unwrap();
                m.flush(off, data.len() as u64);
                m.sync_all()
            };
            let m = open(true);
            store(&*m, 0, &kept).unwrap();
            ext4.disk.fill();
            // Into a hole of the image: ext4 takes new blocks, whose write-back fails.
            let e = store(&*m, 8 << 20, &lost).unwrap_err();
            assert!(m.write_back_failed().is_some(), "pmem {pmem}: {e}");
            drop(m);
            ext4.disk.unfill();
            let m = open(false);
            let mut got = vec![0u8; 64 << 10];
            m.read(0, &mut got).unwrap();
            assert!(got == kept, "pmem {pmem}: the durable write is gone");
            m.read(8 << 20, &mut got).unwrap();
            assert!(
                got.iter().all(|&b| b == 0),
                "pmem {pmem} keep_cache {keep_cache}: the reopened image reads bytes that \
                 never reached the disk"
            );
            assert_eq!(m.write_back_failed(), None);
        }
    }

    /// A run that died before its next fence never heard that the kernel could not write its
    /// last stores back; the kernel tells the next open of the file, once. The open takes that
    /// as news of the past (the medium opens, reads what reached the disk, and says so), not
    /// as a failure of its own first fence.
    #[test]
    fn an_open_hears_of_a_write_back_that_failed_after_the_last_run() {
        let Some(ext4) = FailingExt4::mount(48) else {
            return;
        };
        let lost = vec![0xa5u8; 64 << 10];
        for pmem in [false, true] {
            let path = ext4
                .dir
                .path()
                .join(if pmem { "pmem" } else { "blockfile" });
            let file = File::create(&path).unwrap();
            file.set_len(16 << 20).unwrap();
            file.sync_all().unwrap();
            ext4.disk.fill();
            // Stored, never synced; the kernel's write-back of it fails.
            std::os::unix::fs::FileExt::write_all_at(&file, &lost, 8 << 20).unwrap();
            drop(file);
            // SAFETY: sync(2) takes no arguments; it waits for the write-back, whatever it gives.
            unsafe { libc::sync() };
            ext4.disk.unfill();
            let earlier = |first: bool| {
                let m: Box<dyn Medium> = if pmem {
                    let m = Pmem::open(&path).unwrap();
                    assert_eq!(m.write_back_failed_before_open().is_some(), first, "pmem");
                    Box::new(m)
                } else {
                    // Kept or not, the cache goes: the open is the one told of the failure.
                    let opts = BlockFileOptions {
                        keep_cache: true,
                        ..BlockFileOptions::default()
                    };
                    let m = BlockFile::open(&path, opts).unwrap();
                    assert_eq!(
                        m.write_back_failed_before_open().is_some(),
                        first,
                        "blockfile"
                    );
                    Box::new(m)
                };
                let mut got = vec![1u8; 64 << 10];
                m.read(8 << 20, &mut got).unwrap();
                assert!(got.iter().all(|&b| b == 0), "pmem {pmem}: reads lost bytes");
                m.write(0, &lost).unwrap();
                m.flush(0, lost.len() as u64);
                m.sync_all().unwrap();
            };
            earlier(true);
            earlier(false);
        }
    }

    /// After one failure every later write-back fails without being tried, even one that
    /// would succeed; the first error is the one its caller gets, and the later ones name it.
    #[test]
    fn a_failed_write_back_fails_every_later_one() {
        let wb = WriteBack::default();
        let mut tried = 0;
        assert!(wb
            .run(|| {
                tried += 1;
                Ok(())
            })
            .is_ok());
        let e = wb
            .run(|| {
                tried += 1;
                Err(Error::Io(std::io::Error::from_raw_os_error(libc::ENOSPC)))
            })
            .unwrap_err();
        assert!(matches!(&e, Error::Io(io) if io.raw_os_error() == Some(libc::ENOSPC)));
        assert_eq!(wb.failure().map(|f| f.contains("space")), Some(true));
        for _ in 0..3 {
            let e = wb
                .run(|| {
                    tried += 1;
                    Ok(())
                })
                .unwrap_err();
            assert!(e.to_string().contains("an earlier write-back"), "{e}");
            assert!(e.to_string().contains("space"), "{e}");
        }
        assert_eq!(tried, 2);
    }

    /// Two write-backs at once, as two threads' `fdatasync` on one file: the kernel reports a
    /// failure to one of them only. The one told "fine" while the other was still running
    /// must fail all the same.
    #[test]
    fn a_write_back_beside_a_failing_one_fails() {
        let wb = WriteBack::default();
        let (started, wait_started) = mpsc::channel();
        let (finish, wait_finish) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let wb = &wb;
            let failing = s.spawn(move || {
                wb.run(|| {
                    started.send(()).unwrap();
                    wait_finish.recv().unwrap();
                    Err(Error::Io(std::io::Error::from_raw_os_error(libc::EIO)))
                })
            });
            wait_started.recv().unwrap();
            let beside = s.spawn(move || wb.run(|| Ok(())));
            // The one beside has its "fine" by now, or soon; the failing one answers later.
            std::thread::sleep(std::time::Duration::from_millis(50));
            finish.send(()).unwrap();
            assert!(failing.join().unwrap().is_err());
            let e = beside.join().unwrap().unwrap_err();
            assert!(e.to_string().contains("an earlier write-back"), "{e}");
        });
    }
}
