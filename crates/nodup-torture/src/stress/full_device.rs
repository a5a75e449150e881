//! A device filled to ENOSPC, half emptied, and filled again.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use nodup_core::media::{Medium, MemMedium};
use nodup_core::FormatOptions;
use nodup_fs::{Caller, FileSystem, FsOptions, MediumKind};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{content, final_check, LibTarget, Retired, StressStats, StressTarget};
use crate::verify::check_invariants;

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
    let mut w = Filler::new(seed, ticks, 8);
    if !w.fill(&t, &mut model, &mut st, 0) {
        return st;
    }
    final_check(&t, &model, &Retired::default(), &mut st);
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
    if w.fill(&t, &mut model, &mut st, 1) && model.len() <= before {
        st.bad("no file could be written after deleting half".into());
    }
    final_check(&t, &model, &Retired::default(), &mut st);
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
        Ok(fs) => final_check(
            &LibTarget(Arc::new(fs)),
            &model,
            &Retired::default(),
            &mut st,
        ),
        Err(e) => st.bad(format!("reopen of a full device: {e}")),
    }
    st
}

/// Files of unique content written one after another until ENOSPC.
pub(super) struct Filler {
    rng: StdRng,
    unique: AtomicU64,
    /// Run the maintenance tick every 32 files.
    ticks: bool,
    /// Blocks per file (70 % of them from a small shared set, see [`content`]).
    blocks: usize,
}

impl Filler {
    pub(super) fn new(seed: u64, ticks: bool, blocks: usize) -> Filler {
        Filler {
            rng: StdRng::seed_from_u64(seed),
            unique: AtomicU64::new(seed << 24),
            ticks,
            blocks,
        }
    }

    /// Write files `t<round>-<i>` until ENOSPC (true) or another error (false, counted as
    /// bad); `model` gets every file as written.
    pub(super) fn fill(
        &mut self,
        t: &LibTarget,
        model: &mut BTreeMap<String, Vec<u8>>,
        st: &mut StressStats,
        round: usize,
    ) -> bool {
        for i in 0..100_000 {
            if self.ticks && i % 32 == 0 {
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
            let data = content(&mut self.rng, self.blocks, &self.unique);
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
    }
}
