//! Media faults: an I/O error or a short write injected at one medium operation inside one
//! file-system operation. The error must reach the caller as EIO, the live file system must
//! still show a state the model allows (and keep working), and the image, reopened with
//! failure recovery, must be consistent with everything committed before still readable.
//! What the failed operation may have left on the medium (a log frame whose fence failed)
//! must not replay onto blocks given back since: the image is also checked after a trim and a
//! crash right after the fault, and in some trials after a clean unmount right after it.
//!
//! Some trials fail a space reservation instead (`Medium::reserve`, ENOSPC, what a full disk
//! under an image file gives): the caller sees success or ENOSPC, and nothing else may differ
//! from an I/O fault's promises; the live engine must stay consistent too.

use std::sync::Arc;
use std::time::Instant;

use nodup_core::media::{FaultMedium, FaultOp, FaultRule, Medium, MemMedium};
use nodup_core::meta::MetaLayoutKind;
use nodup_core::policy::PolicyKind;
use nodup_core::{FormatOptions, BLOCK_SIZE};
use nodup_fs::{Caller, FileSystem, FsOptions, MediumKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::model::{run_op, setup, snapshot_fs, Model, Snapshot};
use crate::verify::{check_crash_image, check_invariants, open_opts, Mutant};
use crate::workload::{generate, pattern_block, WorkloadSpec};

/// Counts of a fault campaign.
#[derive(Debug, Clone, Default)]
pub struct FaultStats {
    /// Trials run (one injected fault each).
    pub trials: u64,
    /// Trials where the fault fired.
    pub fired: u64,
    /// Trials that broke a promise.
    pub violations: u64,
    /// Fired faults the operation did not report (it returned success; a short copy counts as
    /// reported, see `run_op`).
    pub swallowed: u64,
    /// Of those, the ones the engine counted as absorbed (`media_errors_absorbed` in the stats).
    pub counted_absorbed: u64,
    /// Known finding 1: operations that completed after an EIO inside a log append were lost
    /// by recovery (the log writer keeps its advanced position after a failed append).
    pub lost_after_eio: u64,
    /// Known finding 2: after a failed operation the live engine holds leaked references or
    /// half-created dedup entries until the next failure recovery.
    pub live_inconsistent: u64,
    /// Fired faults that failed a space reservation ([`Aim::reserve`]).
    pub reserves_failed: u64,
    /// Of those, the ones whose operation failed with ENOSPC (the rest went through).
    pub reserve_enospc: u64,
    /// First violations and findings, with seed and op to replay.
    pub examples: Vec<String>,
}

impl FaultStats {
    /// Add another run's counts.
    pub fn merge(&mut self, t: FaultStats) {
        self.trials += t.trials;
        self.fired += t.fired;
        self.swallowed += t.swallowed;
        self.counted_absorbed += t.counted_absorbed;
        self.violations += t.violations;
        self.lost_after_eio += t.lost_after_eio;
        self.live_inconsistent += t.live_inconsistent;
        self.reserves_failed += t.reserves_failed;
        self.reserve_enospc += t.reserve_enospc;
        for e in t.examples {
            if self.examples.len() < 20 {
                self.examples.push(e);
            }
        }
    }

    fn note(&mut self, m: String) {
        if self.examples.len() < 20 {
            self.examples.push(m);
        }
    }

    fn violation(&mut self, m: String) {
        self.violations += 1;
        if self.examples.len() < 20 {
            self.examples.push(m);
        }
    }
}

struct Setup {
    mem: Arc<MemMedium>,
    fm: Arc<FaultMedium>,
    fs: FileSystem,
}

/// One workload in this many runs on a block-file image (appends not fenced one by one,
/// releases waiting for a sync), the rest on pmem.
const BLOCKFILE_EVERY: u64 = 4;

/// Where a trial's fault goes, and what follows it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Aim {
    /// The operation of the workload the fault hits.
    pub k: usize,
    /// The medium operation of it that fails (1-based).
    pub nth: u64,
    /// A write or discard fails after a prefix instead of whole.
    pub short: bool,
    /// A clean unmount follows the fault instead of more work.
    pub unmount: bool,
    /// On a block-file image instead of pmem.
    pub block_file: bool,
    /// The fault fails a space reservation with ENOSPC (`nth` counts reservations) instead
    /// of an I/O.
    pub reserve: bool,
    /// With `reserve`: every reservation of the op fails, not only the `nth` (the disk
    /// under the image stays full while it runs).
    pub every: bool,
}

/// What op `k` of a workload does to the medium: operations a fault can fail, and space
/// reservations.
#[derive(Debug, Clone, Copy)]
struct Cost {
    ops: u64,
    reserves: u64,
}

