//! Failure recovery while mounted. When the engine gives up its live state (a store and its
//! undo both failed, a release's retry failed, a region chain may differ from what it counts),
//! no change can be made until its counts, index and allocator are rebuilt from the block maps.
//! The next mount's failure recovery does that; so does the next change (from its space check),
//! the maintenance tick (woken by a refused change) and the unmount, at most once a second and
//! with a growing wait after a failed try, every operation paused meanwhile, so one transient
//! medium error costs neither a remount nor more failed operations than those in flight. Not
//! after a failed write-back of the image (the kernel may have dropped pages, so what the
//! medium holds is unknown until a new boot or mount) nor after a superblock switch that could
//! not be undone (the medium may name either checkpoint): those still wait for the next mount.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nodup_core::engine::RecoveryReport;

use crate::error::Result;
use crate::fs::FileSystem;

/// Least time between two tries: a medium that keeps failing pauses the file system for a
/// scan at most this often.
const RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest wait after failed tries (it doubles after each failed one).
const RETRY_MAX: Duration = Duration::from_secs(600);

/// Tries of failure recovery while mounted: when the next one may run, and what they did.
#[derive(Debug, Default)]
pub(crate) struct LiveRecovery {
    /// No try before this.
    next: Option<Instant>,
    /// Wait after the next try if it fails.
    delay: Duration,
    /// The last try (or rebuild for leaks) worked.
    last_ok: bool,
    /// The last working try came as soon as the one before it let it (the engine gave up
    /// again at once: something a rebuild does not fix); the waits then grow as after failed
    /// tries, and no change waits for the next try.
    repeating: bool,
    /// Tries begun (counted under the rebuild's locks).
    started: u64,
    /// Rebuilds run to free blocks a lost fingerprint group kept (the engine had not given
    /// up; [`FileSystem::rebuild_if_leaked`]).
    pub(crate) for_leaks: u64,
    /// Recoveries that made changes possible again.
    pub(crate) done: u64,
    /// Recoveries that failed (the engine still gave up).
    pub(crate) failed: u64,
}

impl LiveRecovery {
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.next.is_none_or(|n| now >= n)
    }

    /// The time left before the next try when a change should wait for it instead of failing
    /// (zero when it is due by now): only the least pause after a rebuild that worked (the
    /// engine gave up again within a second of it), never the longer waits of a failing medium
    /// or of a give-up that keeps coming back.
    fn brief_wait(&self, now: Instant) -> Option<Duration> {
        let next = self.next?;
        (self.last_ok && !self.repeating).then(|| next.saturating_duration_since(now))
    }

    /// Record a rebuild for leaks at `now`; `again`: a leak is suspected once more.
    fn rebuilt_for_leaks(&mut self, now: Instant, again: bool) {
        self.for_leaks += 1;
        self.last_ok = !again;
        self.repeating = false;
        self.delay = if again {
            (self.delay * 2).clamp(RETRY_MIN, RETRY_MAX)
        } else {
            RETRY_MIN
        };
        self.next = Some(now + self.delay);
    }

    /// Record a try at `now`; returns the wait before the next one.
    fn tried(&mut self, now: Instant, ok: bool) -> Duration {
        // A working try within a second of when the last working one let it run: the engine
        // gave up again as soon as it could.
        let at_once = self.last_ok && self.next.is_some_and(|n| now < n + RETRY_MIN);
        if ok {
            self.done += 1;
        } else {
            self.failed += 1;
        }
        self.repeating = ok && at_once;
        self.delay = if ok && !at_once {
            RETRY_MIN
        } else {
            (self.delay * 2).clamp(RETRY_MIN, RETRY_MAX)
        };
        self.last_ok = ok;
        self.next = Some(now + self.delay);
        self.delay
    }
}

impl FileSystem {
    /// Failure recovery on a running file system: rebuild the engine's reference counts, index
    /// and allocator from the block maps and the metadata chains (`fsck --repair`, and the
    /// maintenance tick once the engine gave up). A `smart` worker step, a checkpoint, every
    /// operation, a release of deferred references and a top-up of the reserve or of the log's
    /// spare blocks each finish first or wait: everything that takes, holds or gives back
    /// references or blocks outside the block maps.
    pub fn recover_engine(&self) -> Result<RecoveryReport> {
        let rebuilt = self.rebuild_engine(&|| true)?;
        Ok(rebuilt.unwrap_or_default())
    }

