//! `nodup mkfs|mount|umount|stats|fsck`: the file-system commands.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use nodup_core::fingerprint::FpKind;
use nodup_core::meta::MetaLayoutKind;
use nodup_core::policy::{PolicyKind, PrefetchMode};
use nodup_core::{FormatOptions, OpenOptions};
use nodup_fs::fuse::MountOptions;
use nodup_fs::image::{self, ImageLock};
use nodup_fs::{Caller, FileSystem, FsError, FsOptions, MediumKind};
use std::io::{Read, Write};
use std::os::unix::io::FromRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arguments of `nodup mkfs`.
#[derive(Args)]
pub struct MkfsArgs {
    /// Image file to create (an existing file is overwritten unless it is mounted).
    pub image: PathBuf,
    /// Size of the image: bytes or with a K/M/G/T suffix (e.g. 4G).
    #[arg(long)]
    pub size: String,
    /// Dedup policy.
    #[arg(long, default_value = "light",
          value_parser = ["light", "smart", "selective", "none", "strong", "weak-verify"])]
    pub policy: String,
    /// Fingerprint function (default: sha256 for strong, crc32c for weak-verify, else xxh3).
    #[arg(long, value_parser = ["xxh3", "crc32c", "ecc", "sha256", "blake3"])]
    pub fingerprint: Option<String>,
    /// On-media dedup metadata layout.
    #[arg(long, default_value = "region", value_parser = ["region", "entry", "hashtable"])]
    pub meta_layout: String,
    /// Memory budget of the fingerprint store for policies that have one (e.g. 256M).
    #[arg(long)]
    pub mem_budget: Option<String>,
    /// Encrypt data with the key in FILE (a later issue).
    #[arg(long, value_name = "FILE")]
    pub encrypt_key_file: Option<PathBuf>,
    /// Medium the image is used as (default: pmem on tmpfs/DAX, else blockfile); recorded in the image.
    #[arg(long, value_parser = ["pmem", "blockfile"])]
    pub medium: Option<String>,
}

/// Arguments of `nodup mount`.
#[derive(Args)]
pub struct MountArgs {
    /// Image made by `nodup mkfs`.
    pub image: PathBuf,
    /// Existing directory to mount on.
    pub mountpoint: PathBuf,
    /// Stay in the foreground (default: daemonize once the mount is usable).
    #[arg(long)]
    pub foreground: bool,
    /// Speculative prefetch variant of the light policy.
    #[arg(long, default_value = "cbp", value_parser = ["none", "p64", "ibp", "pc", "sp", "pn", "cbp"])]
    pub prefetch: String,
    /// FUSE writeback cache (default: on for blockfile images, off for pmem images); =false disables.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub writeback_cache: Option<bool>,
    /// Memory budget override for policies that have one.
    #[arg(long)]
    pub mem_budget: Option<String>,
    /// Key file for encrypted images (a later issue).
    #[arg(long, value_name = "FILE")]
    pub encrypt_key_file: Option<PathBuf>,
    /// Threads serving FUSE requests.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Internal: file descriptor on which the daemon reports readiness to its parent.
    #[arg(long, hide = true)]
    pub ready_fd: Option<i32>,
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

/// Arguments of `nodup stats`.
#[derive(Args)]
pub struct StatsArgs {
    /// An image file (not mounted) or the mount point of a mounted one.
    pub target: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `nodup fsck`.
#[derive(Args)]
pub struct FsckArgs {
    /// Image file (must not be mounted).
    pub image: PathBuf,
    /// Fix what failure recovery would fix, and report it.
    #[arg(long)]
    pub repair: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Parse `4096`, `64K`, `512M`, `4G`, `1T` (binary units; an optional `iB`/`B` suffix is accepted).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mul) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow!("invalid size {s:?}"))?;
    if !(n.is_finite() && n > 0.0) {
        bail!("invalid size {s:?}");
    }
    Ok((n * mul as f64) as u64)
}

