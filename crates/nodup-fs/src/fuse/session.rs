//! Mounting and serving: the FUSE session over an [`Adapter`], its options, signal handling,
//! the maintenance thread, and the clean shutdown when it ends.

use super::kernel::{block_signals, session_config};
use super::space;
use super::Adapter;
use crate::atime::AtimeMode;
use crate::fs::FileSystem;
use crate::FsError;
use fuser::MountOption;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Options of one mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Let the kernel cache writes and send them in large batches (durability at fsync/close).
    pub writeback_cache: bool,
    /// Threads serving requests.
    pub threads: usize,
    /// Source name shown in /proc/mounts (the image path; `nodup umount` finds the image by it).
    pub fsname: String,
    /// Allow other users to access the mount (needed for permission tests as root).
    pub allow_other: bool,
    /// When reads and listings update access times.
    pub atime: AtimeMode,
    /// Request buffers on 2 MiB pages ([`super::request_buffer`]; a binary without
    /// [`super::RequestBufferAlloc`] installed keeps fuser's own buffers either way).
    pub huge_buffers: bool,
    /// Answer large direct writes before they are stored (durable at fsync, as on ext4; see
    /// `answered`).
    pub async_writes: bool,
    /// Which handles bypass the kernel's page cache: one copy fewer per write (ignored with
    /// the writeback cache; see `kernel::is_direct`).
    pub direct_writes: super::kernel::DirectWrites,
}

/// Mount `fs` at `mountpoint` and serve it until unmounted (or SIGTERM/SIGINT/SIGHUP, which
/// unmount). `ready` runs once the mount is usable. On return the file system has been shut
/// down cleanly (checkpoint, engine shutdown, clean flag).
pub fn serve(
    fs: Arc<FileSystem>,
    mountpoint: &Path,
    opts: &MountOptions,
    ready: impl FnOnce(),
) -> crate::Result<()> {
    let set = block_signals();
    super::request_buffer::set_huge_pages(opts.huge_buffers);
    // The type shows as `fuse.nodup` in /proc/mounts (`nodup list`, `mount -t fuse.nodup`).
    let mut config = session_config(&opts.fsname, "nodup", opts.allow_other, opts.threads);
    if opts.atime == AtimeMode::Noatime {
        // Shown in /proc/mounts; the updates themselves are ours (FUSE inodes are S_NOATIME).
        config.mount_options.push(MountOption::NoAtime);
    }
    let adapter = Adapter::new(fs.clone(), opts);
    let notifier = adapter.notifier.clone();
    let space = adapter.space.clone();
    let mut session = fuser::Session::new(adapter, mountpoint, &config)?;
    if opts.writeback_cache {
        let capacity = fs.statfs().blocks * nodup_core::BLOCK_SIZE as u64;
        // Keeping room for a window is only sensible while the room is a small part of the
        // image; otherwise (a kernel limit we may not lower, unprivileged) the guard stays off
        // and a full file system shows at fsync/close, as it would without it.
        match space::set_dirty_window(mountpoint, capacity) {
            Ok(w) if w <= capacity / space::MAX_WINDOW_SHARE => {
                space.enable(w);
                crate::logging::info(&format!(
                    "writeback cache: up to {} MiB dirty in the kernel; buffered writes get ENOSPC below {} MiB free",
                    w >> 20,
                    (space::REFUSE_WINDOWS * space.window()) >> 20
                ));
            }
            Ok(w) => crate::logging::warn(&format!(
                "writeback cache: the kernel may hold {} MiB dirty for this {} MiB image and the limit cannot be lowered (not root?): a full file system is reported at fsync/close, not at write",
                w >> 20,
                capacity >> 20
            )),
            Err(e) => crate::logging::warn(&format!(
                "writeback cache: dirty limit unknown ({e}): a full file system is reported at fsync/close, not at write"
            )),
        }
    }
    let _ = notifier.set(session.notifier());
    let mut unmounter = session.unmount_callable();
    std::thread::Builder::new()
        .name("nodup-signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: waits on the set blocked above; `sig` is a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                crate::logging::info(&format!("signal {sig}: unmounting"));
                if let Err(e) = unmounter.unmount() {
                    crate::logging::error(&format!("unmount on signal {sig} failed: {e}"));
                }
            }
        })?;
    let stop = Arc::new(AtomicBool::new(false));
    let maint = {
        let fs = fs.clone();
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("nodup-maint".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    fs.wait_for_tick(Duration::from_millis(500));
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if let Err(e) = fs.tick() {
                        crate::logging::error(&format!("background checkpoint/sync failed: {e}"));
                    }
                }
            })?
    };
    fs.start_smart_worker()?;
    ready();
    let r = session.run();
    fs.stop_smart_worker();
    stop.store(true, Ordering::Relaxed);
    fs.wake_maintenance();
    let _ = maint.join();
    // destroy() normally ran inside run(); make sure the clean shutdown happened (a second
    // call returns the first one's failure).
    fs.shutdown().map_err(|e| match e {
        FsError::Unclean(_) => e,
        e => FsError::Unclean(e.to_string()),
    })?;
    r?;
    Ok(())
}
