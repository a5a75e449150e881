//! The engine: image geometry, the inline-dedup write path, release, and recovery.
//!
//! This file is the contract between nodup-core and its callers (nodup-fs, trace replay, benches).
//!
//! Image ownership: the engine formats the whole medium. Block 0 is the engine superblock.
//! Blocks `[client_area_start, client_area_start + client_area_blocks)` are reserved for the
//! caller (the file system keeps its own superblock / checkpoint pointers there) and are never
//! touched by the engine. Every other block is managed by the engine's allocator: data blocks
//! (through [`Engine::write`]) and caller metadata blocks (through [`Engine::alloc_meta`]).
//!
//! Persistence contract of [`Engine::write`]: when it returns, every returned block's data is
//! durable and, for dedup blocks, its metadata entry (with the incremented reference count) is
//! durable too; with [`OpenOptions::fenced_by_caller`] all of it is durable only after the
//! caller's next fence (see that option). Each returned block carries one reference owned by the caller: the caller
//! commits it into its own metadata (e.g. a file's block map) or gives it back with
//! [`Engine::release`]. The caller is the source of truth after a crash: failure recovery
//! ([`Engine::recover`]) rebuilds reference counts and the allocator from the references the
//! caller reports.

pub mod audit;
mod ctx;
mod give_back;
mod host_space;
mod locks;
mod media;
mod options;
mod outofline;
mod read_cache;
pub mod recovery;
mod release;
pub mod remap;
mod share;
pub mod superblock;
pub(crate) mod write;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::alloc::Allocator;
use crate::fingerprint::{fingerprinter, Fingerprinter, FpKind};
use crate::index::FpIndex;
use crate::media::{AccessMeter, Medium};
use crate::meta::io::{IoTally, MetaIo};
use crate::meta::revmap::RevMap;
use crate::meta::{make_layout, LayoutGeometry, MetaLayout, MetaLayoutKind};
use crate::policy::{make_policy, Policy, PolicyKind, PrefetchMode};
use crate::store::{StoreHandle, StoreIo, StoreParams};
use crate::{BlockNr, EngineStats, Error, Result, BLOCK_SIZE};
use locks::EntryLocks;
use superblock::{PolicyParams, Superblock};

pub use ctx::{Miss, WriteCtx};
use media::meta_medium;
pub use media::Media;
pub use options::{FormatOptions, KeyFile, OpenOptions, OpenState, RecoveryReport};
pub use outofline::Adopted;
pub use write::SplitOptions;

/// Engine-wide counters (merged once per call from each writer's tally).
#[derive(Debug, Default)]
struct Counters {
    blocks_written: AtomicU64,
    dedup_hits: AtomicU64,
    fp_collisions: AtomicU64,
    media_written: AtomicU64,
    media_read: AtomicU64,
    meta_written: AtomicU64,
    meta_read: AtomicU64,
    hint_hits: AtomicU64,
    hint_misses: AtomicU64,
    /// Media errors worked around without failing the operation.
    media_errors_absorbed: AtomicU64,
    /// References added by [`Engine::share`] (server-side copies).
    blocks_shared: AtomicU64,
    /// Data blocks in use (distinct, whatever their reference count).
    physical_blocks: AtomicU64,
}

/// What the write path asks the policy once per open rather than per block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PolicyFlags {
    /// [`Policy::stages`].
    pub(crate) stages: bool,
    /// [`Policy::samples_inline`].
    pub(crate) samples: bool,
    /// [`Policy::reports_misses`].
    pub(crate) reports_misses: bool,
    /// [`Policy::min_dup_run`].
    pub(crate) min_run: usize,
}

/// Life cycle of an open engine.
const STATE_NEEDS_RECOVERY: u8 = 0;
const STATE_READY: u8 = 1;
const STATE_SHUT: u8 = 2;
/// Opened read-only ([`OpenOptions::read_only`]): reads only, until [`Engine::begin_use`].
const STATE_READ_ONLY: u8 = 3;

/// Source of writer ids (never 0).
static NEXT_CTX_ID: AtomicU64 = AtomicU64::new(1);

