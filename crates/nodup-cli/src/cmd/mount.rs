//! `nodup mount|umount`: mounting an image (a daemon serving FUSE) and unmounting it cleanly.

use super::mkfs::{check_policy_options, parse_budget, read_key_file};
use super::plain_error;
use super::size::parse_size;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use nodup_core::policy::selective::SelectiveOptions;
use nodup_core::policy::smart::{Eviction, SmartOptions};
use nodup_core::policy::{PolicyOptions, PrefetchMode};
use nodup_core::{OpenOptions, SplitOptions};
use nodup_fs::atime::AtimeMode;
use nodup_fs::fuse::kernel::DirectWrites;
use nodup_fs::fuse::MountOptions;
use nodup_fs::image::{self, ImageLock};
use nodup_fs::logging::{self, Sink};
use nodup_fs::{FileSystem, FsError, FsOptions, MediumKind};
use std::io::{Read, Write};
use std::os::unix::io::FromRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arguments of `nodup mount`.
#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// Image made by `nodup mkfs`.
    pub image: PathBuf,
    /// Existing, empty directory to mount on.
    pub mountpoint: PathBuf,
    /// Stay in the foreground and log to stderr (default: daemonize once the mount is usable).
    #[arg(long)]
    pub foreground: bool,
    /// Speculative prefetch variant of the light policy.
    #[arg(long, default_value = "cbp", value_parser = ["none", "p64", "ibp", "pc", "sp", "pn", "cbp"])]
    pub prefetch: String,
    /// FUSE writeback cache (default: on for blockfile images, off for pmem images); =false disables.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub writeback_cache: Option<bool>,
    /// Memory budget override for a `smart` image (the one recorded at mkfs otherwise), at
    /// most the machine's memory.
    #[arg(long, value_name = "SIZE")]
    pub mem_budget: Option<String>,
    /// Options of the `smart` policy.
    #[command(flatten)]
    pub smart: SmartArgs,
    /// Options of the `selective` policy.
    #[command(flatten)]
    pub selective: SelectiveArgs,
    /// Key file of an encrypted image (the one given to mkfs).
    #[arg(long, value_name = "FILE")]
    pub encrypt_key_file: Option<PathBuf>,
    /// When reads update access times: relatime (when older than the last change, or a day
    /// old), strictatime (every read; one log record each) or noatime.
    #[arg(long, default_value = "relatime", value_parser = ["relatime", "strictatime", "noatime"])]
    pub atime: String,
    /// Threads serving FUSE requests (1 to 64).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: u16,
    /// Parts one large write request is split into, each written by its own thread (0 = one
    /// per core, 1 = never split, the default: on 2 cores splitting measured slower, see
    /// docs/choices.md); requests under 256 KiB are never split.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(0..=8))]
    pub split_writes: u16,
    /// Request buffers on 2 MiB pages: the kernel copies large writes in faster (about 4 % at
    /// 1 MiB, docs/choices.md) for 2 MiB of memory per serving thread; =false keeps them on
    /// 4 KiB pages.
    #[arg(long, num_args = 0..=1, default_value = "true", default_missing_value = "true", value_name = "BOOL")]
    pub huge_buffers: bool,
    /// New data blocks of a pmem image written with non-temporal stores (as NOVA and PMDK do)
    /// instead of stores + cache-line flushes (default: on, except for encrypted images, where
    /// it measured slower): new data through the mount about 8-11 % faster, rewrites of
    /// deduplicated data level (docs/choices.md). Block-file images ignore it.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub stream_data: Option<bool>,
    /// Answer large writes (128 KiB and up, without the writeback cache) before they are
    /// stored, so the daemon's work overlaps the writer's next write (about 8 % faster at
    /// 1 MiB, docs/choices.md). Such data is durable at fsync, as on ext4, not when write(2)
    /// returns; close waits for it and reports its errors. Within 8 MiB of a full image
    /// writes are stored before they are answered, so a full image still fails the write
    /// itself. Off by default.
    #[arg(long, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_name = "BOOL")]
    pub async_writes: bool,
    /// Which handles bypass the kernel's page cache: a write through one goes from the
    /// writer's memory to nodup in one copy instead of two and is not kept a second time in
    /// the page cache (docs/choices.md). write-only (the default without the writeback
    /// cache): handles opened O_WRONLY (cp, dd, tar, rsync), which nothing reads through;
    /// read-write: O_RDWR handles too (fio, databases, VM images; 1 MiB writes 1.2-1.7 x
    /// faster), whose reads then come from nodup uncached; off. The writeback cache excludes
    /// it; given on a blockfile image, it turns that image's default writeback cache off.
    #[arg(long, num_args = 0..=1, default_missing_value = "write-only", value_name = "MODE", value_parser = DirectWrites::parse)]
    pub direct_writes: Option<DirectWrites>,
    /// Mount even over a directory that is not empty or is already a mount point (what is
    /// there stays hidden until unmount).
    #[arg(long)]
    pub nonempty: bool,
    /// Append the daemon's log to FILE, opened (created) before the daemon starts (default:
    /// syslog when daemonized, stderr in the foreground).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Internal: file descriptor on which the daemon reports readiness to its parent.
    #[arg(long, hide = true)]
    pub ready_fd: Option<i32>,
}

