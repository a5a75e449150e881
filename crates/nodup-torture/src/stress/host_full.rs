//! The disk holding the image fills: a sparse image on a small tmpfs. Every write that needs
//! space the disk lacks fails with ENOSPC and nothing else (no EIO, no engine giving up its
//! live state, no failure recovery while mounted), everything written reads back, rewrites and
//! deletes on the full disk go through, and once the disk has room again the same file system writes on until its own image is full, shuts down
//! cleanly, and reopens with every file. Root only: it mounts the tmpfs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use nodup_core::FormatOptions;
use nodup_fs::{Caller, FileSystem, FsOptions, MediumKind};

use super::full_device::Filler;
use super::{final_check, LibTarget, StressStats, StressTarget};
use crate::verify::check_invariants;

/// A tmpfs of a given size on a directory of its own, unmounted and removed on drop.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    fn mount(tag: &str, size: &str) -> Result<SmallDisk, String> {
        let dir = std::env::temp_dir().join(format!("nodup-torture-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let disk = SmallDisk { dir };
        disk.run(&["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])?;
        Ok(disk)
    }

    /// Give the tmpfs `size` (what it holds stays).
    fn resize(&self, size: &str) -> Result<(), String> {
        self.run(&["-o", &format!("remount,size={size}")])
    }

    fn run(&self, args: &[&str]) -> Result<(), String> {
        let st = Command::new("mount").args(args).arg(&self.dir).status();
        match st {
            Ok(s) if s.success() => Ok(()),
            r => Err(format!("mount {args:?} {}: {r:?}", self.dir.display())),
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// On the still full disk: what needs no new space goes through (or fails with ENOSPC at
/// most, and never stops changes): every third file rewritten with its own content (its
/// blocks found again: reference counts stored in place), another third deleted, and the
/// maintenance tick.
fn still_full(t: &LibTarget, model: &mut BTreeMap<String, Vec<u8>>, st: &mut StressStats) {
    let names: Vec<String> = model.keys().cloned().collect();
    let (mut tried, mut done) = (0, 0);
    for (i, n) in names.iter().enumerate() {
        let r = match i % 3 {
            0 => t.write(n, 0, &model[n]),
            1 => t.unlink(n).map(|()| {
                model.remove(n);
            }),
            _ => continue,
        };
        tried += 1;
        match r {
            Ok(()) => done += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {}
            Err(e) => st.bad(format!("{n} on a full disk: {e} (expected ENOSPC at most)")),
        }
        if i % 64 == 0 {
            if let Err(e) = t.0.tick() {
                if e.errno() != libc::ENOSPC {
                    st.bad(format!("tick on a full disk: {e}"));
                }
            }
        }
    }
    st.ops += done;
    // A log block or a checkpoint may still need space here and there; most must not.
    if done * 2 < tried {
        st.bad(format!(
            "only {done} of {tried} rewrites and deletes went through on a full disk"
        ));
    }
    if let Err(e) = t.0.changes_possible() {
        st.bad(format!("changes refused on a full disk: {e}"));
    }
    if t.0.live_recoveries() != (0, 0) {
        st.bad("the engine gave up its live state on a full disk".into());
    }
    final_check(t, model, &BTreeSet::new(), st);
}

/// Fill a 24 MiB tmpfs under a 64 MiB image of `kind` until ENOSPC, check, give the tmpfs
/// room, fill the image itself, check, shut down, reopen and check. `None` without root.
pub fn host_full(seed: u64, kind: MediumKind) -> Option<StressStats> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let mut st = StressStats::default();
    let disk = match SmallDisk::mount(&format!("hostfull-{seed}"), "24M") {
        Ok(d) => d,
        Err(e) => {
            st.bad(e);
            return Some(st);
        }
    };
    let img = disk.dir.join("x.img");
    let opened = nodup_fs::image::create(&img, 64 << 20, kind).and_then(|m| {
        FileSystem::format(
            m,
            kind,
            &FormatOptions::default(),
            &FsOptions::default(),
            Caller::default(),
        )
    });
    let fs = match opened {
        Ok(f) => Arc::new(f),
        Err(e) => {
            st.bad(format!("format on a small disk: {e}"));
            return Some(st);
        }
    };
    let mut t = LibTarget(fs);
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    // Files of 1 MiB, as a writer's large requests: a store's blocks, entries and region
    // grows then meet the full disk together.
    let mut w = Filler::new(seed, true, 256);
    // Both rounds end in ENOSPC: the disk's, then the image's own.
    for (round, room) in [(0, None), (1, Some("160M"))] {
        if let Some(size) = room {
            if let Err(e) = disk.resize(size) {
                st.bad(e);
                return Some(st);
            }
        }
        let before = model.len();
        if !w.fill(&t, &mut model, &mut st, round) {
            return Some(st);
        }
        if model.len() <= before {
            st.bad(format!("round {round}: no file written"));
        }
        if let Err(e) = t.0.changes_possible() {
            st.bad(format!("round {round}: changes refused after ENOSPC: {e}"));
        }
        if t.0.live_recoveries() != (0, 0) {
            st.bad(format!(
                "round {round}: the engine gave up its live state on ENOSPC ({:?} rebuilds)",
                t.0.live_recoveries()
            ));
        }
        final_check(&t, &model, &BTreeSet::new(), &mut st);
        if let Err(e) = check_invariants(&t.0) {
            st.bad(format!("round {round}: invariants: {e}"));
        }
        if round == 0 {
            still_full(&t, &mut model, &mut st);
            // Again on a fresh open of the still full image: the medium knows nothing about
            // its holes yet (a shutdown that cannot checkpoint on the full disk leaves it to
            // failure recovery, which is allowed here).
            let _ = t.0.shutdown();
            drop(t);
            t = match reopen(&img) {
                Ok(fs) => LibTarget(Arc::new(fs)),
                Err(e) => {
                    st.bad(format!("reopen on a full disk: {e}"));
                    return Some(st);
                }
            };
            final_check(&t, &model, &BTreeSet::new(), &mut st);
            still_full(&t, &mut model, &mut st);
        }
    }
    if let Err(e) = t.0.shutdown() {
        st.bad(format!("shutdown after the disk had room again: {e}"));
    }
    drop(t);
    match reopen(&img) {
        Ok(fs) => {
            if fs.recovery().kind != "clean" {
                st.bad(format!("the reopen was a {} recovery", fs.recovery().kind));
            }
            final_check(&LibTarget(Arc::new(fs)), &model, &BTreeSet::new(), &mut st);
        }
        Err(e) => st.bad(format!("reopen: {e}")),
    }
    Some(st)
}

fn reopen(img: &std::path::Path) -> nodup_fs::Result<FileSystem> {
    nodup_fs::image::open(img).and_then(|(m, _)| FileSystem::open(m, &FsOptions::default()))
}