/// The policy of workload `seed`: of every four, one on `smart` (a 16 KiB budget, so its
/// fingerprint groups are merged and evicted all the time, and half the blocks left to its
/// out-of-line worker, which the workload's `SmartStep`s run) and one on `selective` (caches
/// small enough to evict and refresh all the time); the others (the block-file one among
/// them) on `light`. One in five is encrypted.
fn policy_of(seed: u64) -> (FormatOptions, FsOptions) {
    let policy = match seed % BLOCKFILE_EVERY {
        2 => PolicyKind::Smart,
        3 => PolicyKind::Selective,
        _ => PolicyKind::Light,
    };
    let mut opts = FsOptions::default();
    opts.open.policy.smart.fixed_selectivity = Some(0.5);
    opts.open.policy.selective = crate::crash::churning_selective();
    let fopts = FormatOptions {
        policy,
        mem_budget: if policy == PolicyKind::Smart {
            16 << 10
        } else {
            0
        },
        meta_layout: MetaLayoutKind::default_for(policy),
        // One workload in five (all policies in turn) on an encrypted image: its media's
        // read-modify-write of partial blocks meets the faults too.
        encrypt: (seed % 5 == 2).then(|| nodup_core::KeyFile(crate::verify::TEST_KEY.to_vec())),
        ..FormatOptions::default()
    };
    (fopts, opts)
}

fn fresh(bytes: u64, seed: u64, block_file: bool) -> Result<Setup, String> {
    let kind = if block_file {
        MediumKind::BlockFile
    } else {
        MediumKind::Pmem
    };
    let mem = Arc::new(MemMedium::new(bytes));
    let fm = Arc::new(FaultMedium::new(mem.clone(), seed));
    // A block-file trial takes the stores a block file takes (gathered data, runs of
    // entries, batch grows of the region table).
    fm.set_gathers(block_file);
    let (fopts, opts) = policy_of(seed);
    let fs = FileSystem::format(fm.clone(), kind, &fopts, &opts, Caller::default())
        .map_err(|e| format!("format: {e}"))?;
    setup(&fs).map_err(|e| format!("setup: {e}"))?;
    Ok(Setup { mem, fm, fs })
}