/// Mount options of the `smart` policy (experiments and operators; refused for other policies).
#[derive(Args, Debug, Clone, Default)]
pub struct SmartArgs {
    /// smart: which in-memory fingerprints make room: the least recently used group
    /// (default), fingerprint, or the one with the fewest references (CAFTL).
    #[arg(long, value_parser = ["group-lru", "lru", "refcount"], value_name = "POLICY")]
    pub eviction: Option<String>,
    /// smart: share of blocks fingerprinted inline: a fixed fraction in (0, 1] (default 1), or
    /// "adaptive" (follows the duplication level, the battery and the CPU and device load).
    #[arg(long, value_name = "adaptive|F")]
    pub selectivity: Option<String>,
    /// smart: deduplicate only runs of at least N consecutive duplicate blocks (1 = all, default).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub min_run: Option<u32>,
    /// smart: the dedup-aware read cache (default on).
    #[arg(long, value_name = "BOOL")]
    pub read_cache: Option<bool>,
    /// smart: blocks per second the out-of-line worker processes (0 pauses it; default 50000).
    #[arg(long, value_name = "N")]
    pub worker_rate: Option<u64>,
}

/// Mount options of the `selective` policy (refused for other policies).
#[derive(Args, Debug, Clone, Default)]
pub struct SelectiveArgs {
    /// selective: size of the hot-fingerprint (LRCU) cache, its whole memory (default 512K).
    #[arg(long, value_name = "SIZE")]
    pub fp_cache: Option<String>,
    /// selective: block contents kept to answer verifications (default 512K; 0 = none).
    #[arg(long, value_name = "SIZE")]
    pub prefetch_cache: Option<String>,
    /// selective: milliseconds between refreshes of the cache's hotness (default 10000; 0 = never).
    #[arg(long, value_name = "MS")]
    pub refresh_ms: Option<u64>,
    /// selective: also refresh after N cache operations (experiments; default never).
    #[arg(long, value_name = "N")]
    pub refresh_ops: Option<u64>,
}

impl SelectiveArgs {
    /// True when any option was given.
    fn any(&self) -> bool {
        self.fp_cache.is_some()
            || self.prefetch_cache.is_some()
            || self.refresh_ms.is_some()
            || self.refresh_ops.is_some()
    }

