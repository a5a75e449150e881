//! What nodup asks of the kernel and of fuser for a mount: the INIT negotiation, the session
//! configuration and the signals the serving process takes over. Public so the reference file
//! systems of the ceiling benchmarks (`nodup-fuseref`) run under exactly the same terms.

use super::MAX_WRITE;
use fuser::{Config, FopenFlags, InitFlags, KernelConfig, MountOption, SessionACL};

/// Which handles bypass the page cache (`nodup mount --direct-writes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DirectWrites {
    /// Every handle uses the page cache (writes go through it to the daemon at once).
    Off,
    /// Handles opened write-only (`cp`, `dd`, `tar`, `rsync`): nothing can read or map
    /// through them, so nothing but the extra copy changes (the default).
    #[default]
    WriteOnly,
    /// Read-write handles too (fio, databases, VM images): their reads then come from the
    /// daemon each time, without readahead or cache.
    ReadWrite,
}

impl DirectWrites {
    /// The mode named `s` (`off`/`false`, `write-only`/`true`, `read-write`).
    pub fn from_name(s: &str) -> Option<DirectWrites> {
        match s {
            "off" | "false" | "no" | "0" => Some(DirectWrites::Off),
            "write-only" | "true" | "yes" | "on" | "1" => Some(DirectWrites::WriteOnly),
            "read-write" => Some(DirectWrites::ReadWrite),
            _ => None,
        }
    }

    /// [`DirectWrites::from_name`] for a command line (clap's `value_parser`).
    pub fn parse(s: &str) -> Result<DirectWrites, String> {
        DirectWrites::from_name(s).ok_or_else(|| format!("{s}: off, write-only or read-write"))
    }

    /// The mode in force: the one `asked`, else write-only, or off under the writeback cache.
    pub fn or_default(asked: Option<DirectWrites>, writeback: bool) -> DirectWrites {
        match asked {
            Some(d) => d,
            None if writeback => DirectWrites::Off,
            None => DirectWrites::WriteOnly,
        }
    }

    /// The mode's name, as `from_name` reads it.
    pub fn name(self) -> &'static str {
        match self {
            DirectWrites::Off => "off",
            DirectWrites::WriteOnly => "write-only",
            DirectWrites::ReadWrite => "read-write",
        }
    }
}

/// What the kernel granted at INIT that changes how requests are answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Granted {
    /// HANDLE_KILLPRIV_V2: clearing set-id bits on write is the file system's job.
    pub killpriv: bool,
    /// DIRECT_IO_ALLOW_MMAP (Linux 6.6): the kernel also drops cached pages before a direct
    /// write (the same release), so a direct handle cannot leave readers with stale pages.
    pub direct_io: bool,
    /// Protocol 7.40 (Linux 6.9) besides: shared mappings of a direct file get writable
    /// pages properly (earlier, msync of such a mapping could fail).
    pub direct_mmap: bool,
}

/// How a mount caches file data: the writeback cache or direct writes as asked (they
/// exclude each other: the writeback cache wins), and what the kernel granted at INIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caching {
    /// FUSE_WRITEBACK_CACHE: the kernel keeps writes and sends them later.
    pub writeback: bool,
    /// Which handles bypass the page cache ([`open_flags`]).
    pub direct: DirectWrites,
    /// Set by [`Caching::negotiate`].
    pub granted: Granted,
}

impl Caching {
    /// The caching asked for; direct writes only without the writeback cache.
    pub fn new(writeback: bool, direct: DirectWrites) -> Caching {
        Caching {
            writeback,
            direct: if writeback { DirectWrites::Off } else { direct },
            granted: Granted::default(),
        }
    }

    /// At INIT: negotiate nodup's kernel settings ([`negotiate`]) and keep what was granted.
    pub fn negotiate(&mut self, config: &mut KernelConfig) {
        self.granted = negotiate(config, self.writeback, self.direct != DirectWrites::Off);
        if self.direct == DirectWrites::ReadWrite
            && self.granted.direct_io
            && !self.granted.direct_mmap
        {
            crate::logging::warn(
                "shared mappings of direct-I/O files are unreliable before Linux 6.9: read-write handles use the page cache",
            );
        }
    }