fn not_yet_policy(p: &str) -> Result<()> {
    if p == "smart" || p == "selective" {
        bail!("policy {p}: not implemented yet (a later issue)");
    }
    Ok(())
}

/// `nodup mkfs`.
pub fn mkfs(a: MkfsArgs) -> Result<()> {
    not_yet_policy(&a.policy)?;
    if a.encrypt_key_file.is_some() {
        bail!("--encrypt-key-file: encryption is not implemented yet (a later issue)");
    }
    let size = parse_size(&a.size)?;
    if size < (4 << 20) {
        bail!("--size {}: an image needs at least 4 MiB", a.size);
    }
    let size = size / 4096 * 4096;
    let policy =
        PolicyKind::from_name(&a.policy).ok_or_else(|| anyhow!("unknown policy {}", a.policy))?;
    let fp_name = a.fingerprint.clone().unwrap_or_else(|| {
        match policy {
            PolicyKind::Strong => "sha256",
            PolicyKind::WeakVerify => "crc32c",
            _ => "xxh3",
        }
        .to_string()
    });
    let fingerprint =
        FpKind::from_name(&fp_name).ok_or_else(|| anyhow!("unknown fingerprint {fp_name}"))?;
    let meta_layout = MetaLayoutKind::from_name(&a.meta_layout)
        .ok_or_else(|| anyhow!("unknown layout {}", a.meta_layout))?;
    let kind = match a.medium.as_deref() {
        Some("pmem") => MediumKind::Pmem,
        Some("blockfile") => MediumKind::BlockFile,
        _ => image::default_kind(&a.image),
    };
    if a.image.exists() {
        if !a.image.is_file() {
            bail!("{}: exists and is not a regular file", a.image.display());
        }
        ImageLock::try_lock(&a.image)
            .map_err(|_| anyhow!("{}: image is mounted", a.image.display()))?;
    }
    let fopts = FormatOptions {
        policy,
        fingerprint,
        meta_layout,
        mem_budget: a
            .mem_budget
            .as_deref()
            .map(parse_size)
            .transpose()?
            .unwrap_or(0),
        ..FormatOptions::default()
    };
    let medium = image::create(&a.image, size, kind)
        .with_context(|| format!("creating {}", a.image.display()))?;
    // SAFETY: getuid/getgid cannot fail.
    let owner = unsafe {
        Caller {
            uid: libc::getuid(),
            gid: libc::getgid(),
        }
    };
    let fs = FileSystem::format(medium, kind, &fopts, &FsOptions::default(), owner)
        .with_context(|| format!("formatting {}", a.image.display()))?;
    fs.shutdown()?;
    println!(
        "nodup: made {} ({} MiB, policy {}, fingerprint {}, layout {}, medium {})",
        a.image.display(),
        size >> 20,
        policy.name(),
        fingerprint.name(),
        meta_layout.name(),
        kind.name()
    );
    Ok(())
}

fn open_options(prefetch: &str, mem_budget: Option<&str>) -> Result<OpenOptions> {
    Ok(OpenOptions {
        prefetch: PrefetchMode::from_name(prefetch)
            .ok_or_else(|| anyhow!("unknown prefetch mode {prefetch}"))?,
        mem_budget: mem_budget.map(parse_size).transpose()?,
        ..OpenOptions::default()
    })
}

fn check_image(path: &Path) -> Result<()> {
    if !path.exists() {
        bail!("{}: no such image", path.display());
    }
    nodup_fs::superblock::probe_file(path).map_err(|e| match e {
        FsError::NotNodup(_) => anyhow!("{}: not a nodup image", path.display()),
        e => anyhow!("{}: {e}", path.display()),
    })?;
    Ok(())
}

