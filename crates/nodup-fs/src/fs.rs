//! The file system type: its options, its state and the plumbing every operation goes through
//! (log append, deferred releases, the namespace and single-inode operation skeletons). The
//! POSIX operations over it live by concern in `query.rs`, `data.rs`, `namespace.rs`,
//! `attrs.rs` and `copy.rs`.
//!
//! Locking (outermost first): `gate` (read by every operation, written by a checkpoint so it
//! sees a quiescent state) -> `tables` (read to find an inode, written by namespace operations)
//! -> one inode's lock -> `log` (the append itself, always last). A data write holds only its
//! inode's lock across the engine call, so writes to different files run in parallel. Around
//! them: a `smart` worker step (`SmartFs::scratch`) before any other lock, then `ckpt_lock`,
//! then the gate; `releasing` after the gate; `meta` before `log`; `pending` and the
//! checkpoint's segment list innermost. Failure recovery while mounted takes them all in that
//! order (`live_recovery.rs`).

use crate::checkpoint::CkptStats;
use crate::error::{errno, FsError, Result};
use crate::inode::{Inode, Kind, Ts};
use crate::log::check;
use crate::log::record::Record;
use crate::log::writer::LogWriter;
use crate::persist::Persist;
use crate::state::{apply_inode, Effects, InodeRef, Tables};
use crate::superblock::{self, MediumKind, Superblock};
use nodup_core::engine::RecoveryReport;
use nodup_core::media::Medium;
use nodup_core::{BlockNr, Engine, OpenOptions, WriteCtx, BLOCK_SIZE};
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

const BS: u64 = BLOCK_SIZE as u64;
/// Largest file size accepted (EFBIG beyond).
pub const MAX_FILE_SIZE: u64 = 1 << 50;
/// File blocks below [`MAX_FILE_SIZE`]: no file maps a block at or past it.
pub const MAX_FILE_BLOCKS: u64 = MAX_FILE_SIZE / BS;
/// Longest name in a directory.
pub const NAME_MAX: usize = 255;
/// Most hard links to one inode.
pub const LINK_MAX: u32 = 65_000;
/// Pending (not yet durable) released blocks at which a BlockFile write forces a sync.
const PENDING_LIMIT: usize = 1 << 20;
/// Free blocks data writes leave for log appends (unlink, truncate on a full device).
pub(crate) const LOG_HEADROOM: u64 = 8;
/// Log bytes a namespace operation appends at most (two names and fixed fields).
pub(crate) const NS_RECORD: usize = 2 * NAME_MAX + 256;

/// How the file system is opened.
#[derive(Debug, Clone, Default)]
pub struct FsOptions {
    /// Engine options for this open (prefetch mode, memory budget).
    pub open: OpenOptions,
    /// Open without writing anything (stats of an unmounted image, fsck without --repair).
    pub read_only: bool,
    /// Log bytes that trigger a checkpoint; 0 derives the limit from the image and its free
    /// space (see [`FileSystem::log_limit`]).
    pub checkpoint_log_bytes: u64,
    /// Clean every checkpoint segment that holds any garbage, at every checkpoint (tests: puts
    /// segment cleaning into every crash state of a torture run).
    pub eager_cleaning: bool,
    /// The image file, when there is one (`smart` samples the utilisation of its device).
    pub image_path: Option<std::path::PathBuf>,
    /// Opened by fsck, which reports (and with --repair fixes) what a normal open refuses: the
    /// checkpoint's inode table is loaded without the open's check of it (fsck runs the same
    /// check), and a log record the table refuses (`log::check`) ends the log where it starts
    /// (with --repair the log is cut there, dropping it and any records after it).
    pub fsck: bool,
    /// The number of a format's first log record; `None` (the default) draws it at random,
    /// so that an earlier image's records on a reused medium never continue the new log. A
    /// fixed one makes a format reproducible byte for byte (fuzzing's base images).
    pub first_log_seq: Option<u64>,
}

