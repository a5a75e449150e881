//! Failed write-back of an image held in a file. A [`BlockFile`](super::BlockFile) fence is
//! `fdatasync` and a [`Pmem`](super::Pmem) fence can be `msync`: both ask the kernel to write
//! back dirty pages. When that fails, Linux may have dropped the pages it could not write
//! (they are marked clean) and reports the error once, to whichever call on the file checks
//! first, so a fence after a failed one, or one that ran beside it, promises nothing about the
//! stores before it; retrying it and trusting the answer is how data goes missing.
//! [`WriteBack`] remembers the first failure and fails every later fence and sync the same way
//! for as long as the image stays open, and a fence that succeeded beside a failing one fails
//! too: the mount can still be read, but nothing it does is called durable, and its unmount
//! cannot be clean. The next open runs failure recovery from what did reach the image.

use std::sync::OnceLock;

use parking_lot::RwLock;

use crate::{Error, Result};

/// The write-back state of one open image (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct WriteBack {
    /// The first failure, as it was reported.
    failed: OnceLock<String>,
    /// Held shared by every write-back while it runs; taken alone by one that succeeded, to
    /// wait until those beside it are done and have recorded any failure.
    running: RwLock<()>,
}

impl WriteBack {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

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
