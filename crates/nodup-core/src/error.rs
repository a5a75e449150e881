//! Error type of the engine: every failure that can come from the medium, the image or the caller.

use thiserror::Error;

/// Result alias used throughout nodup-core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine.
#[derive(Debug, Error)]
pub enum Error {
    /// An I/O error from the underlying file or device.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The image is not a nodup image (bad magic).
    #[error("not a nodup image: {0}")]
    NotNodup(String),
    /// The engine superblock has a newer on-media version than this build reads.
    #[error(
        "engine superblock version {found} is newer than this build supports (max {supported}); upgrade nodup"
    )]
    Version {
        /// Version found on the medium.
        found: u32,
        /// Newest version this build reads.
        supported: u32,
    },
    /// The image is valid but uses something this build does not have (an incompatible
    /// feature bit, a cipher); the message names it.
    #[error("{0}")]
    Unsupported(String),
    /// A structure on the medium failed validation (checksum, bounds, invariants).
    #[error("corrupt image: {0}")]
    Corrupt(String),
    /// No free block left on the medium.
    #[error("no space left on the medium")]
    NoSpace,
    /// Memory a structure reserves whole at open (a store's budget, a cache) could not be
    /// had; the message says what and how much.
    #[error("out of memory: {0}")]
    NoMemory(String),
    /// The caller passed something invalid (size, option, block number).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The image needs failure recovery before it can be used.
    #[error("image needs failure recovery")]
    NeedsRecovery,
}