    /// The engine's options for `selective`.
    fn options(&self) -> Result<SelectiveOptions> {
        let mut o = SelectiveOptions::default();
        if let Some(x) = &self.fp_cache {
            o.fp_cache_bytes = parse_size(x).map_err(|e| anyhow!("--fp-cache {x}: {e}"))?;
            if o.fp_cache_bytes < 4096 {
                bail!("--fp-cache {x}: at least 4K");
            }
        }
        if let Some(x) = &self.prefetch_cache {
            o.prefetch_bytes = if x == "0" {
                0
            } else {
                parse_size(x).map_err(|e| anyhow!("--prefetch-cache {x}: {e}"))?
            };
        }
        if let Some(ms) = self.refresh_ms {
            o.refresh_ms = (ms > 0).then_some(ms);
        }
        if let Some(n) = self.refresh_ops {
            o.refresh_ops = (n > 0).then_some(n);
        }
        Ok(o)
    }

    /// The same options on a command line (the daemon's).
    fn to_args(&self) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(x) = &self.fp_cache {
            v.push(format!("--fp-cache={x}"));
        }
        if let Some(x) = &self.prefetch_cache {
            v.push(format!("--prefetch-cache={x}"));
        }
        if let Some(x) = self.refresh_ms {
            v.push(format!("--refresh-ms={x}"));
        }
        if let Some(x) = self.refresh_ops {
            v.push(format!("--refresh-ops={x}"));
        }
        v
    }
}

impl SmartArgs {
    /// True when any option was given.
    fn any(&self) -> bool {
        self.eviction.is_some()
            || self.selectivity.is_some()
            || self.min_run.is_some()
            || self.read_cache.is_some()
            || self.worker_rate.is_some()
    }

    /// The engine's options for `smart`.
    fn options(&self) -> Result<SmartOptions> {
        let mut o = SmartOptions::default();
        if let Some(e) = &self.eviction {
            o.eviction =
                Eviction::from_name(e).ok_or_else(|| anyhow!("--eviction {e}: unknown policy"))?;
        }
        match self.selectivity.as_deref() {
            None => {}
            Some("adaptive") => o.fixed_selectivity = None,
            Some(f) => match f.parse::<f64>() {
                Ok(x) if x > 0.0 && x <= 1.0 => o.fixed_selectivity = Some(x),
                _ => bail!("--selectivity {f}: \"adaptive\" or a fraction in (0, 1]"),
            },
        }
        if let Some(n) = self.min_run {
            o.min_run = n;
        }
        if let Some(r) = self.read_cache {
            o.read_cache = r;
        }
        Ok(o)
    }

    /// The same options on a command line (the daemon's).
    fn to_args(&self) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(x) = &self.eviction {
            v.push(format!("--eviction={x}"));
        }
        if let Some(x) = &self.selectivity {
            v.push(format!("--selectivity={x}"));
        }
        if let Some(x) = self.min_run {
            v.push(format!("--min-run={x}"));
        }
        if let Some(x) = self.read_cache {
            v.push(format!("--read-cache={x}"));
        }
        if let Some(x) = self.worker_rate {
            v.push(format!("--worker-rate={x}"));
        }
        v
    }
}

