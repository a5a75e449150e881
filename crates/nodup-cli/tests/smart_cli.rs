//! Policy `smart` through the command line and a real mount: mkfs with a budget, the inline
//! misses left to the worker (paused, then resumed with `nodup ctl`), the stats it reports, the
//! options refused where they mean nothing, and the data intact across a remount and fsck.

mod common;
use common::*;
use std::fs;
use std::time::{Duration, Instant};

fn blocks(first: u64, n: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(0x5ab);
    let mut out = vec![0u8; (n * 4096) as usize];
    for (k, b) in out.chunks_mut(4096).enumerate() {
        rng.fill(b);
        b[..8].copy_from_slice(&(first + k as u64).to_le_bytes());
    }
    out
}

/// The GLIBC_TUNABLES value in process `pid`'s environment ("" when unset).
fn tunables_of(pid: i32) -> String {
    let env = fs::read(format!("/proc/{pid}/environ")).unwrap();
    env.split(|&b| b == 0)
        .find_map(|v| v.strip_prefix(b"GLIBC_TUNABLES="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

/// `--foreground` re-executes itself once with the malloc setting: the process serving the
/// mount (the same pid) has it in its environment, with the marker that stops a second
/// re-execution.
#[test]
fn a_foreground_mount_gets_the_malloc_setting() {
    if !fuse_available() {
        return;
    }
    let f = Fixture::new("fgmalloc", "64M", &[]);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nodup"))
        .args([
            "mount",
            f.img.to_str().unwrap(),
            f.mnt.to_str().unwrap(),
            "--foreground",
        ])
        .env_remove("GLIBC_TUNABLES")
        .env_remove("NODUP_MALLOC_REEXECUTED")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !nodup(&["stats", f.mnt.to_str().unwrap(), "--json"])
        .status
        .success()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the mount did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = child.id() as i32;
    assert_eq!(
        daemon_pid(&f.img),
        pid,
        "the re-executed process keeps the pid"
    );
    assert_eq!(tunables_of(pid), "glibc.malloc.tcache_max=64");
    let env = fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(env
        .split(|&b| b == 0)
        .any(|v| v == b"NODUP_MALLOC_REEXECUTED=1"));
    ok(nodup(&["umount", f.mnt.to_str().unwrap()]));
    assert!(child.wait().unwrap().success());
}

fn one_line_error(o: &std::process::Output, has: &str) {
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains(has), "{e}");
}

#[test]
fn smart_through_a_mount() {
    if !fuse_available() {
        return;
    }
    let f = Fixture::new(
        "smart",
        "256M",
        &["--policy", "smart", "--mem-budget", "128K"],
    );
    f.mount(&["--worker-rate", "0"]);
    // The daemon runs with glibc's thread caches limited (their hoard made budgets look
    // overspent). Only checked when this process has no GLIBC_TUNABLES of its own: glibc
    // rewrites the variable in place while parsing it, so /proc shows only the first of
    // several tunables (all of them apply).
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        assert_eq!(
            tunables_of(daemon_pid(&f.img)),
            "glibc.malloc.tcache_max=64"
        );
    }
    // 4000 unique blocks: far more fingerprints than 128 KiB holds in memory.
    let data = blocks(0, 4000);
    fs::write(f.path("a"), &data).unwrap();
    fs::write(f.path("b"), &data).unwrap();
    let s = f.stats();
    let sm = &s["smart"];
    assert!(
        sm["memory"]["total_bytes"].as_u64().unwrap() <= 128 << 10,
        "{sm}"
    );
    assert!(
        sm["fs"]["skipped_buffer"]["pending_blocks"]
            .as_u64()
            .unwrap()
            > 0
            || sm["fs"]["skipped_buffer"]["pending_files"]
                .as_u64()
                .unwrap()
                > 0
    );
    let before = s["dedup_ratio"].as_f64().unwrap();
    assert!(before < 0.45, "inline dedup alone: {before}");
    // With the worker paused a short wait times out, in one line.
    assert_eq!(f.stats()["smart"]["fs"]["idle"], false);
    one_line_error(
        &nodup(&[
            "ctl",
            f.mnt.to_str().unwrap(),
            "--wait-idle",
            "--timeout",
            "1",
        ]),
        "still had work queued",
    );
    // Resume the worker and wait for it to settle.
    ok(nodup(&[
        "ctl",
        f.mnt.to_str().unwrap(),
        "--worker-rate",
        "100000",
        "--wait-idle",
        "--timeout",
        "60",
    ]));
    let s = f.stats();
    assert_eq!(s["smart"]["fs"]["idle"], true);
    assert!(
        s["dedup_ratio"].as_f64().unwrap() > 0.49,
        "{}",
        s["dedup_ratio"]
    );
    let ool = s["smart"]["out_of_line_hits"].as_u64().unwrap();
    assert!(ool > 0);
    // The human form shows the policy's section with the same figures.
    let text = ok(nodup(&["stats", f.mnt.to_str().unwrap()]));
    assert!(text.contains("Smart (memory budget 128 KiB"), "{text}");
    let dups = text
        .lines()
        .find(|l| l.trim_start().starts_with("duplicates"))
        .unwrap_or_else(|| panic!("{text}"));
    let grouped = ool
        .to_string()
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join(",");
    assert!(dups.contains(&format!("{grouped} out of line")), "{dups}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("skipped buffer")),
        "{text}"
    );
    // The control interface refuses nonsense in one line and changes nothing.
    // Which nonsense it is: out of range, or not a number at all.
    one_line_error(
        &nodup(&["ctl", f.mnt.to_str().unwrap(), "--battery", "500"]),
        "--battery 500: out of range",
    );
    one_line_error(
        &nodup(&["ctl", f.mnt.to_str().unwrap(), "--battery", "abc"]),
        "--battery abc: not a number",
    );
    one_line_error(
        &nodup(&["ctl", f.mnt.to_str().unwrap(), "--cpu-busy", "2"]),
        "--cpu-busy 2: out of range",
    );
    ok(nodup(&[
        "ctl",
        f.mnt.to_str().unwrap(),
        "--battery",
        "40",
        "--low-power",
        "on",
    ]));
    let r = &f.stats()["smart"]["engine"]["policy"]["selectivity"]["resources"];
    assert_eq!(r["battery"], 40.0);
    f.umount();
    assert!(f.fsck().status.success());
    // An unmounted image: the store's figures (every fingerprint is on the medium now), no
    // worker.
    let img = f.img.to_str().unwrap();
    let o = nodup(&["stats", img, "--json"]);
    let s = json(&o);
    let st = &s["smart"]["engine"]["store"];
    assert!(
        st["fingerprints_on_media"].as_u64().unwrap() >= 4000,
        "{st}"
    );
    assert!(s["smart"]["fs"].is_null());
    let text = ok(nodup(&["stats", img]));
    assert!(text.contains("on media in"), "{text}");
    let starts = |t: &str, p: &str| t.lines().any(|l| l.trim_start().starts_with(p));
    assert!(!starts(&text, "skipped buffer"), "{text}");
    f.mount(&[]);
    assert_eq!(fs::read(f.path("a")).unwrap(), data);
    assert_eq!(fs::read(f.path("b")).unwrap(), data);
    f.umount();
}

#[test]
fn smart_options_are_refused_where_they_mean_nothing() {
    if !fuse_available() {
        return;
    }
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let img = format!("/dev/shm/nodup-test-{}-refuse-{n}.img", std::process::id());
    one_line_error(
        &nodup(&["mkfs", &img, "--size", "64M", "--mem-budget", "1M"]),
        "only smart",
    );
    one_line_error(
        &nodup(&[
            "mkfs",
            &img,
            "--size",
            "64M",
            "--policy",
            "smart",
            "--mem-budget",
            "1K",
        ]),
        "at least",
    );
    assert!(!std::path::Path::new(&img).exists());
    let f = Fixture::new("light", "64M", &[]);
    let o = nodup(&[
        "mount",
        f.img.to_str().unwrap(),
        f.mnt.to_str().unwrap(),
        "--eviction",
        "lru",
    ]);
    one_line_error(&o, "options of policy smart");
    f.mount(&[]);
    one_line_error(
        &nodup(&["ctl", f.mnt.to_str().unwrap(), "--worker-rate", "5"]),
        "--worker-rate is only for policy smart, and this mount's policy is light",
    );
    // Refused before anything is sent: the checkpoint asked with it is not written.
    let checkpoints = || f.stats()["checkpoints"]["count"].as_u64().unwrap();
    let before = checkpoints();
    one_line_error(
        &nodup(&[
            "ctl",
            f.mnt.to_str().unwrap(),
            "--checkpoint",
            "--wait-idle",
        ]),
        "--wait-idle is only for policy smart (only a smart mount has an out-of-line worker to \
         wait for), and this mount's policy is light",
    );
    assert_eq!(checkpoints(), before);
    f.umount();
}