/// Who performs an operation (owner of new inodes).
#[derive(Debug, Clone, Copy, Default)]
pub struct Caller {
    /// Owner of new inodes.
    pub uid: u32,
    /// Group of new inodes (unless the parent directory is set-group-ID).
    pub gid: u32,
    /// The creating process's umask, applied to new inodes unless the parent directory has a
    /// default ACL (which then decides instead, as POSIX says).
    pub umask: u32,
}

/// How the last open found the image, for logs and `nodup stats`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RecoveryInfo {
    /// `fresh` (mkfs), `clean` (normal recovery) or `failure` (crash recovery).
    pub kind: String,
    /// Wall time of the whole open, seconds.
    pub seconds: f64,
    /// Log records replayed on top of the checkpoint.
    pub replayed_records: u64,
    /// Replayed records that changed only an inode unlinked while open (dropped at open).
    pub skipped_records: u64,
    /// The log record that ended the replay because the table refused it (its sequence number
    /// and why), with [`FsOptions::fsck`].
    pub refused_record: Option<String>,
    /// With [`FsOptions::fsck`]: what its table check found in the checkpoint as loaded, before
    /// the log was replayed on it (a normal open refuses such a checkpoint).
    pub checkpoint_problems: Vec<String>,
    /// Seconds spent reading the checkpoint and replaying the log.
    pub load_seconds: f64,
    /// Seconds spent in the engine's open (normal recovery) and failure recovery.
    pub engine_seconds: f64,
    /// What the engine's failure recovery did.
    pub engine: Option<RecoveryReport>,
}

/// What `statfs` reports, in 4 KiB blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub free: u64,
    pub avail: u64,
    pub inodes: u64,
}

/// Requested attribute changes (setattr).
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Ts>,
    pub mtime: Option<Ts>,
    pub ctime: Option<Ts>,
}

/// One directory entry returned by readdir: (next offset, inode, kind, name).
pub type DirEntry = (u64, u64, Kind, Vec<u8>);

/// fallocate mode bits understood here.
pub mod falloc {
    pub const KEEP_SIZE: i32 = 0x01;
    pub const PUNCH_HOLE: i32 = 0x02;
    pub const ZERO_RANGE: i32 = 0x10;
}
/// rename flags.
pub mod rename_flags {
    pub const NOREPLACE: u32 = 1;
    pub const EXCHANGE: u32 = 2;
}

/// The superblock in force and the metadata blocks outside the log and the segments.
pub(crate) struct MetaState {
    pub(crate) sb: Superblock,
    /// Which superblock copy holds `sb`.
    pub(crate) slot: usize,
    /// Next chain generation to hand out.
    pub(crate) next_gen: u64,
    /// Blocks of the manifest chain in force.
    pub(crate) manifest: Vec<BlockNr>,
    /// The snapshot chain of a version-1 image (freed by its first checkpoint).
    pub(crate) legacy: Vec<BlockNr>,
    /// Metadata blocks held back so a checkpoint can be written even when data filled the device.
    pub(crate) reserve: Vec<BlockNr>,
}

