//! Systematic crash testing at the media level (pmreorder / Chipmunk style).
//!
//! A seeded workload runs through the file system on a `CrashSim` medium, formatted as pmem
//! (every operation durable when it returns) or, for every [`CrashConfig::blockfile_every`]th
//! workload, as a block file (durable at the next sync: releases wait for it, so a block an
//! unsynced record dropped is never reused or given back). A crash point is captured at
//! every fence.
//! Each point is materialised several ways (pending stores all dropped, all kept, per-line
//! prefixes, and on pmem random subsets and 8-byte tearing: see [`modes`]); each distinct image is opened with failure
//! recovery and checked: invariants (fsck, audit, refcounts, allocator) and the visible state
//! against the model — every operation completed before the crash point fully visible, the
//! one in flight either not at all or fully (or at one of its record boundaries); on a block
//! file, the state after any operation (or record boundary) since the last completed sync. A
//! sample of the images is crashed again *during* recovery and checked the same way.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use nodup_core::fingerprint::FpKind;
use nodup_core::media::{CrashMode, CrashPoint, CrashSim, Medium};
use nodup_core::policy::PolicyKind;
use nodup_core::FormatOptions;
use nodup_fs::{Caller, FileSystem, FsOptions, MediumKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::model::{run_op, setup, Model, Op, Snapshot};
use crate::verify::{check_crash_image, Mutant};
use crate::workload::{generate, WorkloadSpec};

/// Settings of a crash campaign.
#[derive(Debug, Clone)]
pub struct CrashConfig {
    /// Image size in bytes (small, so materialising is cheap).
    pub image_bytes: u64,
    /// Workload shape.
    pub spec: WorkloadSpec,
    /// Crash points checked per workload at most (a seeded sample when there are more).
    pub max_points: usize,
    /// Random materialisations per mode (line prefix, random subset, torn) per point.
    pub random_per_mode: u64,
    /// Every Nth checked state also writes after recovery and reopens cleanly (0 = never).
    pub exercise_every: u64,
    /// Every Nth checked state is also crashed during its recovery (0 = never).
    pub recovery_crash_every: u64,
    /// Broken step injected after recovery (tests of the checker itself).
    pub mutant: Mutant,
    /// Mutant at the medium level: flushes are dropped, so nothing ever becomes durable.
    pub drop_flushes: bool,
    /// Every Nth workload (by seed) formats with the 8-value test fingerprint, so collisions
    /// store duplicates apart and remaps move blocks (0 = never).
    pub collide_every: u64,
    /// Every Nth workload (by seed, offset by one from the collision seeds) formats with policy
    /// `smart` and a 16 KiB budget, so its store evicts, merges and promotes, and its worker
    /// remaps and adopts blocks inside the crash states (0 = never).
    pub smart_every: u64,
    /// Every Nth workload (by seed, residue 1) formats as a block file instead of pmem
    /// (0 = never).
    pub blockfile_every: u64,
    /// Every Nth block-file workload (by seed) writes large files ([`WorkloadSpec::large`])
    /// instead of `spec`'s, so the region table grows in batches inside its crash states
    /// (0 = never).
    pub large_every: u64,
}

impl Default for CrashConfig {
    fn default() -> Self {
        CrashConfig {
            image_bytes: 8 << 20,
            spec: WorkloadSpec::default(),
            max_points: 400,
            random_per_mode: 1,
            exercise_every: 25,
            recovery_crash_every: 40,
            mutant: Mutant::None,
            drop_flushes: false,
            collide_every: 3,
            smart_every: 4,
            blockfile_every: 5,
            large_every: 4,
        }
    }
}

/// Counts of a campaign.
#[derive(Debug, Clone, Default)]
pub struct CrashStats {
    /// Workloads run.
    pub workloads: u64,
    /// Distinct crash images checked.
    pub states: u64,
    /// Of those, images that broke an invariant or the model.
    pub violations: u64,
    /// Descriptions of the first violations (with seed, point and mode to replay them).
    pub examples: Vec<String>,
}

impl CrashStats {
    /// Add another campaign's counts.
    pub fn merge(&mut self, o: CrashStats) {
        self.workloads += o.workloads;
        self.states += o.states;
        self.violations += o.violations;
        for e in o.examples {
            if self.examples.len() < 20 {
                self.examples.push(e);
            }
        }
    }

    fn violation(&mut self, msg: String) {
        self.violations += 1;
        if self.examples.len() < 20 {
            self.examples.push(msg);
        }
    }
}

/// A medium that forgets flushes once armed (a mutant persistence layer for the checker's own
/// tests): stores after arming never become durable.
struct NoFlush(Arc<CrashSim>, std::sync::atomic::AtomicBool);

impl Medium for NoFlush {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> nodup_core::Result<()> {
        self.0.read(off, buf)
    }
    fn write(&self, off: u64, data: &[u8]) -> nodup_core::Result<()> {
        self.0.write(off, data)
    }
    fn flush(&self, off: u64, len: u64) {
        if !self.1.load(std::sync::atomic::Ordering::Relaxed) {
            self.0.flush(off, len)
        }
    }
    fn fence(&self) -> nodup_core::Result<()> {
        self.0.fence()
    }
    fn sync_all(&self) -> nodup_core::Result<()> {
        if self.1.load(std::sync::atomic::Ordering::Relaxed) {
            self.0.fence()
        } else {
            self.0.sync_all()
        }
    }
    fn discard(&self, off: u64, len: u64) -> nodup_core::Result<bool> {
        self.0.discard(off, len)
    }
    fn reserve(&self, off: u64, len: u64) -> nodup_core::Result<()> {
        self.0.reserve(off, len)
    }
    fn kind(&self) -> &'static str {
        "crashsim"
    }
}

