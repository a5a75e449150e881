//! Process crashes: the real `nodup` mount daemon is killed with SIGKILL at a random moment
//! while a driver writes and fsyncs files (recording every fsync that returned, with a content
//! hash), a background load runs (fio with verify, cp of a tree, `nodup replay` with reads
//! verifying content) and `fstrim` gives the free space back again and again. The dead mount
//! is detached, the image remounted (failure recovery), every fsynced file verified through
//! the mount, the image unmounted cleanly and `nodup fsck` must exit 0.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::workload::pattern_block;

/// Settings of a kill -9 campaign.
#[derive(Debug, Clone)]
pub struct Kill9Config {
    /// The `nodup` binary.
    pub nodup: PathBuf,
    /// Scratch directory (images and mount points), e.g. /dev/shm/nodup-torture.
    pub workdir: PathBuf,
    /// Image size in MiB.
    pub image_mib: u64,
    /// Seed of the run (kill times, loads, content).
    pub seed: u64,
    /// Source tree copied by the `cp` load.
    pub cp_source: PathBuf,
    /// Longest time a load runs before the kill, in milliseconds.
    pub max_kill_ms: u64,
}

/// Counts of a kill -9 campaign.
#[derive(Debug, Clone, Default)]
pub struct Kill9Stats {
    /// Completed kill -9 cycles (kill, detach, remount, verify, umount, fsck).
    pub cycles: u64,
    /// Of those, cycles mounted with `--async-writes` (large writes answered early).
    pub async_cycles: u64,
    /// `fstrim` runs that succeeded while the load ran (those cut short by the kill fail).
    pub trims: u64,
    /// Files whose fsync had returned that were missing or differed after recovery.
    pub lost_fsynced: u64,
    /// Files verified after recovery.
    pub verified: u64,
    /// fsck failures, failed remounts, failed verify loads.
    pub failures: u64,
    /// First problems.
    pub examples: Vec<String>,
    /// First lost files (with the cycle and image).
    pub lost_examples: Vec<String>,
}

impl Kill9Stats {
    fn fail(&mut self, m: String) {
        self.failures += 1;
        if self.examples.len() < 20 {
            self.examples.push(m);
        }
    }
}

