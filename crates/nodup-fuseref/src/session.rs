//! The FUSE session both reference file systems run in: nodup's mount options, thread count,
//! cloned device fds and negotiated kernel settings, so that the only difference from a nodup
//! mount is the file system behind the requests.

use fuser::Filesystem;
use nodup_fs::fuse::kernel;
use std::path::Path;

/// How long the kernel may cache attributes and entries, and the largest write request
/// (nodup's values).
pub use nodup_fs::fuse::{MAX_WRITE, TTL};

/// Options of one mount.
#[derive(Debug, Clone)]
pub struct Options {
    /// Ask for the kernel's writeback cache (nodup's `--writeback-cache`).
    pub writeback_cache: bool,
    /// Which handles bypass the page cache (nodup's `--direct-writes`; off with the
    /// writeback cache).
    pub direct_writes: kernel::DirectWrites,
    /// Threads serving requests, each on its own cloned /dev/fuse fd.
    pub threads: usize,
    /// Source name shown in /proc/mounts.
    pub fsname: String,
}

impl Options {
    /// The caching these options ask for (nodup's rules, [`kernel::Caching`]).
    pub fn caching(&self) -> kernel::Caching {
        kernel::Caching::new(self.writeback_cache, self.direct_writes)
    }
}

/// Mount `fs` at `mountpoint` (type `fuse.SUBTYPE`) and serve it in the foreground until it is
/// unmounted, or SIGTERM/SIGINT/SIGHUP arrives (which unmounts).
pub fn serve(
    fs: impl Filesystem,
    mountpoint: &Path,
    opts: &Options,
    subtype: &str,
) -> std::io::Result<()> {
    let set = kernel::block_signals();
    // nodup's session, allowing other users when it runs as root (as nodup is run there).
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let config = kernel::session_config(&opts.fsname, subtype, root, opts.threads);
    let mut session = fuser::Session::new(fs, mountpoint, &config)?;
    let mut unmounter = session.unmount_callable();
    std::thread::Builder::new()
        .name("fuseref-signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: waits on the set blocked above; `sig` is a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                if let Err(e) = unmounter.unmount() {
                    eprintln!("nodup-fuseref: unmount on signal {sig} failed: {e}");
                }
            }
        })?;
    session.run()
}