/// The inline-dedup engine over one medium.
pub struct Engine {
    /// The data medium (see [`Media`]).
    pub(crate) medium: Arc<dyn Medium>,
    /// The metadata medium, unmetered (superblock, caller's metadata).
    meta_medium: Arc<dyn Medium>,
    pub(crate) meta: MetaIo,
    /// The access meter metadata I/O goes through, when `OpenOptions::meter_granularity` is set.
    meter: Option<Arc<AccessMeter>>,
    sb: Mutex<Superblock>,
    geo: Superblock,
    policy: Box<dyn Policy>,
    /// The policy's answers that do not change while open, read on the hot path without a
    /// virtual call.
    pub(crate) flags: PolicyFlags,
    fpr: Box<dyn Fingerprinter>,
    pub(crate) prefetch: PrefetchMode,
    pub(crate) transition: usize,
    /// The medium lets the engine store into it directly ([`Medium::fill_with`]): new blocks
    /// are fingerprinted while they are copied.
    fused: bool,
    /// Data and metadata media make a system call per store ([`Medium::gathers`]: a plain
    /// block file): the write path gathers its stores.
    pub(crate) gathers: bool,
    alloc: Arc<Allocator>,
    /// The dedup-aware read cache, when the policy keeps one.
    read_cache: Option<read_cache::ReadCache>,
    /// The policy's fingerprint store.
    pub(crate) store: StoreHandle,
    /// The entry locks and in-flight entries (`locks.rs`).
    pub(crate) locks: EntryLocks,
    pub(crate) layout: Box<dyn MetaLayout>,
    revmap: RevMap,
    state: AtomicU8,
    /// Writers currently inside the write path (transition threshold).
    pub(crate) active: AtomicUsize,
    /// Writers waiting for another call's pending entry (the hash lock, `write/join.rs`).
    join: write::JoinWait,
    next_pool: AtomicUsize,
    /// How large calls are split across threads (`write/split.rs`).
    split: write::SplitOptions,
    /// Writer contexts of the parts a split call hands to other threads.
    split_ctxs: Mutex<Vec<WriteCtx>>,
    /// A write call leaves its data and entry stores to the caller's next fence
    /// (`OpenOptions::fenced_by_caller`).
    fenced_by_caller: bool,
    /// With `fenced_by_caller`: a write call stored new data since the caller last took this
    /// ([`Engine::take_unfenced_data`]).
    unfenced_data: AtomicBool,
    c: Counters,
    /// Serialises shutdown / recovery against each other.
    admin: Mutex<()>,
    /// What the normal recovery at open did (reload of the save area), when it ran.
    open_report: Mutex<Option<RecoveryReport>>,
    /// What the clean shutdown gave back to the medium's holder: blocks, or why it stopped.
    given_back: Mutex<Option<std::result::Result<u64, String>>>,
    /// The save area's space is taken where the image lives (`host_space.rs`).
    save_reserved: AtomicBool,
    /// Free blocks whose space a clean shutdown takes for the next open (`host_space.rs`).
    keep_for_next: AtomicU64,
}

