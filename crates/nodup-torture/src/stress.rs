//! Stress: many threads creating, writing identical and distinct content, reading (and checking
//! what they read), deleting and renaming concurrently on one file system, with a model check
//! at the end; and full-device behaviour (ENOSPC at the limit, then delete and continue).
//!
//! Each thread owns its names (`t<i>-<k>`), so a per-thread model is exact, while content is
//! shared across threads (the same pattern blocks), so dedup lookups, reference counts and
//! releases of the same physical blocks race with each other. The same workers run against
//! the library ([`LibTarget`]) or a real mount ([`DirTarget`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nodup_core::media::{FaultMedium, FaultOp, FaultRule, Medium, MemMedium};
use nodup_core::{FormatOptions, BLOCK_SIZE};
use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::{Caller, FileSystem, FsOptions, MediumKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::verify::check_invariants;
use crate::workload::pattern_block;

/// The operations the stress workers need, on a flat directory.
pub trait StressTarget: Send + Sync {
    /// Create an empty file.
    fn create(&self, name: &str) -> std::io::Result<()>;
    /// Write `data` at `off`.
    fn write(&self, name: &str, off: u64, data: &[u8]) -> std::io::Result<()>;
    /// The whole file.
    fn read(&self, name: &str) -> std::io::Result<Vec<u8>>;
    /// Remove a file.
    fn unlink(&self, name: &str) -> std::io::Result<()>;
    /// Rename (replacing).
    fn rename(&self, from: &str, to: &str) -> std::io::Result<()>;
    /// Names in the directory.
    fn list(&self) -> std::io::Result<Vec<String>>;
}

fn io(e: nodup_fs::FsError) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.errno())
}

/// The library file system, files in the root directory.
pub struct LibTarget(pub Arc<FileSystem>);

impl LibTarget {
    fn ino(&self, name: &str) -> std::io::Result<u64> {
        Ok(self.0.lookup(ROOT_INO, name.as_bytes()).map_err(io)?.0)
    }
}

impl StressTarget for LibTarget {
    fn create(&self, name: &str) -> std::io::Result<()> {
        self.0
            .mknod(
                ROOT_INO,
                name.as_bytes(),
                Kind::File,
                0o644,
                0,
                b"",
                Caller::default(),
            )
            .map_err(io)?;
        Ok(())
    }
    fn write(&self, name: &str, off: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.write(self.ino(name)?, off, data).map_err(io)?;
        Ok(())
    }
    fn read(&self, name: &str) -> std::io::Result<Vec<u8>> {
        let ino = self.ino(name)?;
        let size = self.0.getattr(ino).map_err(io)?.size;
        self.0.read(ino, 0, size as usize).map_err(io)
    }
    fn unlink(&self, name: &str) -> std::io::Result<()> {
        self.0.unlink(ROOT_INO, name.as_bytes()).map_err(io)
    }
    fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        self.0
            .rename(ROOT_INO, from.as_bytes(), ROOT_INO, to.as_bytes(), 0)
            .map_err(io)
    }
    fn list(&self) -> std::io::Result<Vec<String>> {
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let ents = self.0.readdir(ROOT_INO, after, 128).map_err(io)?;
            if ents.is_empty() {
                return Ok(out);
            }
            for (c, _, _, n) in ents {
                after = c;
                if n != b"." && n != b".." {
                    out.push(String::from_utf8_lossy(&n).into_owned());
                }
            }
        }
    }
}

/// A directory of a real (mounted) file system.
pub struct DirTarget(pub PathBuf);

impl StressTarget for DirTarget {
    fn create(&self, name: &str) -> std::io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.0.join(name))
            .map(|_| ())
    }
    fn write(&self, name: &str, off: u64, data: &[u8]) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.0.join(name))?;
        f.seek(SeekFrom::Start(off))?;
        f.write_all(data)
    }
    fn read(&self, name: &str) -> std::io::Result<Vec<u8>> {
        let mut v = Vec::new();
        std::fs::File::open(self.0.join(name))?.read_to_end(&mut v)?;
        Ok(v)
    }
    fn unlink(&self, name: &str) -> std::io::Result<()> {
        std::fs::remove_file(self.0.join(name))
    }
    fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        std::fs::rename(self.0.join(from), self.0.join(to))
    }
    fn list(&self) -> std::io::Result<Vec<String>> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(&self.0)? {
            v.push(e?.file_name().to_string_lossy().into_owned());
        }
        Ok(v)
    }
}