/// One trial: workload `seed`, its fault where `aim` says.
pub fn trial(seed: u64, spec: &WorkloadSpec, aim: Aim) -> FaultStats {
    let mut st = FaultStats {
        trials: 1,
        ..Default::default()
    };
    let Aim {
        k,
        nth,
        short,
        unmount,
        block_file,
        reserve,
        every,
    } = aim;
    let what = format!("fault seed {seed} {aim:?}");
    let ops = generate(seed, spec);
    let s = match fresh(8 << 20, seed, block_file) {
        Ok(s) => s,
        Err(e) => {
            st.violation(format!("{what}: {e}"));
            return st;
        }
    };
    let mut model = Model::default();
    for op in &ops[..k] {
        if let Err(e) = run_op(&s.fs, op) {
            st.violation(format!("{what}: op {op:?} failed without a fault: {e}"));
            return st;
        }
        model.apply_steps(op);
    }
    let mut allowed: Vec<Snapshot> = vec![model.snapshot()];
    allowed.extend(model.apply_steps(&ops[k]));
    let mut rule = FaultRule::new(FaultOp::Any).nth(nth).once();
    if reserve && every {
        rule = FaultRule::new(FaultOp::Reserve);
    } else if reserve {
        rule = FaultRule::new(FaultOp::Reserve).nth(nth).once();
    } else if short {
        rule = rule.short_write((nth as usize * 37) % 4096);
    }
    s.fm.add_rule(rule);
    let absorbed0 = s.fs.engine().stats().media_errors_absorbed;
    let r = run_op(&s.fs, &ops[k]);
    let absorbed = s.fs.engine().stats().media_errors_absorbed > absorbed0;
    let fired = s.fm.injected() > 0;
    s.fm.clear_rules();
    // A rebuild of the engine (failure recovery while mounted) that met the fault leaves it
    // given up; the maintenance tick tries again after its wait, as here, and the checks below
    // see what that left. Any other operation must leave changes possible: the next change
    // would rebuild the engine itself, so the probe below would not show that one fault made
    // it give up (every change in flight meanwhile fails).
    if matches!(ops[k], crate::model::Op::Rebuild) {
        s.fs.recover_if_gave_up(true);
    } else if let Err(e) = s.fs.changes_possible() {
        st.violation(format!("{what}: one fault stopped every change: {e}"));
    }
    if fired && reserve {
        st.fired += 1;
        st.reserves_failed += 1;
        match &r {
            Ok(()) => {}
            Err(e) if e.errno() == libc::ENOSPC => st.reserve_enospc += 1,
            // A short copy (blocks shared, then ENOSPC) is how copy_file_range reports it,
            // as write(2) does; `run_op` stands it for an EIO.
            Err(e) if e.errno() == libc::EIO && matches!(ops[k], crate::model::Op::Copy(..)) => {
                st.reserve_enospc += 1
            }
            Err(e) => st.violation(format!(
                "{what}: a failed reservation reaches the caller as {e} (errno {})",
                e.errno()
            )),
        }
    } else if fired {
        st.fired += 1;
        match &r {
            Ok(()) => {
                st.swallowed += 1;
                st.counted_absorbed += u64::from(absorbed);
                if !absorbed && std::env::var_os("NODUP_TORTURE_SWALLOWED").is_some() {
                    st.note(format!("{what}: swallowed by op {:?}", ops[k]));
                }
            }
            Err(e) if e.errno() != libc::EIO => st.violation(format!(
                "{what}: error {e} reaches the caller as errno {}",
                e.errno()
            )),
            Err(_) => {}
        }
    } else if let Err(e) = &r {
        st.violation(format!("{what}: op failed without a fault: {e}"));
    }
    let refs: Vec<&Snapshot> = allowed.iter().collect();
    // The live file system keeps serving a state the model allows.
    let live = match snapshot_fs(&s.fs) {
        Ok(got) if refs.iter().any(|a| **a == got) => Some(got),
        Ok(_) => {
            st.violation(format!("{what}: live state after the fault is not allowed"));
            None
        }
        Err(e) => {
            st.violation(format!("{what}: live read after the fault: {e}"));
            None
        }
    };
    if let Err(e) = check_invariants(&s.fs) {
        if reserve {
            st.violation(format!(
                "{what}: live invariants after a failed reservation: {e}"
            ));
        } else {
            st.live_inconsistent += 1;
            st.note(format!(
                "{what}: [finding 2] live invariants after the fault: {e}"
            ));
        }
    }
    if fired {
        // Free space given back to the medium (filled with a pattern here): a crash now must
        // not show a file whose record names any of it.
        match s.fs.trim(0, s.mem.len(), BLOCK_SIZE as u64) {
            Ok(_) => {
                let img = s.mem.snapshot();
                if let Err(e) = check_crash_image(img, &refs, Mutant::None, false) {
                    st.violation(format!("{what}: after a trim and a crash: {e}"));
                }
            }
            Err(e) => st.violation(format!("{what}: trim after the fault: {e}")),
        }
    }
    if unmount {
        // A clean unmount now, and a clean reopen shows what the live file system did.
        let Some(live) = live else { return st };
        if let Err(e) = s.fs.shutdown() {
            st.violation(format!("{what}: clean unmount after the fault: {e}"));
            return st;
        }
        drop(s.fs);
        let img = s.mem.snapshot();
        if let Err(e) = check_clean_image(img, &live) {
            st.violation(format!("{what}: reopened after a clean unmount: {e}"));
        }
        return st;
    }
    // ... and keeps working.
    let probe = pattern_block(seed);
    let ok =
        s.fs.mknod(
            nodup_fs::inode::ROOT_INO,
            b"probe",
            nodup_fs::inode::Kind::File,
            0o644,
            0,
            b"",
            Caller::default(),
        )
        .and_then(|(ino, _)| s.fs.write(ino, 0, &probe).map(|_| ino))
        .and_then(|ino| s.fs.read(ino, 0, probe.len()));
    match ok {
        Ok(d) if d == probe => {}
        Ok(_) => st.violation(format!("{what}: probe file reads back wrong")),
        Err(e) => st.violation(format!("{what}: file system unusable after the fault: {e}")),
    }
    // The image as the fault left it (probe included), reopened with failure recovery.
    let probe_states: Vec<Snapshot> = allowed
        .iter()
        .map(|a| {
            let mut a = a.clone();
            a.insert(
                "probe".into(),
                crate::model::Entry {
                    group: "probe".into(),
                    nlink: 1,
                    size: probe.len() as u64,
                    hash: xxhash_rust::xxh3::xxh3_64(&probe),
                },
            );
            a
        })
        .collect();
    // A block file holds its log records back until the tick writes them out (after a fence
    // for their data, not durable; `log/held.rs`): the crash comes after that, so the probe's
    // record is on the medium as every record was at its append before session 47.
    if let Err(e) = s.fs.write_out_log() {
        st.violation(format!("{what}: writing out the log after the probe: {e}"));
    }
    let img = s.mem.snapshot();
    drop(s.fs);
    let refs: Vec<&Snapshot> = probe_states.iter().collect();
    if let Err(e) = check_crash_image(img.clone(), &refs, Mutant::None, false) {
        if probe_lost(img) {
            st.lost_after_eio += 1;
            st.note(format!("{what}: [finding 1] after reopen: {e}"));
        } else {
            st.violation(format!("{what}: after reopen: {e}"));
        }
    }
    st
}

