//! `nodup ctl`: commands to a mounted file system through its control attribute: a checkpoint
//! now, and for `smart` the worker's rate and the resource readings its adaptation follows
//! (for experiments: a battery level or low-power mode on a machine that has neither), and a
//! wait until its worker is idle.

use super::list::{dead_mount_error, mounted, Mounted};
use anyhow::{anyhow, bail, Result};
use clap::Args;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Arguments of `nodup ctl`.
#[derive(Args)]
pub struct CtlArgs {
    /// Mount point of a nodup file system (its root; any other path is refused).
    pub mountpoint: PathBuf,
    /// Write a checkpoint now.
    #[arg(long)]
    pub checkpoint: bool,
    /// smart: blocks per second of the out-of-line worker (0 pauses it).
    #[arg(long, value_name = "N")]
    pub worker_rate: Option<u64>,
    /// smart: low-power mode (no inline dedup, worker paused): on, off, or auto (measured).
    #[arg(long, value_parser = ["on", "off", "auto"])]
    pub low_power: Option<String>,
    /// smart: battery level 0-100 the rate follows, or auto (the machine's, if any). Values
    /// of this and the two readings below are checked before anything is sent.
    #[arg(long, value_name = "PERCENT|auto")]
    pub battery: Option<String>,
    /// smart: CPU utilisation 0-1 to act on, or auto (measured).
    #[arg(long, value_name = "F|auto")]
    pub cpu_busy: Option<String>,
    /// smart: device utilisation 0-1 to act on, or auto (measured).
    #[arg(long, value_name = "F|auto")]
    pub device_busy: Option<String>,
    /// smart: after the other commands, wait until the worker has nothing queued (a cheap
    /// query every 0.2 s; fails after --timeout seconds). Only smart has an out-of-line
    /// worker: on another policy's mount it is refused before anything is sent.
    #[arg(long)]
    pub wait_idle: bool,
    /// Seconds --wait-idle waits at most.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 600,
        requires = "wait_idle"
    )]
    pub timeout: u64,
}