/// The crash points of one workload with the model states each of them allows.
struct Recorded {
    points: Vec<(CrashPoint, usize, usize)>,
    states: Vec<Snapshot>,
    /// Formatted as a block file (crash states per sector, see [`modes`]).
    blockfile: bool,
}

fn record(seed: u64, cfg: &CrashConfig, ops: Option<&[Op]>) -> Result<Recorded, String> {
    let sim = Arc::new(CrashSim::new(cfg.image_bytes));
    let noflush = Arc::new(NoFlush(sim.clone(), false.into()));
    let medium: Arc<dyn Medium> = if cfg.drop_flushes {
        noflush.clone()
    } else {
        sim.clone()
    };
    // Every other workload cleans segments at each checkpoint, so crash states fall inside
    // segment cleaning too.
    let mut opts = FsOptions {
        eager_cleaning: seed % 2 == 1,
        ..FsOptions::default()
    };
    // `smart` fingerprints half the blocks inline, so its worker finds duplicates stored apart
    // and remaps them, or gives blocks their entries, inside the crash states; half the
    // workloads also run the run filter (runs of two and more).
    opts.open.policy.smart.fixed_selectivity = Some(0.5);
    opts.open.policy.smart.min_run = 1 + (seed / 4 % 2) as u32;
    let smart = cfg.smart_every > 0 && seed % cfg.smart_every == 1 % cfg.smart_every;
    // `selective` on another residue, with caches small enough to evict and refresh all the
    // time: its prefetch cache must never confirm a block whose entry went in the crash.
    let selective = !smart && cfg.smart_every > 2 && seed % cfg.smart_every == 3 % cfg.smart_every;
    opts.open.policy.selective = churning_selective();
    let blockfile =
        cfg.blockfile_every > 0 && seed % cfg.blockfile_every == 1 % cfg.blockfile_every;
    // On a block file, a `light` workload whose seed is divisible by 3 (with the default
    // `collide_every`, never one with the colliding fingerprint) runs `strong` instead: the policy that shares on a fingerprint
    // match without comparing bytes, whose recovery checks each kept entry against its block.
    let strong = blockfile && !smart && !selective && seed.is_multiple_of(3);
    let fopts = FormatOptions {
        fingerprint: if cfg.collide_every > 0 && seed % cfg.collide_every == cfg.collide_every - 1 {
            FpKind::TestCollide
        } else {
            FpKind::Xxh3
        },
        policy: if smart {
            PolicyKind::Smart
        } else if selective {
            PolicyKind::Selective
        } else if strong {
            PolicyKind::Strong
        } else {
            PolicyKind::Light
        },
        mem_budget: if smart { 16 << 10 } else { 0 },
        // Each policy on the layout mkfs gives it (smart: the hash table).
        meta_layout: nodup_core::meta::MetaLayoutKind::default_for(if smart {
            PolicyKind::Smart
        } else {
            PolicyKind::Light
        }),
        // Every fifth workload on an encrypted image (all policies in turn): the encrypting
        // media must keep the persistence model byte for byte.
        encrypt: (seed % 5 == 2).then(|| nodup_core::KeyFile(crate::verify::TEST_KEY.to_vec())),
        ..FormatOptions::default()
    };
    let kind = if blockfile {
        // The engine's stores as on a `BlockFile` (gathered runs, one-store entry bodies).
        sim.set_gathers(true);
        MediumKind::BlockFile
    } else {
        MediumKind::Pmem
    };
    let fs = FileSystem::format(medium, kind, &fopts, &opts, Caller::default())
        .map_err(|e| format!("format: {e}"))?;
    setup(&fs).map_err(|e| format!("setup: {e}"))?;
    // The starting point is durable on a block file too (on pmem it already is).
    fs.sync().map_err(|e| format!("setup: {e}"))?;
    noflush.1.store(true, std::sync::atomic::Ordering::Relaxed);
    let generated;
    let ops = match ops {
        Some(o) => o,
        None => {
            let large = blockfile
                && cfg.large_every > 0
                && (seed / cfg.blockfile_every) % cfg.large_every == 2 % cfg.large_every;
            let large_spec;
            let spec = if large {
                large_spec = WorkloadSpec::large();
                &large_spec
            } else {
                &cfg.spec
            };
            generated = generate(seed, spec);
            &generated[..]
        }
    };
    let mut model = Model::default();
    // states[k]: snapshots in order; each op covers a range of them.
    let mut states = vec![model.snapshot()];
    sim.set_capture_filter(Box::new(|_| true));
    // (first fence, last fence, first allowed state, last allowed state) per op.
    let mut spans = Vec::with_capacity(ops.len());
    // On a block file, the state at the end of the last completed sync: what a crash may
    // fall back to.
    let mut synced = 0;
    // On a block file, the held-back log records also go out between operations now and then,
    // as the daemon's tick writes them (after a fence, not durable).
    let mut tick = StdRng::seed_from_u64(seed ^ 0x7100_7100);
    for (i, op) in ops.iter().enumerate() {
        let f0 = sim.fence_count();
        run_op(&fs, op).map_err(|e| format!("seed {seed}: op {i} {op:?} failed: {e}"))?;
        if blockfile && tick.gen_bool(0.3) {
            fs.write_out_log()
                .map_err(|e| format!("seed {seed}: writing out the log after op {i}: {e}"))?;
        }
        let f1 = sim.fence_count();
        let before = if blockfile { synced } else { states.len() - 1 };
        states.extend(model.apply_steps(op));
        spans.push((f0, f1, before, states.len() - 1));
        if matches!(op, Op::Sync | Op::Checkpoint | Op::Trim) {
            synced = states.len() - 1;
        }
    }
    sim.clear_capture_filter();
    // The live file system must be consistent too (reference counts against the files): a
    // recovery recounts them, so a crash state alone would not show a count that is too low.
    match nodup_fs::fsck::check(&fs, false) {
        Ok(r) if r.consistent() => {}
        Ok(r) => return Err(format!("seed {seed}: live fsck: {:?}", r.problems)),
        Err(e) => return Err(format!("seed {seed}: live fsck failed: {e}")),
    }
    let mut points = Vec::new();
    for p in sim.take_captures() {
        // A capture at fence n has fence() == n - 1 and belongs to the op with f0 < n <= f1.
        let n = p.fence() + 1;
        if let Some(&(_, _, a, b)) = spans.iter().find(|s| s.0 < n && n <= s.1) {
            points.push((p, a, b));
        }
    }
    let last = states.len() - 1;
    points.push((
        sim.crash_point(),
        if blockfile { synced } else { last },
        last,
    ));
    drop(fs);
    Ok(Recorded {
        points,
        states,
        blockfile,
    })
}

