//! The disk holding the image fills: a sparse image on a small tmpfs. Every write that needs
//! space the disk lacks fails with ENOSPC and nothing else (no EIO, no engine giving up its
//! live state, no failure recovery while mounted), everything written reads back, rewrites and
//! deletes on the full disk go through, a shutdown on the full disk is clean, and once the
//! disk has room again the same file system writes on until its own image is full, shuts down
//! cleanly, and reopens with every file. Root only: it mounts the tmpfs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use nodup_core::FormatOptions;
use nodup_fs::{Caller, FileSystem, FsOptions, MediumKind};

use super::full_device::Filler;
use super::{final_check, LibTarget, Retired, StressStats, StressTarget};
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

    /// Take every page left with a file of its own (a later call starts it over: the disk is
    /// full again after it).
    fn fill(&self) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        let path = self.dir.join("filler");
        let f = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let page = [0x5au8; 4096];
        let mut at = 0u64;
        for size in [64 << 10, 4096] {
            let chunk = page.repeat(size / 4096);
            while f.write_all_at(&chunk, at).is_ok() {
                at += size as u64;
            }
        }
        Ok(())
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
    final_check(t, model, &Retired::default(), st);
}

/// Make the save area of a 64 MiB image of `kind` on a 48 MiB tmpfs sparse, fill the tmpfs
/// until ENOSPC, check, twice shut down, fill the tmpfs again and reopen (both clean), give the
/// tmpfs room, fill the image itself, check, shut down, reopen and check. `None` without root.
pub fn host_full(seed: u64, kind: MediumKind) -> Option<StressStats> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let mut st = StressStats::default();
    let disk = match SmallDisk::mount(&format!("hostfull-{seed}"), "48M") {
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
    // The image as a copy with `cp --sparse=always` (or a format before the save area was
    // taken ahead) leaves it: the zero blocks of the save area holes, taken again at the open.
    let (save, save_blocks) = fs.engine().save_area();
    let sparse = fs
        .shutdown()
        .map_err(|e| e.to_string())
        .and_then(|()| zeros_to_holes(&img, save..save + save_blocks).map(|_| ()));
    drop(fs);
    let fs = match sparse.and_then(|()| reopen(&img).map_err(|e| e.to_string())) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            st.bad(format!("a sparse save area: {e}"));
            return Some(st);
        }
    };
    let mut t = LibTarget(fs);
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    // Zero blocks (one data block, shared), which a sparse copy of the image makes holes;
    // first by name, so the rounds on a full disk rewrite it and never delete it.
    let zeros = [vec![0u8; 16 << 12], vec![0x33u8; 1 << 12]].concat();
    if let Err(e) = t
        .create("t-zeros")
        .and_then(|()| t.write("t-zeros", 0, &zeros))
    {
        st.bad(format!("a file of zeros: {e}"));
        return Some(st);
    }
    model.insert("t-zeros".into(), zeros);
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
        final_check(&t, &model, &Retired::default(), &mut st);
        if let Err(e) = check_invariants(&t.0) {
            st.bad(format!("round {round}: invariants: {e}"));
        }
        if round == 0 {
            // What the image's ENOSPC left of the disk (less than what one allocation asks):
            // taken too, to the last page.
            if let Err(e) = disk.fill() {
                st.bad(e);
            }
            still_full(&t, &mut model, &mut st);
            // Twice: a clean shutdown on the full disk (its final checkpoint writes blocks
            // the checkpoint reserve holds, the engine's save an area taken at the open);
            // the zero blocks the image holds made holes, as a sparse copy would (the save
            // area's, the file of zeros' data block; not the free ones the shutdown kept for
            // the next open, which a copy would lose); the disk filled again (the shutdown gave
            // back what was freed: the free blocks are holes now, but for the few it took
            // again for the next open's reserve); a clean reopen, whose medium knows nothing
            // about its holes yet and reads zeros from them (a pmem image's load from a hole
            // through the mapping is a SIGBUS on a full tmpfs, see `media/backing.rs`); more
            // on the full disk, and the next clean shutdown.
            for _ in 0..2 {
                let held = held_blocks(&t.0);
                if let Err(e) = t.0.shutdown() {
                    st.bad(format!("shutdown on a full disk: {e}"));
                }
                drop(t);
                match zeros_to_holes(&img, held) {
                    Ok(p) if p.iter().any(|b| !(save..save + save_blocks).contains(b)) => {}
                    Ok(_) => st.bad("the zero data block was not found".into()),
                    Err(e) => st.bad(format!("zero blocks to holes: {e}")),
                }
                if let Err(e) = disk.fill() {
                    st.bad(e);
                }
                t = match reopen(&img) {
                    Ok(fs) => LibTarget(Arc::new(fs)),
                    Err(e) => {
                        st.bad(format!("reopen on a full disk: {e}"));
                        return Some(st);
                    }
                };
                if t.0.recovery().kind != "clean" {
                    st.bad(format!(
                        "the reopen on a full disk was a {} recovery",
                        t.0.recovery().kind
                    ));
                }
                final_check(&t, &model, &Retired::default(), &mut st);
                still_full(&t, &mut model, &mut st);
            }
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
            final_check(
                &LibTarget(Arc::new(fs)),
                &model,
                &Retired::default(),
                &mut st,
            );
        }
        Err(e) => st.bad(format!("reopen: {e}")),
    }
    Some(st)
}

fn reopen(img: &std::path::Path) -> nodup_fs::Result<FileSystem> {
    nodup_fs::image::open(img).and_then(|(m, _)| FileSystem::open(m, &FsOptions::default()))
}

/// The save area and the data blocks with references of `fs`'s image.
fn held_blocks(fs: &FileSystem) -> Vec<u64> {
    let e = fs.engine();
    let (save, n) = e.save_area();
    let blocks = e.medium().len() / nodup_core::BLOCK_SIZE as u64;
    let data = (0..blocks).filter(|&b| matches!(e.block_refcount(b), Ok(Some(r)) if r > 0));
    (save..save + n).chain(data).collect()
}

/// Punch each of `blocks` that is all zeros out of the file at `img`, as a sparse copy of it
/// would have none there; the blocks punched.
fn zeros_to_holes(
    img: &std::path::Path,
    blocks: impl IntoIterator<Item = u64>,
) -> Result<Vec<u64>, String> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(img);
    let f = f.map_err(|e| format!("{}: {e}", img.display()))?;
    let bs = nodup_core::BLOCK_SIZE as u64;
    let mut block = vec![0u8; bs as usize];
    let mut punched = Vec::new();
    for b in blocks {
        f.read_exact_at(&mut block, b * bs)
            .map_err(|e| e.to_string())?;
        if block.iter().any(|&x| x != 0) {
            continue;
        }
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: fallocate on a descriptor `f` owns, inside the file.
        if unsafe { libc::fallocate(f.as_raw_fd(), mode, (b * bs) as i64, bs as i64) } != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        punched.push(b);
    }
    Ok(punched)
}