/// `nodup mount`.
pub fn mount(a: MountArgs) -> Result<()> {
    if a.encrypt_key_file.is_some() {
        bail!("--encrypt-key-file: encryption is not implemented yet (a later issue)");
    }
    check_image(&a.image)?;
    match std::fs::metadata(&a.mountpoint) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("{}: mount point is not a directory", a.mountpoint.display()),
        // ENOTCONN: a FUSE daemon died and left its mount behind.
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => bail!(
            "{}: a dead mount is still attached here (fusermount3 -u it first)",
            a.mountpoint.display()
        ),
        Err(e) => bail!("{}: mount point: {e}", a.mountpoint.display()),
    }
    drop(
        ImageLock::try_lock(&a.image)
            .map_err(|_| anyhow!("{}: image is already mounted", a.image.display()))?,
    );
    open_options(&a.prefetch, a.mem_budget.as_deref())?;
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
        "--ready-fd",
        "3",
    ]);
    if let Some(w) = a.writeback_cache {
        cmd.arg(format!("--writeback-cache={w}"));
    }
    if let Some(m) = &a.mem_budget {
        cmd.args(["--mem-budget", m]);
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
        bail!("the mount daemon exited before the mount was ready")
    }
}

fn run_daemon(a: MountArgs) -> Result<()> {
    // SAFETY: the descriptor was set up by our parent (dup2 onto fd 3) and is owned from here on.
    let mut ready = a
        .ready_fd
        .map(|fd| unsafe { std::fs::File::from_raw_fd(fd) });
    let r = daemon_body(&a, &mut ready);
    if let Err(e) = &r {
        if let Some(f) = ready.as_mut() {
            let _ = writeln!(f, "err {e:#}");
        }
    }
    r
}

fn daemon_body(a: &MountArgs, ready: &mut Option<std::fs::File>) -> Result<()> {
    let _lock = ImageLock::try_lock(&a.image)
        .map_err(|_| anyhow!("{}: image is already mounted", a.image.display()))?;
    let (medium, kind) =
        image::open(&a.image).map_err(|e| anyhow!("{}: {e}", a.image.display()))?;
    let opts = FsOptions {
        open: open_options(&a.prefetch, a.mem_budget.as_deref())?,
        ..FsOptions::default()
    };
    let fs = FileSystem::open(medium, &opts).map_err(|e| anyhow!("{}: {e}", a.image.display()))?;
    let rec = fs.recovery().clone();
    let note = format!("{} mount, recovery {:.3} s", rec.kind, rec.seconds);
    eprintln!("nodup: {}: {note}", a.image.display());
    let fsname = a.image.canonicalize().unwrap_or_else(|_| a.image.clone());
    let mopts = MountOptions {
        writeback_cache: a.writeback_cache.unwrap_or(kind == MediumKind::BlockFile),
        threads: a.threads,
        fsname: fsname.to_string_lossy().into_owned(),
        // SAFETY: geteuid cannot fail.
        allow_other: unsafe { libc::geteuid() } == 0,
    };
    let fs = Arc::new(fs);
    let mut ready_taken = ready.take();
    let r = nodup_fs::fuse::serve(fs, &a.mountpoint, &mopts, || {
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
    r.map_err(|e| anyhow!("{}: {e}", a.mountpoint.display()))
}

/// Unescape a path field of /proc/self/mountinfo (`\040` for space etc.).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The image behind a nodup mount point, from /proc/self/mountinfo.
fn mounted_image(mp: &Path) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut found = None;
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(sep) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        if f.len() < sep + 3 || f.len() < 5 {
            continue;
        }
        let src = PathBuf::from(unescape(f[sep + 2]));
        if Path::new(&unescape(f[4])) == mp
            && f[sep + 1].starts_with("fuse")
            && nodup_fs::superblock::probe_file(&src).is_ok()
        {
            found = Some(src);
        }
    }
    found
}