/// The materialisations of a point with `pending` stores.
///
/// On persistent memory, beyond the line prefixes cache write-back can produce, random subsets
/// and 8-byte tearing hold the code to more than the hardware does. A block file's crash
/// states are coarser: the page cache writes a page back as it is at that moment, and a disk
/// (or a sector rewritten whole under `O_DIRECT`) persists each sector whole, so every sector
/// shows a prefix of the stores made to it. Per-line prefixes (64 bytes, finer than any
/// sector) include all of those states; a later store to a sector without an earlier one
/// does not happen there, short of a copy below the page cache racing the stores (the one
/// case docs/results/torture.md's Limits name), so block-file workloads get line-prefix
/// samples instead: two uniform, one that keeps each line whole three times in four (the
/// states where a record is durable and the entry it needs is not are rare otherwise).
fn modes(cfg: &CrashConfig, rng: &mut StdRng, pending: usize, blockfile: bool) -> Vec<CrashMode> {
    let mut v = vec![CrashMode::DropAll];
    if pending == 0 {
        return v;
    }
    v.push(CrashMode::KeepAll);
    for _ in 0..cfg.random_per_mode {
        v.push(CrashMode::LinePrefix { seed: rng.gen() });
        if blockfile {
            v.push(CrashMode::LinePrefix { seed: rng.gen() });
            v.push(CrashMode::LinePrefixKeep { seed: rng.gen() });
        } else {
            v.push(CrashMode::Random { seed: rng.gen() });
            v.push(CrashMode::Torn { seed: rng.gen() });
        }
    }
    v
}