/// Run a command; its stdout on success, a description of the failure otherwise.
pub(crate) fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{:?} {}: {}{}",
            cmd.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Mount `img` for a cycle; `async_writes` answers large writes before they are stored (only
/// fsynced files are checked, and fsync must wait for them).
fn mount(cfg: &Kill9Config, img: &Path, mp: &Path, async_writes: bool) -> Result<i32, String> {
    let mut extra = key_args(cfg, img);
    if async_writes {
        extra.push("--async-writes".into());
    }
    if img.to_string_lossy().contains("selective") {
        // Caches small enough to evict and refresh all the time.
        for a in [
            "--fp-cache",
            "16K",
            "--prefetch-cache",
            "32K",
            "--refresh-ops",
            "200",
        ] {
            extra.push(a.into());
        }
    }
    mount_image_with(&cfg.nodup, img, mp, &cfg.workdir.join("daemon.log"), &extra)
}

/// The key file of the campaign's encrypted image (its name says `-enc`), for mount and fsck.
fn key_args(cfg: &Kill9Config, img: &Path) -> Vec<std::ffi::OsString> {
    if img.to_string_lossy().contains("-enc") {
        vec![
            "--encrypt-key-file".into(),
            cfg.workdir.join("k9.key").into(),
        ]
    } else {
        Vec::new()
    }
}

/// `nodup mount img mp`; returns the daemon's pid.
pub(crate) fn mount_image(nodup: &Path, img: &Path, mp: &Path, log: &Path) -> Result<i32, String> {
    mount_image_with(nodup, img, mp, log, &[])
}

/// `nodup mount img mp EXTRA...`; returns the daemon's pid.
fn mount_image_with(
    nodup: &Path,
    img: &Path,
    mp: &Path,
    log: &Path,
    extra: &[std::ffi::OsString],
) -> Result<i32, String> {
    let out = run(Command::new(nodup)
        .arg("mount")
        .arg(img)
        .arg(mp)
        .args(extra)
        .env("NODUP_DAEMON_LOG", log))?;
    out.split("daemon pid ")
        .nth(1)
        .and_then(|s| s.trim().trim_end_matches(')').parse().ok())
        .ok_or_else(|| format!("no daemon pid in {out:?}"))
}

/// Detach a (possibly dead) mount.
pub(crate) fn detach(mp: &Path) {
    if run(Command::new("fusermount3").arg("-u").arg(mp)).is_err() {
        let _ = run(Command::new("umount").arg("-l").arg(mp));
    }
}

fn hash(d: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(d)
}

/// The fsync driver: new files, written and fsynced; a file enters `done` only once its
/// fsync returned. Stops at the first error (the daemon is gone) or when `stop` is set.
fn driver(
    dir: PathBuf,
    cycle: u64,
    seed: u64,
    done: Arc<Mutex<BTreeMap<String, (u64, u64)>>>,
    stop: Arc<AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    // Bounded per cycle: verifying every fsynced file twice per cycle is the cycle's main cost.
    for k in 0..150 {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let name = format!("c{cycle}-{k}");
        // One file in eight is written in requests large enough to be answered early on a
        // mount with --async-writes (128 KiB and up).
        let blocks = if rng.gen_ratio(1, 8) {
            rng.gen_range(32..=64)
        } else {
            rng.gen_range(1..=12)
        };
        let mut data = Vec::with_capacity(blocks * 4096);
        for _ in 0..blocks {
            let id = if rng.gen_bool(0.6) {
                rng.gen_range(0..16)
            } else {
                rng.gen::<u64>() | 1 << 40
            };
            data.extend(pattern_block(id));
        }
        data.truncate(data.len() - rng.gen_range(0..4096));
        let r = (|| -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(dir.join(&name))?;
            f.write_all(&data)?;
            f.sync_all()
        })();
        match r {
            Ok(()) => {
                done.lock()
                    .unwrap()
                    .insert(name, (data.len() as u64, hash(&data)));
            }
            Err(_) => return,
        }
    }
}

fn start_load(cfg: &Kill9Config, kind: u32, mp: &Path, cycle: u64, trace: &Path) -> Option<Child> {
    let quiet = |c: &mut Command| {
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    };
    let mut c = match kind {
        0 => {
            let d = mp.join(format!("fio{cycle}"));
            let _ = std::fs::create_dir(&d);
            let mut c = Command::new("fio");
            c.args([
                "--name=k9",
                "--rw=randwrite",
                "--bs=4k",
                "--size=2M",
                "--verify=crc32c",
                "--do_verify=1",
                "--dedupe_percentage=50",
                "--ioengine=psync",
                "--loops=50",
            ])
            .arg(format!("--directory={}", d.display()));
            c
        }
        1 => {
            let mut c = Command::new("cp");
            c.arg("-r")
                .arg(&cfg.cp_source)
                .arg(mp.join(format!("cp{cycle}")));
            c
        }
        _ => {
            let d = mp.join(format!("replay{cycle}"));
            let _ = std::fs::create_dir(&d);
            let mut c = Command::new(&cfg.nodup);
            c.arg("replay").arg("--dir").arg(&d).arg(trace);
            c
        }
    };
    quiet(&mut c);
    c.spawn().ok()
}

/// A short load that is *not* killed and must succeed: fio writes then verifies its data.
fn verify_load(mp: &Path, cycle: u64) -> Result<(), String> {
    let d = mp.join(format!("vfio{cycle}"));
    std::fs::create_dir(&d).map_err(|e| e.to_string())?;
    run(Command::new("fio")
        .args([
            "--name=v",
            "--rw=randwrite",
            "--bs=4k",
            "--size=1M",
            "--verify=crc32c",
            "--do_verify=1",
            "--dedupe_percentage=50",
            "--ioengine=psync",
            "--verify_fatal=1",
        ])
        .arg(format!("--directory={}", d.display())))?;
    std::fs::remove_dir_all(&d).map_err(|e| e.to_string())
}