/// Arguments of `nodup umount`.
#[derive(Args)]
pub struct UmountArgs {
    /// Mount point of a nodup file system.
    pub mountpoint: PathBuf,
    /// Seconds to wait for the daemon to finish its clean shutdown.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

fn open_options(a: &MountArgs) -> Result<OpenOptions> {
    Ok(OpenOptions {
        prefetch: PrefetchMode::from_name(&a.prefetch)
            .ok_or_else(|| anyhow!("unknown prefetch mode {}", a.prefetch))?,
        mem_budget: a.mem_budget.as_deref().map(parse_budget).transpose()?,
        key: a
            .encrypt_key_file
            .as_deref()
            .map(read_key_file)
            .transpose()?,
        policy: PolicyOptions {
            smart: a.smart.options()?,
            selective: a.selective.options()?,
        },
        write_split: match a.split_writes {
            0 => SplitOptions::per_core(),
            n => SplitOptions {
                parts: n as usize,
                ..SplitOptions::per_core()
            },
        },
        ..OpenOptions::default()
    })
}

/// Whether `--direct-writes` asked for a direct mode (not `off`, not left to the default).
fn direct_asked(a: &MountArgs) -> bool {
    a.direct_writes.is_some_and(|d| d != DirectWrites::Off)
}

/// The image at `path` must exist and be a nodup image (checked read-only).
pub fn check_image(path: &Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("{}: no such image", path.display())
        }
        Err(e) => bail!("{}: {}", path.display(), super::plain(&e)),
    };
    // Before anything opens it: an open of a FIFO waits for a writer forever, and nothing but
    // a file or a block device holds an image.
    let t = meta.file_type();
    if !t.is_file() && !t.is_block_device() {
        bail!("{}: not a regular file or block device", path.display());
    }
    nodup_fs::superblock::probe_file(path).map_err(|e| match e {
        FsError::NotNodup(_) => anyhow!("{}: not a nodup image", path.display()),
        e => anyhow!("{}: {e}", path.display()),
    })?;
    Ok(())
}

/// True when `dir` is a mount point (its device differs from its parent's, or it is `/`).
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(d) = std::fs::metadata(dir) else {
        return false;
    };
    let Ok(p) = std::fs::metadata(dir.join("..")) else {
        return false;
    };
    d.dev() != p.dev() || d.ino() == p.ino()
}

/// Refuse a mount point that would hide something, unless `--nonempty`.
fn check_mountpoint(mp: &Path, nonempty: bool) -> Result<()> {
    let d = mp.display();
    match std::fs::metadata(mp) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("{d}: mount point is not a directory"),
        // ENOTCONN: a FUSE daemon died and left its mount behind. A nodup one is detached by
        // `nodup umount`, which the message names (with the image a new mount recovers).
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(super::list::dead_mount_error(mp).unwrap_or_else(|| {
                anyhow!("{d}: a dead mount is still attached here (fusermount3 -u it first)")
            }))
        }
        Err(e) => bail!("{d}: mount point: {}", super::plain(&e)),
    }
    if nonempty {
        return Ok(());
    }
    if is_mount_point(mp) {
        bail!("{d}: is already a mount point; mounting over it would hide it (--nonempty to do it anyway)");
    }
    let mut entries = std::fs::read_dir(mp).with_context(|| format!("{d}"))?;
    if entries.next().is_some() {
        bail!(
            "{d}: is not empty; mounting over it would hide its files (--nonempty to do it anyway)"
        );
    }
    Ok(())
}

/// `nodup mount`.
pub fn mount(a: MountArgs) -> Result<()> {
    if a.foreground {
        super::malloc_tune::reexec_with_tunables();
    }
    check_image(&a.image)?;
    if a.writeback_cache == Some(true) && direct_asked(&a) {
        bail!("--writeback-cache and --direct-writes exclude each other: the writeback cache keeps writes in the page cache, direct writes skip it");
    }
    let sb = nodup_fs::superblock::probe_file(&a.image)
        .map_err(|e| anyhow!("{}: {e}", a.image.display()))?
        .0;
    let policy =
        nodup_core::policy::PolicyKind::from_u32(sb.policy).map_or("unknown", |p| p.name());
    check_policy_options(policy, a.mem_budget.is_some())?;
    if a.mem_budget.is_none() {
        super::mkfs::check_recorded_budget(&a.image)?;
    }
    if a.smart.any() && policy != "smart" {
        bail!("--eviction, --selectivity, --min-run, --read-cache and --worker-rate are options of policy smart, not {policy}");
    }
    if a.selective.any() && policy != "selective" {
        bail!("--fp-cache, --prefetch-cache, --refresh-ms and --refresh-ops are options of policy selective, not {policy}");
    }
    open_options(&a)?;
    if a.ready_fd.is_none() {
        check_mountpoint(&a.mountpoint, a.nonempty)?;
    }
    drop(
        ImageLock::try_lock(&a.image)
            .map_err(|_| anyhow!("{}: image is already mounted", a.image.display()))?,
    );
    drop(claim_device(&a.image)?);
    // Here, not only in the daemon: once daemonized, its error could only say that it exited.
    if let Some(p) = &a.log_file {
        open_log_file(p)?;
    }
    if a.foreground || a.ready_fd.is_some() {
        return run_daemon(a);
    }
    spawn_daemon(&a)
}