impl Engine {
    fn build(media: Media, sb: Superblock, open: &OpenOptions) -> Result<Engine> {
        media.check()?;
        let Media {
            data: medium, meta, ..
        } = media;
        let policy = make_policy(sb.policy, &open.policy)?;
        let alloc = Arc::new(Allocator::new(sb.data_start, sb.data_blocks));
        let store = match policy.make_store(&StoreParams {
            medium_len: medium.len(),
            mem_budget: open.mem_budget.unwrap_or(sb.params.mem_budget),
            io: Some(StoreIo {
                medium: meta.clone(),
                alloc: alloc.clone(),
            }),
        })? {
            Some(s) => StoreHandle::Own(s),
            None => StoreHandle::Complete(FpIndex::new(medium.len())),
        };
        let read_cache = match policy.read_cache_bytes() {
            0 => None,
            n => Some(read_cache::ReadCache::new(n)?),
        };
        let fpr = fingerprinter(sb.fingerprint);
        let geo = LayoutGeometry {
            start_block: sb.layout_start,
            blocks: sb.layout_blocks,
            slots: sb.layout_slots,
            nblocks: sb.total_blocks,
            data_start: sb.data_start,
        };
        let (metered, meter) = meta_medium(&meta, open.meter_granularity)?;
        let gathers = medium.gathers() && meta.gathers();
        Ok(Engine {
            meta: MetaIo::new(metered, meter.is_some()),
            meta_medium: meta,
            meter,
            prefetch: policy.prefetch(open.prefetch),
            transition: open.transition_threshold.max(1),
            fused: medium.fill_with(0, 0, &mut |_| {}).unwrap_or(false),
            gathers,
            alloc,
            read_cache,
            store,
            locks: EntryLocks::default(),
            layout: make_layout(sb.meta_layout, geo),
            revmap: RevMap {
                start: sb.revmap_start * BLOCK_SIZE as u64,
                nblocks: sb.total_blocks,
            },
            sb: Mutex::new(sb),
            geo: sb,
            flags: PolicyFlags {
                stages: policy.stages(),
                samples: policy.samples_inline(),
                reports_misses: policy.reports_misses(),
                min_run: policy.min_dup_run(),
            },
            policy,
            fpr,
            medium,
            state: AtomicU8::new(STATE_NEEDS_RECOVERY),
            active: AtomicUsize::new(0),
            join: write::JoinWait::default(),
            next_pool: AtomicUsize::new(0),
            split: open.write_split,
            split_ctxs: Mutex::new(Vec::new()),
            fenced_by_caller: open.fenced_by_caller,
            unfenced_data: AtomicBool::new(false),
            c: Counters::default(),
            admin: Mutex::new(()),
            open_report: Mutex::new(None),
            given_back: Mutex::new(None),
            save_reserved: AtomicBool::new(false),
            keep_for_next: AtomicU64::new(0),
        })
    }

    /// With [`OpenOptions::fenced_by_caller`]: whether a write call has stored new data since
    /// the last call of this, which the caller must fence before anything durable of its own
    /// names it; taking it clears it. A caller whose fence then fails gives it back
    /// ([`Engine::note_unfenced_data`]). Always false without the option.
    pub fn take_unfenced_data(&self) -> bool {
        self.unfenced_data.swap(false, Ordering::SeqCst)
    }

    /// Set again what [`Engine::take_unfenced_data`] took, when the fence it asked for failed.
    pub fn note_unfenced_data(&self) {
        if self.fenced_by_caller {
            self.unfenced_data.store(true, Ordering::SeqCst);
        }
    }

    /// Format `medium` as a fresh nodup image.
    pub fn format(
        medium: Arc<dyn Medium>,
        opts: &FormatOptions,
        open: &OpenOptions,
    ) -> Result<Engine> {
        Engine::format_media(Media::single(medium), opts, open)
    }

    /// Format with separate data and metadata handles (see [`Media`]).
    pub fn format_media(media: Media, opts: &FormatOptions, open: &OpenOptions) -> Result<Engine> {
        media.check()?;
        let medium = &media.meta;
        let policy = make_policy(opts.policy, &open.policy)?;
        let fp = policy.fingerprint_for(opts.fingerprint);
        let layout_kind = opts.meta_layout;
        let mut params = PolicyParams {
            mem_budget: opts.mem_budget,
            ..PolicyParams::default()
        };
        let mut keys = None;
        if let Some(kf) = &opts.encrypt {
            if opts.client_area_blocks < 2 {
                // The first two client blocks stay in the clear (the caller's superblocks).
                return Err(Error::Invalid(
                    "an encrypted image needs a client area of at least 2 blocks".into(),
                ));
            }
            let kdf = crate::media::crypt::KdfParams::for_key_file(&kf.0);
            let salt: [u8; 16] = rand::random();
            let master = crate::media::crypt::master_key(&kf.0, &salt, &kdf)?;
            params.cipher = superblock::CIPHER_AES256;
            params.kdf = Some(kdf);
            params.salt = salt;
            params.key_check = crate::media::crypt::ImageKeys::check_value(&master, &salt);
            keys = Some(crate::media::crypt::ImageKeys::derive(&master, &salt));
        }
        let mut sb = Superblock::plan(
            medium.len(),
            opts.client_area_blocks,
            opts.policy,
            fp,
            layout_kind,
            params,
            |total, slots| state_words(layout_kind, total, slots),
        )?;
        let media = match keys {
            Some(k) => Media::encrypted(media, k, sb.client_start),
            None => media,
        };
        let medium = &media.meta;
        // Invalidate any previous superblock first, so a half-formatted image is never opened.
        medium.write(0, &[0u8; superblock::SB_SIZE])?;
        medium.flush(0, superblock::SB_SIZE as u64);
        medium.fence()?;
        let e = Engine::build(media, sb, open)?;
        let mut t = IoTally::default();
        e.zero_blocks(&mut t, sb.revmap_start, sb.revmap_blocks)?;
        e.zero_blocks(&mut t, sb.save_start, 1)?;
        e.layout.format(&e.meta, &mut t)?;
        e.merge_tally(&t);
        sb.store(&*e.meta_medium)?;
        e.set_state(STATE_READY);
        // A full disk is not a failed format: the caller may try again (and the unmount
        // writes the area anyway, if it can).
        let _ = e.reserve_save_area();
        Ok(e)
    }