/// Counts of a stress run.
#[derive(Debug, Clone, Default)]
pub struct StressStats {
    /// Operations performed.
    pub ops: u64,
    /// Reads (during the run and at the end) that disagreed with the model, plus unexpected
    /// errors and namespace differences.
    pub mismatches: u64,
    /// Known finding 3: a clean shutdown of a full device fails with ENOSPC (the checkpoint
    /// reserve is sized from the previous checkpoint, not from the current tables).
    pub shutdown_enospc: u64,
    /// Media faults injected ([`library_faults`]).
    pub faults: u64,
    /// [`library_faults`]: the engine gave up its live state after a fault (its error); only
    /// the crash image is checked then.
    pub gave_up: Option<String>,
    /// First mismatches (and findings).
    pub examples: Vec<String>,
}

impl StressStats {
    fn bad(&mut self, m: String) {
        self.mismatches += 1;
        if self.examples.len() < 20 {
            self.examples.push(m);
        }
    }
    fn merge(&mut self, o: StressStats) {
        self.ops += o.ops;
        self.mismatches += o.mismatches;
        for e in o.examples {
            if self.examples.len() < 20 {
                self.examples.push(e);
            }
        }
    }
}

fn content(rng: &mut StdRng, blocks: usize, unique: &AtomicU64) -> Vec<u8> {
    let mut v = Vec::with_capacity(blocks * BLOCK_SIZE);
    for _ in 0..blocks {
        let id = if rng.gen_bool(0.7) {
            rng.gen_range(0..8)
        } else {
            2_000_000 + unique.fetch_add(1, Ordering::Relaxed)
        };
        v.extend(pattern_block(id));
    }
    v
}

/// A worker's outcome: its final model, the names whose state an EIO left unknown (they may
/// exist or not, with either content), and its counts.
type WorkerEnd = (BTreeMap<String, Vec<u8>>, BTreeSet<String>, StressStats);

