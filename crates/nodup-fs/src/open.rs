//! Creating, opening and closing a file system: mkfs, loading the checkpoint and replaying the
//! log (normal or failure recovery), and the clean shutdown.

use crate::chain::{cut_tail, read_chain, ChainKind, PAYLOAD};
use crate::error::{FsError, Result};
use crate::fs::{FileSystem, FsOptions, MetaState, RecoveryInfo};
use crate::inode::ROOT_INO;
use crate::log::record::Record;
use crate::log::replay::{replay, Replayed};
use crate::log::writer::LogWriter;
use crate::persist::load;
use crate::state::Tables;
use crate::superblock::{self, MediumKind, Superblock};
use crate::{fsck, snapshot_v1, Caller};
use nodup_core::alloc::bitmap::Bitmap;
use nodup_core::media::Medium;
use nodup_core::{BlockNr, Engine, FormatOptions, Media, OpenState};
use rustc_hash::FxHashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

const BS: u64 = nodup_core::BLOCK_SIZE as u64;

/// The metadata as read from the medium, before the engine is touched.
struct Found {
    tables: Tables,
    /// Manifest + segment blocks (or the version-1 snapshot chain).
    ckpt_blocks: Vec<BlockNr>,
    manifest: Vec<BlockNr>,
    legacy: Vec<BlockNr>,
    replayed: Replayed,
    /// Records for inodes no directory reaches any more (written to an unlinked open file
    /// after the cut), skipped by the replay.
    skipped: u64,
    /// Blocks of inodes left without links (version-1 images only), for a clean open to release.
    orphan_blocks: Vec<BlockNr>,
    /// The record that ended the log because the table refused it (fsck only).
    refused: Option<String>,
    /// What fsck's table check found in the checkpoint as loaded, before the log (fsck only).
    checkpoint_problems: Vec<String>,
    /// The data-area blocks the checkpoint's maps point at, by offset from the area's start
    /// (a version-2 checkpoint checked as it loaded; not fsck).
    mapped: Option<Bitmap>,
}

/// On a clean open, refuse a block map onto a block of the engine's metadata layout (a region
/// of dedup entries): unlinking that file would free the region under the engine, and the next
/// write would overwrite its entries. The engine and the checkpoint are read side by side, so
/// this is checked once both are in, before anything is written: the layout's blocks (a list
/// in memory) against `mapped`, the loader's record of the blocks the maps point at (offsets
/// from `data_start`), or against every map when there is none (a version-1 checkpoint). After
/// a crash the open refuses such a reference before failure recovery would. A map onto a
/// `smart` fingerprint group is left to fsck: listing the groups reads every group block
/// (+70 % on the clean open of a `smart` image holding 2 GiB of unique data).
fn refuse_engine_blocks(
    engine: &Engine,
    tables: &Tables,
    mapped: Option<&Bitmap>,
    data_start: BlockNr,
) -> Result<()> {
    let held: FxHashSet<u64> = engine
        .layout_blocks()
        .into_iter()
        .filter(|&b| {
            mapped.is_none_or(|m| {
                b.checked_sub(data_start)
                    .is_some_and(|i| i < m.len() as u64 && m.get(i as usize))
            })
        })
        .collect();
    match map_onto(tables, &held) {
        Some(what) => Err(FsError::Corrupt(format!(
            "checkpoint: {what}; `nodup fsck --repair` repairs it"
        ))),
        None => Ok(()),
    }
}

/// Some block map onto a block of `held` (the engine's metadata layout), as the open's and
/// fsck's refusals name it.
fn map_onto(tables: &Tables, held: &FxHashSet<u64>) -> Option<String> {
    if held.is_empty() {
        return None;
    }
    let (ino, fb, b) = tables.find_ref(|b| held.contains(&b))?;
    Some(format!(
        "inode {ino} block {fb}: invalid physical block {b} (the engine's metadata holds it)"
    ))
}

