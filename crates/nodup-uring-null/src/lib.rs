//! A null FUSE file system (flat root, writes discarded, reads zeros) with two transports
//! running the same request handler: the classic /dev/fuse read/write loop and
//! FUSE-over-io_uring (Linux 6.14+, `fuse.enable_uring`). It exists to measure what the ring
//! transport does to the FUSE ceiling before nodup, whose FUSE layer (fuser 0.18) has no ring,
//! would adopt it (issue 20).

pub mod abi;
pub mod classic;
pub mod init;
pub mod mount;
pub mod nullfs;
pub mod ring;

use std::sync::atomic::AtomicU64;

/// Requests served, per transport (printed at exit; the test checks the ring carried them).
#[derive(Debug, Default)]
pub struct Served {
    /// Over io_uring entries.
    pub ring: AtomicU64,
    /// Over /dev/fuse read/write.
    pub classic: AtomicU64,
}
