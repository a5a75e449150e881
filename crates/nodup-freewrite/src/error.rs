//! The one error type of the crate: I/O, corrupt store files, bad arguments, a store in use.

use std::path::Path;
use thiserror::Error;

/// Everything that can go wrong in a store, the planner's callers or the debubble tool.
#[derive(Debug, Error)]
pub enum Error {
    /// An operating-system I/O error, with what was being done.
    #[error("{what}: {source}")]
    Io {
        /// What the store was doing (path and action).
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file of the store that fails validation (bad magic, version, checksum, length).
    #[error("{file}: corrupt: {msg}")]
    Corrupt {
        /// The file (path as text).
        file: String,
        /// What is wrong, with the offset where it applies.
        msg: String,
    },
    /// An invalid argument (empty or oversized key, oversized value, cap out of range...).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Another process (or another handle in this one) has the store open.
    #[error("{0}: store is in use by another process")]
    Locked(String),
}

/// Result with the crate's error.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Wrap an `io::Error` with a description of the action that failed.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// A validation failure of `file`.
    pub fn corrupt(file: &Path, msg: impl Into<String>) -> Self {
        Error::Corrupt {
            file: file.display().to_string(),
            msg: msg.into(),
        }
    }
}

/// Attach `what` to an I/O result.
pub(crate) trait IoContext<T> {
    /// Map the error to [`Error::Io`] with a lazily built description.
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::io(what(), e))
    }
}