/// On a clean open, refuse block maps the engine's saved state does not account for: a mapped
/// block free in its allocator (the next write could take it and overwrite the file), or a
/// number of distinct mapped blocks other than the engine's count of blocks in use (a leak, or
/// a block released under a file). `mapped` is the loader's record of the mapped blocks, with
/// the allocator's layout: one bit per block of the data area, which the allocator manages.
/// Both are word-wise passes over bitmaps of a bit per block. (Reference counts block by block
/// are fsck's.)
fn refuse_unaccounted(engine: &Engine, tables: &Tables, mapped: &Bitmap) -> Result<()> {
    let alloc = engine.allocator();
    let allocated = alloc.snapshot();
    if allocated.len() == mapped.len() {
        let hit = mapped
            .words()
            .iter()
            .zip(allocated.words())
            .enumerate()
            .find(|(_, (m, a))| *m & !*a != 0);
        if let Some((i, (m, a))) = hit {
            let b = alloc.start() + i as u64 * 64 + u64::from((m & !a).trailing_zeros());
            let at = tables
                .find_ref(|x| x == b)
                .map(|(ino, fb, _)| format!("inode {ino} block {fb}: "))
                .unwrap_or_default();
            return Err(FsError::Corrupt(format!(
                "checkpoint: {at}block {b} is mapped but free in the allocator; `nodup fsck --repair` repairs it"
            )));
        }
    }
    // Every clean open has the report; without one there is no saved count to hold the maps to.
    let Some(in_use) = engine.open_report().map(|r| r.referenced_blocks) else {
        return Ok(());
    };
    let distinct = mapped.count_ones() as u64;
    if in_use != distinct {
        return Err(FsError::Corrupt(format!(
            "checkpoint: engine counts {in_use} data blocks in use, block maps reference {distinct} distinct blocks; `nodup fsck --repair` repairs it"
        )));
    }
    Ok(())
}

