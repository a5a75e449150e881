//! Threads on the library file system, with and without media faults.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use nodup_core::media::{FaultMedium, FaultOp, FaultRule, Medium, MemMedium};
use nodup_core::meta::MetaLayoutKind;
use nodup_core::policy::PolicyKind;
use nodup_core::FormatOptions;
use nodup_fs::{Caller, FileSystem, FsOptions, MediumKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{final_check, run_workers, LibTarget, Retired, StressStats, StressTarget};
use crate::verify::check_invariants;
use crate::workload::pattern_block;

/// Library stress: threads on one file system, then invariants, a clean reopen and a crash
/// reopen (failure recovery), each compared with the model.
pub fn library(threads: usize, seed: u64, deadline: Instant) -> StressStats {
    library_run(threads, seed, deadline, false, false)
}

/// [`library`] on `smart` with a 64 KiB budget (its fingerprint groups evicted and merged
/// all the time) and half the blocks fingerprinted inline: its background worker adopts and
/// remaps blocks while the threads write, delete and rename them.
pub fn library_smart(threads: usize, seed: u64, deadline: Instant) -> StressStats {
    library_run(threads, seed, deadline, false, true)
}

/// [`library`] on a medium that fails about one operation in [`FAULT_ONE_IN`] (an I/O error,
/// or a write that fails after its bytes landed) and one space reservation in ten (ENOSPC, a
/// full disk under the image): failures race with other threads' appends, checkpoints and
/// trims. An operation may fail only with EIO, and the names it touched leave the model, or
/// with ENOSPC, having changed nothing; once the faults stop, the file system must keep working and hold the rest of
/// the model, live, after a crash and after a clean unmount. Every [`GIVE_UP_EVERY`] the
/// engine gives up its live state, and the maintenance tick rebuilds it while the threads
/// run. An even `seed` runs it on `smart` as [`library_smart`] does (its worker meets the
/// faults too).
pub fn library_faults(threads: usize, seed: u64, deadline: Instant) -> StressStats {
    library_run(threads, seed, deadline, true, seed.is_multiple_of(2))
}

/// Medium operations per injected fault in [`library_faults`]: about 40 faults a second with
/// 6 threads. At one in 4 000 the engine soon gives up its live state (a failed release asks
/// for failure recovery), and the rest of the run only meets that.
pub const FAULT_ONE_IN: u32 = 40_000;

/// How often [`library_faults`] makes the engine give up its live state beside the running
/// threads, so failure recovery while mounted runs among them.
pub const GIVE_UP_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

fn library_run(
    threads: usize,
    seed: u64,
    deadline: Instant,
    faults: bool,
    smart: bool,
) -> StressStats {
    let mem = Arc::new(MemMedium::new(64 << 20));
    let fm = Arc::new(FaultMedium::new(mem.clone(), seed));
    let mut opts = FsOptions {
        checkpoint_log_bytes: 1 << 20,
        ..FsOptions::default()
    };
    let mut fopts = FormatOptions::default();
    if smart {
        opts.open.policy.smart.fixed_selectivity = Some(0.5);
        fopts.policy = PolicyKind::Smart;
        fopts.mem_budget = 64 << 10;
        fopts.meta_layout = MetaLayoutKind::default_for(PolicyKind::Smart);
    }
    let fs = match FileSystem::format(
        fm.clone(),
        MediumKind::Pmem,
        &fopts,
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
    if let Err(e) = fs.start_smart_worker() {
        let mut st = StressStats::default();
        st.bad(format!("smart worker: {e}"));
        return st;
    }
    let background = |fm: &FaultMedium| {
        let p = 0.5 / FAULT_ONE_IN as f64;
        fm.add_rule(FaultRule::new(FaultOp::Any).probability(p));
        // One metadata reservation in ten finds no room where the image lives (a full disk):
        // the file system takes other blocks, waits or fails the operation with ENOSPC.
        fm.add_rule(FaultRule::new(FaultOp::Reserve).probability(0.1));
        fm.add_rule(
            FaultRule::new(FaultOp::Write)
                .probability(p)
                .short_write(usize::MAX),
        );
    };
    if faults {
        background(&fm);
    }
    // The daemon's maintenance timer: checkpoints (small threshold, so they race with the
    // workers) and deferred releases; and `fstrim` as often, so free blocks are given back
    // (overwritten with a poison pattern by the test medium) while the workers allocate.
    // With faults, every fourth round also takes a checkpoint with one of its first
    // operations failing (the background rate fails hardly any: a checkpoint is a few dozen
    // of the millions of operations), while the workers go on. The tick's own checkpoints
    // run on this thread too.
    // With faults, every GIVE_UP_EVERY the engine gives up its live state, whatever runs, and
    // is rebuilt while the workers and the ticker go on: at once every other time (operations
    // that began before are still running), else after 20 ms, when a worker's next change
    // has usually rebuilt it first. On a thread of its own, so a rebuild can meet a
    // checkpoint, a trim or a `smart` step in flight.
    let healer = faults.then(|| {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let mut gave_ups = 0u64;
            while Instant::now() + GIVE_UP_EVERY < deadline {
                std::thread::sleep(GIVE_UP_EVERY);
                fs.engine().give_up_live_state();
                gave_ups += 1;
                if gave_ups.is_multiple_of(2) {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                fs.recover_if_gave_up(true);
            }
        })
    });
    let ticker = {
        let (fs, fm) = (fs.clone(), fm.clone());
        std::thread::spawn(move || {
            let mut errors = Vec::new();
            let allowed = |e: &nodup_fs::FsError| faults && e.errno() == libc::EIO;
            let mut rng = StdRng::seed_from_u64(seed ^ 0xC4EC);
            let mut round = 0u64;
            while Instant::now() < deadline {
                round += 1;
                if faults && round.is_multiple_of(4) {
                    // (operation, landed, how many of it a small checkpoint takes)
                    let (op, landed, n) = [
                        (FaultOp::Write, false, 24),
                        (FaultOp::Write, true, 24),
                        (FaultOp::Fence, false, 3),
                        (FaultOp::Read, false, 2),
                    ][rng.gen_range(0..4)];
                    let rule = FaultRule::new(op)
                        .this_thread()
                        .nth(rng.gen_range(1..=n))
                        .once();
                    fm.add_rule(if landed {
                        rule.short_write(usize::MAX)
                    } else {
                        rule
                    });
                    match fs.checkpoint(false) {
                        Err(e) if !allowed(&e) => errors.push(format!("checkpoint: {e}")),
                        _ => {}
                    }
                    fm.clear_rules();
                    background(&fm);
                }
                match fs.tick() {
                    Err(e) if !allowed(&e) => errors.push(format!("tick: {e}")),
                    _ => {}
                }
                match fs.trim(0, u64::MAX, 0) {
                    Err(e) if !allowed(&e) => errors.push(format!("trim: {e}")),
                    _ => {}
                }
                // smart: worker steps here too, beside the worker's own thread (which paces
                // itself), so out-of-line dedup races the threads all the time.
                if smart {
                    if let Err(e) = fs.smart_step(256) {
                        errors.push(format!("smart step: {e}"));
                    }
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
    if let Some(h) = healer {
        if h.join().is_err() {
            st.bad("the thread giving the engine up panicked".into());
        }
    }
    st.faults = fm.injected();
    st.checkpoints_failed = fs.stats_json()["checkpoints"]["failed"]
        .as_u64()
        .unwrap_or(0);
    fm.clear_rules();
    let mut model = model;
    if faults {
        // An engine given up last (a tick waits between tries) is rebuilt now.
        fs.recover_if_gave_up(true);
        st.live_recoveries = fs.live_recoveries().0;
        // The faults stopped: the mount goes on (unless no change can be made durable any
        // more: the engine gave up its live state, or a switch could not be undone; it says
        // so, and failure recovery at the next mount is the way back).
        match fs.changes_possible() {
            Ok(()) => {
                final_check(&*t, &model, &unknown, &mut st);
                drop_unknown(&*t, &unknown, &mut st);
                keeps_working(&*t, &mut model, &mut st);
            }
            Err(e) => st.gave_up = Some(e.to_string()),
        }
    }
    // The worker (smart) stops before the checks below: a crash image copied while it
    // stores could hold half of one store, which no medium shows.
    fs.stop_smart_worker();
    if smart {
        let w = &fs.stats_json()["smart"]["fs"]["worker"];
        st.smart_worked = ["adopted", "remapped"]
            .iter()
            .filter_map(|k| w[*k].as_u64())
            .sum();
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

/// After the faults: the files an EIO left behind under names the workers retired are
/// removed. A long run (one with a budget of 1500 s gives this run 74 s) retires names faster
/// than it reuses space: seed 65 left 4 451 such files filling the 64 MiB image, so every new
/// file after the faults met ENOSPC, which is the image being full, not the file system failing.
fn drop_unknown(t: &dyn StressTarget, unknown: &Retired, st: &mut StressStats) {
    let names = match t.list() {
        Ok(n) => n,
        Err(e) => return st.bad(format!("after the faults, list: {e}")),
    };
    for n in names.iter().filter(|n| unknown.contains(n)) {
        if let Err(e) = t.unlink(n) {
            st.bad(format!("after the faults, unlink {n}: {e}"));
        }
    }
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
