//! The mount daemon's malloc setting. glibc gives every thread a cache of freed chunks
//! (tcache, up to 1 KiB each by default) that it never hands back; across the daemon's dozen
//! threads those caches and the chunks they pin held about 1 MiB that no structure was using
//! (measured: `smart`'s growth beyond its budget fell from 1.0 to 0.1 MiB without them, `none`'s
//! from 0.5 to 0.3, with no throughput change in fio). The daemon therefore runs with the cache
//! limited to chunks of at most [`TCACHE_MAX`] bytes, through `GLIBC_TUNABLES`, which glibc
//! reads only at process start: the spawned daemon gets it in its environment, and a
//! `--foreground` mount re-executes itself once with it. A `tcache_max` the caller already set
//! is left as it is. Other C libraries ignore the variable. (glibc 2.36 rewrites the variable
//! in place while parsing it, so `/proc/PID/environ` shows only the first of several
//! tunables; all of them apply: gdb shows `mp_.tcache_max_bytes` 64 beside a caller's
//! `arena_max`.)

use std::ffi::{OsStr, OsString};

/// Largest chunk (bytes) a thread's cache keeps.
pub const TCACHE_MAX: u32 = 64;

/// The environment variable glibc reads its tunables from.
pub const VAR: &str = "GLIBC_TUNABLES";

/// The `GLIBC_TUNABLES` value the daemon should run with, given the current one; `None` when
/// the current one already sets the cache limit (the caller's choice wins).
pub fn daemon_tunables(current: Option<&OsStr>) -> Option<OsString> {
    let ours = format!("glibc.malloc.tcache_max={TCACHE_MAX}");
    match current {
        Some(c) if !c.is_empty() => {
            let s = c.to_string_lossy();
            if s.split(':')
                .any(|t| t.starts_with("glibc.malloc.tcache_max="))
            {
                return None;
            }
            let mut v = c.to_os_string();
            v.push(":");
            v.push(&ours);
            Some(v)
        }
        _ => Some(ours.into()),
    }
}

/// Set in the re-executed process, so that it never re-executes again (a loader that drops
/// `GLIBC_TUNABLES`, as for a set-id binary, would otherwise make that a loop).
const REEXECUTED: &str = "NODUP_MALLOC_REEXECUTED";

/// For `--foreground`: run this same command again with the setting when the process started
/// without it, before anything was read (a key file on a pipe can be read once). Returns only
/// when that was not needed or the re-execution failed (the mount then goes on with glibc's
/// defaults).
pub fn reexec_with_tunables() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os(REEXECUTED).is_some() {
        return;
    }
    let Some(v) = daemon_tunables(std::env::var_os(VAR).as_deref()) else {
        return;
    };
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(VAR, v)
        .env(REEXECUTED, "1")
        .exec();
    eprintln!("nodup: warning: could not restart with {VAR} set ({err}); going on with glibc's malloc defaults");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_the_limit_and_keeps_the_callers_settings() {
        assert_eq!(
            daemon_tunables(None).unwrap(),
            OsString::from("glibc.malloc.tcache_max=64")
        );
        assert_eq!(
            daemon_tunables(Some(OsStr::new(""))).unwrap(),
            OsString::from("glibc.malloc.tcache_max=64")
        );
        assert_eq!(
            daemon_tunables(Some(OsStr::new("glibc.malloc.arena_max=2"))).unwrap(),
            OsString::from("glibc.malloc.arena_max=2:glibc.malloc.tcache_max=64")
        );
        assert!(daemon_tunables(Some(OsStr::new("glibc.malloc.tcache_max=1032"))).is_none());
        // glibc does not trim: a spaced name is not the caller's setting, and ours is added.
        assert_eq!(
            daemon_tunables(Some(OsStr::new(" glibc.malloc.tcache_max=0"))).unwrap(),
            OsString::from(" glibc.malloc.tcache_max=0:glibc.malloc.tcache_max=64")
        );
        assert!(daemon_tunables(Some(OsStr::new(
            "glibc.malloc.arena_max=1:glibc.malloc.tcache_max=0"
        )))
        .is_none());
    }
}