/// Crash the recovery of `img` at a few of its fences and check those images too.
fn crash_during_recovery(
    img: &[u8],
    allowed: &[&Snapshot],
    rng: &mut StdRng,
    st: &mut CrashStats,
    what: &str,
) {
    let sim = Arc::new(CrashSim::from_bytes(img.to_vec()));
    sim.set_capture_filter(Box::new(|_| true));
    let fs = match FileSystem::open(sim.clone(), &crate::verify::open_opts(&*sim)) {
        Ok(fs) => fs,
        Err(e) => {
            st.states += 1;
            st.violation(format!("{what}: recovery failed: {e}"));
            return;
        }
    };
    drop(fs);
    let caps = sim.take_captures();
    if caps.is_empty() {
        return;
    }
    for _ in 0..2 {
        let p = &caps[rng.gen_range(0..caps.len())];
        let mode = if rng.gen_bool(0.5) {
            CrashMode::DropAll
        } else {
            CrashMode::LinePrefix { seed: rng.gen() }
        };
        st.states += 1;
        if let Err(e) = check_crash_image(p.materialize(&mode), allowed, Mutant::None, false) {
            st.violation(format!(
                "{what}, then crash during recovery at fence {} {mode:?}: {e}",
                p.fence() + 1
            ));
        }
    }
}

/// Run one workload (`seed`) and check its crash states, stopping early at `deadline`.
pub fn run_workload(seed: u64, cfg: &CrashConfig, deadline: Option<Instant>) -> CrashStats {
    check_ops(seed, cfg, None, deadline)
}

/// Check the crash states of a given operation sequence (`seed` picks the sampled points and
/// the format, as for a generated workload).
pub fn run_ops(seed: u64, cfg: &CrashConfig, ops: &[Op], deadline: Option<Instant>) -> CrashStats {
    check_ops(seed, cfg, Some(ops), deadline)
}

fn check_ops(
    seed: u64,
    cfg: &CrashConfig,
    ops: Option<&[Op]>,
    deadline: Option<Instant>,
) -> CrashStats {
    let mut st = CrashStats {
        workloads: 1,
        ..Default::default()
    };
    let rec = match record(seed, cfg, ops) {
        Ok(r) => r,
        Err(e) => {
            st.violation(e);
            return st;
        }
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0xC4A5_11ED);
    let mut idx: Vec<usize> = (0..rec.points.len()).collect();
    if idx.len() > cfg.max_points {
        // Keep the final point, sample the rest.
        let last = idx.pop().unwrap();
        for i in 0..cfg.max_points - 1 {
            let j = rng.gen_range(i..idx.len());
            idx.swap(i, j);
        }
        idx.truncate(cfg.max_points - 1);
        idx.sort_unstable();
        idx.push(last);
    }
    let mut checked = 0u64;
    for i in idx {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let (p, a, b) = &rec.points[i];
        let allowed: Vec<&Snapshot> = rec.states[*a..=*b].iter().collect();
        let mut seen = HashSet::new();
        for mode in modes(cfg, &mut rng, p.pending().len(), rec.blockfile) {
            let img = p.materialize(&mode);
            if !seen.insert(xxhash_rust::xxh3::xxh3_128(&img)) {
                continue;
            }
            checked += 1;
            st.states += 1;
            let exercise = cfg.exercise_every > 0 && checked.is_multiple_of(cfg.exercise_every);
            let what = format!(
                "seed {seed} point {i} (fence {}, {} pending) {mode:?}",
                p.fence() + 1,
                p.pending().len()
            );
            match check_crash_image(img.clone(), &allowed, cfg.mutant, exercise) {
                Err(e) => st.violation(format!("{what}: {e}")),
                Ok(()) => {
                    if cfg.recovery_crash_every > 0
                        && checked.is_multiple_of(cfg.recovery_crash_every)
                    {
                        crash_during_recovery(&img, &allowed, &mut rng, &mut st, &what);
                    }
                }
            }
        }
    }
    st
}

/// Run workloads with seeds `seed, seed+1, ...` until `deadline` or `max_states` states.
pub fn campaign(seed: u64, cfg: &CrashConfig, deadline: Instant, max_states: u64) -> CrashStats {
    let mut total = CrashStats::default();
    let mut s = seed;
    while Instant::now() < deadline && total.states < max_states {
        total.merge(run_workload(s, cfg, Some(deadline)));
        s += 1;
    }
    total
}

/// `selective`'s options in the campaigns: caches small enough to evict and refresh all the
/// time.
pub fn churning_selective() -> nodup_core::policy::selective::SelectiveOptions {
    nodup_core::policy::selective::SelectiveOptions {
        fp_cache_bytes: 4 << 10,
        prefetch_bytes: 16 << 10,
        refresh_ms: None,
        refresh_ops: Some(5),
    }
}