/// `nodup umount`.
pub fn umount(a: UmountArgs) -> Result<()> {
    let mp = a
        .mountpoint
        .canonicalize()
        .with_context(|| format!("{}", a.mountpoint.display()))?;
    let img =
        mounted_image(&mp).ok_or_else(|| anyhow!("{}: not a nodup mount point", mp.display()))?;
    let out = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(&mp)
        .output()
        .or_else(|_| std::process::Command::new("umount").arg(&mp).output())
        .context("running fusermount3")?;
    if !out.status.success() {
        bail!(
            "{}: unmount failed: {}",
            mp.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // The daemon holds the image lock until its clean shutdown (checkpoint) is done.
    let t0 = Instant::now();
    loop {
        match ImageLock::try_lock(&img) {
            Ok(_) => return Ok(()),
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

fn print_stats(v: &serde_json::Value, json: bool) {
    if json {
        println!("{v}");
        return;
    }
    if let Some(o) = v.as_object() {
        for (k, val) in o {
            match val {
                serde_json::Value::Number(n) if k.ends_with("_bytes") => {
                    let b = n.as_u64().unwrap_or(0);
                    println!("{k:>22}: {b} ({:.1} MiB)", b as f64 / (1 << 20) as f64);
                }
                serde_json::Value::Number(n) if k == "dedup_ratio" => {
                    println!("{k:>22}: {:.4}", n.as_f64().unwrap_or(0.0))
                }
                serde_json::Value::String(s) => println!("{k:>22}: {s}"),
                other => println!("{k:>22}: {other}"),
            }
        }
    }
}

/// Open an unmounted image for stats/fsck (read-only unless `write`).
fn open_unmounted(path: &Path, write: bool) -> Result<(ImageLock, FileSystem)> {
    check_image(path)?;
    let lock = ImageLock::try_lock(path).map_err(|_| {
        anyhow!(
            "{}: image is mounted (use the mount point instead, or unmount it first)",
            path.display()
        )
    })?;
    let (medium, _) = image::open(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let opts = FsOptions {
        read_only: !write,
        ..FsOptions::default()
    };
    let fs = FileSystem::open(medium, &opts).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok((lock, fs))
}

/// `nodup stats`.
pub fn stats(a: StatsArgs) -> Result<()> {
    let v = if a.target.is_dir() {
        nodup_fs::ctl::read_stats(&a.target)
            .with_context(|| format!("{}: not a mounted nodup file system", a.target.display()))?
    } else {
        let (_lock, fs) = open_unmounted(&a.target, false)?;
        let v = fs.stats_json();
        fs.shutdown()?;
        v
    };
    print_stats(&v, a.json);
    Ok(())
}

/// `nodup fsck`.
pub fn fsck(a: FsckArgs) -> Result<()> {
    let (_lock, fs) = open_unmounted(&a.image, a.repair)?;
    let mut rep = nodup_fs::fsck::check(&fs, a.repair)?;
    if a.repair && fs.recovery().kind == "failure" {
        let ri = fs.recovery();
        let mut what = format!(
            "failure recovery: replayed {} log records",
            ri.replayed_records
        );
        if let Some(e) = &ri.engine {
            what.push_str(&format!(
                ", {} reference counts fixed, {} entries recreated, {} entries invalidated, {} leaked blocks freed",
                e.refcounts_fixed, e.entries_recreated, e.entries_invalidated, e.leaked_blocks_freed
            ));
        }
        rep.repaired.insert(0, what);
    }
    if !a.repair && fs.recovery().kind == "failure" {
        rep.problems.insert(
            0,
            "image was not unmounted cleanly: failure recovery needed (mount it, or fsck --repair)"
                .into(),
        );
    }
    fs.shutdown()?;
    if a.json {
        println!("{}", serde_json::to_string(&rep)?);
    } else {
        for r in &rep.repaired {
            println!("repaired: {r}");
        }
        for p in &rep.problems {
            println!("problem: {p}");
        }
        println!(
            "nodup fsck: {} inodes ({} files, {} directories), {} block references to {} distinct blocks: {}",
            rep.inodes,
            rep.files,
            rep.directories,
            rep.block_refs,
            rep.distinct_blocks,
            if rep.consistent() { "consistent" } else { "INCONSISTENT" }
        );
    }
    if !rep.consistent() {
        bail!(
            "{}: {} problem(s) found",
            a.image.display(),
            rep.problems.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5m").unwrap(), 3 << 19);
        assert!(parse_size("x").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape("/tmp/a\\040b"), "/tmp/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
