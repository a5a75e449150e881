//! The benchmark driver behind `nodup freewrite bench`: run a §4.1 workload against a store in
//! a directory (a nodup mount, for the acceptance figures) with freewrite on or off.
//!
//! FAWN: PUTs until the data log holds `size` bytes, then one garbage collection over it (the
//! measured phase, as in the paper, which measures GC once the store is built). The two
//! phases can run as separate processes (`Phase::Load`, then `Phase::Gc` on the same
//! directory), so a caller can read the medium's counters between them.
//! LSM: PUTs until `size` bytes of keys and values were put, then close (memtable flush and
//! the compactions it triggers); everything is measured, as the paper's Figure 2 does.

use crate::error::{Error, Result};
use crate::fawn::{FawnOptions, FawnStore};
use crate::lsm::{LsmOptions, LsmStore};
use crate::planner::{Caps, PlanStats};
use crate::workload::{KeyDist, Workload};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

nodup_core::named_enum! {
    /// Which store a benchmark drives.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum StoreKind {
        /// The FAWN-like log store; garbage collection is measured.
        Fawn = 1 => "fawn",
        /// The LSM store; the whole load with its compactions is measured.
        Lsm = 2 => "lsm",
    }
}

nodup_core::named_enum! {
    /// Which part of a FAWN benchmark runs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Phase {
        /// Load, then garbage collection (FAWN); the load (LSM).
        All = 1 => "all",
        /// Load only (FAWN), leaving the store for a `gc` run.
        Load = 2 => "load",
        /// Garbage collection of a store loaded before (FAWN).
        Gc = 3 => "gc",
    }
}

/// One benchmark run.
#[derive(Debug, Clone)]
pub struct BenchSpec {
    /// The store.
    pub store: StoreKind,
    /// Its directory.
    pub dir: PathBuf,
    /// FAWN: log bytes to fill; LSM: key and value bytes to put.
    pub size: u64,
    /// Bytes of each value.
    pub value_size: usize,
    /// Key distribution.
    pub keys: KeyDist,
    /// Bubbles on (with `caps`) or off.
    pub freewrite: bool,
    /// Bubble and global caps.
    pub caps: Caps,
    /// Which part runs.
    pub phase: Phase,
    /// Seed of the workload.
    pub seed: u64,
}

/// What a run measured; `ops_per_sec`, `app_bytes_written`, `bubble_bytes` and
/// `gc_or_compaction_runs` describe the measured phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchReport {
    /// "fawn" or "lsm".
    pub store: &'static str,
    /// Phase run.
    pub phase: &'static str,
    /// Key distribution.
    pub keys: &'static str,
    /// Bytes of each value.
    pub value_size: usize,
    /// Freewrite on.
    pub freewrite: bool,
    /// Bubble cap.
    pub bubble_cap: f64,
    /// Global cap.
    pub global_cap: f64,
    /// The size asked for.
    pub size: u64,
    /// Operations of the measured phase per second: FAWN GC, records of the old log
    /// processed; LSM, PUTs (flush and compactions included).
    pub ops_per_sec: f64,
    /// Operations of the measured phase.
    pub ops: u64,
    /// Seconds of the measured phase.
    pub seconds: f64,
    /// PUTs of the load (0 for a FAWN `gc` run).
    pub puts: u64,
    /// Of which overwrites.
    pub overwrites: u64,
    /// Seconds of the load (FAWN; the measured phase for LSM).
    pub load_seconds: f64,
    /// Bytes the store handed to the file system in the measured phase.
    pub app_bytes_written: u64,
    /// Bubble bytes written in the measured phase.
    pub bubble_bytes: u64,
    /// Bubble bytes in the store's files at the end.
    pub bubble_space_bytes: u64,
    /// Bytes of the store's data files at the end (log, or tables).
    pub store_bytes: u64,
    /// Garbage collections or (merging) compactions in the measured phase.
    pub gc_or_compaction_runs: u64,
    /// LSM: compactions that only moved a table.
    pub trivial_moves: u64,
    /// Planner counts of the measured phase.
    pub plan: PlanStats,
}

