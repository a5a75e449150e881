//! Error type of the file system: engine failures, on-media format problems and POSIX errors.

use thiserror::Error;

/// Result alias used throughout nodup-fs.
pub type Result<T, E = FsError> = std::result::Result<T, E>;

/// Everything that can go wrong in the file system.
#[derive(Debug, Error)]
pub enum FsError {
    /// A failure reported by the dedup engine or the medium under it.
    #[error("{0}")]
    Engine(#[from] nodup_core::Error),
    /// A POSIX error to hand to the application (ENOENT, EEXIST, ...).
    #[error("{}", std::io::Error::from_raw_os_error(*.0))]
    Errno(i32),
    /// The image does not hold a nodup file system.
    #[error("not a nodup image: {0}")]
    NotNodup(String),
    /// The file system was written by a newer (or unknown) format version.
    #[error("unsupported file-system version {found} (this build supports {supported})")]
    Version { found: u32, supported: u32 },
    /// A file-system structure on the medium failed validation.
    #[error("corrupt file system: {0}")]
    Corrupt(String),
    /// The image is mounted or otherwise locked by another process.
    #[error("image is busy: {0}")]
    Busy(String),
    /// A feature that a later issue builds.
    #[error("not implemented yet: {0}")]
    Unimplemented(String),
    /// The clean shutdown at unmount failed (its error): the image needs failure recovery.
    #[error("not unmounted cleanly, the next mount runs failure recovery: {0}")]
    Unclean(String),
    /// An I/O error outside the medium (lock files, the image file itself).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl FsError {
    /// The errno a FUSE reply should carry for this error.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Errno(e) => *e,
            FsError::Engine(nodup_core::Error::NoSpace) => libc::ENOSPC,
            // The file system holding the image is full (see `Pmem`'s backing store).
            FsError::Engine(nodup_core::Error::Io(e)) if e.raw_os_error() == Some(libc::ENOSPC) => {
                libc::ENOSPC
            }
            FsError::Engine(nodup_core::Error::Invalid(_)) => libc::EINVAL,
            FsError::Engine(nodup_core::Error::NoMemory(_)) => libc::ENOMEM,
            FsError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            FsError::Unimplemented(_) => libc::ENOSYS,
            _ => libc::EIO,
        }
    }
}

/// Shorthand for returning a POSIX error.
pub fn errno<T>(e: i32) -> Result<T> {
    Err(FsError::Errno(e))
}
