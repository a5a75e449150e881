//! Checks of a (recovered) file system: fsck, the engine's metadata audit, reference counts
//! against the block maps, allocator against references, and the namespace and contents
//! against the model states the crash point allows.

use std::collections::HashMap;
use std::sync::Arc;

use nodup_core::media::{Medium, MemMedium};
use nodup_core::BLOCK_SIZE;
use nodup_fs::{fsck, FileSystem, FsOptions};

use crate::model::{diff, snapshot_fs, Snapshot};

/// A deliberately broken step injected after recovery, to prove the checker is not vacuous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutant {
    /// No mutation: the real system under test.
    None,
    /// Give back one reference a file still holds (a refcount bug in recovery).
    ReleaseReferenced,
    /// Overwrite one byte of a referenced data block behind the engine (silent corruption).
    CorruptData,
}

/// Every invariant a recovered file system must satisfy that does not depend on the model.
pub fn check_invariants(fs: &FileSystem) -> Result<(), String> {
    let rep = fsck::check(fs, false).map_err(|e| format!("fsck failed: {e}"))?;
    if !rep.consistent() {
        return Err(format!("fsck: {:?}", rep.problems));
    }
    let eng = fs.engine();
    let audit = eng.audit().map_err(|e| format!("audit failed: {e}"))?;
    if !audit.problems.is_empty() {
        return Err(format!("engine audit: {:?}", audit.problems));
    }
    // References no map holds yet (a release waiting for a sync, a failed append's) count.
    let mut refs = fs.with_tables(|t| t.data_refs());
    refs.extend(fs.unmapped_refs());
    let mut count: HashMap<u64, u64> = HashMap::new();
    for b in refs {
        *count.entry(b).or_default() += 1;
    }
    let alloc = eng.allocator();
    for (&b, &n) in &count {
        if !alloc.is_allocated(b) {
            return Err(format!("block {b} is referenced {n} times but free"));
        }
        match eng.block_refcount(b) {
            Ok(Some(rc)) if rc != n => {
                return Err(format!("block {b}: refcount {rc}, {n} references"))
            }
            Ok(None) if n != 1 => {
                return Err(format!("block {b}: no dedup entry but {n} references"))
            }
            Err(e) => return Err(format!("block {b}: refcount lookup: {e}")),
            _ => {}
        }
    }
    for b in fs.meta_blocks() {
        if !alloc.is_allocated(b) {
            return Err(format!("metadata block {b} is free"));
        }
        if count.contains_key(&b) {
            return Err(format!("metadata block {b} is also a file block"));
        }
    }
    let s = eng.stats();
    if s.physical_bytes != count.len() as u64 * BLOCK_SIZE as u64 {
        return Err(format!(
            "engine counts {} physical bytes, files reference {} distinct blocks",
            s.physical_bytes,
            count.len()
        ));
    }
    if s.free_blocks > s.total_blocks {
        return Err(format!(
            "{} free of {} blocks",
            s.free_blocks, s.total_blocks
        ));
    }
    Ok(())
}

/// Apply `mutant` to a recovered file system.
pub fn apply_mutant(fs: &FileSystem, mutant: Mutant) {
    let refs = fs.with_tables(|t| t.data_refs());
    let Some(&b) = refs.first() else { return };
    match mutant {
        Mutant::None => {}
        Mutant::ReleaseReferenced => {
            let _ = fs.engine().release(b);
        }
        Mutant::CorruptData => {
            let m = fs.engine().data_medium();
            let off = b * BLOCK_SIZE as u64 + 17;
            let mut x = [0u8; 1];
            if m.read(off, &mut x).is_ok() {
                let _ = m.write(off, &[x[0] ^ 0x5A]);
            }
        }
    }
}

/// The key of the encrypted images of the campaigns (a raw 32-byte key: no KDF cost).
pub const TEST_KEY: [u8; 32] = [0xe5; 32];