/// One worker: random operations on its own names. With `eio`, an operation failing with EIO
/// (injected media faults) is allowed: the names it touched leave the model as unknown, and
/// the worker goes on under new ones.
fn worker(
    t: &dyn StressTarget,
    id: usize,
    seed: u64,
    deadline: Instant,
    unique: &AtomicU64,
    max_blocks: u64,
    eio: bool,
) -> WorkerEnd {
    let mut rng = StdRng::seed_from_u64(seed ^ (id as u64).wrapping_mul(0x9E37_79B9));
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut unknown = BTreeSet::new();
    let mut st = StressStats::default();
    // Slot k's current name; an EIO retires it for the next generation.
    let mut gen = [0u32; 6];
    let name = |k: usize, gen: &[u32; 6]| format!("t{id}-{k}-{}", gen[k]);
    let mut retire = |k: usize, gen: &mut [u32; 6], model: &mut BTreeMap<String, Vec<u8>>| {
        let n = name(k, gen);
        model.remove(&n);
        unknown.insert(n);
        gen[k] += 1;
    };
    let is_eio = |e: &std::io::Error| eio && e.raw_os_error() == Some(libc::EIO);
    while Instant::now() < deadline {
        let k = rng.gen_range(0..6);
        let n = name(k, &gen);
        let exists = model.contains_key(&n);
        match rng.gen_range(0..10) {
            0 | 1 if !exists => match t.create(&n) {
                Ok(()) => {
                    model.insert(n, Vec::new());
                }
                Err(e) if is_eio(&e) => retire(k, &mut gen, &mut model),
                Err(e) => st.bad(format!("create {n}: {e}")),
            },
            0..=4 if exists => {
                let blocks = rng.gen_range(1..=4);
                let off = if rng.gen_bool(0.7) {
                    rng.gen_range(0..max_blocks) * BLOCK_SIZE as u64
                } else {
                    rng.gen_range(0..max_blocks * BLOCK_SIZE as u64)
                };
                let data = content(&mut rng, blocks, unique);
                match t.write(&n, off, &data) {
                    Ok(()) => {
                        let f = model.get_mut(&n).unwrap();
                        let end = off as usize + data.len();
                        if f.len() < end {
                            f.resize(end, 0);
                        }
                        f[off as usize..end].copy_from_slice(&data);
                    }
                    Err(e) if is_eio(&e) => retire(k, &mut gen, &mut model),
                    Err(e) => st.bad(format!("write {n}: {e}")),
                }
            }
            5 | 6 if exists => match t.read(&n) {
                Ok(d) if d == model[&n] => {}
                Ok(d) => st.bad(format!(
                    "read {n}: {} bytes differ from the model's {}",
                    d.len(),
                    model[&n].len()
                )),
                // A failed read changes nothing.
                Err(e) if is_eio(&e) => {}
                Err(e) => st.bad(format!("read {n}: {e}")),
            },
            7 if exists => match t.unlink(&n) {
                Ok(()) => {
                    model.remove(&n);
                }
                Err(e) if is_eio(&e) => retire(k, &mut gen, &mut model),
                Err(e) => st.bad(format!("unlink {n}: {e}")),
            },
            8 | 9 if exists => {
                let k2 = rng.gen_range(0..6);
                let to = name(k2, &gen);
                match t.rename(&n, &to) {
                    Ok(()) => {
                        let d = model.remove(&n).unwrap();
                        model.insert(to, d);
                    }
                    Err(e) if is_eio(&e) => {
                        retire(k, &mut gen, &mut model);
                        if k2 != k {
                            retire(k2, &mut gen, &mut model);
                        }
                    }
                    Err(e) => st.bad(format!("rename {n} {to}: {e}")),
                }
            }
            _ => continue,
        }
        st.ops += 1;
    }
    (model, unknown, st)
}

/// Compare the target with the union of the models (names in `unknown` may be there or not).
pub fn final_check(
    t: &dyn StressTarget,
    model: &BTreeMap<String, Vec<u8>>,
    unknown: &BTreeSet<String>,
    st: &mut StressStats,
) {
    match t.list() {
        Ok(mut names) => {
            names.retain(|n| n.starts_with('t') && !unknown.contains(n));
            names.sort();
            let want: Vec<&String> = model.keys().collect();
            if names.iter().collect::<Vec<_>>() != want {
                st.bad(format!(
                    "namespace differs: {} names, model has {}",
                    names.len(),
                    want.len()
                ));
            }
        }
        Err(e) => st.bad(format!("list: {e}")),
    }
    for (n, d) in model {
        match t.read(n) {
            Ok(x) if &x == d => {}
            Ok(_) => st.bad(format!("final read {n}: content differs")),
            Err(e) => st.bad(format!("final read {n}: {e}")),
        }
    }
}

/// What [`run_workers`] ends with: the stats, the final model and the unknown names.
pub type Outcome = (StressStats, BTreeMap<String, Vec<u8>>, BTreeSet<String>);

/// Run `threads` workers on `t` until `deadline` (with `eio`, EIO is allowed, see [`worker`]);
/// returns the stats, the final model and the names an EIO left unknown.
pub fn run_workers(
    t: Arc<dyn StressTarget>,
    threads: usize,
    seed: u64,
    deadline: Instant,
    max_blocks: u64,
    eio: bool,
) -> Outcome {
    let unique = Arc::new(AtomicU64::new(seed.wrapping_mul(7_919) << 20));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let t = t.clone();
            let unique = unique.clone();
            std::thread::spawn(move || worker(&*t, i, seed, deadline, &unique, max_blocks, eio))
        })
        .collect();
    let mut st = StressStats::default();
    let mut model = BTreeMap::new();
    let mut unknown = BTreeSet::new();
    for h in handles {
        match h.join() {
            Ok((m, u, s)) => {
                st.merge(s);
                model.extend(m);
                unknown.extend(u);
            }
            Err(_) => st.bad("a worker panicked".into()),
        }
    }
    if !eio {
        final_check(&*t, &model, &unknown, &mut st);
    }
    (st, model, unknown)
}