/// A mounted (open) nodup file system.
pub struct FileSystem {
    pub(crate) engine: Engine,
    pub(crate) medium: Arc<dyn Medium>,
    pub(crate) kind: MediumKind,
    pub(crate) area: BlockNr,
    pub(crate) durable: bool,
    pub(crate) read_only: bool,
    /// Log limit from the options (0 = derived from the image, see `log_limit`).
    pub(crate) fixed_log_limit: u64,
    /// See [`FsOptions::eager_cleaning`].
    pub(crate) eager_cleaning: bool,
    pub(crate) gate: RwLock<()>,
    pub(crate) tables: RwLock<Tables>,
    /// The checkpoint bookkeeping shared with `tables`.
    pub(crate) persist: Arc<Persist>,
    pub(crate) log: Mutex<LogWriter>,
    pub(crate) meta: Mutex<MetaState>,
    /// Held by the one checkpoint that may run at a time.
    pub(crate) ckpt_lock: Mutex<()>,
    pub(crate) ckpt_stats: Mutex<CkptStats>,
    /// Blocks a server-side copy shared instead of writing.
    pub(crate) copy_shared: AtomicU64,
    /// Blocks reserved by writes answered before they are stored (`admit`).
    pub(crate) admitted_blocks: AtomicU64,
    /// Working vectors of the cut, kept between checkpoints.
    pub(crate) cut_scratch: Mutex<crate::checkpoint::CutScratch>,
    /// Released blocks waiting for the next sync before they go back (blockfile images).
    pub(crate) pending: Mutex<Vec<BlockNr>>,
    /// Held shared by [`FileSystem::sync`] from taking `pending` until the engine has released
    /// it, and taken exclusively by the unmount, which so waits for every release in flight
    /// (the maintenance thread's) instead of saving the engine's counts in the middle of one;
    /// syncs do not wait for each other.
    pub(crate) releasing: RwLock<()>,
    ctxs: Mutex<Vec<WriteCtx>>,
    /// File blocks mapped by all files (the logical size, in blocks).
    pub(crate) mapped: AtomicU64,
    pub(crate) recovery: RecoveryInfo,
    pub(crate) shut: std::sync::atomic::AtomicBool,
    /// Why the clean shutdown failed, for the callers after the first.
    pub(crate) shutdown_error: std::sync::OnceLock<String>,
    /// The maintenance thread has said once that the image's write-back failed.
    pub(crate) said_failed: std::sync::atomic::AtomicBool,
    /// The last top-up of the checkpoint reserve fell short for lack of room on the disk
    /// holding the image (not of free blocks in it).
    pub(crate) reserve_short_of_host: std::sync::atomic::AtomicBool,
    /// The log says the disk holding the image has no room for what a clean unmount writes
    /// (and has not said that it has again): see [`FileSystem::keep_unmount_room`].
    pub(crate) said_unreserved: std::sync::atomic::AtomicBool,
    /// A superblock switch failed and so did putting the slot back: the medium may name a
    /// checkpoint whose blocks went back to the reserve (see [`FileSystem::switch_sb`]).
    pub(crate) switch_unsettled: std::sync::atomic::AtomicBool,
    /// Failure recovery while mounted: when it may run next, and what it did.
    pub(crate) live_recovery: Mutex<crate::live_recovery::LiveRecovery>,
    /// When the file system was opened, and milliseconds after it of the last logged operation.
    pub(crate) clock: Instant,
    last_op_ms: AtomicU64,
    /// Set to ask the maintenance thread for a checkpoint now; the thread waits on `wake`.
    wake_flag: Mutex<bool>,
    wake: parking_lot::Condvar,
    /// Policy `smart`'s skipped buffer and out-of-line worker (writable opens of `smart` images).
    pub(crate) smart: Option<crate::smart::SmartFs>,
}