/// `nodup ctl`.
pub fn ctl(a: CtlArgs) -> Result<()> {
    let mut cmds: Vec<String> = Vec::new();
    if a.checkpoint {
        cmds.push("checkpoint".into());
    }
    if let Some(r) = a.worker_rate {
        cmds.push(format!("worker-rate={r}"));
    }
    for (k, v) in [
        ("low-power", &a.low_power),
        ("battery", &a.battery),
        ("cpu-busy", &a.cpu_busy),
        ("device-busy", &a.device_busy),
    ] {
        if let Some(v) = v {
            cmds.push(format!("{k}={v}"));
        }
    }
    if cmds.is_empty() && !a.wait_idle {
        bail!("nothing to do: give at least one of --checkpoint, --worker-rate, --low-power, --battery, --cpu-busy, --device-busy, --wait-idle");
    }
    // The daemon answers a bad value only with EINVAL, which cannot tell a malformed value
    // from one out of range or from an option its policy lacks: what can be checked here is,
    // so each of those gets its own message.
    check_reading("--battery", &a.battery, 100.0, "a percentage")?;
    check_reading("--cpu-busy", &a.cpu_busy, 1.0, "a fraction")?;
    check_reading("--device-busy", &a.device_busy, 1.0, "a fraction")?;
    let (root, mounted) = open_root(&a.mountpoint)?;
    let mp = a.mountpoint.display();
    let policy = mounted.policy.as_str();
    let smart_only: Vec<&str> = [
        ("--worker-rate", a.worker_rate.is_some()),
        ("--low-power", a.low_power.is_some()),
        ("--battery", a.battery.is_some()),
        ("--cpu-busy", a.cpu_busy.is_some()),
        ("--device-busy", a.device_busy.is_some()),
    ]
    .iter()
    .filter(|(_, given)| *given)
    .map(|(flag, _)| *flag)
    .collect();
    if policy != "smart" && !smart_only.is_empty() {
        bail!(
            "{mp}: {} only for policy smart, and this mount's policy is {policy}",
            if smart_only.len() == 1 {
                format!("{} is", smart_only[0])
            } else {
                format!("{} are", smart_only.join(", "))
            }
        );
    }
    // Refused, not taken as already idle: asking to wait for a worker that does not exist is a
    // mistake about the mount (as the other smart options are), and found before any command.
    if policy != "smart" && a.wait_idle {
        bail!(
            "{mp}: --wait-idle is only for policy smart (only a smart mount has an out-of-line \
             worker to wait for), and this mount's policy is {policy}"
        );
    }
    for c in cmds {
        nodup_fs::ctl::command_fd(root.as_fd(), &c).map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => anyhow::anyhow!("{mp}: \"{c}\" refused by the daemon"),
            Some(libc::ENODATA) | Some(libc::ENOTSUP) => {
                anyhow::anyhow!("{mp}: not a nodup mount")
            }
            _ => anyhow::Error::new(e).context(format!("{mp}: {c}")),
        })?;
    }
    if a.wait_idle {
        let t0 = std::time::Instant::now();
        loop {
            match nodup_fs::ctl::worker_idle_fd(root.as_fd()) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {
                    bail!("{mp}: no out-of-line worker to wait for (not a smart mount)")
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => {
                    bail!("{mp}: not a nodup mount")
                }
                Err(e) => return Err(anyhow::Error::new(e).context(format!("{mp}: worker state"))),
            }
            if t0.elapsed().as_secs() >= a.timeout {
                bail!(
                    "{mp}: the worker still had work queued after {} s",
                    a.timeout
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
    Ok(())
}

/// `path` opened once, and checked through that descriptor to be the root of a nodup mount.
/// The control attribute is answered only at the root of a mount: anywhere else setxattr would
/// store the command as a plain attribute and report success. The commands then go through
/// this descriptor, so an unmount after the check cannot make them land on the directory
/// underneath, as a second lookup of the path would; and while it is open, a plain unmount
/// fails as busy (a lazy one leaves it on the mount). The mount table says which mounts are
/// nodup's roots (and their policy) without asking the daemon for its stats, whose report
/// reads every entry slot and grows the daemon's memory.
fn open_root(path: &Path) -> Result<(File, Mounted)> {
    let not_nodup = || anyhow!("{}: not a mounted nodup file system", path.display());
    if let Some(e) = dead_mount_error(path) {
        return Err(e);
    }
    let root = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => not_nodup(),
            // The daemon died since the check above.
            Some(libc::ENOTCONN) => dead_mount_error(path).unwrap_or_else(not_nodup),
            _ => anyhow!("{}: {}", path.display(), super::plain(&e)),
        })?;
    let id = mount_id(&root).ok_or_else(not_nodup)?;
    if !is_mount_root(&root) {
        return Err(not_nodup());
    }
    // A bind mount of a directory inside a nodup mount is on it too, but is not its root.
    let mounted = mounted()
        .into_iter()
        .find(|m| m.mount_id == id && m.whole)
        .ok_or_else(not_nodup)?;
    Ok((root, mounted))
}

/// The id of the mount the open file `f` is on, as /proc/self/mountinfo numbers mounts (from
/// /proc/self/fdinfo).
fn mount_id(f: &File) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", f.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether the open directory `d` is the root of its mount: its "..", which the kernel takes
/// across the mount, is on another device (or is `d` itself, at `/`).
fn is_mount_root(d: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = d.metadata() else {
        return false;
    };
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut up: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `d` is open, the path is NUL terminated and `up` is writable.
    let r = unsafe { libc::fstatat(d.as_raw_fd(), c"..".as_ptr(), &mut up, 0) };
    r == 0 && (up.st_dev != m.dev() || up.st_ino == m.ino())
}

/// A resource reading given by hand: `auto`, or a number from 0 to `max` (`what` names it).
fn check_reading(flag: &str, v: &Option<String>, max: f64, what: &str) -> Result<()> {
    let Some(v) = v.as_deref() else {
        return Ok(());
    };
    if v == "auto" {
        return Ok(());
    }
    let Ok(x) = v.parse::<f64>() else {
        bail!("{flag} {v}: not a number ({what} from 0 to {max}, or auto)");
    };
    if !(0.0..=max).contains(&x) {
        bail!("{flag} {v}: out of range ({what} from 0 to {max}, or auto)");
    }
    Ok(())
}
