//! nodup-fs: the nodup file system over the inline-dedup engine, and its FUSE adapter.
//!
//! Start from `examples/embedded_fs.rs` (`cargo run -p nodup-fs --example embedded_fs`): the
//! file system driven through its API without FUSE — [`FileSystem::format`], `mknod`, `write`,
//! `copy_range`, `lookup`, `read`, the stats, [`fsck::check`], `shutdown` and
//! [`FileSystem::open`]. [`fuse::serve`] mounts the same type.
//!
//! # Design
//!
//! - **One image.** The engine formats the medium and owns every block except its client area;
//!   the file system keeps its superblock there, as two alternating copies (sequence number +
//!   crc32c, see [`superblock`]), so switching to a new checkpoint is a single atomic step.
//! - **Metadata in DRAM, persisted as log + incremental checkpoints** (instead of NOVA's
//!   per-inode logs): inodes, directories and per-file block maps live in DRAM ([`state`],
//!   [`inode`], [`dir`], [`blockmap`]). Every operation appends one checksummed,
//!   sequence-numbered record to an operation log ([`log`]) kept in a chain of blocks from
//!   `Engine::alloc_meta` ([`chain`]). A checkpoint ([`checkpoint`], format in [`persist`])
//!   writes only the pieces of metadata that changed since the previous one, as a new segment,
//!   plus a manifest of the segments still needed, then switches the superblock to the manifest
//!   and to a cut in the log, and frees what is no longer needed. Its cost follows what
//!   changed, not the size of the file system. Multi-inode operations (rename with replace,
//!   link, unlink) are one record, so they are atomic without a separate journal.
//! - **Writes** ([`fs::FileSystem::write`]) split a request into 4 KiB blocks (edges are
//!   read-modify-write), hand all of them to the engine in one call, append one record
//!   {inode, first block, new blocks, size, mtime}, make it durable (Pmem), and only then
//!   release the replaced blocks — a crash never loses both the old and the new version. On a
//!   BlockFile image the record becomes durable at the next fsync/sync, so releases wait in a
//!   pending list until then (a freed block is never reused while a durable map still names it).
//! - **Recovery** ([`open`]): load the checkpoint, replay the log from the cut up to the
//!   first invalid record, then — after a crash — `Engine::recover` with every block reference
//!   of every file and every metadata block of the chains (files are the source of truth,
//!   Light-Dedup §4.5), followed by a fresh checkpoint. After a clean unmount the engine's
//!   normal recovery is all there is. The time taken is reported in the stats.
//! - **Durability**: Pmem images are durable when a call returns; BlockFile images after fsync.
//! - **Stats from a mount**: the virtual xattr [`ctl::STATS_XATTR`] on the root directory.

pub mod acl;
pub mod admit;
pub mod atime;
pub mod attrs;
pub mod blockmap;
pub mod chain;
pub mod checkpoint;
pub mod codec;
pub mod copy;
pub mod ctl;
pub mod data;
pub mod dir;
pub mod error;
pub mod fs;
pub mod fsck;
pub mod fuse;
pub mod image;
pub mod inode;
mod live_recovery;
pub mod log;
pub mod logging;
pub mod mountinfo;
pub mod namespace;
pub mod open;
pub mod persist;
pub mod query;
pub mod remap;
pub mod report;
pub mod smart;
pub mod snapshot_v1;
pub mod state;
pub mod superblock;
pub mod usage;

pub use error::{FsError, Result};
pub use fs::{Caller, FileSystem, FsOptions};
pub use superblock::MediumKind;

#[cfg(test)]
pub(crate) mod testing {
    //! What the crate's unit tests share.
    use crate::inode::{Kind, ROOT_INO};
    use crate::{Caller, FileSystem, FsOptions, MediumKind};
    use nodup_core::media::{Medium, MemMedium};
    use nodup_core::FormatOptions;
    use std::sync::Arc;

    /// A new 16 MiB pmem file system in memory.
    pub fn fresh() -> FileSystem {
        fresh_on(Arc::new(MemMedium::new(16 << 20)))
    }

    /// A new pmem file system formatted on `medium` (whatever it held before).
    pub fn fresh_on(medium: Arc<dyn Medium>) -> FileSystem {
        FileSystem::format(
            medium,
            MediumKind::Pmem,
            &FormatOptions::default(),
            &FsOptions::default(),
            Caller::default(),
        )
        .unwrap()
    }

    /// Create an empty regular file `name` in the root directory; its inode.
    pub fn create(fs: &FileSystem, name: &[u8]) -> u64 {
        fs.mknod(ROOT_INO, name, Kind::File, 0o644, 0, b"", Caller::default())
            .unwrap()
            .0
    }
}
