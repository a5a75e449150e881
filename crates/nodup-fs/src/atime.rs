//! Access times: when a read or a directory listing updates `atime` (`relatime` by default,
//! `strictatime`, `noatime`, as the kernel's mount options mean them).
//!
//! FUSE leaves atime to the daemon entirely (the kernel marks its inodes `S_NOATIME`), and reads
//! served from the page cache never reach the daemon; so an open for reading counts as an access
//! too, which keeps `relatime`'s promise (the first read after a change is seen) at the price of
//! also stamping a file that is opened for reading and then not read.

use crate::error::Result;
use crate::fs::FileSystem;
use crate::inode::{Attr, Ts};
use crate::log::record::Record;

/// Seconds after which `relatime` refreshes an atime even if the file did not change.
const RELATIME_SECS: i64 = 24 * 3600;

nodup_core::named_enum! {
    /// How reads update access times (named as the mount options; the numbers are not stored).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub enum AtimeMode {
        /// Update when atime is not newer than mtime or ctime, or is a day old (Linux default).
        #[default]
        Relatime = 0 => "relatime",
        /// Update on every access (one log record each).
        Strictatime = 1 => "strictatime",
        /// Never update on access.
        Noatime = 2 => "noatime",
    }
}

impl AtimeMode {
    /// Whether an access at `now` must write a new atime into `a`.
    pub fn needs_update(self, a: &Attr, now: Ts) -> bool {
        match self {
            AtimeMode::Noatime => false,
            // Already stamped in this tick: nothing to write (as the kernel decides).
            _ if a.atime == now => false,
            AtimeMode::Strictatime => true,
            AtimeMode::Relatime => {
                a.atime <= a.mtime || a.atime <= a.ctime || now.sec - a.atime.sec >= RELATIME_SECS
            }
        }
    }
}

impl FileSystem {
    /// Record an access to `ino` under `mode`; returns whether atime changed (the caller then
    /// drops the kernel's cached attributes).
    pub fn accessed(&self, ino: u64, mode: AtimeMode) -> Result<bool> {
        // Most accesses change nothing: decide under the read lock first (noatime without
        // looking at all).
        if mode == AtimeMode::Noatime || !mode.needs_update(&self.getattr(ino)?, Ts::now()) {
            return Ok(false);
        }
        self.inode_op(ino, 128, |n| {
            let now = Ts::now();
            let a = &n.attr;
            if !mode.needs_update(a, now) {
                return Ok((None, false));
            }
            let rec = Record::SetAttr {
                ino,
                perm: a.perm,
                uid: a.uid,
                gid: a.gid,
                atime: now,
                mtime: a.mtime,
                ctime: a.ctime,
            };
            Ok((Some(rec), true))
        })
    }
}