pub(crate) fn name_ok(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return errno(libc::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name == b"." || name == b".." {
        return errno(libc::EINVAL);
    }
    Ok(())
}

impl FileSystem {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn assemble(
        engine: Engine,
        medium: Arc<dyn Medium>,
        kind: MediumKind,
        area: BlockNr,
        opts: &FsOptions,
        tables: Tables,
        log: LogWriter,
        meta: MetaState,
        recovery: RecoveryInfo,
    ) -> FileSystem {
        let mapped = tables.mapped_blocks();
        let persist = tables.persist.clone();
        let smart = crate::smart::for_engine(&engine, area, opts);
        let durable = kind == MediumKind::Pmem || medium.kind() == "mem";
        let mut log = log;
        if !durable {
            // The engine leaves new data unfenced here (`open.rs`, `engine_options`).
            log.hold_back_records();
        }
        FileSystem {
            engine,
            durable,
            medium,
            kind,
            area,
            read_only: opts.read_only,
            fixed_log_limit: opts.checkpoint_log_bytes,
            eager_cleaning: opts.eager_cleaning,
            gate: RwLock::new(()),
            tables: RwLock::new(tables),
            persist,
            log: Mutex::new(log),
            meta: Mutex::new(meta),
            ckpt_lock: Mutex::new(()),
            ckpt_stats: Mutex::new(CkptStats::default()),
            copy_shared: AtomicU64::new(0),
            admitted_blocks: AtomicU64::new(0),
            cut_scratch: Mutex::new(Default::default()),
            pending: Mutex::new(Vec::new()),
            releasing: RwLock::new(()),
            ctxs: Mutex::new(Vec::new()),
            mapped: AtomicU64::new(mapped),
            recovery,
            shut: std::sync::atomic::AtomicBool::new(false),
            shutdown_error: std::sync::OnceLock::new(),
            said_failed: std::sync::atomic::AtomicBool::new(false),
            reserve_short_of_host: std::sync::atomic::AtomicBool::new(false),
            said_unreserved: std::sync::atomic::AtomicBool::new(false),
            switch_unsettled: std::sync::atomic::AtomicBool::new(false),
            live_recovery: Mutex::new(Default::default()),
            clock: Instant::now(),
            last_op_ms: AtomicU64::new(0),
            wake_flag: Mutex::new(false),
            wake: parking_lot::Condvar::new(),
            smart,
        }
    }

    /// Ask the maintenance thread to run [`FileSystem::tick`] now.
    pub(crate) fn wake_maintenance(&self) {
        let mut f = self.wake_flag.lock();
        if !*f {
            *f = true;
            self.wake.notify_one();
        }
    }

    /// Maintenance thread: wait up to `timeout` or until an operation asks for a tick.
    pub fn wait_for_tick(&self, timeout: std::time::Duration) {
        let mut f = self.wake_flag.lock();
        if !*f {
            self.wake.wait_for(&mut f, timeout);
        }
        *f = false;
    }

    /// Drop the engine write contexts (before the engine shuts down).
    pub(crate) fn clear_ctxs(&self) {
        self.ctxs.lock().clear();
    }

    /// True once [`FileSystem::shutdown`] ran.
    pub fn is_shut_down(&self) -> bool {
        self.shut.load(Ordering::SeqCst)
    }

    /// Note that an operation ran now (for idle checkpoints).
    pub(crate) fn touch_clock(&self) {
        let ms = self.clock.elapsed().as_millis() as u64;
        self.last_op_ms.store(ms, Ordering::Relaxed);
    }

    /// Milliseconds since the last logged operation.
    pub(crate) fn idle_ms(&self) -> u64 {
        let now = self.clock.elapsed().as_millis() as u64;
        now.saturating_sub(self.last_op_ms.load(Ordering::Relaxed))
    }

    pub(crate) fn sub_mapped(&self, n: u64) {
        self.mapped.fetch_sub(n, Ordering::Relaxed);
    }

    pub(crate) fn write_sb(&self, flags: u32) -> Result<()> {
        let mut meta = self.meta.lock();
        let mut sb = meta.sb.clone();
        sb.seq += 1;
        sb.flags = flags;
        let slot = 1 - meta.slot;
        self.switch_sb(&meta.sb, slot, &sb)?;
        meta.sb = sb;
        meta.slot = slot;
        Ok(())
    }

    /// Write `sb` into superblock `slot`. When that fails, the slot is rewritten with `cur`
    /// (the superblock in force), so the medium never announces a switch the live file system
    /// did not make; only a second failure in a row can leave the slot ambiguous.
    pub(crate) fn switch_sb(
        &self,
        cur: &superblock::Superblock,
        slot: usize,
        sb: &superblock::Superblock,
    ) -> Result<()> {
        let m = &*self.medium;
        if let Err(e) = superblock::write_slot(m, self.area, slot, sb) {
            // The new copy may have landed though its write or fence failed: put the current
            // one there again. If that fails too, the medium may name the new checkpoint,
            // whose blocks the caller gives back to the reserve; nothing may be written any
            // more (a later checkpoint would reuse them) until failure recovery at the next
            // mount reads whichever copy is there.
            if superblock::write_slot(m, self.area, slot, cur).is_err() {
                self.switch_unsettled.store(true, Ordering::Release);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Make everything written so far durable (fsync on BlockFile) and drop deferred references.
    /// Once the unmount has begun, its final checkpoint takes and releases them instead; while
    /// the engine has given up its live state they wait for its rebuild (which counts them as
    /// held), and what was written is durable all the same.
    pub fn sync(&self) -> Result<()> {
        let _r = self.releasing.read();
        let pending = {
            let mut log = self.log.lock();
            // Held-back records after a fence for the data they name, then their own fence.
            self.write_out_held(&mut log)?;
            self.medium.fence()?;
            if self.is_shut_down() || self.engine_gave_up() {
                return Ok(());
            }
            std::mem::take(&mut *self.pending.lock())
        };
        // Nothing to release, nothing more to make durable: the fence above was the sync (an
        // empty release would only fence again, and on a disk every fdatasync is a flush).
        if !pending.is_empty() {
            self.engine.release_batch(&pending)?;
        }
        Ok(())
    }

    /// Write the log records a block-file image holds back to the medium, after a fence for the
    /// data they name, without making them durable (what the maintenance tick does every half
    /// second; `log/held.rs`). Nothing to do on a pmem image.
    pub fn write_out_log(&self) -> Result<()> {
        self.write_out_held(&mut self.log.lock())
    }

    /// Write out what `log` (its lock held) holds back, fenced first only when the engine
    /// stored new data since the last such fence (records of duplicates name only data a
    /// fence covered).
    pub(crate) fn write_out_held(&self, log: &mut LogWriter) -> Result<()> {
        if !log.holds_records() {
            return Ok(());
        }
        let fence = self.engine.take_unfenced_data();
        let r = log.write_out(&*self.medium, fence);
        if r.is_err() && fence {
            self.engine.note_unfenced_data();
        }
        r
    }

    /// Give free space back to what holds the image while mounted (`fstrim`, FITRIM), first
    /// dropping the references that waited for durability (a [`FileSystem::sync`]), so what
    /// was just deleted is among it. `[off, off+len)` are bytes of the image and `min` the
    /// shortest run worth giving back, as FITRIM has them; returns the bytes given back.
    /// EROFS on a read-only mount, EOPNOTSUPP where the image's holder cannot take space back,
    /// EINVAL, as ext4, for a range that starts past the image or is shorter than a block, or
    /// a `min` longer than any free run can be.
    pub fn trim(&self, off: u64, len: u64, min: u64) -> Result<u64> {
        if self.read_only {
            return errno(libc::EROFS);
        }
        if off >= self.medium.len() || len < nodup_core::BLOCK_SIZE as u64 {
            return errno(libc::EINVAL);
        }
        // An engine that gave up its live state is rebuilt first, as for a change (the trim
        // goes on whatever the check says, as it always did: it gives back only free blocks).
        let _ = self.changes_possible_or_rebuilt(false);
        self.sync()?;
        match self.engine.trim(off, len, min)? {
            Some(n) => Ok(n),
            None => errno(libc::EOPNOTSUPP),
        }
    }

    // ---------------------------------------------------------------- plumbing

    /// Append `rec`, a change of the single inode `n`, to the log (durable on return on a pmem
    /// image). It must pass the checks replay applies first (`log::check`): a refused record
    /// in the log would make the image refuse to open; refused here, it is an error instead.
    pub(crate) fn append_for(&self, n: &Inode, rec: &Record) -> Result<()> {
        self.append_naming(n, rec, &[])
    }

    /// [`FileSystem::append_for`] of a record that maps `named`, references the caller took
    /// for it (new data, dedup hits, shared blocks). When the append fails they are given
    /// back, but only once nothing on the medium can name them: the frame of a failed append
    /// may be there all the same (see [`LogWriter::settled`]).
    pub(crate) fn append_naming(&self, n: &Inode, rec: &Record, named: &[BlockNr]) -> Result<()> {
        if let Err(e) = check::inode(n, rec) {
            // Refused before anything was written.
            let _ = self.engine.release_batch(named);
            return Err(e);
        }
        self.append_holding(rec, named)
    }

    /// Append `rec` to the log; every caller has checked it against the table first.
    fn append(&self, rec: &Record) -> Result<()> {
        self.append_holding(rec, &[])
    }

    /// [`FileSystem::append`], holding `named` (see [`FileSystem::append_naming`]) when the
    /// append fails after writing.
    fn append_holding(&self, rec: &Record, named: &[BlockNr]) -> Result<()> {
        if self.read_only {
            let _ = self.engine.release_batch(named);
            return errno(libc::EROFS);
        }
        self.touch_clock();
        let mut log = self.log.lock();
        // Under the log lock: after a superblock switch that could not be undone, the blocks
        // its checkpoint wrote go back to the reserve, which can lend them to the log's spare
        // pool (under this lock) only once the stop is set; checked before the lock, an append
        // could pass it and then write into them.
        if let Err(e) = self.changes_possible() {
            drop(log);
            let _ = self.engine.release_batch(named);
            return Err(e);
        }
        let engine = &self.engine;
        let r = log.append(&*self.medium, rec, self.durable, &mut |n| {
            Ok(engine.alloc_meta(n)?)
        });
        let (now, settled) = match &r {
            Ok(()) => (&[][..], log.settled()),
            Err(_) if log.unsure() => {
                log.hold(named);
                (&[][..], Vec::new())
            }
            // It failed before writing anything (no metadata block for it).
            Err(_) => (named, Vec::new()),
        };
        drop(log);
        if !now.is_empty() {
            let _ = self.engine.release_batch(now);
        }
        self.give_back_settled(settled);
        r
    }

    /// Whether a change can still be made durable: not once the image's write-back failed
    /// (no fence of this open succeeds again, see `media/write_back.rs`) or a superblock switch
    /// could not be undone, until the next mount; and not while the engine has given up its
    /// live state after a store it could not undo, until failure recovery rebuilds it (the
    /// maintenance tick runs it while mounted, see `live_recovery.rs`). Then every change
    /// fails with EIO saying so, as ext4 refuses changes once its journal is aborted.
    pub fn changes_possible(&self) -> Result<()> {
        const REMOUNT: &str = "until the image is mounted again";
        let (why, until) = match self.medium.write_back_failed() {
            Some(f) => (
                format!("an earlier write-back of the image failed ({f})"),
                REMOUNT,
            ),
            None if self.switch_unsettled.load(Ordering::Acquire) => (
                "a checkpoint's superblock switch failed and could not be undone".to_string(),
                REMOUNT,
            ),
            None if self.engine_gave_up() => {
                // The maintenance thread rebuilds it: now, not at its next round (only when a
                // try is due, or the thread, which asks too, would spin).
                if self.live_recovery.lock().due(Instant::now()) {
                    self.wake_maintenance();
                }
                (
                    "the engine gave up its live state after a failed store".to_string(),
                    "until failure recovery rebuilds it (tried while mounted, else at the next \
                     mount)",
                )
            }
            None => return Ok(()),
        };
        Err(FsError::Engine(nodup_core::Error::Io(
            std::io::Error::other(format!("{why}: no change can be made durable {until}")),
        )))
    }

    /// Whether the engine gave up its live state (after a store it could not undo) and waits
    /// for failure recovery.
    pub(crate) fn engine_gave_up(&self) -> bool {
        matches!(
            self.engine.check_ready(),
            Err(nodup_core::Error::NeedsRecovery)
        )
    }

    /// Give back references held for failed appends that nothing on the medium can name any
    /// more (see [`LogWriter::settled`]), as a record's releases are ([`FileSystem::finish`]):
    /// at once on a pmem image, on a block file after the next fence. The scrub that settled
    /// them was fenced, so the block-file wait is not needed, only harmless (and rare).
    pub(crate) fn give_back_settled(&self, blocks: Vec<BlockNr>) {
        let n = blocks.len();
        let eff = Effects {
            released: blocks,
            mapped_delta: 0,
        };
        if let Err(e) = self.finish(eff) {
            crate::logging::warn(&format!(
                "{n} references held for a failed log append not given back: {e}"
            ));
        }
    }

    /// References the engine counts that no block map holds: releases waiting for a sync
    /// (block files) and references held for failed appends (checks count them in).
    pub fn unmapped_refs(&self) -> Vec<BlockNr> {
        self.unmapped_refs_of(&self.log.lock())
    }

    /// [`FileSystem::unmapped_refs`] with `log` held.
    pub(crate) fn unmapped_refs_of(&self, log: &LogWriter) -> Vec<BlockNr> {
        let mut v = log.held().to_vec();
        v.extend(self.pending.lock().iter().copied());
        v
    }

    /// Give references back to the engine once the record that dropped them is durable.
    pub(crate) fn finish(&self, eff: Effects) -> Result<()> {
        if eff.mapped_delta >= 0 {
            self.mapped
                .fetch_add(eff.mapped_delta as u64, Ordering::Relaxed);
        } else {
            self.mapped
                .fetch_sub(eff.mapped_delta.unsigned_abs(), Ordering::Relaxed);
        }
        if eff.released.is_empty() {
            return Ok(());
        }
        if self.durable {
            self.engine.release_batch(&eff.released)?;
        } else {
            let n = {
                let mut p = self.pending.lock();
                p.extend(eff.released);
                p.len()
            };
            if n > PENDING_LIMIT {
                self.sync()?;
            }
        }
        Ok(())
    }

    /// The inode `ino` (ENOENT when there is none).
    pub(crate) fn node(&self, ino: u64) -> Result<InodeRef> {
        self.tables
            .read()
            .get(ino)
            .ok_or(FsError::Errno(libc::ENOENT))
    }

    /// A namespace operation: one record built from the tables, appended, applied. `grows`:
    /// it adds an inode (see [`FileSystem::ensure_space`]).
    pub(crate) fn meta_op<R>(
        &self,
        grows: bool,
        build: impl FnOnce(&Tables) -> Result<(Record, R)>,
    ) -> Result<R> {
        self.ensure_space(0, grows, NS_RECORD)?;
        let _g = self.gate.read();
        let mut t = self.tables.write();
        let (rec, r) = build(&t)?;
        check::namespace(&t, &rec)?;
        self.append(&rec)?;
        let eff = t.apply(&rec)?;
        drop(t);
        self.finish(eff)?;
        Ok(r)
    }

    /// A change of one inode appending at most `log_bytes` to the log.
    pub(crate) fn inode_op<R>(
        &self,
        ino: u64,
        log_bytes: usize,
        build: impl FnOnce(&Inode) -> Result<(Option<Record>, R)>,
    ) -> Result<R> {
        self.ensure_space(0, false, log_bytes)?;
        let _g = self.gate.read();
        let node = self.node(ino)?;
        // A directory's change is ordered with the namespace operations in it, which hold the
        // tables lock from building their record to applying it: a create must be applied in
        // log order with a change of its parent's default ACL, or replay would disagree with
        // what ran. (Lock order as in meta_op: tables, then the inode.)
        let _t = (node.read().attr.kind == Kind::Dir).then(|| self.tables.read());
        let mut n = node.write();
        let (rec, r) = build(&n)?;
        if let Some(rec) = rec {
            self.append_for(&n, &rec)?;
            let eff = apply_inode(&mut n, &rec, &self.persist)?;
            drop(n);
            self.finish(eff)?;
        }
        Ok(r)
    }

    /// Store `blocks` through the engine (deduplicated); one physical block each, in order,
    /// and the blocks stored as new data that the policy wants an out-of-line worker to look
    /// at (every caller that maps them into a file must queue them, or the worker would keep
    /// the fingerprint of the file block's old content).
    /// `waited`: a writer waits for this call, so it may be split across threads.
    pub(crate) fn engine_write_misses(
        &self,
        blocks: &[&[u8]],
        waited: bool,
    ) -> Result<(Vec<BlockNr>, Vec<nodup_core::engine::Miss>)> {
        let mut ctx = self.ctxs.lock().pop().unwrap_or_default();
        ctx.may_split = waited;
        let r = self.engine.write(&mut ctx, blocks);
        let misses = std::mem::take(&mut ctx.misses);
        self.ctxs.lock().push(ctx);
        Ok((r?, misses))
    }

    // ---------------------------------------------------------------- accessors and repair

    /// Bytes free for file data (what writes may still allocate), cheap enough for every write.
    pub fn free_data_bytes(&self) -> u64 {
        let free = self.engine.allocator().free_blocks();
        free.saturating_sub(LOG_HEADROOM) * BS
    }

    /// How the image was found at open.
    pub fn recovery(&self) -> &RecoveryInfo {
        &self.recovery
    }

    /// The medium kind recorded at mkfs.
    pub fn medium_kind(&self) -> MediumKind {
        self.kind
    }

    /// True when writes are durable on return (Pmem).
    pub fn durable_on_return(&self) -> bool {
        self.durable
    }

    /// The engine (fsck, tests).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Run `f` over the inode table under the checkpoint gate (fsck, tests).
    pub fn with_tables<R>(&self, f: impl FnOnce(&Tables) -> R) -> R {
        let _g = self.gate.write();
        f(&self.tables.read())
    }

    /// Metadata blocks the file system holds (checkpoint, log, spare, reserve).
    pub fn meta_blocks(&self) -> Vec<BlockNr> {
        let meta = self.meta.lock();
        let log = self.log.lock();
        self.meta_blocks_of(&meta, &log)
    }

    /// [`FileSystem::meta_blocks`] with `meta` and `log` held.
    pub(crate) fn meta_blocks_of(&self, meta: &MetaState, log: &LogWriter) -> Vec<BlockNr> {
        let mut v = meta.manifest.clone();
        v.extend_from_slice(&meta.legacy);
        for s in self.persist.segs.lock().values() {
            v.extend_from_slice(&s.blocks);
        }
        v.extend_from_slice(log.blocks());
        v.extend_from_slice(&log.spare);
        v.extend_from_slice(&meta.reserve);
        v
    }

    /// Client-area block where the superblock pair lives.
    pub fn client_area(&self) -> BlockNr {
        self.area
    }

    /// Total mapped file blocks (logical size / 4096).
    pub fn mapped_blocks(&self) -> u64 {
        self.mapped.load(Ordering::Relaxed)
    }

    /// Replace the inode table wholesale and checkpoint it (fsck --repair).
    pub fn replace_tables(&self, t: Tables) -> Result<()> {
        {
            let _g = self.gate.write();
            let mapped = t.mapped_blocks();
            let mut t = t;
            // Everything is written anew; every segment of the old checkpoint becomes garbage.
            t.persist = self.persist.clone();
            self.persist.take_queue();
            for s in self.persist.segs.lock().values_mut() {
                s.live = 0;
            }
            for n in t.inodes.values() {
                t.persist.touch_all(&mut n.write());
            }
            *self.tables.write() = t;
            self.mapped.store(mapped, Ordering::Relaxed);
        }
        self.checkpoint(false)
    }
}

impl Drop for FileSystem {
    fn drop(&mut self) {
        // Write contexts belong to this engine instance; drop them before it.
        self.ctxs.get_mut().clear();
        // Records held back go to the medium (after a fence for the data they name), as every
        // record did at its append before session 47: a file system dropped without a clean
        // unmount (one that failed, or a library caller's) leaves its log as complete as it
        // was live, for the next mount's failure recovery. Best effort: an error here leaves
        // the image as a crash before the last sync would.
        let log = self.log.get_mut();
        if log.holds_records() {
            let _ = log.write_out(&*self.medium, true);
        }
    }
}
