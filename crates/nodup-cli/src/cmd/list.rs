//! `nodup list`: the mounted nodup file systems, from /proc/self/mountinfo, with the policy
//! from each image's superblock and the daemon's pid from the lock it holds (/proc/locks).

use anyhow::Result;
use clap::Args;
use nodup_core::policy::PolicyKind;
use std::path::{Path, PathBuf};

/// Arguments of `nodup list`.
#[derive(Args)]
pub struct ListArgs {
    /// Print one JSON array.
    #[arg(long)]
    pub json: bool,
}

/// One mounted nodup file system.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Mounted {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    pub policy: String,
    pub medium: String,
    /// The daemon serving it (0 when it cannot be found).
    pub pid: u32,
    /// The daemon is gone (killed or crashed): the kernel still has the mount, every access
    /// to it fails with "Transport endpoint is not connected".
    pub dead: bool,
    /// The mount's id in /proc/self/mountinfo (what an open descriptor's fdinfo names).
    #[serde(skip)]
    pub mount_id: u64,
    /// The mount shows the whole file system (its root is the file system's root), not a
    /// bind mount of a directory inside it.
    #[serde(skip)]
    pub whole: bool,
}

/// The way back from a dead mount: `nodup umount` detaches it (fusermount3 works without the
/// daemon), and a new mount runs the image's failure recovery.
fn what_to_do(m: &Mounted) -> String {
    format!(
        "run `nodup umount {}`, then mount {} again, which recovers it",
        m.mountpoint.display(),
        m.image.display()
    )
}

/// Whether an access to `path` failed because the FUSE daemon behind it is gone.
fn is_dead(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
}

/// If `path` is on a nodup mount whose daemon is gone, the error to give for it: what happened
/// and what to do. Such a path answers nothing but ENOTCONN, which would otherwise read as "no
/// such file" or a bare "Transport endpoint is not connected".
pub fn dead_mount_error(path: &Path) -> Option<anyhow::Error> {
    if !is_dead(path) {
        return None;
    }
    // The mount it is on: the longest dead nodup mount point the absolute path starts with
    // (the path itself cannot be canonicalized: resolving it needs the dead daemon).
    let abs = std::env::current_dir()
        .map(|c| c.join(path))
        .unwrap_or_else(|_| path.to_path_buf());
    let m = mounted()
        .into_iter()
        .filter(|m| m.dead && abs.starts_with(&m.mountpoint))
        .max_by_key(|m| m.mountpoint.as_os_str().len());
    let d = path.display();
    Some(match m {
        Some(m) => {
            let which = if abs == m.mountpoint {
                "of this nodup mount".to_string()
            } else {
                format!("of the nodup mount {}", m.mountpoint.display())
            };
            anyhow::anyhow!(
                "{d}: the daemon {which} is gone (killed or crashed); {}",
                what_to_do(&m)
            )
        }
        // Not a nodup mount (none is listed for the path): `nodup umount` would refuse it.
        None => anyhow::anyhow!(
            "{d}: the file system daemon behind this path is gone (Transport endpoint is not \
             connected); unmount it (`fusermount3 -u`) and mount it again"
        ),
    })
}

/// Every nodup mount of this mount namespace.
pub fn mounted() -> Vec<Mounted> {
    nodup_fs::mountinfo::entries()
        .into_iter()
        .filter(|e| e.fstype == "fuse.nodup")
        .map(|e| {
            let (policy, medium) = match nodup_fs::superblock::probe_file(&e.source) {
                Ok((sb, _, _)) => (
                    PolicyKind::from_u32(sb.policy)
                        .map_or("unknown", |p| p.name())
                        .to_string(),
                    sb.medium_kind().name().to_string(),
                ),
                Err(_) => ("unknown".into(), "unknown".into()),
            };
            Mounted {
                pid: lock_holder(&e.source).unwrap_or(0),
                dead: is_dead(&e.mountpoint),
                mount_id: e.id,
                whole: e.root == Path::new("/"),
                mountpoint: e.mountpoint,
                image: e.source,
                policy,
                medium,
            }
        })
        .collect()
}

/// The pid holding the flock on `path` (the mount daemon holds its image's lock).
fn lock_holder(path: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    let (maj, min) = (libc::major(m.dev()), libc::minor(m.dev()));
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    // "1: FLOCK  ADVISORY  WRITE 1234 00:2b:5678 0 EOF": pid, then major:minor:inode (hex
    // device numbers, decimal inode).
    for l in locks.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || f[1] != "FLOCK" {
            continue;
        }
        let id: Vec<&str> = f[5].split(':').collect();
        if id.len() != 3 {
            continue;
        }
        let same = u32::from_str_radix(id[0], 16).ok() == Some(maj)
            && u32::from_str_radix(id[1], 16).ok() == Some(min)
            && id[2].parse::<u64>().ok() == Some(m.ino());
        if same {
            return f[4].parse().ok();
        }
    }
    None
}

/// `nodup list`: a dead mount (daemon gone) shows "dead" as its pid (`"dead": true` in JSON),
/// with a line on stderr saying what to do.
pub fn list(a: ListArgs) -> Result<()> {
    let v = mounted();
    if a.json {
        println!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    if v.is_empty() {
        println!("no nodup file system is mounted");
        return Ok(());
    }
    let w = v
        .iter()
        .map(|m| m.mountpoint.display().to_string().len())
        .max()
        .unwrap_or(0)
        .max(10);
    println!(
        "{:<w$}  {:<11}  {:<9}  {:>7}  IMAGE",
        "MOUNTPOINT", "POLICY", "MEDIUM", "PID"
    );
    for m in &v {
        // A dead mount has no daemon, so no pid: the column says so instead of a 0.
        let pid = if m.dead {
            "dead".to_string()
        } else {
            m.pid.to_string()
        };
        println!(
            "{:<w$}  {:<11}  {:<9}  {:>7}  {}",
            m.mountpoint.display(),
            m.policy,
            m.medium,
            pid,
            m.image.display()
        );
    }
    for m in v.iter().filter(|m| m.dead) {
        eprintln!(
            "nodup: {}: its daemon is gone (killed or crashed); {}",
            m.mountpoint.display(),
            what_to_do(m)
        );
    }
    Ok(())
}
