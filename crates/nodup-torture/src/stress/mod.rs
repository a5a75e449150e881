//! Stress: many threads creating, writing identical and distinct content, reading (and checking
//! what they read), deleting and renaming concurrently on one file system, with a model check
//! at the end; and full-device behaviour (ENOSPC at the limit, then delete and continue).
//!
//! Each thread owns its names (`t<i>-<k>`), so a per-thread model is exact, while content is
//! shared across threads (the same pattern blocks), so dedup lookups, reference counts and
//! releases of the same physical blocks race with each other. The same workers run against
//! the library ([`LibTarget`]) or a real mount ([`DirTarget`]).
//!
//! By run: `library` (threads on the library, with and without media faults), `full_device`,
//! `host_full` (the disk under the image fills, then has room again), `mount` (threads through
//! the kernel on a real mount).

mod full_device;
mod host_full;
mod library;
mod mount;

pub use self::full_device::full_device;
pub use self::host_full::host_full;
pub use self::library::{library, library_faults, library_smart, FAULT_ONE_IN};
pub use self::mount::mount_stress;

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nodup_core::BLOCK_SIZE;
use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::{Caller, FileSystem};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
    /// [`library_smart`]: blocks the out-of-line worker adopted or remapped during the run.
    pub smart_worked: u64,
    /// [`library_faults`]: checkpoints that failed or were refused (the previous one stayed).
    pub checkpoints_failed: u64,
    /// [`library_faults`]: failure recoveries run while mounted that made changes possible
    /// again.
    pub live_recoveries: u64,
    /// [`library_faults`]: no change could be made durable any more after a fault (the
    /// engine gave up its live state, or a switch could not be undone; the error); only the
    /// crash image is checked then.
    pub gave_up: Option<String>,
    /// [`library_faults`]: operations that failed with ENOSPC (a metadata allocation found
    /// no room where the image lives) and must have changed nothing.
    pub full: u64,
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
        self.full += o.full;
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
type WorkerEnd = (BTreeMap<String, Vec<u8>>, Retired, StressStats);

/// The names an EIO retired: their state is unknown (they may exist or not, with either
/// content), and no worker uses them again. Worker `id` retires slot `k`'s names in order of
/// generation, so `t<id>-<k>-<g>` is retired exactly when `g` is below the slot's current
/// generation: a counter per slot instead of a set of names (once the file system refuses
/// every change, a worker retires a name per operation: millions in a long run).
#[derive(Debug, Default, Clone)]
pub struct Retired {
    /// (worker, slot) -> how many of the slot's generations are retired.
    below: BTreeMap<(usize, usize), u32>,
}

impl Retired {
    /// Whether `name` is a retired name.
    pub fn contains(&self, name: &str) -> bool {
        let parse = || -> Option<(usize, usize, u32)> {
            let mut it = name.strip_prefix('t')?.split('-');
            let r = (
                it.next()?.parse().ok()?,
                it.next()?.parse().ok()?,
                it.next()?.parse().ok()?,
            );
            it.next().is_none().then_some(r)
        };
        // Only the names a worker writes (`t1-2-0`, not `t01-2-0` or `t+1-2-0`).
        parse().is_some_and(|(id, k, g)| {
            name == format!("t{id}-{k}-{g}") && self.below.get(&(id, k)).is_some_and(|&b| g < b)
        })
    }

    /// Record that slot `k` of worker `id` has retired every generation below `gen`.
    fn note(&mut self, id: usize, k: usize, gen: u32) {
        self.below.insert((id, k), gen);
    }

    /// Take in another worker's retired names.
    fn merge(&mut self, other: Retired) {
        for (slot, b) in other.below {
            let e = self.below.entry(slot).or_insert(0);
            *e = (*e).max(b);
        }
    }
}

/// One worker: random operations on its own names. With `eio`, an operation failing with EIO
/// (injected media faults) is allowed: the names it touched leave the model as unknown, and
/// the worker goes on under new ones; so is one failing with ENOSPC (an injected full disk),
/// which must have changed nothing (the model stays, and later reads check it).
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
    let mut unknown = Retired::default();
    let mut st = StressStats::default();
    // Slot k's current name; an EIO retires it for the next generation.
    let mut gen = [0u32; 6];
    let name = |k: usize, gen: &[u32; 6]| format!("t{id}-{k}-{}", gen[k]);
    let mut retire = |k: usize, gen: &mut [u32; 6], model: &mut BTreeMap<String, Vec<u8>>| {
        model.remove(&name(k, gen));
        gen[k] += 1;
        unknown.note(id, k, gen[k]);
    };
    let is_eio = |e: &std::io::Error| eio && e.raw_os_error() == Some(libc::EIO);
    // A failed reservation of metadata space (the injected full disk): nothing changed.
    let is_full = |e: &std::io::Error| eio && e.raw_os_error() == Some(libc::ENOSPC);
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
                Err(e) if is_full(&e) => st.full += 1,
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
                    Err(e) if is_full(&e) => st.full += 1,
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
                Err(e) if is_full(&e) => st.full += 1,
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
                    Err(e) if is_full(&e) => st.full += 1,
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
    unknown: &Retired,
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
pub type Outcome = (StressStats, BTreeMap<String, Vec<u8>>, Retired);

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
    let mut unknown = Retired::default();
    for h in handles {
        match h.join() {
            Ok((m, u, s)) => {
                st.merge(s);
                model.extend(m);
                unknown.merge(u);
            }
            Err(_) => st.bad("a worker panicked".into()),
        }
    }
    if !eio {
        final_check(&*t, &model, &unknown, &mut st);
    }
    (st, model, unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot's retired names are exactly its generations below the current one; other
    /// names (another slot's, the after-the-faults files, malformed ones) are not retired.
    #[test]
    fn retired_names_are_the_generations_below_each_slot() {
        let mut a = Retired::default();
        a.note(1, 2, 3);
        let mut b = Retired::default();
        b.note(1, 2, 1);
        b.note(0, 5, 1);
        a.merge(b);
        for (n, want) in [
            ("t1-2-0", true),
            ("t1-2-2", true),
            ("t1-2-3", false),
            ("t0-5-0", true),
            ("t0-5-1", false),
            ("t0-4-0", false),
            ("t2-2-0", false),
            ("tafter-0", false),
            ("t1-2", false),
            ("t1-2-0-1", false),
            ("x1-2-0", false),
            ("t01-2-0", false),
            ("t+1-2-0", false),
        ] {
            assert_eq!(a.contains(n), want, "{n}");
        }
    }
}