/// Open `img`, unmounted cleanly: a clean open, every invariant, and exactly `live`.
fn check_clean_image(img: Vec<u8>, live: &Snapshot) -> Result<(), String> {
    let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(img));
    let fs = FileSystem::open(m.clone(), &open_opts(&*m)).map_err(|e| format!("open: {e}"))?;
    if fs.recovery().kind != "clean" {
        return Err(format!("the open ran {} recovery", fs.recovery().kind));
    }
    check_invariants(&fs)?;
    match snapshot_fs(&fs)? {
        got if got == *live => Ok(()),
        _ => Err("the state is not the live one".into()),
    }
}

/// True when the recovered image lacks the probe file written after the fault.
fn probe_lost(img: Vec<u8>) -> bool {
    let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(img));
    match FileSystem::open(m.clone(), &open_opts(&*m)) {
        Ok(fs) => snapshot_fs(&fs).is_ok_and(|s| !s.contains_key("probe")),
        Err(_) => false,
    }
}

/// Medium operations and reservations each op of workload `seed` performs (to aim the
/// faults).
fn op_costs(seed: u64, spec: &WorkloadSpec, block_file: bool) -> Result<Vec<Cost>, String> {
    let ops = generate(seed, spec);
    let s = fresh(8 << 20, seed, block_file)?;
    // A rule that never fires (no reservation is the 0th), counting the reservations.
    let counter = s.fm.add_rule(FaultRule::new(FaultOp::Reserve).nth(0));
    let reserves = || s.fm.rule(counter).map_or(0, |r| r.seen());
    let mut v = Vec::with_capacity(ops.len());
    for op in &ops {
        let (ops0, res0) = (s.fm.ops(), reserves());
        run_op(&s.fs, op).map_err(|e| format!("fault seed {seed}: {op:?}: {e}"))?;
        v.push(Cost {
            ops: s.fm.ops() - ops0,
            reserves: reserves() - res0,
        });
    }
    Ok(v)
}

/// Every trial that fails space reservations of workload `seed`: each reservation of each op
/// in turn (every other one followed by a clean unmount), and for each op that reserves,
/// all of its reservations (followed by more work). The campaign draws from these only now
/// and then, since few ops take space from the medium.
pub fn reserve_aims(seed: u64, spec: &WorkloadSpec) -> Result<Vec<Aim>, String> {
    let block_file = seed % BLOCKFILE_EVERY == 1;
    let costs = op_costs(seed, spec, block_file)?;
    let aims = costs.iter().enumerate().flat_map(|(k, c)| {
        let one = (1..=c.reserves).map(move |nth| Aim {
            k,
            nth,
            block_file,
            reserve: true,
            unmount: nth % 2 == 0,
            ..Aim::default()
        });
        let every = (c.reserves > 0).then_some(Aim {
            k,
            nth: 1,
            block_file,
            reserve: true,
            every: true,
            ..Aim::default()
        });
        one.chain(every)
    });
    Ok(aims.collect())
}

/// Run fault trials from `seed` until `deadline` or `max_trials`.
pub fn campaign(seed: u64, spec: &WorkloadSpec, deadline: Instant, max_trials: u64) -> FaultStats {
    let mut total = FaultStats::default();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut wseed = seed;
    while Instant::now() < deadline && total.trials < max_trials {
        let block_file = wseed % BLOCKFILE_EVERY == 1;
        let costs = match op_costs(wseed, spec, block_file) {
            Ok(c) => c,
            Err(e) => {
                total.violation(e);
                total.trials += 1;
                wseed += 1;
                continue;
            }
        };
        for _ in 0..8 {
            if Instant::now() >= deadline || total.trials >= max_trials {
                break;
            }
            let k = rng.gen_range(0..costs.len());
            // One trial in four, where the op reserves space at all, fails reservations.
            let reserve = costs[k].reserves > 0 && rng.gen_bool(0.25);
            let n = if reserve {
                costs[k].reserves
            } else {
                costs[k].ops
            };
            if n == 0 {
                continue;
            }
            let nth = rng.gen_range(1..=n);
            let aim = Aim {
                k,
                nth,
                short: !reserve && rng.gen_bool(0.3),
                unmount: rng.gen_bool(0.25),
                block_file,
                reserve,
                // A third of them fail every reservation of the op (a disk that stays full).
                every: reserve && rng.gen_bool(1.0 / 3.0),
            };
            total.merge(trial(wseed, spec, aim));
        }
        wseed += 1;
    }
    total
}
