//! `mount.fuse.nodup`: the mount(8) helper, so `mount -t fuse.nodup IMAGE DIR -o OPTS` and an
//! /etc/fstab line work. mount(8) runs `/sbin/mount.fuse.nodup IMAGE DIR [-sfnv] [-o OPTS]`;
//! `make install` links that name to the nodup binary, which turns the call into
//! `nodup mount`.

use super::mount::{mount, MountArgs};
use anyhow::{bail, Result};
use nodup_core::policy::smart::Eviction;
use nodup_fs::fuse::kernel::DirectWrites;
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
    let mut m = defaults(image, mountpoint);
    parse_options(&mut m, &opts, sloppy)?;
    if fake {
        return Ok(());
    }
    // `nodup mount` names its long options; the user of the helper typed `-o` options.
    mount(m).map_err(|e| anyhow::anyhow!(as_mount_options(&super::plain_error(&e))))
}

/// `msg` with each `--long-option` that has a `-o` spelling named as that option
/// (`--mem-budget` becomes `mem_budget`; a hint in parentheses, `(-o nonempty ...`).
fn as_mount_options(msg: &str) -> String {
    let known: Vec<&str> = KNOWN
        .split(',')
        .map(|k| k.trim().trim_end_matches('='))
        .collect();
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(i) = rest.find("--") {
        let (before, after) = rest.split_at(i);
        out.push_str(before);
        let name_len = after[2..]
            .find(|c: char| !(c.is_ascii_lowercase() || c == '-'))
            .unwrap_or(after.len() - 2);
        let opt = after[2..2 + name_len].replace('-', "_");
        if known.contains(&opt.as_str()) {
            if out.ends_with('(') {
                out.push_str("-o ");
            }
            out.push_str(&opt);
        } else {
            out.push_str(&after[..2 + name_len]);
        }
        rest = &after[2 + name_len..];
    }
    out.push_str(rest);
    out
}

/// A mount of `image` at `mountpoint` with `nodup mount`'s defaults, before `-o`.
fn defaults(image: PathBuf, mountpoint: PathBuf) -> MountArgs {
    MountArgs {
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
        split_writes: 1,
        huge_buffers: true,
        stream_data: None,
        async_writes: false,
        direct_writes: None,
        atime: "relatime".into(),
        nonempty: false,
        log_file: None,
        ready_fd: None,
    }
}

/// What `-o` accepts (the error for an unknown option lists it).
const KNOWN: &str = "prefetch=, threads=, split_writes=, huge_buffers=, stream_data=, \
    async_writes, direct_writes, writeback_cache, nonempty, log_file=, mem_budget=, encrypt_key_file=, fp_cache=, \
    prefetch_cache=, refresh_ms=, refresh_ops=, eviction=, selectivity=, min_run=, read_cache=, \
    worker_rate=, relatime, strictatime, noatime";

/// Apply mount(8)'s `-o` options to `m` (`sloppy`: ignore unknown ones, as `-s` asks).
fn parse_options(m: &mut MountArgs, opts: &[String], sloppy: bool) -> Result<()> {
    let number = |k: &str, v: &str| -> Result<u64> {
        v.parse::<u64>()
            .map_err(|_| anyhow::anyhow!("{k}={v}: a whole number"))
    };
    for o in opts.iter().filter(|o| !o.is_empty()) {
        let (k, v) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o.as_str(), None),
        };
        // Both spellings, as the long options (`--fp-cache`) and as fstab habit (`fp_cache`).
        let key = k.replace('-', "_");
        match (key.as_str(), v) {
            (k, None) if IGNORED.contains(&k) => {}
            (k, _) if k.starts_with("x_") || k == "comment" => {}
            ("ro", None) => bail!("read-only mounts are not supported (mount it rw)"),
            ("prefetch", Some(v)) => m.prefetch = v.into(),
            ("threads", Some(v)) => match v.parse::<u16>() {
                Ok(n) if (1..=64).contains(&n) => m.threads = n,
                _ => bail!("threads={v}: a number from 1 to 64"),
            },
            ("split_writes", Some(v)) => match v.parse::<u16>() {
                Ok(n) if n <= 8 => m.split_writes = n,
                _ => bail!("split_writes={v}: a number from 0 (one per core) to 8"),
            },
            ("huge_buffers", None) => m.huge_buffers = true,
            ("huge_buffers", Some(v)) => m.huge_buffers = boolean(k, v)?,
            ("stream_data", None) => m.stream_data = Some(true),
            ("stream_data", Some(v)) => m.stream_data = Some(boolean(k, v)?),
            ("async_writes", None) => m.async_writes = true,
            ("async_writes", Some(v)) => m.async_writes = boolean(k, v)?,
            ("direct_writes", None) => m.direct_writes = Some(DirectWrites::WriteOnly),
            ("direct_writes", Some(v)) => {
                m.direct_writes =
                    Some(DirectWrites::parse(v).map_err(|e| anyhow::anyhow!("direct_writes={e}"))?)
            }
            ("writeback_cache", None) => m.writeback_cache = Some(true),
            ("writeback_cache", Some(v)) => m.writeback_cache = Some(boolean(k, v)?),
            ("nonempty", None) => m.nonempty = true,
            ("relatime" | "atime", None) => m.atime = "relatime".into(),
            ("strictatime" | "noatime", None) => m.atime = key.clone(),
            ("log_file", Some(v)) => m.log_file = Some(v.into()),
            ("mem_budget", Some(v)) => m.mem_budget = Some(v.into()),
            ("encrypt_key_file", Some(v)) => m.encrypt_key_file = Some(v.into()),
            ("fp_cache", Some(v)) => m.selective.fp_cache = Some(v.into()),
            ("prefetch_cache", Some(v)) => m.selective.prefetch_cache = Some(v.into()),
            ("refresh_ms", Some(v)) => m.selective.refresh_ms = Some(number(k, v)?),
            ("refresh_ops", Some(v)) => m.selective.refresh_ops = Some(number(k, v)?),
            ("eviction", Some(v)) => match Eviction::from_name(v) {
                Some(_) => m.smart.eviction = Some(v.into()),
                None => {
                    let names: Vec<&str> = Eviction::ALL.iter().map(|e| e.name()).collect();
                    bail!("eviction={v}: one of {}", names.join(", "))
                }
            },
            // Checked with the other smart options when the mount builds them.
            ("selectivity", Some(v)) => m.smart.selectivity = Some(v.into()),
            ("min_run", Some(v)) => match v.parse::<u32>() {
                Ok(n) if (1..=64).contains(&n) => m.smart.min_run = Some(n),
                _ => bail!("min_run={v}: a number from 1 to 64"),
            },
            ("read_cache", None) => m.smart.read_cache = Some(true),
            ("read_cache", Some(v)) => m.smart.read_cache = Some(boolean(k, v)?),
            ("worker_rate", Some(v)) => m.smart.worker_rate = Some(number(k, v)?),
            _ if sloppy => {}
            _ => bail!("unknown mount option {o:?} (nodup takes {KNOWN})"),
        }
    }
    Ok(())
}

