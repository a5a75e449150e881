//! `mount.fuse.nodup`: the mount(8) helper, so `mount -t fuse.nodup IMAGE DIR -o OPTS` and an
//! /etc/fstab line work. mount(8) runs `/sbin/mount.fuse.nodup IMAGE DIR [-sfnv] [-o OPTS]`;
//! `make install` links that name to the nodup binary, which turns the call into
//! `nodup mount`.

use super::mount::{mount, MountArgs};
use anyhow::{bail, Result};
use std::ffi::OsString;
use std::path::PathBuf;

/// Names the binary answers to as a mount helper.
pub const NAMES: [&str; 2] = ["mount.fuse.nodup", "mount.nodup"];

/// Options mount(8) and fstab pass that mean nothing to a nodup mount, or that it already
/// does (a FUSE mount is always nosuid/nodev unless asked, which nodup asks).
const IGNORED: [&str; 18] = [
    "rw", "defaults", "auto", "noauto", "user", "users", "nouser", "owner", "group", "nofail",
    "_netdev", "exec", "noexec", "suid", "nosuid", "dev", "nodev", "async",
];

/// Run as a mount helper with the arguments after the program name.
pub fn run(args: Vec<OsString>) -> Result<()> {
    let mut pos: Vec<PathBuf> = Vec::new();
    let mut opts: Vec<String> = Vec::new();
    let (mut fake, mut sloppy) = (false, false);
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy().into_owned();
        match s.as_str() {
            "-o" => match it.next() {
                Some(o) => opts.extend(o.to_string_lossy().split(',').map(String::from)),
                None => bail!("-o needs a value"),
            },
            "-t" => {
                it.next();
            }
            _ if s.starts_with("-o") && s.len() > 2 => {
                opts.extend(s[2..].split(',').map(String::from))
            }
            _ if s.starts_with('-') && s.len() > 1 && !s.starts_with("--") => {
                for c in s[1..].chars() {
                    match c {
                        'f' => fake = true,
                        's' => sloppy = true,
                        'n' | 'v' => {}
                        _ => bail!("unknown flag -{c}"),
                    }
                }
            }
            _ => pos.push(PathBuf::from(a)),
        }
    }
    let [image, mountpoint]: [PathBuf; 2] = match pos.try_into() {
        Ok(x) => x,
        Err(_) => bail!("usage: mount.fuse.nodup IMAGE MOUNTPOINT [-o OPTIONS]"),
    };
    let mut m = MountArgs {
        image,
        mountpoint,
        foreground: false,
        prefetch: "cbp".into(),
        writeback_cache: None,
        mem_budget: None,
        smart: Default::default(),
        selective: Default::default(),
        encrypt_key_file: None,
        threads: 4,
        split_writes: 0,
        atime: "relatime".into(),
        nonempty: false,
        log_file: None,
        ready_fd: None,
    };
    for o in opts.iter().filter(|o| !o.is_empty()) {
        let (k, v) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o.as_str(), None),
        };
        match (k, v) {
            (k, None) if IGNORED.contains(&k) => {}
            (k, _) if k.starts_with("x-") || k == "comment" => {}
            ("ro", None) => bail!("read-only mounts are not supported (mount it rw)"),
            ("prefetch", Some(v)) => m.prefetch = v.into(),
            ("threads", Some(v)) => match v.parse::<u16>() {
                Ok(n) if (1..=64).contains(&n) => m.threads = n,
                _ => bail!("threads={v}: a number from 1 to 64"),
            },
            ("split_writes" | "split-writes", Some(v)) => match v.parse::<u16>() {
                Ok(n) if n <= 8 => m.split_writes = n,
                _ => bail!("split_writes={v}: a number from 0 (one per core) to 8"),
            },
            ("writeback_cache", None) => m.writeback_cache = Some(true),
            ("writeback_cache", Some(v)) => match v {
                "true" | "1" | "yes" => m.writeback_cache = Some(true),
                "false" | "0" | "no" => m.writeback_cache = Some(false),
                _ => bail!("writeback_cache={v}: true or false"),
            },
            ("nonempty", None) => m.nonempty = true,
            ("relatime" | "atime", None) => m.atime = "relatime".into(),
            ("strictatime" | "noatime", None) => m.atime = k.into(),
            ("log_file" | "log-file", Some(v)) => m.log_file = Some(v.into()),
            ("mem_budget" | "mem-budget", Some(v)) => m.mem_budget = Some(v.into()),
            ("encrypt_key_file" | "encrypt-key-file", Some(v)) => {
                m.encrypt_key_file = Some(v.into())
            }
            ("fp_cache" | "fp-cache", Some(v)) => m.selective.fp_cache = Some(v.into()),
            ("prefetch_cache" | "prefetch-cache", Some(v)) => {
                m.selective.prefetch_cache = Some(v.into())
            }
            ("refresh_ms" | "refresh-ms", Some(v)) => match v.parse::<u64>() {
                Ok(n) => m.selective.refresh_ms = Some(n),
                Err(_) => bail!("refresh_ms={v}: a number of milliseconds"),
            },
            _ if sloppy => {}
            _ => bail!("unknown mount option {o:?} (nodup takes prefetch=, threads=, split_writes=, writeback_cache, nonempty, log_file=, mem_budget=, encrypt_key_file=, fp_cache=, prefetch_cache=, refresh_ms=, relatime, strictatime, noatime)"),
        }
    }
    if fake {
        return Ok(());
    }
    mount(m)
}