fn spawn_daemon(a: &MountArgs) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 returns.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    let (rfd, wfd) = (fds[0], fds[1]);
    let exe = std::env::current_exe().context("locating the nodup binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("mount").arg(&a.image).arg(&a.mountpoint).args([
        "--prefetch",
        &a.prefetch,
        "--threads",
        &a.threads.to_string(),
        "--split-writes",
        &a.split_writes.to_string(),
        &format!("--huge-buffers={}", a.huge_buffers),
        &format!("--async-writes={}", a.async_writes),
        "--atime",
        &a.atime,
        "--ready-fd",
        "3",
    ]);
    if let Some(w) = a.writeback_cache {
        cmd.arg(format!("--writeback-cache={w}"));
    }
    if let Some(st) = a.stream_data {
        cmd.arg(format!("--stream-data={st}"));
    }
    if let Some(d) = a.direct_writes {
        cmd.arg(format!("--direct-writes={}", d.name()));
    }
    if let Some(b) = &a.mem_budget {
        cmd.arg(format!("--mem-budget={b}"));
    }
    if let Some(k) = &a.encrypt_key_file {
        // The path, never the key: the daemon reads the file itself.
        let abs = std::path::absolute(k).unwrap_or_else(|_| k.clone());
        cmd.arg("--encrypt-key-file").arg(abs);
    }
    cmd.args(a.smart.to_args());
    cmd.args(a.selective.to_args());
    if let Some(f) = &a.log_file {
        // The daemon runs in `/` after setsid: hand it an absolute path.
        let abs = std::path::absolute(f).unwrap_or_else(|_| f.clone());
        cmd.arg("--log-file").arg(abs);
    }
    if let Some(v) =
        super::malloc_tune::daemon_tunables(std::env::var_os(super::malloc_tune::VAR).as_deref())
    {
        cmd.env(super::malloc_tune::VAR, v);
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    match std::env::var_os("NODUP_DAEMON_LOG") {
        Some(p) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?;
            cmd.stderr(f);
            cmd.env("NODUP_LOG_STDERR", "1");
        }
        None => {
            cmd.stderr(std::process::Stdio::null());
        }
    }
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 || libc::dup2(wfd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().context("starting the mount daemon")?;
    // SAFETY: closing our copy of the write end; the read end becomes an owned File.
    unsafe { libc::close(wfd) };
    let mut r = unsafe { std::fs::File::from_raw_fd(rfd) };
    let mut msg = String::new();
    r.read_to_string(&mut msg)
        .context("waiting for the mount daemon")?;
    let msg = msg.trim();
    if let Some(ok) = msg.strip_prefix("ok ") {
        println!(
            "nodup: mounted {} on {} ({ok}; daemon pid {})",
            a.image.display(),
            a.mountpoint.display(),
            child.id()
        );
        Ok(())
    } else if let Some(e) = msg.strip_prefix("err ") {
        bail!("{e}")
    } else {
        bail!(
            "the mount daemon {} before the mount was ready",
            daemon_end(child)
        )
    }
}