/// A mount option's boolean value.
fn boolean(k: &str, v: &str) -> Result<bool> {
    match v {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => bail!("{k}={v}: true or false"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(opts: &str, sloppy: bool) -> Result<MountArgs> {
        let mut m = defaults("img".into(), "mnt".into());
        let o: Vec<String> = opts.split(',').map(String::from).collect();
        parse_options(&mut m, &o, sloppy)?;
        Ok(m)
    }

    #[test]
    fn every_policy_option_reaches_the_mount() {
        let m = parse(
            "rw,noatime,mem_budget=3M,eviction=lru,selectivity=adaptive,min-run=2,\
             read_cache=off,worker_rate=0,fp_cache=64K,prefetch-cache=0,refresh_ms=500,\
             refresh_ops=1000,split_writes=2,huge-buffers=off,stream_data=no,writeback_cache,\
             async-writes,direct_writes=false,x-systemd.automount",
            false,
        )
        .unwrap();
        assert_eq!(m.atime, "noatime");
        assert_eq!(m.mem_budget.as_deref(), Some("3M"));
        assert_eq!(m.smart.eviction.as_deref(), Some("lru"));
        assert_eq!(m.smart.selectivity.as_deref(), Some("adaptive"));
        assert_eq!(m.smart.min_run, Some(2));
        assert_eq!(m.smart.read_cache, Some(false));
        assert_eq!(m.smart.worker_rate, Some(0));
        assert_eq!(m.selective.fp_cache.as_deref(), Some("64K"));
        assert_eq!(m.selective.prefetch_cache.as_deref(), Some("0"));
        assert_eq!(m.selective.refresh_ms, Some(500));
        assert_eq!(m.selective.refresh_ops, Some(1000));
        assert_eq!(m.split_writes, 2);
        assert!(!m.huge_buffers);
        assert_eq!(m.stream_data, Some(false));
        assert_eq!(m.writeback_cache, Some(true));
        assert!(m.async_writes);
        assert_eq!(m.direct_writes, Some(DirectWrites::Off));
    }

    #[test]
    fn mount_errors_name_the_mount_options() {
        assert_eq!(
            as_mount_options("--mem-budget: policy light keeps no memory budget"),
            "mem_budget: policy light keeps no memory budget"
        );
        assert_eq!(
            as_mount_options("x: is not empty (--nonempty to do it anyway)"),
            "x: is not empty (-o nonempty to do it anyway)"
        );
        assert_eq!(
            as_mount_options("--eviction and --worker-rate; --foreground --"),
            "eviction and worker_rate; --foreground --"
        );
    }

    #[test]
    fn bad_values_and_unknown_options_are_refused_with_their_name() {
        for (o, says) in [
            ("eviction=fifo", "eviction=fifo"),
            ("min_run=0", "min_run=0"),
            ("worker_rate=fast", "worker_rate=fast"),
            ("read_cache=maybe", "read_cache=maybe"),
            ("refresh_ops=-1", "refresh_ops=-1"),
            ("bogus=1", "unknown mount option \"bogus=1\""),
            ("direct_writes=sometimes", "direct_writes=sometimes"),
            ("ro", "read-only"),
        ] {
            let e = parse(o, false).expect_err(o).to_string();
            assert!(e.contains(says), "{o}: {e}");
        }
        // -s (sloppy) skips unknown options but still checks the known ones.
        assert!(parse("bogus=1,threads=8", true).is_ok_and(|m| m.threads == 8));
        assert!(parse("bogus=1,threads=99", true).is_err());
    }
}