/// Load the checkpoint named by `sb` and replay the log after its cut. Reads only.
/// `for_fsck`: the checkpoint's table is not checked (fsck checks and repairs it), and a record
/// the table refuses ends the log instead of failing the load.
fn load_metadata(
    m: &dyn Medium,
    sb: &Superblock,
    data: std::ops::Range<BlockNr>,
    for_fsck: bool,
) -> Result<Found> {
    let (mut tables, ckpt_blocks, manifest, legacy, mapped) = if sb.version == 1 {
        let (blocks, payload) = read_chain(
            m,
            sb.ckpt_head,
            ChainKind::Checkpoint,
            sb.ckpt_gen,
            u64::MAX,
        )?;
        if blocks.is_empty() {
            return Err(FsError::Corrupt("checkpoint not found".into()));
        }
        let t = snapshot_v1::decode(&payload)?;
        (t, blocks.clone(), Vec::new(), blocks, None)
    } else {
        // The loader checks the tree as it walks it, unless fsck (which checks it itself).
        let l = load::load(
            m,
            sb.ckpt_head,
            sb.ckpt_gen,
            (!for_fsck).then(|| load::Bounds {
                data: data.clone(),
                meta: vec![sb.log_head],
            }),
        )?;
        let mut blocks = l.manifest_blocks.clone();
        for s in l.tables.persist.segs.lock().values() {
            blocks.extend_from_slice(&s.blocks);
        }
        (l.tables, blocks, l.manifest_blocks, Vec::new(), l.mapped)
    };
    if tables.get(ROOT_INO).is_none() {
        return Err(FsError::Corrupt("root directory missing".into()));
    }
    // Inodes without links were open when a version-1 image was last written; nobody can
    // reach them any more (records written to them after the cut are skipped below). A
    // version-2 checkpoint holds only inodes a directory reaches, so one without links there
    // is a wrong link count, for the checks to report rather than a reason to release the
    // blocks of a file that is still named.
    let mut orphan_blocks = Vec::new();
    if sb.version == 1 {
        for ino in tables.unlinked() {
            if let Some(n) = tables.remove_inode(ino) {
                orphan_blocks.extend(n.read().data_blocks());
            }
        }
    }
    // Before the log: a record is checked against the table it changes, which must itself be
    // sound. A version-2 checkpoint was checked as it was loaded; fsck loads without and
    // reports what is wrong with the checkpoint as well as with the table after the log (a
    // record may have removed the problem from the one, not from the image).
    let meta: FxHashSet<u64> = ckpt_blocks.iter().chain([&sb.log_head]).copied().collect();
    let checkpoint_problems = if for_fsck {
        fsck::table_problems(&tables, data, &meta)
    } else {
        if sb.version == 1 {
            if let Some(first) = fsck::table_problems(&tables, data, &meta).first() {
                return Err(FsError::Corrupt(format!(
                    "checkpoint: {first}; `nodup fsck --repair` repairs it"
                )));
            }
        }
        Vec::new()
    };
    if sb.log_off as usize > PAYLOAD {
        return Err(FsError::Corrupt("log offset past the block".into()));
    }
    let mut skipped = 0u64;
    let mut refused = None;
    let replayed = replay(m, sb.log_start(), sb.log_gen, &mut |seq, rec| {
        // An inode no directory reaches was unlinked while open before the cut: records
        // written to it later change nothing that survives.
        if let Some(ino) = inode_only(&rec) {
            if tables.get(ino).is_none() && ino < tables.next_ino {
                skipped += 1;
                return Ok(true);
            }
        }
        match tables.apply(&rec) {
            Ok(_) => Ok(true),
            Err(FsError::Corrupt(why)) => {
                // "log record refers to ..." becomes "log record N refers to ...", N counted
                // from the last checkpoint (the numbers themselves start anywhere).
                let n = seq.wrapping_sub(sb.log_seq).wrapping_add(1);
                let what = match why.strip_prefix("log record ") {
                    Some(rest) => format!("log record {n} {rest}"),
                    None => format!("log record {n}: {why}"),
                };
                if !for_fsck {
                    return Err(FsError::Corrupt(format!(
                        "{what}; `nodup fsck --repair` ends the log before it, dropping it and any records after it"
                    )));
                }
                refused = Some(what);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    })?;
    Ok(Found {
        tables,
        ckpt_blocks,
        manifest,
        legacy,
        replayed,
        skipped,
        orphan_blocks,
        refused,
        checkpoint_problems,
        mapped,
    })
}

/// The inode a record changes alone (no directory entry involved).
fn inode_only(rec: &Record) -> Option<u64> {
    match rec {
        Record::SetAttr { ino, .. }
        | Record::Write { ino, .. }
        | Record::Truncate { ino, .. }
        | Record::Punch { ino, .. }
        | Record::SetXattr { ino, .. }
        | Record::RemoveXattr { ino, .. }
        | Record::Remap { ino, .. } => Some(*ino),
        Record::Create { .. }
        | Record::Link { .. }
        | Record::Unlink { .. }
        | Record::Rmdir { .. }
        | Record::Rename { .. } => None,
    }
}

/// The engine's options for an image of `kind`: on a block file, where the log holds records
/// back until a fence has made the data they name durable (`log/held.rs`), a write call fences
/// nothing itself (failure recovery rebuilds the entries and counts a crash lost from the
/// records; `OpenOptions::fenced_by_caller`).
fn engine_options(opts: &FsOptions, kind: MediumKind) -> nodup_core::OpenOptions {
    let mut o = opts.open.clone();
    o.fenced_by_caller = kind == MediumKind::BlockFile;
    o
}

impl FileSystem {
    /// Format `medium` (engine + file system) and return it open. What an earlier image left
    /// on the medium is never read as this one's (its log records are numbered differently).
    pub fn format(
        medium: Arc<dyn Medium>,
        kind: MediumKind,
        fopts: &FormatOptions,
        opts: &FsOptions,
        owner: Caller,
    ) -> Result<FileSystem> {
        let t0 = Instant::now();
        let mut fopts = fopts.clone();
        fopts.client_area_blocks = fopts.client_area_blocks.max(2);
        let engine = Engine::format(medium, &fopts, &engine_options(opts, kind))?;
        // The file system's metadata goes through the engine's metadata medium: encrypted with
        // the engine's when the image is.
        let medium = engine.medium().clone();
        let (area, alen) = engine.client_area();
        if alen < 2 {
            return Err(FsError::Corrupt(
                "engine client area smaller than 2 blocks".into(),
            ));
        }
        let mut sb = Superblock::new(
            kind,
            medium.len() / BS,
            fopts.policy as u32,
            fopts.fingerprint as u32,
            fopts.meta_layout as u32,
        );
        let first = engine.alloc_meta(1)?;
        // Records are numbered from a random start, not from 1: on a medium an earlier image
        // used, its log frames after this block's header carry that image's numbers, and
        // replay accepts only the next number of this one.
        let first_seq = opts
            .first_log_seq
            .unwrap_or_else(|| rand::random::<u64>() >> 2)
            .max(1);
        let log = LogWriter::start(&*medium, 1, first[0], first_seq)?;
        sb.log_head = first[0];
        sb.log_gen = 1;
        sb.next_gen = 2;
        let fs = FileSystem::assemble(
            engine,
            medium,
            kind,
            area,
            opts,
            Tables::with_root(owner.uid, owner.gid),
            log,
            MetaState {
                sb,
                slot: 1,
                next_gen: 2,
                manifest: Vec::new(),
                legacy: Vec::new(),
                reserve: Vec::new(),
            },
            RecoveryInfo {
                kind: "fresh".into(),
                ..Default::default()
            },
        );
        fs.checkpoint(false)?;
        // Make both copies valid so a stale superblock of an older image can never be chosen.
        {
            let meta = fs.meta.lock();
            superblock::write_slot(&*fs.medium, area, 1 - meta.slot, &meta.sb)?;
        }
        fs.top_up_reserve();
        fs.keep_unmount_room();
        let mut fs = fs;
        fs.recovery.seconds = t0.elapsed().as_secs_f64();
        Ok(fs)
    }

    /// Open an existing image: load the checkpoint, replay the log, then either normal recovery
    /// (clean unmount) or failure recovery (engine.recover with every reference the files hold).
    /// With `opts.read_only` nothing is written: the image stays byte-identical.
    pub fn open(medium: Arc<dyn Medium>, opts: &FsOptions) -> Result<FileSystem> {
        let t0 = Instant::now();
        // The file-system superblock is in the clear on an encrypted image too: anything that
        // is not a nodup image is refused as such before any key is looked at. The key is then
        // checked, and the metadata read through the decrypting medium.
        let (sb, _, _) = superblock::probe_medium(&*medium)?;
        // Where block maps may point, for the check of the checkpoint (the engine's superblock
        // is in the clear).
        let esb = nodup_core::engine::superblock::Superblock::load(&*medium)?;
        let data = esb.data_start..esb.data_start + esb.data_blocks;
        let media = Media::unlock(medium, opts.open.key.as_ref())?;
        let medium = media.meta.clone();
        let m = &*medium;
        // The engine's normal recovery (index reload) and the metadata load are independent:
        // run them side by side, both without writing. Only when both succeeded is the image
        // marked in use, so a corrupt image is refused untouched.
        let mut eopts = engine_options(opts, sb.medium_kind());
        eopts.read_only = true;
        let (engine_res, found, load_seconds, engine_seconds) = std::thread::scope(|sc| {
            let eng = sc.spawn(|| {
                let t1 = Instant::now();
                let r = Engine::open_media(media.clone(), &eopts);
                (r, t1.elapsed().as_secs_f64())
            });
            let found = load_metadata(m, &sb, data, opts.fsck);
            let load_seconds = t0.elapsed().as_secs_f64();
            let (r, secs) = match eng.join() {
                Ok(x) => x,
                Err(_) => (
                    Err(nodup_core::Error::Corrupt("engine open panicked".into())),
                    0.0,
                ),
            };
            (r, found, load_seconds, secs)
        });
        let t1 = Instant::now();
        let (engine, state) = engine_res?;
        let found = found?;
        let rp = &found.replayed;
        let needs = !sb.is_clean() || state == OpenState::NeedsRecovery || rp.records > 0;
        if !opts.fsck && !needs {
            let data_start = engine.data_area().0;
            let held =
                refuse_engine_blocks(&engine, &found.tables, found.mapped.as_ref(), data_start)
                    .and_then(|_| match &found.mapped {
                        Some(mapped) => refuse_unaccounted(&engine, &found.tables, mapped),
                        None => Ok(()),
                    })
                    .and_then(|_| {
                        engine.check_reverse_map().map_err(|e| match e {
                            nodup_core::Error::Corrupt(m) => FsError::Corrupt(format!(
                                "engine: {m}; `nodup fsck --repair` repairs it"
                            )),
                            e => e.into(),
                        })
                    });
            match held {
                // What these protect against is a write or an unlink freeing or taking a block
                // still in use; a read-only open does neither, so the data can still be read
                // (or copied off) before the repair.
                Err(FsError::Corrupt(m)) if opts.read_only => {
                    crate::logging::warn(&format!("read-only open despite: {m}"))
                }
                r => r?,
            }
        }
        if !opts.read_only {
            engine.begin_use()?;
        }
        let (area, _) = engine.client_area();
        let (_, slot) = superblock::read_pair(m, area)?;
        let mut info = RecoveryInfo {
            kind: if needs { "failure" } else { "clean" }.into(),
            replayed_records: rp.records,
            skipped_records: found.skipped,
            refused_record: found.refused.clone(),
            checkpoint_problems: found.checkpoint_problems.clone(),
            load_seconds,
            ..Default::default()
        };
        if needs && !opts.read_only {
            let mut refs = found.tables.data_refs();
            let metas: Vec<BlockNr> = found
                .ckpt_blocks
                .iter()
                .chain(rp.blocks.iter())
                .copied()
                .collect();
            let layout: FxHashSet<u64> = engine.layout_blocks().into_iter().collect();
            if opts.fsck {
                // A reference failure recovery refuses (outside the data area, on a metadata
                // block, on a block of the engine's metadata layout) is left to fsck's table
                // check, which unmaps it; the engine counts the others.
                let (start, len) = engine.data_area();
                let meta: FxHashSet<u64> = metas.iter().chain(&layout).copied().collect();
                let bounds = fsck::Bounds {
                    data: start..start + len,
                    meta: &meta,
                };
                refs.retain(|&b| bounds.allows(b));
            } else if let Some(what) = map_onto(&found.tables, &layout) {
                // Failure recovery would refuse it too, naming only the block.
                return Err(FsError::Corrupt(format!(
                    "{what}; `nodup fsck --repair` unmaps it"
                )));
            }
            let report = engine
                .recover(&mut refs.into_iter(), &mut metas.into_iter())
                .map_err(|e| match e {
                    // A block map (from the checkpoint or a replayed record) the recovery
                    // refuses.
                    nodup_core::Error::Invalid(m)
                        if m.starts_with("referenced block") || m.starts_with("metadata block") =>
                    {
                        FsError::Corrupt(format!("{m}; `nodup fsck --repair` unmaps it"))
                    }
                    e => e.into(),
                })?;
            info.engine = Some(report);
        } else if !needs && !opts.read_only && !found.orphan_blocks.is_empty() {
            // A version-1 orphan's map was never checked against the engine: a block the
            // engine's metadata holds is the engine's, and is not freed with the orphan.
            let mut held = FxHashSet::default();
            engine.with_engine_owned_blocks(&mut |b, _| held.extend(b.iter().copied()));
            let orphans: Vec<BlockNr> = found
                .orphan_blocks
                .iter()
                .copied()
                .filter(|b| !held.contains(b))
                .collect();
            engine.release_batch(&orphans)?;
        }
        info.engine_seconds = engine_seconds + t1.elapsed().as_secs_f64();
        if !opts.read_only {
            // Bytes an interrupted run left after the end of the log must never be read as
            // records once appending resumes there.
            cut_tail(m, rp.end.block, rp.end.off)?;
        }
        let log = LogWriter::resume(
            sb.log_gen,
            sb.log_index,
            rp.blocks.clone(),
            rp.end,
            rp.records,
            rp.bytes,
        );
        let upgrade = sb.version == 1;
        let fs = FileSystem::assemble(
            engine,
            medium,
            sb.medium_kind(),
            area,
            opts,
            found.tables,
            log,
            MetaState {
                next_gen: sb.next_gen,
                sb,
                slot,
                manifest: found.manifest,
                legacy: found.legacy,
                reserve: Vec::new(),
            },
            info,
        );
        if !opts.read_only {
            if needs || upgrade {
                // A checkpoint folds the replayed log in (and writes a version-1 image in the
                // current format). On a full device it is deferred: the replayed log stays the
                // valid one (appends continue on it) so the user can mount and delete files;
                // the next tick or the shutdown writes the checkpoint.
                match fs.checkpoint(false) {
                    Ok(()) => {}
                    Err(e) if e.errno() == libc::ENOSPC => fs.write_sb(0)?,
                    Err(e) => return Err(e),
                }
            } else {
                fs.write_sb(0)?;
            }
            fs.top_up_reserve();
            fs.keep_unmount_room();
        }
        let mut fs = fs;
        fs.recovery.seconds = t0.elapsed().as_secs_f64();
        Ok(fs)
    }

    /// Clean unmount: final checkpoint with the clean flag, give back held metadata blocks,
    /// then the engine's shutdown (normal recovery reloads its state next time).
    /// A call after the first returns the first one's failure, if it failed.
    pub fn shutdown(&self) -> Result<()> {
        if self.shut.swap(true, Ordering::SeqCst) {
            return match self.shutdown_error.get() {
                Some(e) => Err(FsError::Unclean(e.clone())),
                None => Ok(()),
            };
        }
        self.shutdown_once().inspect_err(|e| {
            let _ = self.shutdown_error.set(e.to_string());
        })
    }

    /// [`FileSystem::shutdown`]'s work.
    fn shutdown_once(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        // An engine that gave up its live state and was not rebuilt yet (its wait after a
        // failed try) gets one more try, so the unmount can still be clean.
        self.recover_if_gave_up(true);
        // Blocks a lost fingerprint group kept are freed before the allocator is saved.
        self.rebuild_if_leaked(true);
        // A release of deferred references in flight (the maintenance thread's sync) finishes
        // before the final checkpoint and the engine's save; later syncs see `shut` and leave
        // them to the checkpoint.
        drop(self.releasing.write());
        // The worker stops first; what it has not done yet is kept for the next mount.
        self.stop_smart_worker();
        if let Err(e) = self.smart_checkpoint() {
            crate::logging::warn(&format!("smart: skipped-buffer checkpoint at unmount: {e}"));
        }
        self.checkpoint(true)?;
        // No operation runs now (the gate), and a reserve top-up still in flight (the
        // maintenance thread's) sees `shut` under `meta` and allocates nothing.
        let _g = self.gate.write();
        let spare: Vec<BlockNr> = {
            let mut meta = self.meta.lock();
            let mut log = self.log.lock();
            let mut v = std::mem::take(&mut log.spare);
            v.append(&mut meta.reserve);
            v
        };
        if !spare.is_empty() {
            self.engine.free_meta(&spare)?;
        }
        // What the next mount's checkpoint reserve and first log blocks will ask for.
        let next = self.reserve_want() + crate::log::writer::LOG_REFILL;
        self.engine.keep_for_next_open(next as u64);
        self.clear_ctxs();
        self.engine.shutdown()?;
        match self.engine.given_back() {
            Some(Ok(0)) | None => {}
            Some(Ok(n)) => crate::logging::info(&format!(
                "gave {} freed blocks ({} MiB) back to what holds the image",
                n,
                (n * BS) >> 20
            )),
            Some(Err(e)) => crate::logging::warn(&format!(
                "freed space not given back to what holds the image (it stays allocated there): {e}"
            )),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fresh;
    use std::sync::atomic::AtomicBool;

    /// A format over a medium an earlier image used (not zeroed first, as a library caller
    /// may) gives an empty file system that opens clean: nothing of the old log replays.
    #[test]
    fn a_format_over_a_used_medium_replays_nothing_of_it() {
        use crate::testing::{create, fresh_on};
        use nodup_core::media::MemMedium;
        let m = Arc::new(MemMedium::new(16 << 20));
        let fs = fresh_on(m.clone());
        for i in 0..50u32 {
            let ino = create(&fs, format!("f{i}").as_bytes());
            fs.write(ino, 0, &[i as u8; 10_000]).unwrap();
        }
        // Left as a crash leaves it: the log's blocks hold its records (a clean unmount
        // would give the freed ones back, and here the medium marks those).
        drop(fs);
        let fs = fresh_on(m.clone());
        fs.shutdown().unwrap();
        drop(fs);
        let fs = FileSystem::open(m.clone(), &FsOptions::default()).unwrap();
        assert_eq!(fs.recovery().kind, "clean");
        assert_eq!(fs.recovery().replayed_records, 0);
        let names: Vec<_> = fs
            .readdir(ROOT_INO, 0, 100)
            .unwrap()
            .into_iter()
            .filter(|e| e.3 != b"." && e.3 != b"..")
            .collect();
        assert!(names.is_empty(), "{} entries of the old image", names.len());
    }

    /// The unmount waits for a release of deferred references in flight (the maintenance
    /// thread's sync holds `releasing` from taking them until the engine has released them):
    /// saved in the middle of one, the engine's counts would leak the blocks. A sync after the
    /// unmount has begun leaves them to the final checkpoint.
    #[test]
    fn shutdown_waits_for_a_release_in_flight() {
        let fs = fresh();
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let held = fs.releasing.read();
            let t = s.spawn(|| {
                fs.shutdown().unwrap();
                done.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(300));
            assert!(fs.is_shut_down(), "the unmount has begun");
            assert!(!done.load(Ordering::SeqCst), "the unmount did not wait");
            drop(held);
            t.join().unwrap();
        });
        assert!(done.load(Ordering::SeqCst));
        fs.pending.lock().push(12345);
        fs.sync().unwrap();
        assert_eq!(
            *fs.pending.lock(),
            vec![12345],
            "a sync after the unmount took pending"
        );
    }

    /// A reserve top-up that began before the unmount (the maintenance thread's tick) but
    /// reaches `meta` only after the unmount began allocates nothing: the unmount takes the
    /// reserve back, and blocks allocated after that would be counted in use with nothing
    /// holding them.
    #[test]
    fn top_up_after_the_unmount_began_allocates_nothing() {
        let fs = fresh();
        assert!(fs.reserve_want() > 0);
        let free = fs.engine.allocator().free_blocks();
        std::thread::scope(|s| {
            let mut meta = fs.meta.lock();
            let reserve = std::mem::take(&mut meta.reserve);
            let t = s.spawn(|| fs.top_up_reserve());
            // The top-up is past its start and waits for `meta`, as it would behind the
            // unmount taking the reserve.
            std::thread::sleep(std::time::Duration::from_millis(200));
            fs.shut.store(true, Ordering::SeqCst);
            drop(meta);
            assert!(t.join().unwrap());
            let mut meta = fs.meta.lock();
            assert!(meta.reserve.is_empty(), "the top-up refilled the reserve");
            meta.reserve = reserve;
        });
        assert_eq!(
            fs.engine.allocator().free_blocks(),
            free,
            "blocks allocated after the unmount began"
        );
    }
}