    /// [`FileSystem::recover_engine`] when `still()`, asked once every lock is held (what
    /// was true before waiting for them may not be: another recovery ran, or the unmount
    /// shut the engine down); `None` when it was not.
    fn rebuild_engine(&self, still: &dyn Fn() -> bool) -> Result<Option<RecoveryReport>> {
        // The order every holder of two of these takes them in: a `smart` step before any
        // other lock, then the checkpoint, the gate, the releases, `meta`, `log`. The block
        // maps cannot change under the gate.
        let _step = self.smart.as_ref().map(|s| s.scratch.lock());
        let _one = self.ckpt_lock.lock();
        let _g = self.gate.write();
        let _r = self.releasing.write();
        if !still() {
            return Ok(None);
        }
        let mut refs = self.tables.read().data_refs();
        let meta = self.meta.lock();
        let log = self.log.lock();
        // References no map holds yet count as the references they are: a release waiting
        // for a sync and a failed append's hold are given back later, as they would have been.
        refs.extend(self.unmapped_refs_of(&log));
        let metas = self.meta_blocks_of(&meta, &log);
        let report = self
            .engine
            .recover(&mut refs.into_iter(), &mut metas.into_iter())?;
        // A write context's stream state names entries recovery may have dropped.
        self.clear_ctxs();
        Ok(Some(report))
    }

    /// True when nothing but the engine's having given up its live state stops changes (see
    /// the module comment for what failure recovery while mounted does not take on).
    fn only_the_engine_gave_up(&self) -> bool {
        self.medium.write_back_failed().is_none()
            && !self.switch_unsettled.load(Ordering::Acquire)
            && self.engine_gave_up()
    }

    /// Whether this thread may rebuild the engine: not on a read-only file system, not inside
    /// a `smart` step (it holds the lock the rebuild takes first: the tick does it instead).
    fn may_rebuild(&self) -> bool {
        !self.read_only && !crate::smart::worker::in_step()
    }

    /// Rebuild the engine while `wanted()`, paced: when a try is due (or `now`). Asked again
    /// under the rebuild's locks, where tries start one at a time: a thread that waited for
    /// them behind another try does not repeat it (unless `now`, the unmount's last chance),
    /// whether it worked or not. `None` when it did not run.
    fn paced_rebuild(
        &self,
        now: bool,
        wanted: &dyn Fn() -> bool,
    ) -> Option<Result<RecoveryReport>> {
        if !wanted() {
            return None;
        }
        let started = {
            let l = self.live_recovery.lock();
            if !now && !l.due(Instant::now()) {
                return None;
            }
            l.started
        };
        let still = || {
            let mut l = self.live_recovery.lock();
            if !(now || l.started == started) || !wanted() {
                return false;
            }
            l.started += 1;
            true
        };
        self.rebuild_engine(&still).transpose()
    }

    /// When only the engine stops changes and the wait after the last try is over (or `now`
    /// says not to wait: the unmount), run failure recovery now and log what it did. True
    /// when changes are possible again.
    pub fn recover_if_gave_up(&self, now: bool) -> bool {
        // A file system shut down is not rebuilt but by its own unmount (`now`).
        if !self.may_rebuild() || (!now && self.is_shut_down()) {
            return false;
        }
        let t = Instant::now();
        let r = match self.paced_rebuild(now, &|| self.only_the_engine_gave_up()) {
            // Changes possible already (another thread rebuilt it), stopped for another
            // reason, or no try due: not a try.
            None => return self.changes_possible().is_ok(),
            Some(r) => r,
        };
        let ok = r.is_ok() && self.changes_possible().is_ok();
        let wait = self.live_recovery.lock().tried(Instant::now(), ok);
        match r {
            Ok(rep) if ok => {
                self.said_failed.store(false, Ordering::Relaxed);
                crate::logging::info(&format!(
                    "the engine had given up its live state after a failed store: failure \
                     recovery while mounted rebuilt it in {:.0} ms ({} counts fixed, {} \
                     entries recreated, {} dropped, {} leaked blocks freed); changes go on",
                    t.elapsed().as_secs_f64() * 1e3,
                    rep.refcounts_fixed,
                    rep.entries_recreated,
                    rep.entries_invalidated,
                    rep.leaked_blocks_freed
                ));
            }
            r => {
                let why = match r {
                    Err(e) => e.to_string(),
                    Ok(_) => match self.changes_possible() {
                        Err(e) => e.to_string(),
                        Ok(()) => "changes still refused".into(),
                    },
                };
                crate::logging::error(&format!(
                    "failure recovery while mounted failed: {why}; {}",
                    if now {
                        "the next mount runs it".to_string()
                    } else {
                        format!("tried again in {} s", wait.as_secs())
                    }
                ));
            }
        }
        ok
    }

