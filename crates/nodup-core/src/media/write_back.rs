//! Failed write-back of an image held in a file. A [`BlockFile`](super::BlockFile) fence is
//! `fdatasync` and a [`Pmem`](super::Pmem) fence can be `msync`: both ask the kernel to write
//! back dirty pages. When that fails, Linux may have dropped the pages it could not write
//! (they are marked clean) and reports the next call clean, so a fence after a failed one
//! promises nothing about the stores before it; retrying it and trusting the answer is how
//! data goes missing. [`WriteBack`] remembers the first failure and fails every later fence
//! and sync the same way for as long as the image stays open: the mount can still be read,
//! but nothing it does is called durable, and its unmount cannot be clean. The next open runs
//! failure recovery from what did reach the image.

use std::sync::OnceLock;

use crate::{Error, Result};

/// The write-back state of one open image (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct WriteBack {
    /// The first failure, as it was reported.
    failed: OnceLock<String>,
}

impl WriteBack {
    /// Run `sync` (a write-back of the image) unless an earlier one failed; a failure is
    /// remembered.
    pub(crate) fn run(&self, sync: impl FnOnce() -> Result<()>) -> Result<()> {
        if let Some(first) = self.failed.get() {
            return Err(Error::Io(std::io::Error::other(format!(
                "an earlier write-back of the image failed ({first}); what reached it is \
                 unknown until it is opened again"
            ))));
        }
        sync().inspect_err(|e| {
            let _ = self.failed.set(e.to_string());
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
