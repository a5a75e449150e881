//! `nodup du PATH...`: per file and per directory, the bytes it refers to (logical), what
//! deleting it would free (exclusive) and what it shares with the rest of the file system,
//! answered by the mount's daemon through the virtual xattr `user.nodup.du`.

use super::size::bytes;
use anyhow::{anyhow, Result};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `nodup du`.
#[derive(Args)]
pub struct DuArgs {
    /// Files or directories on a nodup mount (a directory counts everything below it, each
    /// block once).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Print one JSON array, an object per path.
    #[arg(long)]
    pub json: bool,
    /// Exact byte counts instead of KiB/MiB/GiB.
    #[arg(long, short = 'b')]
    pub bytes: bool,
}

/// One path's accounting.
#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    path: String,
    logical_bytes: u64,
    exclusive_bytes: u64,
    shared_bytes: u64,
}

/// `nodup du`.
pub fn du(a: DuArgs) -> Result<()> {
    let mut rows = Vec::new();
    for p in &a.paths {
        let d = p.display();
        if let Err(e) = std::fs::metadata(p) {
            if let Some(dead) = super::list::dead_mount_error(p) {
                return Err(dead);
            }
            return Err(anyhow!("{d}: {}", super::plain(&e)));
        }
        let v = nodup_fs::ctl::read_json(p, nodup_fs::ctl::USAGE_XATTR).map_err(|e| {
            match e.raw_os_error() {
                Some(libc::ENODATA) | Some(libc::ENOTSUP) => {
                    anyhow!("{d}: not on a mounted nodup file system")
                }
                _ => anyhow!("{d}: {}", super::plain(&e)),
            }
        })?;
        let g = |k: &str| v[k].as_u64().unwrap_or(0);
        rows.push(Row {
            path: d.to_string(),
            logical_bytes: g("logical_bytes"),
            exclusive_bytes: g("exclusive_bytes"),
            shared_bytes: g("shared_bytes"),
        });
    }
    if a.json {
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(());
    }
    let fmt = |b: u64| if a.bytes { b.to_string() } else { bytes(b) };
    println!(
        "{:>12}  {:>12}  {:>12}  PATH",
        "LOGICAL", "EXCLUSIVE", "SHARED"
    );
    for r in rows {
        println!(
            "{:>12}  {:>12}  {:>12}  {}",
            fmt(r.logical_bytes),
            fmt(r.exclusive_bytes),
            fmt(r.shared_bytes),
            r.path
        );
    }
    Ok(())
}
