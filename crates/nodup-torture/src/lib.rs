//! nodup-torture: the reliability machinery of nodup (issue 5).
//!
//! - [`model`] / [`workload`]: a reference model of the namespace and contents, and seeded
//!   operation sequences that are valid against it.
//! - [`verify`]: the checks a recovered file system must pass (fsck, engine audit, refcounts,
//!   allocator, visible state against the model), plus mutants that prove the checks bite.
//! - [`crash`]: systematic crash states on `CrashSim` at every fence.
//! - [`faults`]: injected I/O errors and short writes through `FaultMedium`.
//! - [`fuzzing`]: the bodies of the fuzz targets and a seeded mutation driver for stable Rust;
//!   [`forged_log`] and [`forged_checkpoint`]: the bodies of the ones that forge log records
//!   and checkpoints with valid checksums.
//! - [`stress`]: concurrent threads on one file system with a model check, and a full device.
//! - [`kill9`]: kill -9 of the real mount daemon under load, remount, fsck, fsynced files.
//! - [`summary`]: the contract's summary lines.

pub mod crash;
pub mod faults;
pub mod forged_checkpoint;
pub mod forged_log;
pub mod fuzzing;
pub mod kill9;
pub mod model;
pub mod stress;
pub mod summary;
pub mod verify;
pub mod workload;
