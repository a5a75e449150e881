//! The FUSE session both reference file systems run in: nodup's mount options, thread count,
//! cloned device fds and negotiated kernel settings, so that the only difference from a nodup
//! mount is the file system behind the requests.

use fuser::{Config, Filesystem, InitFlags, KernelConfig, MountOption, SessionACL};
use std::path::Path;
use std::time::Duration;

/// How long the kernel may cache attributes and entries (nodup's value).
pub const TTL: Duration = Duration::from_secs(1);
/// Largest write request negotiated with the kernel (nodup's value, 256 pages).
pub const MAX_WRITE: u32 = 1 << 20;

/// Options of one mount.
#[derive(Debug, Clone)]
pub struct Options {
    /// Ask for the kernel's writeback cache (nodup's `--writeback-cache`).
    pub writeback_cache: bool,
    /// Threads serving requests, each on its own cloned /dev/fuse fd.
    pub threads: usize,
    /// Source name shown in /proc/mounts.
    pub fsname: String,
}

/// Negotiate what nodup negotiates in its `init`: 1 MiB writes and readahead, 64 background
/// requests and the same capabilities. Returns whether HANDLE_KILLPRIV_V2 was granted (set-id
/// bits are then the file system's to clear).
pub fn negotiate(config: &mut KernelConfig, writeback: bool) -> bool {
    let _ = config.set_max_write(MAX_WRITE);
    let _ = config.set_max_readahead(MAX_WRITE);
    let _ = config.set_max_background(64);
    let mut caps = InitFlags::FUSE_PARALLEL_DIROPS
        | InitFlags::FUSE_DO_READDIRPLUS
        | InitFlags::FUSE_HANDLE_KILLPRIV_V2
        | InitFlags::FUSE_EXPORT_SUPPORT
        | InitFlags::FUSE_POSIX_ACL
        | InitFlags::FUSE_DONT_MASK;
    if writeback {
        caps |= InitFlags::FUSE_WRITEBACK_CACHE;
    }
    let mut killpriv = false;
    for cap in caps.iter() {
        match config.add_capabilities(cap) {
            Ok(()) if cap == InitFlags::FUSE_HANDLE_KILLPRIV_V2 => killpriv = true,
            Ok(()) => {}
            Err(unsupported) if unsupported.contains(InitFlags::FUSE_WRITEBACK_CACHE) => {
                eprintln!("nodup-fuseref: the kernel does not support the FUSE writeback cache");
            }
            Err(_) => {}
        }
    }
    killpriv
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// The session configuration nodup's `serve` builds, with `subtype` in place of `nodup`.
fn config(opts: &Options, subtype: &str) -> Config {
    let mut config = Config::default();
    // As in nodup: fuser hands `Subtype` only to fusermount; a direct mount needs the option.
    let subtype = if is_root() {
        MountOption::CUSTOM(format!("subtype={subtype}"))
    } else {
        MountOption::Subtype(subtype.into())
    };
    config.mount_options = vec![
        MountOption::FSName(opts.fsname.clone()),
        subtype,
        MountOption::DefaultPermissions,
        MountOption::Dev,
        MountOption::Suid,
    ];
    // nodup allows other users when it runs as root.
    config.acl = if is_root() {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    config
}

/// Mount `fs` at `mountpoint` (type `fuse.SUBTYPE`) and serve it in the foreground until it is
/// unmounted, or SIGTERM/SIGINT/SIGHUP arrives (which unmounts).
pub fn serve(
    fs: impl Filesystem,
    mountpoint: &Path,
    opts: &Options,
    subtype: &str,
) -> std::io::Result<()> {
    let set = block_signals();
    let mut session = fuser::Session::new(fs, mountpoint, &config(opts, subtype))?;
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