/// Options to open `medium`: with [`TEST_KEY`] when its engine superblock says it is encrypted.
pub fn open_opts(medium: &dyn Medium) -> FsOptions {
    let encrypted = nodup_core::engine::superblock::Superblock::load(medium)
        .is_ok_and(|sb| sb.params.cipher != nodup_core::engine::superblock::CIPHER_NONE);
    open_opts_for(encrypted)
}

/// Default options, with [`TEST_KEY`] when `encrypted`.
pub fn open_opts_for(encrypted: bool) -> FsOptions {
    let mut o = FsOptions::default();
    if encrypted {
        o.open.key = Some(nodup_core::KeyFile(TEST_KEY.to_vec()));
    }
    o
}

/// Budget of the clean reopen of an exercised `smart` crash image (the campaigns make them
/// with 16 KiB): a different prefix width, so the reopen rebuckets the groups.
const REOPEN_BUDGET: u64 = 64 << 10;

/// Open a crash image (failure recovery), check every invariant and that the visible state is
/// one of `allowed`; with `exercise`, also write after recovery and reopen cleanly.
pub fn check_crash_image(
    img: Vec<u8>,
    allowed: &[&Snapshot],
    mutant: Mutant,
    exercise: bool,
) -> Result<(), String> {
    let medium: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(img));
    let fs = FileSystem::open(medium.clone(), &open_opts(&*medium))
        .map_err(|e| format!("recovery failed: {e}"))?;
    apply_mutant(&fs, mutant);
    check_invariants(&fs)?;
    let got = snapshot_fs(&fs)?;
    if !allowed.iter().any(|s| **s == got) {
        let d: Vec<String> = allowed.iter().map(|s| diff(s, &got)).collect();
        return Err(format!(
            "state matches none of the {} allowed: {}",
            allowed.len(),
            d.join(" | ")
        ));
    }
    if exercise {
        exercise_after_recovery(&fs, &got)?;
        let smart = fs.engine().policy_kind() == nodup_core::policy::PolicyKind::Smart;
        fs.shutdown().map_err(|e| format!("shutdown: {e}"))?;
        drop(fs);
        let mut opts = open_opts(&*medium);
        if smart {
            // Another budget than the image's: its fingerprint groups are rewritten for other
            // prefixes on this open, and must come out whole (fsck reads every group).
            opts.open.mem_budget = Some(REOPEN_BUDGET);
        }
        let fs = FileSystem::open(medium.clone(), &opts)
            .map_err(|e| format!("clean reopen failed: {e}"))?;
        if fs.recovery().kind != "clean" {
            return Err(format!(
                "reopen after clean shutdown ran {} recovery",
                fs.recovery().kind
            ));
        }
        check_invariants(&fs)?;
    }
    Ok(())
}

/// The engine keeps working after recovery: duplicate and new content is written, read back.
fn exercise_after_recovery(fs: &FileSystem, got: &Snapshot) -> Result<(), String> {
    use nodup_fs::inode::{Kind, ROOT_INO};
    let e = |x: nodup_fs::FsError| format!("after recovery: {x}");
    let (ino, _) = fs
        .mknod(
            ROOT_INO,
            b"after-recovery",
            Kind::File,
            0o644,
            0,
            b"",
            nodup_fs::Caller::default(),
        )
        .map_err(e)?;
    let mut data = crate::workload::pattern_block(0);
    data.extend(crate::workload::pattern_block(7_777_777));
    data.extend(crate::workload::pattern_block(1));
    fs.write(ino, 0, &data).map_err(e)?;
    if fs.read(ino, 0, data.len()).map_err(e)? != data {
        return Err("after recovery: new file reads back wrong".into());
    }
    check_invariants(fs)?;
    let now = snapshot_fs(fs)?;
    for (p, ent) in got {
        if now.get(p) != Some(ent) {
            return Err(format!("after recovery: writing a new file changed {p}"));
        }
    }
    Ok(())
}