/// How a mount daemon that closed its ready pipe without a word ended: its exit status, or
/// the signal that killed it, waiting up to a second for it to be gone.
fn daemon_end(mut child: std::process::Child) -> String {
    use std::os::unix::process::ExitStatusExt;
    for _ in 0..100 {
        match child.try_wait() {
            Ok(Some(st)) => {
                return match (st.code(), st.signal()) {
                    (Some(c), _) => format!("exited with status {c}"),
                    (None, Some(s)) => format!("was killed by {}", signal_name(s)),
                    _ => "exited".into(),
                }
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => break,
        }
    }
    "stopped answering".into()
}

/// A signal's name, for the signals a daemon dies of.
fn signal_name(s: i32) -> String {
    match s {
        libc::SIGBUS => "SIGBUS".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGINT => "SIGINT".into(),
        _ => format!("signal {s}"),
    }
}

/// The daemon's log file, opened for appending (created when missing).
fn open_log_file(p: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .map_err(|e| anyhow!("{}: log file: {}", p.display(), super::plain(&e)))
}

fn run_daemon(a: MountArgs) -> Result<()> {
    // SAFETY: the descriptor was set up by our parent (dup2 onto fd 3) and is owned from here on.
    let mut ready = a
        .ready_fd
        .map(|fd| unsafe { std::fs::File::from_raw_fd(fd) });
    let sink = match &a.log_file {
        Some(p) => Sink::File(open_log_file(p)?),
        None if a.ready_fd.is_none() || std::env::var_os("NODUP_LOG_STDERR").is_some() => {
            Sink::Stderr
        }
        None => Sink::Syslog,
    };
    logging::set_sink(sink);
    let r = daemon_body(&a, &mut ready);
    if let Err(e) = &r {
        logging::error(&plain_error(e));
        if let Some(f) = ready.as_mut() {
            let _ = writeln!(f, "err {}", plain_error(e));
        }
    }
    r
}

/// [`image::claim_device`] with its refusal as one line.
pub fn claim_device(path: &Path) -> Result<Option<std::fs::File>> {
    image::claim_device(path).map_err(|e| match e {
        FsError::Busy(m) => anyhow!(m),
        e => anyhow!("{}: {}", path.display(), super::plain(&e)),
    })
}

fn daemon_body(a: &MountArgs, ready: &mut Option<std::fs::File>) -> Result<()> {
    let img = a.image.display();
    let _lock =
        ImageLock::try_lock(&a.image).map_err(|_| anyhow!("{img}: image is already mounted"))?;
    // A device stays claimed while mounted: no kernel file system or mkfs takes it meanwhile.
    let _claim = claim_device(&a.image)?;
    // An encrypted image's blocks go through a stack buffer before streaming stores, which
    // measured slower than encrypting straight into the mapping (docs/choices.md). A key file
    // is given exactly for an encrypted image: the engine refuses the mount otherwise.
    let stream_data = a.stream_data.unwrap_or(a.encrypt_key_file.is_none());
    let (medium, kind, stores) =
        image::open_for_mount(&a.image, stream_data).map_err(|e| anyhow!("{img}: {e}"))?;
    for w in image::host_warnings(&a.image, &img.to_string()) {
        logging::warn(&w);
    }
    if let Some(stores) = stores {
        logging::info(&format!(
            "{img}: new data blocks written with {}",
            stores.describe()
        ));
    }
    if a.async_writes {
        logging::info(&format!(
            "{img}: writes of {} KiB and up answered before they are stored (--async-writes): durable at fsync",
            nodup_fs::fuse::ASYNC_MIN >> 10
        ));
    }
    let opts = FsOptions {
        open: open_options(a)?,
        image_path: Some(a.image.clone()),
        ..FsOptions::default()
    };
    logging::info(&format!(
        "mounting {img} on {} (pid {})",
        a.mountpoint.display(),
        std::process::id()
    ));
    let fs =
        FileSystem::open(medium, &opts).map_err(|e| anyhow!("{img}: {}", super::open_error(&e)))?;
    if let Some(r) = a.smart.worker_rate {
        fs.smart_control(&format!("worker-rate={r}"))
            .map_err(|e| anyhow!("--worker-rate: {e}"))?;
    }
    let rec = fs.recovery().clone();
    let note = format!(
        "{} mount, recovery {}",
        rec.kind,
        super::size::duration(rec.seconds)
    );
    logging::info(&format!(
        "{img}: {note} ({} log records replayed)",
        rec.replayed_records
    ));
    let fsname = a.image.canonicalize().unwrap_or_else(|_| a.image.clone());
    // Blockfile images default to the writeback cache, unless direct writes are asked for.
    let writeback_cache = a
        .writeback_cache
        .unwrap_or(kind == MediumKind::BlockFile && !direct_asked(a));
    let mopts = MountOptions {
        writeback_cache,
        threads: a.threads as usize,
        fsname: fsname.to_string_lossy().into_owned(),
        // SAFETY: geteuid cannot fail.
        allow_other: unsafe { libc::geteuid() } == 0,
        atime: AtimeMode::from_name(&a.atime)
            .ok_or_else(|| anyhow!("--atime {}: relatime, strictatime or noatime", a.atime))?,
        huge_buffers: a.huge_buffers,
        async_writes: a.async_writes,
        direct_writes: DirectWrites::or_default(a.direct_writes, writeback_cache),
    };
    logging::info(&format!(
        "{img}: {}",
        if mopts.writeback_cache {
            "writeback cache: writes are kept in the page cache and sent later (durable at fsync)"
        } else {
            match mopts.direct_writes {
                DirectWrites::Off => "writes go through the page cache to the image (--direct-writes=off)",
                DirectWrites::WriteOnly => "write-only handles bypass the page cache (--direct-writes=write-only)",
                DirectWrites::ReadWrite => "write-only and read-write handles bypass the page cache (--direct-writes=read-write)",
            }
        }
    ));
    if stores == Some(image::PmemStores::Msynced { page_cache: true }) && !mopts.writeback_cache {
        // pmem's promise (durable when the call returns) stays the default; on a disk it costs
        // msyncs in every write, which --writeback-cache spreads over gathered writes.
        logging::info(&format!(
            "{img}: every write syncs the disk before it is answered{}, so small writes are \
             slow here; --writeback-cache gathers them into large requests, durable at fsync \
             (docs/operating.md)",
            if mopts.async_writes {
                " (or, with --async-writes, before fsync for large ones)"
            } else {
                ""
            }
        ));
    }
    let fs = Arc::new(fs);
    let mut ready_taken = ready.take();
    let r = nodup_fs::fuse::serve(fs, &a.mountpoint, &mopts, || {
        logging::info(&format!("{img}: mounted on {}", a.mountpoint.display()));
        if let Some(mut f) = ready_taken.take() {
            let _ = writeln!(f, "ok {note}");
        }
    });
    if let Some(mut f) = ready_taken {
        // Mounting failed before the ready callback ran.
        if let Err(e) = &r {
            let _ = writeln!(f, "err {}: {e}", a.mountpoint.display());
        }
    }
    logging::flush_repeats(true);
    match &r {
        Ok(()) => logging::info(&format!("{img}: unmounted cleanly")),
        Err(e) => logging::error(&format!("{img}: {e}")),
    }
    r.map_err(|e| anyhow!("{}: {e}", a.mountpoint.display()))
}

/// The image behind a nodup mount point, from /proc/self/mountinfo: a `fuse.nodup` mount's
/// source whatever became of it (a dead mount whose image was removed is still ours to
/// detach), or any other `fuse*` type's source that holds a nodup image (a mount made
/// through another FUSE helper).
pub fn mounted_image(mp: &Path) -> Option<PathBuf> {
    nodup_fs::mountinfo::entries()
        .into_iter()
        .rev()
        .find(|e| {
            e.mountpoint == mp
                && (e.fstype == "fuse.nodup"
                    || e.fstype.starts_with("fuse")
                        && nodup_fs::superblock::probe_file(&e.source).is_ok())
        })
        .map(|e| e.source)
}

/// Whether the unmounted image at `img` was left clean: its file-system superblock pair and
/// the engine's superblock (block 0, whose flag the engine's own save at the end of a clean
/// shutdown sets, after the final checkpoint) both say so; both are in the clear on an
/// encrypted image too. Read through the opened medium, which drops the image's cached pages
/// when they may differ from the disk (`media/write_back.rs`). `None` when they cannot be read.
fn image_clean(img: &Path) -> Option<bool> {
    let (m, _, failed_before) = nodup_fs::image::open_reporting(img, true).ok()?;
    if let Some(line) = failed_before {
        eprintln!("nodup: warning: {line}");
    }
    let (sb, _, _) = nodup_fs::superblock::probe_medium(&*m).ok()?;
    let esb = nodup_core::engine::superblock::Superblock::load(&*m).ok()?;
    Some(sb.is_clean() && esb.clean)
}

/// `nodup umount`.
pub fn umount(a: UmountArgs) -> Result<()> {
    let mp = a
        .mountpoint
        .canonicalize()
        .with_context(|| format!("{}", a.mountpoint.display()))?;
    let img =
        mounted_image(&mp).ok_or_else(|| anyhow!("{}: not a nodup mount point", mp.display()))?;
    // A daemon that is already gone (a dead mount) left the image as it was: the unmount only
    // detaches, and an unclean image is no failure of it. A live daemon holds the image lock.
    let daemon_alive = matches!(ImageLock::try_lock(&img), Err(FsError::Busy(_)));
    let detach = || {
        std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(&mp)
            .output()
            .or_else(|_| std::process::Command::new("umount").arg(&mp).output())
            .context("running fusermount3")
    };
    let mut out = detach()?;
    // A file closed just before can still hold the mount for a moment (the kernel finishes
    // the last close of a file asynchronously, and a process forked while it was open holds
    // it until its exec): "busy" is retried for up to a second before it is reported.
    let t0 = Instant::now();
    while !out.status.success()
        && String::from_utf8_lossy(&out.stderr).contains("resource busy")
        && t0.elapsed() < Duration::from_secs(1)
    {
        std::thread::sleep(Duration::from_millis(50));
        out = detach()?;
    }
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        if said.contains("resource busy") {
            bail!(
                "{}: unmount failed: the mount is busy, a process still uses it (an open file or \
                 a working directory in it; `fuser -vm {}` names them)",
                mp.display(),
                mp.display()
            );
        }
        bail!("{}: unmount failed: {}", mp.display(), said.trim());
    }
    // The daemon holds the image lock until its clean shutdown (checkpoint) is done.
    let t0 = Instant::now();
    loop {
        match ImageLock::try_lock(&img) {
            Ok(_) => {
                // The daemon's clean shutdown can fail (a failed write-back of the image, a
                // full disk under it, the daemon killed during it): the file system is
                // detached all the same, but the unmount did not do its job, and scripts must
                // be able to tell.
                if image_clean(&img) == Some(false) {
                    if daemon_alive {
                        bail!(
                            "{} was not unmounted cleanly: the daemon's clean shutdown did not \
                             finish (its log says why); {} is detached and the next mount runs \
                             failure recovery",
                            img.display(),
                            mp.display()
                        );
                    }
                    eprintln!(
                        "nodup: warning: the daemon of {} was already gone: the image was not \
                         unmounted cleanly; the next mount runs failure recovery",
                        mp.display()
                    );
                }
                return Ok(());
            }
            Err(FsError::Busy(_)) if t0.elapsed() < Duration::from_secs(a.timeout) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(FsError::Busy(_)) => {
                bail!("{}: daemon still busy after {} s", img.display(), a.timeout)
            }
            // The image went away (removed while mounted): nothing more to wait for.
            Err(_) => return Ok(()),
        }
    }
}