    /// Open an existing image, validating the superblock. Performs normal recovery when clean.
    pub fn open(medium: Arc<dyn Medium>, opts: &OpenOptions) -> Result<(Engine, OpenState)> {
        Engine::open_media(Media::unlock(medium, opts.key.as_ref())?, opts)
    }

    /// Open with separate data and metadata handles (see [`Media`]).
    pub fn open_media(media: Media, opts: &OpenOptions) -> Result<(Engine, OpenState)> {
        media.check()?;
        let sb = Superblock::load(&*media.meta)?;
        if (sb.params.cipher != superblock::CIPHER_NONE) != media.encrypted {
            return Err(Error::Invalid(
                "the image's encryption and the media opened for it disagree (use Media::unlock)"
                    .into(),
            ));
        }
        let kind = sb.meta_layout;
        let expected = Superblock::plan(
            sb.total_blocks * BLOCK_SIZE as u64,
            sb.client_blocks,
            sb.policy,
            sb.fingerprint,
            kind,
            sb.params,
            |total, slots| state_words(kind, total, slots),
        )
        .map_err(|_| Error::Corrupt("engine superblock geometry is inconsistent".into()))?;
        sb.check_geometry(&expected)?;
        let e = Engine::build(media, sb, opts)?;
        let mut t = IoTally::default();
        e.layout.attach(&e.meta, &mut t)?;
        e.merge_tally(&t);
        if !sb.clean {
            return Ok((e, OpenState::NeedsRecovery));
        }
        let t0 = std::time::Instant::now();
        e.load_saved()?;
        *e.open_report.lock() = Some(RecoveryReport {
            seconds: t0.elapsed().as_secs_f64(),
            entries_scanned: e.store.dyn_store().len(),
            referenced_blocks: e.c.physical_blocks.load(Ordering::Relaxed),
            ..Default::default()
        });
        e.set_state(STATE_READ_ONLY);
        if !opts.read_only {
            e.begin_use()?;
        }
        Ok((e, OpenState::Clean))
    }

    /// Start writing to an image opened read-only and found clean: mark it in use (dirty until
    /// the next clean shutdown). An image that needs recovery stays so until [`Engine::recover`].
    pub fn begin_use(&self) -> Result<()> {
        let _g = self.admin.lock();
        if self.state.load(Ordering::Acquire) != STATE_READ_ONLY {
            return Ok(());
        }
        let mut s = self.sb.lock();
        if s.clean {
            s.clean = false;
            s.store(&*self.meta_medium)?;
        }
        drop(s);
        // Only once the image is marked in use: what the store rewrites may land on blocks
        // the saved state still names (a rebucketing pass reuses each old group's blocks), so
        // an interruption must lead to failure recovery, which rebuilds the store.
        self.store.dyn_store().begin_writes();
        self.set_state(STATE_READY);
        let _ = self.reserve_save_area();
        Ok(())
    }