    /// [`FileSystem::changes_possible`], once the engine was rebuilt first when only it stops
    /// changes ([`FileSystem::recover_if_gave_up`], when a try is due): the check a change
    /// starts with (`wait`: it may wait for the next try). A change that finds the engine
    /// given up again within a second of a rebuild that worked waits for the next try
    /// (latency, not EIO); after failed tries, or when the give-up keeps coming back, it fails
    /// at once. The caller must hold no lock the rebuild takes.
    pub(crate) fn changes_possible_or_rebuilt(&self, wait: bool) -> Result<()> {
        if self.changes_possible().is_ok() || self.recover_if_gave_up(false) {
            return Ok(());
        }
        if wait && self.may_rebuild() && self.only_the_engine_gave_up() {
            let left = self.live_recovery.lock().brief_wait(Instant::now());
            if let Some(left) = left {
                std::thread::sleep(left);
                if self.recover_if_gave_up(false) {
                    return Ok(());
                }
            }
        }
        self.changes_possible()
    }

    /// When the engine suspects blocks held by nothing (a fingerprint group lost after a
    /// medium error keeps its blocks: `Allocator::leak_suspected`) and the file system is idle,
    /// or unmounting (`now`), rebuild it as failure recovery while mounted does, which frees
    /// them. Paced as the tries after a give-up; a rebuild that fails leaves the engine given
    /// up, and that path goes on from there.
    pub(crate) fn rebuild_if_leaked(&self, now: bool) {
        if !self.may_rebuild() {
            return;
        }
        let t = Instant::now();
        let leaky =
            || self.engine.allocator().leak_suspected() && self.engine.check_ready().is_ok();
        match self.paced_rebuild(now, &leaky) {
            None => {}
            Some(Ok(rep)) => {
                // Suspected again at once (the groups rebuilt met an error too: a failing
                // medium): wait longer each time, as after failed tries, not every second.
                let again = self.engine.allocator().leak_suspected();
                self.live_recovery
                    .lock()
                    .rebuilt_for_leaks(Instant::now(), again);
                crate::logging::info(&format!(
                    "a fingerprint group lost after a medium error kept its blocks: rebuilt the \
                     engine{} in {:.0} ms, {} leaked blocks freed",
                    if now { " at unmount" } else { " while idle" },
                    t.elapsed().as_secs_f64() * 1e3,
                    rep.leaked_blocks_freed
                ));
            }
            Some(Err(e)) => {
                self.live_recovery.lock().tried(Instant::now(), false);
                crate::logging::error(&format!(
                    "rebuilding the engine to free blocks a lost fingerprint group kept failed: \
                     {e}"
                ));
            }
        }
    }

