//! ENOSPC at `write(2)` under the writeback cache.
//!
//! With the writeback cache the kernel copies written data into its page cache and returns;
//! the data reaches us later, and a failure then is only reported at fsync or close, so a
//! `dd` into a full file system would never stop. The kernel holds at most its per-device
//! dirty limit for this mount (FUSE devices are strictly limited, `/sys/class/bdi/*/max_bytes`);
//! we set that window and keep room for it:
//!
//! - while free space is above [`TIGHT_WINDOWS`] windows nothing changes;
//! - below, the mount is *tight*: files get attributes that expire at once, so every buffered
//!   `write(2)` asks for them first (a GETATTR carrying the writer's handle);
//! - below [`REFUSE_WINDOWS`] windows that GETATTR fails with ENOSPC, so the write that would
//!   not fit fails, while what the kernel already accepted (at most one window, plus overshoot)
//!   still fits when it is written back.
//!
//! Read-only handles never get ENOSPC (the same GETATTR precedes a read past the cached end of
//! file); a handle opened for writing can see it on such a read or an `lseek(SEEK_END)` too.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

/// Free space, in windows, below which a mount is tight.
pub const TIGHT_WINDOWS: u64 = 4;
/// Free space, in windows, below which buffered writes are refused.
pub const REFUSE_WINDOWS: u64 = 2;
/// The guard runs only when a window is at most this fraction of the image (1/16), so the
/// room kept for the kernel stays a small part of it.
pub const MAX_WINDOW_SHARE: u64 = 16;
/// Smallest window we set (smaller ones throttle writers for nothing).
const MIN_WINDOW: u64 = 1 << 20;
/// The window is at most this fraction of the image (1/64), so the room kept stays small.
const WINDOW_SHARE: u64 = 64;
/// Handle number of opens that may write through the page cache (`0` is read-only, `2` a
/// writer that bypasses it: `direct.rs`); the only writers under the writeback cache.
pub const WRITER_FH: u64 = 1;

/// The dirty window of one mount and whether it is tight.
#[derive(Debug, Default)]
pub struct SpaceGuard {
    /// Bytes the kernel may hold dirty for this mount; 0 = the guard is off (no writeback cache).
    window: AtomicU64,
    tight: AtomicBool,
    /// Inodes open for writing, with their handle counts.
    writers: Mutex<HashMap<u64, u32>>,
}

impl SpaceGuard {
    /// Turn the guard on with a dirty window of `window` bytes.
    pub fn enable(&self, window: u64) {
        self.window.store(window.max(MIN_WINDOW), Ordering::Relaxed);
    }

    /// The dirty window in bytes (0 when off).
    pub fn window(&self) -> u64 {
        self.window.load(Ordering::Relaxed)
    }

    /// Whether attributes must expire at once.
    pub fn is_tight(&self) -> bool {
        self.tight.load(Ordering::Relaxed)
    }

    /// Note the free space; returns the inodes open for writing when the mount just became
    /// tight (their cached attributes must be dropped so their next write asks us).
    pub fn observe(&self, free: u64) -> Vec<u64> {
        let w = self.window();
        if w == 0 {
            return Vec::new();
        }
        let tight = free < TIGHT_WINDOWS * w;
        if self.tight.swap(tight, Ordering::Relaxed) == tight || !tight {
            return Vec::new();
        }
        self.writers.lock().keys().copied().collect()
    }

    /// Whether a buffered write through handle `fh` must fail with ENOSPC now.
    pub fn refuse(&self, fh: u64, free: u64) -> bool {
        let w = self.window();
        w != 0 && fh == WRITER_FH && self.is_tight() && free < REFUSE_WINDOWS * w
    }

    /// A handle on `ino` was opened for writing.
    pub fn opened(&self, ino: u64) {
        *self.writers.lock().entry(ino).or_insert(0) += 1;
    }

    /// A handle on `ino` opened for writing was closed.
    pub fn closed(&self, ino: u64) {
        let mut w = self.writers.lock();
        if let Some(c) = w.get_mut(&ino) {
            *c -= 1;
            if *c == 0 {
                w.remove(&ino);
            }
        }
    }
}

/// Set the dirty window of the mount at `mountpoint` for an image of `capacity` bytes: the
/// kernel's per-device limit, lowered to 1/64 of the image when that is smaller. Returns the
/// window in force, or an error line when the device's limit cannot be read.
pub fn set_dirty_window(mountpoint: &Path, capacity: u64) -> Result<u64, String> {
    let dev = crate::mountinfo::mount_device(mountpoint).ok_or_else(|| {
        format!(
            "{}: not found in /proc/self/mountinfo",
            mountpoint.display()
        )
    })?;
    let knob = format!("/sys/class/bdi/{dev}/max_bytes");
    let cur: u64 = std::fs::read_to_string(&knob)
        .map_err(|e| format!("{knob}: {e}"))?
        .trim()
        .parse()
        .map_err(|_| format!("{knob}: not a number"))?;
    let want = (capacity / WINDOW_SHARE).max(MIN_WINDOW);
    if cur != 0 && want >= cur {
        return Ok(cur);
    }
    match std::fs::write(&knob, want.to_string()) {
        Ok(()) => Ok(want),
        // Unprivileged: the kernel's limit stays; a zero limit means "no cap", use ours anyway.
        Err(_) if cur != 0 => Ok(cur),
        Err(e) => Err(format!("{knob}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tight_and_refuse_follow_the_window() {
        let g = SpaceGuard::default();
        assert!(g.observe(0).is_empty(), "off without a window");
        assert!(!g.refuse(WRITER_FH, 0));
        g.enable(8 << 20);
        g.opened(7);
        assert!(g.observe(64 << 20).is_empty());
        assert!(!g.is_tight());
        assert_eq!(
            g.observe(31 << 20),
            vec![7],
            "entering tight lists the writers"
        );
        assert!(g.observe(30 << 20).is_empty(), "only once");
        assert!(!g.refuse(WRITER_FH, 17 << 20));
        assert!(g.refuse(WRITER_FH, 15 << 20));
        assert!(
            !g.refuse(0, 15 << 20),
            "read-only handles are never refused"
        );
        g.observe(40 << 20);
        assert!(!g.is_tight() && !g.refuse(WRITER_FH, 15 << 20));
        g.closed(7);
        assert!(g.observe(1).is_empty());
    }
}