    /// Write path: for each 4 KiB block in `blocks`, return the physical block it now maps to
    /// (an existing duplicate or a newly written block), each with one reference for the caller.
    pub fn write(&self, ctx: &mut WriteCtx, blocks: &[&[u8]]) -> Result<Vec<BlockNr>> {
        self.write_maybe_split(ctx, blocks)
    }

    /// Read one data block.
    pub fn read(&self, block: BlockNr, buf: &mut [u8]) -> Result<()> {
        if buf.len() != BLOCK_SIZE {
            return Err(Error::Invalid(format!(
                "read buffer of {} bytes",
                buf.len()
            )));
        }
        if !self.in_data(block) {
            return Err(Error::Invalid(format!(
                "block {block} is not in the data area"
            )));
        }
        if let Some(rc) = &self.read_cache {
            if rc.get(block, buf) {
                return Ok(());
            }
        }
        self.c
            .media_read
            .fetch_add(BLOCK_SIZE as u64, Ordering::Relaxed);
        self.medium.read(block * BLOCK_SIZE as u64, buf)?;
        if let Some(rc) = &self.read_cache {
            rc.put(block, buf);
        }
        Ok(())
    }

    /// Drop one reference to a data block (overwrite, truncate, punch, unlink); frees it at zero.
    pub fn release(&self, block: BlockNr) -> Result<()> {
        self.check_ready()?;
        self.release_blocks(std::slice::from_ref(&block))
    }

    /// Drop one reference to each of `blocks` (a block may appear as often as references are
    /// dropped) with a single fence: the batch form of [`Engine::release`] for truncate and
    /// unlink. On an error, the blocks before the failing one were released.
    pub fn release_batch(&self, blocks: &[BlockNr]) -> Result<()> {
        self.check_ready()?;
        self.release_blocks(blocks)
    }

    /// First block and length (in blocks) of the caller's reserved area.
    pub fn client_area(&self) -> (BlockNr, u64) {
        (self.geo.client_start, self.geo.client_blocks)
    }

    /// The metadata medium, for the caller's own metadata I/O in its blocks.
    // The caller's medium is the metadata one; `medium` is the engine's data handle.
    #[allow(clippy::misnamed_getters)]
    pub fn medium(&self) -> &Arc<dyn Medium> {
        &self.meta_medium
    }

    /// The data medium (where data blocks are written and read).
    pub fn data_medium(&self) -> &Arc<dyn Medium> {
        &self.medium
    }

    /// First block and length of the save area (what a clean shutdown saves for the next open;
    /// tests and fuzzers aim at it).
    pub fn save_area(&self) -> (BlockNr, u64) {
        (self.geo.save_start, self.geo.save_blocks)
    }

    /// First block and length of the data area (where data and caller metadata blocks live).
    pub fn data_area(&self) -> (BlockNr, u64) {
        (self.geo.data_start, self.geo.data_blocks)
    }

    /// The policy recorded at format time.
    pub fn policy_kind(&self) -> PolicyKind {
        self.geo.policy
    }

    /// The policy object in force.
    pub fn policy(&self) -> &dyn Policy {
        &*self.policy
    }

    /// The policy's, its store's and the read cache's own figures (`null` parts when absent).
    pub fn policy_report(&self) -> serde_json::Value {
        serde_json::json!({
            "policy": self.policy.report(),
            "store": self.store.dyn_store().report(),
            "read_cache": self.read_cache.as_ref().map(|rc| rc.report()),
        })
    }

    /// The fingerprint function in use.
    pub fn fingerprint_kind(&self) -> FpKind {
        self.geo.fingerprint
    }

    /// The metadata layout recorded at format time.
    pub fn meta_layout(&self) -> MetaLayoutKind {
        self.geo.meta_layout
    }

    /// The policy parameters recorded at format time (defaults for a version-1 image).
    pub fn policy_params(&self) -> PolicyParams {
        self.geo.params
    }

    /// The prefetch variant in effect (the policy may override the one asked for).
    pub fn prefetch_mode(&self) -> PrefetchMode {
        self.prefetch
    }

    /// The access meter of metadata I/O, when one was asked for at open (benches drain and
    /// reset it between phases).
    pub fn meter(&self) -> Option<&Arc<AccessMeter>> {
        self.meter.as_ref()
    }

