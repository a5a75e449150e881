//! What nodup asks of the kernel and of fuser for a mount: the INIT negotiation, the session
//! configuration and the signals the serving process takes over. Public so the reference file
//! systems of the ceiling benchmarks (`nodup-fuseref`) run under exactly the same terms.

use super::MAX_WRITE;
use fuser::{Config, InitFlags, KernelConfig, MountOption, SessionACL};

/// Negotiate nodup's kernel settings: 1 MiB writes and readahead, 64 background requests and
/// its capabilities (the writeback cache when asked). Returns whether HANDLE_KILLPRIV_V2 was
/// granted (clearing set-id bits on write is then the file system's job).
pub fn negotiate(config: &mut KernelConfig, writeback: bool) -> bool {
    let _ = config.set_max_write(MAX_WRITE);
    let _ = config.set_max_readahead(MAX_WRITE);
    let _ = config.set_max_background(64);
    // HANDLE_KILLPRIV_V2 makes the kernel set SB_NOSEC: once an inode is known to carry no
    // suid/sgid bit nor security xattr, write() stops asking us for `security.capability`
    // (a GETXATTR round trip per write syscall otherwise, which halved 4 KiB write speed).
    // In exchange we clear suid/sgid ourselves on writes flagged FUSE_WRITE_KILL_SUIDGID.
    // EXPORT_SUPPORT: inode numbers are stable and never reused (generation 0), so a file
    // handle (open_by_handle_at, an NFS export) stays valid after the kernel evicts the
    // inode and across remounts: the kernel finds it again by looking up "." in it.
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
                crate::logging::warn("the kernel does not support the FUSE writeback cache");
            }
            // Without KILLPRIV_V2 the kernel keeps clearing set-id bits itself.
            Err(_) => {}
        }
    }
    killpriv
}

/// The fuser session configuration of a mount of type `fuse.SUBTYPE` named `fsname`: nodup's
/// mount options, `threads` serving threads on cloned /dev/fuse descriptors, other users
/// allowed with `allow_other`.
pub fn session_config(fsname: &str, subtype: &str, allow_other: bool, threads: usize) -> Config {
    let mut config = Config::default();
    // fuser hands `Subtype` only to fusermount; a direct mount (root) needs it as a kernel
    // option.
    // SAFETY: geteuid cannot fail.
    let subtype = if unsafe { libc::geteuid() } == 0 {
        MountOption::CUSTOM(format!("subtype={subtype}"))
    } else {
        MountOption::Subtype(subtype.into())
    };
    config.mount_options = vec![
        MountOption::FSName(fsname.into()),
        subtype,
        MountOption::DefaultPermissions,
        MountOption::Dev,
        MountOption::Suid,
    ];
    config.acl = if allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(threads.max(1));
    config.clone_fd = true;
    config
}

/// Block SIGTERM, SIGINT and SIGHUP in the calling thread (and the threads it starts), so one
/// thread can `sigwait` for them and unmount cleanly; returns the set.
pub fn block_signals() -> libc::sigset_t {
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