    /// Failure recoveries run while mounted: (made changes possible again, failed).
    pub fn live_recoveries(&self) -> (u64, u64) {
        let l = self.live_recovery.lock();
        (l.done, l.failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{create, fresh};
    use crate::{Caller, FsOptions, MediumKind};
    use nodup_core::media::{FaultMedium, FaultOp, FaultRule, MemMedium};
    use nodup_core::FormatOptions;
    use std::sync::Arc;

    /// Two tries that passed the check before either got the locks: the second finds the
    /// engine rebuilt and neither runs nor counts.
    #[test]
    fn a_try_that_waited_for_another_finds_the_engine_rebuilt() {
        let fs = fresh();
        let ino = create(&fs, b"f");
        fs.engine().give_up_live_state();
        std::thread::scope(|s| {
            let held = fs.gate.read();
            let tries: Vec<_> = (0..2)
                .map(|_| s.spawn(|| fs.recover_if_gave_up(true)))
                .collect();
            std::thread::sleep(Duration::from_millis(200));
            assert!(
                tries.iter().all(|t| !t.is_finished()),
                "both wait for the gate"
            );
            drop(held);
            for t in tries {
                assert!(t.join().unwrap(), "changes possible after either");
            }
        });
        assert_eq!(fs.live_recoveries(), (1, 0));
        fs.write(ino, 0, b"after").unwrap();
    }

    /// A change refused wakes the maintenance thread, which rebuilds the engine at once
    /// instead of at its next round (here a minute away).
    #[test]
    fn a_refused_change_wakes_the_maintenance_thread() {
        let fs = fresh();
        let ino = create(&fs, b"f");
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    fs.wait_for_tick(Duration::from_secs(60));
                    fs.tick().unwrap();
                }
            });
            // The thread's first round (it may not wait yet) is over.
            std::thread::sleep(Duration::from_millis(200));
            fs.engine().give_up_live_state();
            // Asked (as every change asks first): refused, and the thread is woken.
            assert!(fs.changes_possible().is_err());
            let t = Instant::now();
            while fs.changes_possible().is_err() && t.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let rebuilt = fs.live_recoveries();
            stop.store(true, Ordering::Relaxed);
            fs.wake_maintenance();
            assert_eq!(rebuilt, (1, 0), "not rebuilt in 20 s");
            fs.write(ino, 0, b"after").unwrap();
        });
    }

    /// A block-file file system (releases wait for a sync) whose engine gave up, and the
    /// fault medium under it.
    fn given_up_block_file() -> (FileSystem, Arc<FaultMedium>) {
        let fm = Arc::new(FaultMedium::new(Arc::new(MemMedium::new(16 << 20)), 1));
        let fs = FileSystem::format(
            fm.clone(),
            MediumKind::BlockFile,
            &FormatOptions::default(),
            &FsOptions::default(),
            Caller::default(),
        )
        .unwrap();
        let ino = create(&fs, b"f");
        fs.write(ino, 0, &[7u8; 8192]).unwrap();
        fs.sync().unwrap();
        fs.write(ino, 0, &[8u8; 8192]).unwrap();
        assert_eq!(
            fs.unmapped_refs().len(),
            2,
            "the old blocks wait for a sync"
        );
        fs.engine().give_up_live_state();
        (fs, fm)
    }

    /// Threads that waited behind a try that failed do not repeat it (each would pause every
    /// operation again and double the wait before the next).
    #[test]
    fn threads_behind_a_failed_try_do_not_repeat_it() {
        let (fs, fm) = given_up_block_file();
        // The rebuild's first medium operation fails.
        fm.add_rule(FaultRule::new(FaultOp::Any).nth(1).once());
        std::thread::scope(|s| {
            let held = fs.gate.read();
            let tries: Vec<_> = (0..3)
                .map(|_| s.spawn(|| fs.recover_if_gave_up(false)))
                .collect();
            std::thread::sleep(Duration::from_millis(200));
            drop(held);
            for t in tries {
                assert!(!t.join().unwrap(), "changes still refused");
            }
        });
        assert_eq!(fm.injected(), 1);
        assert_eq!(fs.live_recoveries(), (0, 1), "one try, not three");
    }

    /// While the engine is given up, a sync still makes what was written durable and keeps the
    /// releases waiting for it for after the rebuild (which counts them as held); and a
    /// refused change wakes the maintenance thread only when a try is due (it asks too, and
    /// would otherwise spin).
    #[test]
    fn a_sync_works_while_given_up_and_waking_waits_for_a_due_try() {
        let (fs, fm) = given_up_block_file();
        fs.sync().unwrap();
        assert_eq!(fs.unmapped_refs().len(), 2, "kept for after the rebuild");
        fm.add_rule(FaultRule::new(FaultOp::Any).nth(1).once());
        assert!(!fs.recover_if_gave_up(false));
        assert_eq!(fs.live_recoveries(), (0, 1));
        fs.wait_for_tick(Duration::ZERO);
        assert!(fs.changes_possible().is_err());
        let t = Instant::now();
        fs.wait_for_tick(Duration::from_millis(300));
        assert!(
            t.elapsed() >= Duration::from_millis(250),
            "woken with no try due"
        );
        std::thread::sleep(Duration::from_millis(800));
        assert!(fs.recover_if_gave_up(false));
        fs.sync().unwrap();
        assert!(fs.unmapped_refs().is_empty(), "released after the rebuild");
        let rep = crate::fsck::check(&fs, false).unwrap();
        assert!(rep.consistent(), "{:?}", rep.problems);
    }

    /// A try that waited through the unmount finds the engine shut down: the saved image is
    /// not written again.
    #[test]
    fn a_try_after_the_unmount_does_nothing() {
        let fs = fresh();
        fs.shutdown().unwrap();
        fs.engine().give_up_live_state();
        let e = fs.recover_engine().unwrap_err();
        assert!(e.to_string().contains("shut down"), "{e}");
        fs.recover_if_gave_up(true);
        fs.recover_if_gave_up(false);
        assert_eq!(fs.live_recoveries(), (0, 0));
    }

    /// The engine gives up again soon after a rebuild that worked: a change waits for the
    /// next try (the pacing's second) and goes through instead of failing until then; after a
    /// failed try a change still fails at once.
    #[test]
    fn a_change_soon_after_a_rebuild_waits_for_the_next_try() {
        let (fs, fm) = given_up_block_file();
        assert!(fs.recover_if_gave_up(false));
        let t = Instant::now();
        let ino = create(&fs, b"g");
        fs.engine().give_up_live_state();
        fs.write(ino, 0, b"waited").unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(900),
            "no try was due: the change waited for one"
        );
        assert_eq!(fs.live_recoveries(), (2, 0));
        // That give-up came back as soon as it could: the next one is not waited for.
        fs.engine().give_up_live_state();
        assert!(fs.write(ino, 0, b"refused").is_err());
        assert_eq!(fs.live_recoveries(), (2, 0));
        std::thread::sleep(2 * RETRY_MIN);
        // A failed try: the next change does not wait out the longer pause.
        fm.add_rule(FaultRule::new(FaultOp::Any).nth(1).once());
        assert!(!fs.recover_if_gave_up(false));
        let t = Instant::now();
        assert!(fs.write(ino, 0, b"refused").is_err());
        assert!(t.elapsed() < Duration::from_millis(500), "it waited");
        assert_eq!(fs.live_recoveries(), (2, 1));
    }

    #[test]
    fn failed_tries_wait_longer_and_a_success_starts_over() {
        let mut l = LiveRecovery::default();
        let t = Instant::now();
        assert!(l.due(t), "the first try runs at once");
        let waits: Vec<u64> = (0..12).map(|_| l.tried(t, false).as_secs()).collect();
        assert_eq!(&waits[..4], &[1, 2, 4, 8]);
        assert_eq!(*waits.last().unwrap(), RETRY_MAX.as_secs());
        assert!(!l.due(t + Duration::from_secs(599)));
        assert!(l.due(t + RETRY_MAX));
        assert_eq!(l.tried(t, true), RETRY_MIN);
        assert_eq!(l.tried(t, false), Duration::from_secs(2));
        assert_eq!((l.done, l.failed), (1, 13));
        // Rebuilds for leaks that leave a leak suspected again wait longer each time.
        l.tried(t, true);
        for want in [2, 4, 8] {
            l.rebuilt_for_leaks(t, true);
            assert_eq!(l.next, Some(t + Duration::from_secs(want)));
        }
        l.rebuilt_for_leaks(t, false);
        assert_eq!(l.next, Some(t + RETRY_MIN));
        assert_eq!(l.for_leaks, 4);
        // Working tries, each as soon as the one before let it (the give-up keeps coming
        // back): the waits grow, and no change waits for them; one long after starts over.
        let mut l = LiveRecovery::default();
        assert_eq!(l.tried(t, true), RETRY_MIN);
        assert_eq!(l.brief_wait(t), Some(RETRY_MIN));
        assert_eq!(l.tried(t + RETRY_MIN, true), 2 * RETRY_MIN);
        assert_eq!(l.brief_wait(t + RETRY_MIN), None);
        assert_eq!(l.tried(t + 3 * RETRY_MIN, true), 4 * RETRY_MIN);
        assert_eq!(l.tried(t + Duration::from_secs(60), true), RETRY_MIN);
        assert_eq!(
            l.brief_wait(t + Duration::from_secs(61) + RETRY_MIN),
            Some(Duration::ZERO),
            "due already: no wait, but a try"
        );
    }
}