    /// The block allocator (aging helpers in tests and benches).
    pub fn allocator(&self) -> &Allocator {
        &self.alloc
    }

    /// Fingerprint of `data` with the image's function.
    pub fn fingerprint(&self, data: &[u8]) -> u64 {
        self.fpr.fingerprint(data)
    }

    /// Current counters.
    pub fn stats(&self) -> EngineStats {
        let c = &self.c;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (mr, mw) = match &self.meter {
            Some(m) => {
                let k = m.counters();
                (k.media_read_bytes, k.media_write_bytes)
            }
            None => (ld(&c.meta_read), ld(&c.meta_written)),
        };
        EngineStats {
            policy: self.geo.policy.name().to_string(),
            fingerprint: self.geo.fingerprint.name().to_string(),
            meta_layout: self.geo.meta_layout.name().to_string(),
            block_size: BLOCK_SIZE as u64,
            physical_bytes: ld(&c.physical_blocks) * BLOCK_SIZE as u64,
            blocks_written: ld(&c.blocks_written),
            dedup_hits: ld(&c.dedup_hits),
            fp_collisions: ld(&c.fp_collisions),
            media_bytes_written: ld(&c.media_written),
            media_bytes_read: ld(&c.media_read),
            meta_bytes_written: mw,
            meta_bytes_read: mr,
            index_entries: self.store.dyn_store().len(),
            index_memory_bytes: self.store.dyn_store().memory_bytes() + self.locks.memory_bytes(),
            read_cache_hits: self.read_cache.as_ref().map_or(0, |rc| rc.hits()),
            total_blocks: self.geo.data_blocks,
            free_blocks: self.alloc.free_blocks(),
            hint_hits: ld(&c.hint_hits),
            hint_misses: ld(&c.hint_misses),
            media_errors_absorbed: ld(&c.media_errors_absorbed),
            blocks_shared: ld(&c.blocks_shared),
        }
    }

    /// Failure recovery: `data_refs` yields every data block the caller references (once per
    /// reference), `meta_blocks` every block the caller holds from `alloc_meta`. Rebuilds
    /// reference counts, invalidates entries nobody references, rebuilds index, region queue
    /// and allocator, and gives every block referenced more than once an entry holding its
    /// count (recreating missing ones; when no slot is left, entries of singly referenced blocks
    /// are given up first; `Error::NoSpace` when none can be made).
    pub fn recover(
        &self,
        data_refs: &mut dyn Iterator<Item = BlockNr>,
        meta_blocks: &mut dyn Iterator<Item = BlockNr>,
    ) -> Result<RecoveryReport> {
        self.failure_recovery(data_refs, meta_blocks)
    }

    /// Report of the normal recovery done by [`Engine::open`] on a clean image (time to reload
    /// index, counters and allocator; `entries_scanned` = index entries reloaded).
    pub fn open_report(&self) -> Option<RecoveryReport> {
        self.open_report.lock().clone()
    }

    /// Clean shutdown: persist index, valid-entry counters and allocator, set the clean flag.
    pub fn shutdown(&self) -> Result<()> {
        self.save_and_close()
    }

    // ---- internal helpers shared by the submodules ----

    fn set_state(&self, s: u8) {
        self.state.store(s, Ordering::Release);
    }

    /// Whether the engine takes operations; the error says why not (it gave up its live state
    /// after a store it could not undo and needs failure recovery, or it is read-only or shut
    /// down). Not only a query: a metadata layout whose structure on the medium may no longer
    /// match its live state ([`MetaLayout::unsettled`]) moves a ready engine to needing
    /// recovery here.
    ///
    /// [`MetaLayout::unsettled`]: crate::meta::MetaLayout::unsettled
    pub fn check_ready(&self) -> Result<()> {
        match self.state.load(Ordering::Acquire) {
            STATE_READY if self.layout.unsettled() => {
                // Only from ready: a state another thread set meanwhile (shut down, read-only)
                // stays. At worst a recovery ending just now is asked for again: the safe way.
                self.give_up_live_state();
                Err(Error::NeedsRecovery)
            }
            STATE_READY => Ok(()),
            STATE_NEEDS_RECOVERY => Err(Error::NeedsRecovery),
            STATE_READ_ONLY => Err(Error::Invalid("the engine was opened read-only".into())),
            _ => Err(Error::Invalid("the engine was shut down".into())),
        }
    }

