//! `nodup-fuseref`: reference FUSE file systems for benchmarks, run in the foreground with
//! nodup's session settings: `null` (accepts and discards data: the FUSE ceiling) and
//! `passthrough` (forwards to a directory), plus `bench-files`, the metadata benchmark's
//! file creator, and `logdisk`, a disk whose writes and flushes are logged for power-loss
//! tests.

mod attr;
mod bench_files;
mod logdisk;
mod null;
mod passthrough;
mod session;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use nodup_fs::fuse::kernel::DirectWrites;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(
    version,
    about = "Reference FUSE file systems for nodup's benchmarks and tests (null, passthrough, logdisk)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount a file system that keeps names and sizes but discards data (reads give zeros).
    Null {
        mountpoint: PathBuf,
        #[command(flatten)]
        mount: MountArgs,
    },
    /// Mount a file system forwarding every operation to SOURCE_DIR.
    Passthrough {
        source_dir: PathBuf,
        mountpoint: PathBuf,
        #[command(flatten)]
        mount: MountArgs,
        /// Descriptors held on inodes before file handles take over (default: the open-file
        /// limit less a reserve for open files).
        #[arg(long, hide = true)]
        fd_budget: Option<usize>,
        /// While this path exists, fsync fails with EIO (a disk whose write-back fails, for
        /// tests of what runs on top).
        #[arg(long, hide = true, value_name = "PATH")]
        fail_fsync_while: Option<PathBuf>,
    },
    /// Mount a disk whose writes and flushes are logged (for power-loss tests).
    ///
    /// The mount holds one file, `disk`, of SIZE bytes (zeros at first), whose writes, zeroed
    /// ranges and fsyncs are appended to LOG, and a file `mark` whose writes are logged as
    /// labels. A loop device over `disk` stands in for dm-log-writes.
    Logdisk {
        /// The log (created, or truncated); its format is in `src/logdisk.rs`.
        log: PathBuf,
        /// An empty directory to mount on.
        mountpoint: PathBuf,
        /// The disk's size in bytes (the tests give it in bytes; `nodup`'s own size parser
        /// lives in its CLI crate).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        size: u64,
    },
    /// Create FILES files of SIZE bytes (distinct contents) in DIRS directories under DIR.
    BenchFiles {
        dir: PathBuf,
        #[arg(long, default_value_t = 1000)]
        dirs: u64,
        #[arg(long, default_value_t = 200_000)]
        files: u64,
        #[arg(long, default_value_t = 4096)]
        size: usize,
    },
}

/// Options shared by both mounts (nodup's names and defaults).
#[derive(Args)]
struct MountArgs {
    /// Ask for the kernel's FUSE writeback cache.
    #[arg(long)]
    writeback_cache: bool,
    /// Which handles bypass the page cache: off, write-only or read-write (nodup's
    /// `--direct-writes`; default write-only, off with --writeback-cache).
    #[arg(long, num_args = 0..=1, default_missing_value = "write-only", value_name = "MODE", value_parser = DirectWrites::parse)]
    direct_writes: Option<DirectWrites>,
    /// Threads serving FUSE requests (1 to 64).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: u16,
}

impl MountArgs {
    fn options(&self, fsname: String) -> session::Options {
        session::Options {
            writeback_cache: self.writeback_cache,
            direct_writes: DirectWrites::or_default(self.direct_writes, self.writeback_cache),
            threads: self.threads as usize,
            fsname,
        }
    }
}

/// Allow as many open files as the system lets us (the passthrough file system holds a
/// descriptor per inode the kernel knows while it can); returns the limit in force.
fn raise_fd_limit() -> u64 {
    let max: libc::rlim_t = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20);
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        let want = libc::rlimit {
            rlim_cur: max,
            rlim_max: max,
        };
        // Raising the hard limit needs CAP_SYS_RESOURCE; otherwise take the hard limit.
        if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
            return max;
        }
        if libc::setrlimit(
            libc::RLIMIT_NOFILE,
            &libc::rlimit {
                rlim_cur: r.rlim_max,
                ..r
            },
        ) == 0
        {
            return r.rlim_max;
        }
        r.rlim_cur
    }
}

fn check_mountpoint(p: &Path) -> Result<()> {
    if !p.is_dir() {
        bail!("{}: not a directory", p.display());
    }
    Ok(())
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("nodup-fuseref: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Null { mountpoint, mount } => {
            check_mountpoint(&mountpoint)?;
            let opts = mount.options("nodup-null".into());
            null::run(&mountpoint, &opts).with_context(|| format!("{}", mountpoint.display()))
        }
        Cmd::Passthrough {
            source_dir,
            mountpoint,
            mount,
            fd_budget,
            fail_fsync_while,
        } => {
            check_mountpoint(&mountpoint)?;
            let source = source_dir
                .canonicalize()
                .with_context(|| format!("{}", source_dir.display()))?;
            let limit = raise_fd_limit() as usize;
            // Room for open files, directory streams and the session's own descriptors.
            let budget = fd_budget.unwrap_or(limit - (limit / 8).max(256).min(limit));
            let opts = mount.options(source.display().to_string());
            passthrough::run(&source, &mountpoint, &opts, budget, fail_fsync_while)
                .with_context(|| format!("{}", mountpoint.display()))
        }
        Cmd::Logdisk {
            log,
            mountpoint,
            size,
        } => {
            check_mountpoint(&mountpoint)?;
            let opts = session::Options {
                writeback_cache: false,
                direct_writes: DirectWrites::Off,
                threads: 1,
                fsname: "nodup-logdisk".into(),
            };
            logdisk::run(&log, size, &mountpoint, &opts)
                .with_context(|| format!("{}", mountpoint.display()))
        }
        Cmd::BenchFiles {
            dir,
            dirs,
            files,
            size,
        } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            bench_files::create(&dir, dirs, files, size)
                .with_context(|| format!("creating files under {}", dir.display()))?;
            Ok(())
        }
    }
}

/// fuser's request buffers on huge pages, as in `nodup` (the ceiling has what nodup has).
#[global_allocator]
static ALLOC: nodup_fs::fuse::RequestBufferAlloc = nodup_fs::fuse::RequestBufferAlloc;