/// `fstrim` on the mount until `stop` (or the daemon is gone): free space given back while
/// the load writes and the kill may come in the middle of it. Returns the runs that
/// succeeded, and the first failure with the moment it was seen (one seen before the kill
/// is a defect).
fn trimmer(mp: PathBuf, seed: u64, stop: Arc<AtomicBool>) -> (u64, Option<(Instant, String)>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut done = 0;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(rng.gen_range(5..=40)));
        if let Err(e) = run(Command::new("fstrim").arg(&mp)) {
            return (done, Some((Instant::now(), e)));
        }
        done += 1;
    }
    (done, None)
}

/// Verify every fsynced file through the mount; lost ones are counted and forgotten.
fn verify(mp: &Path, done: &Mutex<BTreeMap<String, (u64, u64)>>, st: &mut Kill9Stats) {
    let mut d = done.lock().unwrap();
    let mut lost = Vec::new();
    for (name, &(len, h)) in d.iter() {
        st.verified += 1;
        match std::fs::read(mp.join("sync").join(name)) {
            Ok(x) if x.len() as u64 == len && hash(&x) == h => {}
            Ok(x) => lost.push(format!(
                "{name}: {} bytes, want {len} (content differs)",
                x.len()
            )),
            Err(e) => lost.push(format!("{name}: {e}")),
        }
    }
    for l in lost {
        st.lost_fsynced += 1;
        if st.lost_examples.len() < 20 {
            st.lost_examples
                .push(format!("{} lost fsynced file {l}", mp.display()));
        }
        let name = l.split(':').next().unwrap_or("").to_string();
        d.remove(&name);
    }
}