/// Library stress: threads on one file system, then invariants, a clean reopen and a crash
/// reopen (failure recovery), each compared with the model.
pub fn library(threads: usize, seed: u64, deadline: Instant) -> StressStats {
    library_run(threads, seed, deadline, false)
}

/// [`library`] on a medium that fails about one operation in [`FAULT_ONE_IN`] (an I/O error,
/// or a write that fails after its bytes landed): failures race with other threads' appends,
/// checkpoints and trims. An operation may fail only with EIO, and the names it touched leave
/// the model; once the faults stop, the file system must keep working and hold the rest of
/// the model, live, after a crash and after a clean unmount.
pub fn library_faults(threads: usize, seed: u64, deadline: Instant) -> StressStats {
    library_run(threads, seed, deadline, true)
}

/// Medium operations per injected fault in [`library_faults`]: about 40 faults a second with
/// 6 threads. At one in 4 000 the engine soon gives up its live state (a failed release asks
/// for failure recovery), and the rest of the run only meets that.
pub const FAULT_ONE_IN: u32 = 40_000;

fn library_run(threads: usize, seed: u64, deadline: Instant, faults: bool) -> StressStats {
    let mem = Arc::new(MemMedium::new(64 << 20));
    let fm = Arc::new(FaultMedium::new(mem.clone(), seed));
    let opts = FsOptions {
        checkpoint_log_bytes: 1 << 20,
        ..FsOptions::default()
    };
    let fs = match FileSystem::format(
        fm.clone(),
        MediumKind::Pmem,
        &FormatOptions::default(),
        &opts,
        Caller::default(),
    ) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            let mut st = StressStats::default();
            st.bad(format!("format: {e}"));
            return st;
        }
    };
    if faults {
        let p = 0.5 / FAULT_ONE_IN as f64;
        fm.add_rule(FaultRule::new(FaultOp::Any).probability(p));
        fm.add_rule(
            FaultRule::new(FaultOp::Write)
                .probability(p)
                .short_write(usize::MAX),
        );
    }
    // The daemon's maintenance timer: checkpoints (small threshold, so they race with the
    // workers) and deferred releases; and `fstrim` as often, so free blocks are given back
    // (overwritten with a poison pattern by the test medium) while the workers allocate.
    let ticker = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let mut errors = Vec::new();
            let allowed = |e: &nodup_fs::FsError| faults && e.errno() == libc::EIO;
            while Instant::now() < deadline {
                match fs.tick() {
                    Err(e) if !allowed(&e) => errors.push(format!("tick: {e}")),
                    _ => {}
                }
                match fs.trim(0, u64::MAX, 0) {
                    Err(e) if !allowed(&e) => errors.push(format!("trim: {e}")),
                    _ => {}
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            errors
        })
    };
    let t = Arc::new(LibTarget(fs.clone()));
    let (mut st, model, unknown) = run_workers(t.clone(), threads, seed, deadline, 24, faults);
    for e in ticker.join().unwrap_or_default() {
        st.bad(e);
    }
    st.faults = fm.injected();
    fm.clear_rules();
    let mut model = model;
    if faults {
        // The faults stopped: the mount goes on (unless the engine gave up its live state,
        // which it says, and failure recovery is the way back).
        match fs.engine().check_ready() {
            Ok(()) => {
                final_check(&*t, &model, &unknown, &mut st);
                keeps_working(&*t, &mut model, &mut st);
            }
            Err(e) => st.gave_up = Some(e.to_string()),
        }
    }
    let live = st.gave_up.is_none();
    if live {
        if let Err(e) = check_invariants(&fs) {
            st.bad(format!("invariants after stress: {e}"));
        }
    }
    // Crash image (no shutdown) and clean image.
    let crashed = mem.snapshot();
    let mut images = vec![("crash", crashed)];
    match fs.shutdown() {
        Ok(()) => images.push(("clean", mem.snapshot())),
        Err(e) if live => st.bad(format!("shutdown: {e}")),
        Err(_) => {}
    }
    drop(t);
    drop(fs);
    for (what, img) in images {
        let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(img));
        match FileSystem::open(m, &FsOptions::default()) {
            Ok(fs) => {
                if let Err(e) = check_invariants(&fs) {
                    st.bad(format!("{what} reopen: {e}"));
                }
                final_check(&LibTarget(Arc::new(fs)), &model, &unknown, &mut st);
            }
            Err(e) => st.bad(format!("{what} reopen: {e}")),
        }
    }
    st
}

