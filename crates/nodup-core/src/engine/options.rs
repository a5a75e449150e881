//! What callers choose at format and at open, and what they learn back from an open.

use crate::fingerprint::FpKind;
use crate::meta::MetaLayoutKind;
use crate::policy::{PolicyKind, PolicyOptions, PrefetchMode};

/// Options fixed at format (mkfs) time and recorded in the engine superblock.
///
/// `fingerprint` is what the user asked for; a policy may substitute its own: `strong` needs a
/// cryptographic function (anything else becomes sha256) and `weak-verify` turns the default
/// xxh3 into crc32c. The function actually used is recorded and reported in the stats.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    /// Dedup policy.
    pub policy: PolicyKind,
    /// Fingerprint function asked for (see above for the policy's substitutions).
    pub fingerprint: FpKind,
    /// On-media metadata layout.
    pub meta_layout: MetaLayoutKind,
    /// Memory budget for policies that have one (`smart`); 0 = unlimited.
    pub mem_budget: u64,
    /// Blocks reserved for the caller right after the engine superblock.
    pub client_area_blocks: u64,
    /// Encrypt the image at rest with this key file (`media::crypt`); None = plain. The first
    /// two blocks of the client area stay in the clear (for the caller's superblocks), so it
    /// must have at least 2.
    pub encrypt: Option<KeyFile>,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            policy: PolicyKind::Light,
            fingerprint: FpKind::Xxh3,
            meta_layout: MetaLayoutKind::Region,
            mem_budget: 0,
            client_area_blocks: 16,
            encrypt: None,
        }
    }
}

/// Options chosen per open (mount).
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Speculative-prefetch variant (`light` only; other policies do not prefetch).
    pub prefetch: PrefetchMode,
    /// Concurrent writers at which prefetch-next is switched off (Light-Dedup transition, default 6).
    pub transition_threshold: usize,
    /// Memory budget override for policies that have one; `None` keeps the formatted value.
    pub mem_budget: Option<u64>,
    /// Count metadata accesses at this granularity through the access meter (None = plain byte counts).
    pub meter_granularity: Option<usize>,
    /// Open without writing anything: the image stays byte-identical (stats, fsck without
    /// repair). Mutating calls fail until [`Engine::begin_use`].
    pub read_only: bool,
    /// Options of the policy in force (`smart`'s eviction, selectivity, run filter).
    pub policy: PolicyOptions,
    /// The key file of an encrypted image (refused for a plain one).
    pub key: Option<KeyFile>,
    /// How a large write call is split across threads (off by default: a library caller may
    /// already run one writer per core; `nodup mount --split-writes 0` turns it on).
    pub write_split: super::SplitOptions,
    /// A write call fences nothing: its new data, entries and reference counts become durable
    /// at the caller's next fence (on a block file, the two `fdatasync`s a call of new data
    /// took). Only for a caller that fences before anything durable of its own names the
    /// blocks (nodup-fs holds a block-file image's log records back until then), whose failure
    /// recovery rebuilds entries and counts from its own references (`failure_recovery`), on a
    /// medium whose crash states keep the stores to one sector in order: a file or block
    /// device, not persistent memory.
    pub fenced_by_caller: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            prefetch: PrefetchMode::Cbp,
            transition_threshold: 6,
            mem_budget: None,
            meter_granularity: None,
            read_only: false,
            policy: PolicyOptions::default(),
            key: None,
            write_split: super::SplitOptions::OFF,
            fenced_by_caller: false,
        }
    }
}

/// The bytes of a key file: 32 bytes are a raw key, anything else a passphrase
/// (`media::crypt::master_key`). Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyFile(pub Vec<u8>);

impl std::fmt::Debug for KeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyFile({} bytes)", self.0.len())
    }
}

/// How the image was found at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenState {
    /// The last shutdown was clean; the index and counters were reloaded (normal recovery).
    Clean,
    /// The image was not shut down cleanly: the caller must call [`Engine::recover`] before writing.
    NeedsRecovery,
}

/// What a recovery did, for logs and reports.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RecoveryReport {
    /// Wall time of the recovery.
    pub seconds: f64,
    /// Entry slots read (normal recovery: index entries reloaded).
    pub entries_scanned: u64,
    /// Entries cleared (nobody references their block, or they were malformed).
    pub entries_invalidated: u64,
    /// Entries whose reference count was rewritten.
    pub refcounts_fixed: u64,
    /// Distinct data blocks the caller references.
    pub referenced_blocks: u64,
    /// Blocks that had an entry but no reference, now free again.
    pub leaked_blocks_freed: u64,
    /// Entries recreated for blocks referenced more than once that had no valid entry (a shared
    /// block without an entry would be freed by its first release).
    pub entries_recreated: u64,
    /// Entries kept for their block's reference count but left out of the index (their
    /// fingerprint did not match the block, or another entry holds it).
    pub entries_unindexed: u64,
}