/// Keep the image from filling: remove old load output and half of the older synced files.
fn prune(mp: &Path, done: &Mutex<BTreeMap<String, (u64, u64)>>, rng: &mut StdRng) {
    if let Ok(rd) = std::fs::read_dir(mp) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n != "sync" {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let mut d = done.lock().unwrap();
    while d.len() > 100 {
        let names: Vec<String> = d.keys().cloned().collect();
        let n = &names[rng.gen_range(0..names.len())];
        // Forget first: an unlink lost in a crash must not count as a loss.
        d.remove(n);
        let _ = std::fs::remove_file(mp.join("sync").join(n));
    }
}

/// Run kill -9 cycles until `deadline` or `max_cycles`.
pub fn campaign(cfg: &Kill9Config, deadline: Instant, max_cycles: u64) -> Kill9Stats {
    let mut st = Kill9Stats::default();
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    if let Err(e) = std::fs::create_dir_all(&cfg.workdir) {
        st.fail(format!("workdir: {e}"));
        return st;
    }
    let trace = cfg.workdir.join("k9.trace");
    if let Err(e) = run(Command::new(&cfg.nodup)
        .args([
            "trace",
            "gen",
            "--size",
            "16M",
            "--dup-ratio",
            "0.5",
            "--read-ratio",
            "0.3",
        ])
        .arg("-o")
        .arg(&trace))
    {
        st.fail(format!("trace gen: {e}"));
        return st;
    }
    // Four images: pmem semantics (durable on return; every other round of it mounted with
    // --async-writes, durable at fsync), blockfile (durable at fsync), policy
    // `smart` on pmem with a small budget (its worker remaps while the writer is killed), and
    // an encrypted `selective` image on pmem with small caches.
    if let Err(e) = std::fs::write(cfg.workdir.join("k9.key"), [0xcbu8; 32]) {
        st.fail(format!("key file: {e}"));
        return st;
    }
    let mut images = Vec::new();
    for (i, (medium, policy)) in [
        ("pmem", "light"),
        ("blockfile", "light"),
        ("pmem", "smart"),
        ("pmem", "selective"),
    ]
    .iter()
    .enumerate()
    {
        let tag = if *policy == "selective" { "-enc" } else { "" };
        let img = cfg.workdir.join(format!("k9-{medium}-{policy}{tag}.img"));
        let key = key_args(cfg, &img);
        let mp = cfg.workdir.join(format!("mnt{i}"));
        // A dead mount left here by an earlier run would make the first mount fail.
        detach(&mp);
        let _ = std::fs::create_dir_all(&mp);
        if let Err(e) = run(Command::new(&cfg.nodup)
            .arg("mkfs")
            .arg(&img)
            .arg("--size")
            .arg(format!("{}M", cfg.image_mib))
            .arg("--medium")
            .arg(medium)
            .arg("--policy")
            .arg(policy)
            .args(if *policy == "smart" {
                &["--mem-budget", "256K"][..]
            } else {
                &[][..]
            })
            .args(&key))
        {
            st.fail(format!("mkfs: {e}"));
            return st;
        }
        images.push((img, mp, Arc::new(Mutex::new(BTreeMap::new()))));
    }
    let mut cycle = 0u64;
    while Instant::now() < deadline && st.cycles < max_cycles {
        let (img, mp, done) = &images[(cycle % images.len() as u64) as usize];
        cycle += 1;
        // Every other round of the plain pmem image (the first) answers large writes early.
        let async_writes = (cycle - 1) % (2 * images.len() as u64) == images.len() as u64;
        let what = format!(
            "cycle {cycle} ({}{})",
            img.display(),
            if async_writes { ", async writes" } else { "" }
        );
        // 1. Mount (failure recovery after the previous kill) and verify fsynced files.
        let pid = match mount(cfg, img, mp, async_writes) {
            Ok(p) => p,
            Err(e) => {
                st.fail(format!("{what}: mount: {e}"));
                detach(mp);
                continue;
            }
        };
        let _ = std::fs::create_dir_all(mp.join("sync"));
        verify(mp, done, &mut st);
        if cycle.is_multiple_of(10) {
            if let Err(e) = verify_load(mp, cycle) {
                st.fail(format!("{what}: fio verify without kill: {e}"));
            }
        }
        prune(mp, done, &mut rng);
        // 2. Load + fsync driver, then SIGKILL of the daemon at a random moment.
        let load = start_load(cfg, rng.gen_range(0..3), mp, cycle, &trace);
        let stop = Arc::new(AtomicBool::new(false));
        let drv = {
            let (dir, done, stop, seed) = (mp.join("sync"), done.clone(), stop.clone(), rng.gen());
            std::thread::spawn(move || driver(dir, cycle, seed, done, stop))
        };
        let trims = {
            let (mp, stop, seed) = (mp.clone(), stop.clone(), rng.gen());
            std::thread::spawn(move || trimmer(mp, seed, stop))
        };
        std::thread::sleep(Duration::from_millis(rng.gen_range(20..=cfg.max_kill_ms)));
        let killed = Instant::now();
        // SAFETY: kill(2) on the daemon we started; a stale pid only yields ESRCH.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        stop.store(true, Ordering::Relaxed);
        let _ = drv.join();
        let (trimmed, failed) = trims.join().unwrap_or((0, None));
        st.trims += trimmed;
        if let Some((_, e)) = failed.filter(|(seen, _)| *seen < killed) {
            st.fail(format!("{what}: fstrim before the kill: {e}"));
        }
        if let Some(mut c) = load {
            let t0 = Instant::now();
            while c.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // Wait for the daemon to be gone, then detach the dead mount.
        let t0 = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() && t0.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        detach(mp);
        // 3. Remount (failure recovery), verify, clean unmount, fsck must be clean.
        match mount(cfg, img, mp, false) {
            Ok(_) => {
                verify(mp, done, &mut st);
                if let Err(e) = run(Command::new(&cfg.nodup).arg("umount").arg(mp)) {
                    st.fail(format!("{what}: umount: {e}"));
                    detach(mp);
                }
            }
            Err(e) => {
                st.fail(format!("{what}: remount after kill: {e}"));
                detach(mp);
                continue;
            }
        }
        if let Err(e) = run(Command::new(&cfg.nodup)
            .arg("fsck")
            .arg(img)
            .args(key_args(cfg, img)))
        {
            st.fail(format!("{what}: fsck after recovery: {e}"));
        }
        st.cycles += 1;
        st.async_cycles += u64::from(async_writes);
    }
    for (img, mp, _) in &images {
        detach(mp);
        let _ = std::fs::remove_file(img);
        let _ = std::fs::remove_dir(mp);
    }
    let _ = std::fs::remove_file(&trace);
    st
}
