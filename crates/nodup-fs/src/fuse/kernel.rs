//! What nodup asks of the kernel and of fuser for a mount: the INIT negotiation, the session
//! configuration and the signals the serving process takes over. Public so the reference file
//! systems of the ceiling benchmarks (`nodup-fuseref`) run under exactly the same terms.

use super::MAX_WRITE;
use fuser::{Config, FopenFlags, InitFlags, KernelConfig, MountOption, SessionACL};

/// What the kernel granted at INIT that changes how requests are answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Granted {
    /// HANDLE_KILLPRIV_V2: clearing set-id bits on write is the file system's job.
    pub killpriv: bool,
    /// DIRECT_IO_ALLOW_MMAP: a file open with FOPEN_DIRECT_IO may still be mapped shared
    /// (Linux 6.6 and later).
    pub direct_mmap: bool,
}

/// How a mount caches file data: the writeback cache or direct writes as asked (they
/// exclude each other: the writeback cache wins), and what the kernel granted at INIT.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caching {
    /// FUSE_WRITEBACK_CACHE: the kernel keeps writes and sends them later.
    pub writeback: bool,
    /// Handles open for writing bypass the page cache ([`open_flags`]).
    pub direct_writes: bool,
    /// Set by [`Caching::negotiate`].
    pub granted: Granted,
}

impl Caching {
    /// The caching asked for; direct writes only without the writeback cache.
    pub fn new(writeback: bool, direct_writes: bool) -> Caching {
        Caching {
            writeback,
            direct_writes: direct_writes && !writeback,
            granted: Granted::default(),
        }
    }

    /// At INIT: negotiate nodup's kernel settings ([`negotiate`]) and keep what was granted.
    pub fn negotiate(&mut self, config: &mut KernelConfig) {
        self.granted = negotiate(config, self.writeback, self.direct_writes);
    }

    /// The reply flags of a new handle opened with `flags` ([`open_flags`]).
    pub fn open_flags(&self, flags: i32) -> FopenFlags {
        open_flags(flags, self.direct_writes, self.granted)
    }
}

/// Negotiate nodup's kernel settings: 1 MiB writes and readahead, 64 background requests and
/// its capabilities (the writeback cache when asked; with `direct_writes`, shared mappings of
/// files open for direct I/O).
pub fn negotiate(config: &mut KernelConfig, writeback: bool, direct_writes: bool) -> Granted {
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
    if direct_writes {
        caps |= InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
    }
    let mut granted = Granted::default();
    for cap in caps.iter() {
        match config.add_capabilities(cap) {
            Ok(()) if cap == InitFlags::FUSE_HANDLE_KILLPRIV_V2 => granted.killpriv = true,
            Ok(()) if cap == InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP => granted.direct_mmap = true,
            Ok(()) => {}
            Err(unsupported) if unsupported.contains(InitFlags::FUSE_WRITEBACK_CACHE) => {
                crate::logging::warn("the kernel does not support the FUSE writeback cache");
            }
            // Without KILLPRIV_V2 the kernel keeps clearing set-id bits itself; without
            // DIRECT_IO_ALLOW_MMAP only write-only handles skip the page cache (`open_flags`).
            Err(_) => {}
        }
    }
    granted
}

/// The caching of a new handle opened with `flags`. With `direct_writes`, a handle open for
/// writing bypasses the page cache (FOPEN_DIRECT_IO): the kernel hands a write to the daemon
/// straight from the writer's memory instead of copying it into cached pages first, and
/// reads through that handle come from the daemon. A read-write handle does so only when
/// the kernel allows shared mappings of such files (`granted.direct_mmap`), since a program
/// may map it. Every handle keeps what others cached (a direct write drops the cached pages
/// it overwrites).
pub fn open_flags(flags: i32, direct_writes: bool, granted: Granted) -> FopenFlags {
    let direct = direct_writes
        && match flags & libc::O_ACCMODE {
            libc::O_WRONLY => true,
            libc::O_RDWR => granted.direct_mmap,
            _ => false,
        };
    if direct {
        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_KEEP_CACHE
    } else {
        FopenFlags::FOPEN_KEEP_CACHE
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_writers_skip_the_cache() {
        let all = Granted {
            killpriv: true,
            direct_mmap: true,
        };
        let direct = FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_KEEP_CACHE;
        let cached = FopenFlags::FOPEN_KEEP_CACHE;
        assert_eq!(
            open_flags(libc::O_WRONLY | libc::O_CREAT, true, all),
            direct
        );
        assert_eq!(open_flags(libc::O_RDWR, true, all), direct);
        assert_eq!(open_flags(libc::O_RDONLY, true, all), cached);
        // Off (or the writeback cache): every handle cached.
        assert_eq!(open_flags(libc::O_WRONLY, false, all), cached);
        assert_eq!(open_flags(libc::O_RDWR, false, all), cached);
        // A kernel that refuses shared mappings of direct files: read-write handles cached.
        let old = Granted {
            direct_mmap: false,
            ..all
        };
        assert_eq!(open_flags(libc::O_WRONLY, true, old), direct);
        assert_eq!(open_flags(libc::O_RDWR, true, old), cached);
    }
}