/// Run `spec`, calling `progress(done, total)` as the load goes.
pub fn run(spec: &BenchSpec, progress: &mut dyn FnMut(u64, u64)) -> Result<BenchReport> {
    let mut rep = BenchReport {
        store: spec.store.name(),
        phase: spec.phase.name(),
        keys: spec.keys.name(),
        value_size: spec.value_size,
        freewrite: spec.freewrite,
        bubble_cap: spec.caps.bubble_cap,
        global_cap: spec.caps.global_cap,
        size: spec.size,
        ..BenchReport::default()
    };
    let fw = spec.freewrite.then_some(spec.caps);
    match spec.store {
        StoreKind::Fawn => run_fawn(spec, fw, &mut rep, progress)?,
        StoreKind::Lsm => run_lsm(spec, fw, &mut rep, progress)?,
    }
    if rep.seconds > 0.0 {
        rep.ops_per_sec = rep.ops as f64 / rep.seconds;
    }
    Ok(rep)
}

/// The workload of a load, a value buffer and the start time; refused over a store that
/// already holds data (`holds`), whose numbers would mean nothing.
fn start_load(spec: &BenchSpec, holds: bool) -> Result<(Workload, Vec<u8>, Instant)> {
    if holds {
        return Err(Error::Invalid(format!(
            "{} already holds a store: load into an empty directory",
            spec.dir.display()
        )));
    }
    let w = Workload::new(spec.keys, spec.value_size, spec.seed)?;
    Ok((w, Vec::new(), Instant::now()))
}

fn run_fawn(
    spec: &BenchSpec,
    fw: Option<Caps>,
    rep: &mut BenchReport,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let opts = FawnOptions {
        freewrite: fw,
        sync: false,
    };
    let mut s = FawnStore::open(&spec.dir, opts)?;
    if spec.phase != Phase::Gc {
        let (mut w, mut v, t) = start_load(spec, s.stats().live_keys > 0)?;
        while s.log_bytes() < spec.size {
            let k = w.next(&mut v);
            s.put(&k, &v)?;
            if w.puts() % 4096 == 0 {
                progress(s.log_bytes(), spec.size);
            }
        }
        s.sync()?;
        rep.load_seconds = t.elapsed().as_secs_f64();
        rep.puts = w.puts();
        rep.overwrites = w.overwrites();
        if spec.phase == Phase::Load {
            let st = s.stats();
            rep.ops = w.puts();
            rep.seconds = rep.load_seconds;
            rep.app_bytes_written = st.app_bytes_written;
            rep.store_bytes = st.log_bytes;
            rep.bubble_space_bytes = st.bubble_space;
            return s.close();
        }
    }
    let before = s.stats().app_bytes_written;
    let t = Instant::now();
    let g = s.gc()?;
    rep.seconds = t.elapsed().as_secs_f64();
    let st = s.stats();
    rep.ops = g.records_scanned;
    rep.app_bytes_written = st.app_bytes_written - before;
    rep.bubble_bytes = g.plan.bubble_bytes;
    rep.bubble_space_bytes = st.bubble_space;
    rep.store_bytes = st.log_bytes;
    rep.gc_or_compaction_runs = 1;
    rep.plan = g.plan;
    s.close()
}

fn run_lsm(
    spec: &BenchSpec,
    fw: Option<Caps>,
    rep: &mut BenchReport,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    if spec.phase != Phase::All {
        return Err(Error::Invalid(
            "the LSM benchmark has one phase (all): its compactions run during the load".into(),
        ));
    }
    let opts = LsmOptions {
        freewrite: fw,
        ..LsmOptions::default()
    };
    let mut s = LsmStore::open(&spec.dir, opts)?;
    let (mut w, mut v, t) = start_load(spec, s.stats().table_bytes > 0)?;
    let mut put = 0u64;
    while put < spec.size {
        let k = w.next(&mut v);
        s.put(&k, &v)?;
        put += w.put_bytes();
        if w.puts() % 4096 == 0 {
            progress(put, spec.size);
        }
    }
    // Flush the memtable (and the compactions that triggers) inside the measured time.
    s.flush()?;
    rep.seconds = t.elapsed().as_secs_f64();
    let st = s.stats();
    rep.load_seconds = rep.seconds;
    rep.puts = w.puts();
    rep.overwrites = w.overwrites();
    rep.ops = w.puts();
    rep.app_bytes_written = st.app_bytes_written;
    rep.bubble_space_bytes = st.bubble_space;
    rep.store_bytes = st.table_bytes;
    rep.gc_or_compaction_runs = st.compactions;
    rep.trivial_moves = st.trivial_moves;
    rep.bubble_bytes = st.bubble_bytes_written;
    rep.plan = st.plan;
    s.close()?;
    Ok(())
}