    /// Give up the live state, when ready (a state another thread set stays): what
    /// [`Engine::check_ready`] does for an unsettled layout, and what tests and the torture
    /// campaigns use to ask for failure recovery at any moment, beside running operations.
    #[doc(hidden)]
    pub fn give_up_live_state(&self) {
        let _ = self.state.compare_exchange(
            STATE_READY,
            STATE_NEEDS_RECOVERY,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// True when `b` is a block of the data area.
    #[inline]
    pub(crate) fn in_data(&self, b: BlockNr) -> bool {
        b >= self.geo.data_start && b < self.geo.total_blocks
    }

    fn zero_blocks(&self, t: &mut IoTally, start: u64, n: u64) -> Result<()> {
        if self
            .meta_medium
            .known_zero(start * BLOCK_SIZE as u64, n * BLOCK_SIZE as u64)
        {
            return Ok(());
        }
        let zero = vec![0u8; BLOCK_SIZE];
        let mut got = vec![0u8; BLOCK_SIZE];
        let mapped = self.meta_medium.direct(0, 0).is_some();
        for b in start..start + n {
            let off = b * BLOCK_SIZE as u64;
            // Looked at in place where the medium lends a view, else read (a mapped image
            // lends none of a block that may be a hole, which reads as zeros): a block of
            // zeros is not written again (nor given a page where it is a hole).
            let zeros = match self.meta_medium.direct(off, BLOCK_SIZE) {
                Some(s) => s.iter().all(|&x| x == 0),
                None if mapped => {
                    self.meta_medium.read(off, &mut got)?;
                    got.iter().all(|&x| x == 0)
                }
                None => false,
            };
            if !zeros {
                self.meta.write(t, off, &zero)?;
            }
        }
        self.meta
            .flush(start * BLOCK_SIZE as u64, n * BLOCK_SIZE as u64);
        self.meta.fence()
    }

    /// Store the reference count `new` at `off` (not flushed). A failed (possibly partial)
    /// store puts `old` back, or gives up on the live state if even that fails.
    #[inline]
    pub(crate) fn store_count(&self, t: &mut IoTally, off: u64, old: u64, new: u64) -> Result<()> {
        if let Err(e) = self.meta.write_u64(t, off, new) {
            if self.meta.write_u64(t, off, old).is_err() {
                self.set_state(STATE_NEEDS_RECOVERY);
            }
            return Err(e);
        }
        Ok(())
    }

    fn merge_tally(&self, t: &IoTally) {
        let c = &self.c;
        add_nonzero(&c.meta_read, t.meta_read);
        add_nonzero(&c.meta_written, t.meta_written);
        add_nonzero(&c.media_read, t.data_read);
        add_nonzero(&c.media_written, t.data_written);
        add_nonzero(&c.media_errors_absorbed, t.errors_absorbed);
    }

    /// Give a fresh writer context its id and pools.
    fn bind(&self, ctx: &mut WriteCtx) {
        if ctx.id == 0 {
            ctx.id = NEXT_CTX_ID.fetch_add(1, Ordering::Relaxed);
            let p = self.next_pool.fetch_add(1, Ordering::Relaxed);
            ctx.pool = p;
            ctx.apool = p % self.alloc.npools();
        }
    }
}

/// Save-area words a layout may need, for sizing at format.
fn state_words(kind: MetaLayoutKind, total: u64, slots: u64) -> u64 {
    match kind {
        MetaLayoutKind::Region => total + 1,
        MetaLayoutKind::Entry => slots + 1,
        MetaLayoutKind::Hashtable => 0,
    }
}

/// Add `n` to a shared counter, skipping the atomic when there is nothing to add (most calls
/// leave most counters unchanged, and an untouched cache line stays shared between writers).
pub(super) fn add_nonzero(counter: &std::sync::atomic::AtomicU64, n: u64) {
    if n != 0 {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