    /// Whether a new handle opened with `flags` bypasses the page cache ([`is_direct`]).
    pub fn is_direct(&self, flags: i32) -> bool {
        is_direct(flags, self.direct, self.granted)
    }

    /// The open reply flags of a new handle opened with `flags` ([`open_flags`]).
    pub fn open_flags(&self, flags: i32) -> FopenFlags {
        open_flags(self.is_direct(flags))
    }
}

/// Whether a handle opened with `flags` bypasses the page cache (FOPEN_DIRECT_IO): the kernel
/// then hands a write to the daemon straight from the writer's memory instead of copying it
/// into cached pages first, and reads through that handle come from the daemon. Only on a
/// kernel that drops cached pages around direct writes (6.6), and for read-write handles
/// (which a program may map) only where shared mappings of such files work (6.9).
pub fn is_direct(flags: i32, direct: DirectWrites, granted: Granted) -> bool {
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => direct != DirectWrites::Off && granted.direct_io,
        libc::O_RDWR => direct == DirectWrites::ReadWrite && granted.direct_mmap,
        _ => false,
    }
}

/// The open reply flags of a handle: every handle keeps what others cached (a direct write
/// drops the cached pages it overwrites), and a direct one bypasses the cache.
pub fn open_flags(direct: bool) -> FopenFlags {
    if direct {
        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_KEEP_CACHE
    } else {
        FopenFlags::FOPEN_KEEP_CACHE
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
            Ok(()) if cap == InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP => {
                granted.direct_io = true;
                let abi = config.kernel_abi();
                granted.direct_mmap = (abi.0, abi.1) >= (7, 40);
            }
            Ok(()) => {}
            Err(unsupported) if unsupported.contains(InitFlags::FUSE_WRITEBACK_CACHE) => {
                crate::logging::warn("the kernel does not support the FUSE writeback cache");
            }
            Err(unsupported) if unsupported.contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP) => {
                crate::logging::warn(
                    "the kernel does not drop cached pages around direct writes (before Linux 6.6): every handle uses the page cache",
                );
            }
            // Without KILLPRIV_V2 the kernel keeps clearing set-id bits itself.
            Err(_) => {}
        }
    }
    granted
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
    fn which_handles_skip_the_cache() {
        use DirectWrites::*;
        let new = Granted {
            killpriv: true,
            direct_io: true,
            direct_mmap: true,
        };
        let (w, rw, r) = (libc::O_WRONLY | libc::O_CREAT, libc::O_RDWR, libc::O_RDONLY);
        assert!(is_direct(w, WriteOnly, new));
        assert!(
            !is_direct(rw, WriteOnly, new),
            "read-write handles keep the cache by default"
        );
        assert!(!is_direct(r, WriteOnly, new));
        assert!(is_direct(w, ReadWrite, new) && is_direct(rw, ReadWrite, new));
        assert!(!is_direct(r, ReadWrite, new));
        assert!(!is_direct(w, Off, new) && !is_direct(rw, Off, new));
        // 6.6 to 6.8: shared mappings of direct files misbehave, read-write handles cached.
        let mid = Granted {
            direct_mmap: false,
            ..new
        };
        assert!(is_direct(w, ReadWrite, mid) && !is_direct(rw, ReadWrite, mid));
        // Before 6.6 no invalidation around direct writes: nothing direct.
        let old = Granted {
            killpriv: true,
            ..Granted::default()
        };
        assert!(!is_direct(w, WriteOnly, old) && !is_direct(rw, ReadWrite, old));
        // The writeback cache excludes direct writes.
        assert_eq!(Caching::new(true, ReadWrite).direct, Off);
        for m in [Off, WriteOnly, ReadWrite] {
            assert_eq!(DirectWrites::from_name(m.name()), Some(m));
        }
        assert_eq!(DirectWrites::from_name("true"), Some(WriteOnly));
        assert_eq!(DirectWrites::from_name("maybe"), None);
    }
}