/// After the faults: new files are made, written, read back, renamed and removed as if
/// nothing had happened; the survivors join `model`.
fn keeps_working(
    t: &dyn StressTarget,
    model: &mut BTreeMap<String, Vec<u8>>,
    st: &mut StressStats,
) {
    for i in 0..8u64 {
        let n = format!("tafter-{i}");
        let data: Vec<u8> = [pattern_block(i % 3), pattern_block(3_000_000 + i)].concat();
        let r = t
            .create(&n)
            .and_then(|()| t.write(&n, 0, &data))
            .and_then(|()| t.read(&n));
        match r {
            Ok(d) if d == data => {
                model.insert(n, data);
            }
            Ok(_) => st.bad(format!("after the faults, {n} reads back wrong")),
            Err(e) => st.bad(format!("after the faults, {n}: {e}")),
        }
    }
    let moved = t
        .rename("tafter-0", "tafter-8")
        .and_then(|()| t.unlink("tafter-1"));
    match moved {
        Ok(()) => {
            if let Some(d) = model.remove("tafter-0") {
                model.insert("tafter-8".into(), d);
            }
            model.remove("tafter-1");
        }
        Err(e) => st.bad(format!("after the faults, rename and unlink: {e}")),
    }
}

/// Full device: fill a small image with unique data until ENOSPC, check everything written is
/// readable, delete half, continue writing, check again, reopen and check.
/// With `ticks`, the maintenance tick runs every 32 files (as the FUSE daemon's timer would).
pub fn full_device(seed: u64, ticks: bool) -> StressStats {
    let mut st = StressStats::default();
    let mem = Arc::new(MemMedium::new(8 << 20));
    let fs = match FileSystem::format(
        mem.clone(),
        MediumKind::Pmem,
        &FormatOptions::default(),
        &FsOptions::default(),
        Caller::default(),
    ) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            st.bad(format!("format: {e}"));
            return st;
        }
    };
    let t = LibTarget(fs.clone());
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(seed);
    let unique = AtomicU64::new(seed << 24);
    let mut fill = |t: &LibTarget,
                    model: &mut BTreeMap<String, Vec<u8>>,
                    st: &mut StressStats,
                    round: usize|
     -> bool {
        for i in 0..100_000 {
            if ticks && i % 32 == 0 {
                // What the FUSE daemon's maintenance timer does between requests.
                if let Err(e) = t.0.tick() {
                    if e.errno() != libc::ENOSPC {
                        st.bad(format!("tick: {e}"));
                    }
                }
            }
            let n = format!("t{round}-{i}");
            if let Err(e) = t.create(&n) {
                if e.raw_os_error() == Some(libc::ENOSPC) {
                    return true;
                }
                st.bad(format!("create {n}: {e}"));
                return false;
            }
            model.insert(n.clone(), Vec::new());
            let data = content(&mut rng, 8, &unique);
            match t.write(&n, 0, &data) {
                Ok(()) => {
                    model.insert(n, data);
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return true,
                Err(e) => {
                    st.bad(format!("write {n}: {e} (expected ENOSPC at most)"));
                    return false;
                }
            }
            st.ops += 1;
        }
        st.bad("the device never filled up".into());
        false
    };
    if !fill(&t, &mut model, &mut st, 0) {
        return st;
    }
    final_check(&t, &model, &BTreeSet::new(), &mut st);
    let names: Vec<String> = model.keys().cloned().collect();
    for n in names.iter().step_by(2) {
        match t.unlink(n) {
            Ok(()) => {
                model.remove(n);
            }
            Err(e) => st.bad(format!("unlink {n} on a full device: {e}")),
        }
    }
    let before = model.len();
    if fill(&t, &mut model, &mut st, 1) && model.len() <= before {
        st.bad("no file could be written after deleting half".into());
    }
    final_check(&t, &model, &BTreeSet::new(), &mut st);
    if let Err(e) = check_invariants(&fs) {
        st.bad(format!("invariants on a full device: {e}"));
    }
    if let Err(e) = fs.shutdown() {
        st.shutdown_enospc += 1;
        st.examples
            .push(format!("[finding 3] shutdown of a full device: {e}"));
    }
    drop(t);
    drop(fs);
    let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(mem.snapshot()));
    match FileSystem::open(m, &FsOptions::default()) {
        Ok(fs) => final_check(&LibTarget(Arc::new(fs)), &model, &BTreeSet::new(), &mut st),
        Err(e) => st.bad(format!("reopen of a full device: {e}")),
    }
    st
}

/// Stress on a real mount: mkfs + mount with the `nodup` binary, threads through the kernel,
/// model check, clean unmount, `nodup fsck`, remount and model check again.
pub fn mount_stress(
    nodup: &std::path::Path,
    workdir: &std::path::Path,
    threads: usize,
    seed: u64,
    dur: std::time::Duration,
) -> StressStats {
    use crate::kill9::{detach, mount_image, run};
    use std::process::Command;
    let mut st = StressStats::default();
    let img = workdir.join("stress.img");
    let mp = workdir.join("mnt");
    let log = workdir.join("daemon.log");
    detach(&mp);
    if let Err(e) = std::fs::create_dir_all(&mp) {
        st.bad(format!("workdir: {e}"));
        return st;
    }
    if let Err(e) = run(Command::new(nodup)
        .arg("mkfs")
        .arg(&img)
        .args(["--size", "256M"]))
    {
        st.bad(format!("mkfs: {e}"));
        return st;
    }
    if let Err(e) = mount_image(nodup, &img, &mp, &log) {
        st.bad(format!("mount: {e}"));
        return st;
    }
    let t: Arc<dyn StressTarget> = Arc::new(DirTarget(mp.clone()));
    let deadline = Instant::now() + dur;
    // `fstrim` through the kernel while the workers write, delete and read.
    let trimmer = {
        let (nodup_mp, deadline) = (mp.clone(), deadline);
        std::thread::spawn(move || -> Result<u64, String> {
            let mut runs = 0;
            while Instant::now() < deadline {
                run(Command::new("fstrim").arg(&nodup_mp)).map_err(|e| format!("fstrim: {e}"))?;
                runs += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Ok(runs)
        })
    };
    let (s1, model, none) = run_workers(t.clone(), threads, seed, deadline, 24, false);
    st.merge(s1);
    match trimmer.join() {
        Ok(Ok(runs)) if runs > 0 => {}
        Ok(Ok(_)) => st.bad("fstrim never ran".into()),
        Ok(Err(e)) => st.bad(e),
        Err(_) => st.bad("the fstrim thread panicked".into()),
    }
    if let Err(e) = run(Command::new(nodup).arg("umount").arg(&mp)) {
        st.bad(format!("umount: {e}"));
        detach(&mp);
    }
    if let Err(e) = run(Command::new(nodup).arg("fsck").arg(&img)) {
        st.bad(format!("fsck after stress: {e}"));
    }
    match mount_image(nodup, &img, &mp, &log) {
        Ok(_) => {
            final_check(&*t, &model, &none, &mut st);
            if let Err(e) = run(Command::new(nodup).arg("umount").arg(&mp)) {
                st.bad(format!("umount: {e}"));
                detach(&mp);
            }
        }
        Err(e) => st.bad(format!("remount: {e}")),
    }
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_dir_all(workdir);
    st
}
