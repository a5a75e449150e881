//! Per-writer state carried between write calls ([`WriteCtx`]).

use crate::BlockNr;

use super::write;

/// A block a write call stored as new data rather than as a duplicate (listed for policies
/// with an out-of-line worker, see [`crate::policy::Policy::reports_misses`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Miss {
    /// Position of the block in the call's input.
    pub index: usize,
    /// Its fingerprint, when it was computed inline.
    pub fp: Option<u64>,
}

/// Per-writer state (one per thread or stream): stream trust degree, last entry, allocation pool.
/// Prefetch state never crosses calls to [`Engine::write`]; hint bookkeeping may.
#[derive(Debug)]
pub struct WriteCtx {
    /// Owner id of this writer's in-flight entries (0 = not bound yet).
    pub(super) id: u64,
    /// Writer pool: selects the current region.
    pub(super) pool: usize,
    /// Allocation pool cursor.
    pub(super) apool: usize,
    /// Light-Dedup's per-stream state (trust degree, previous entry, prefetch-next).
    pub(crate) light: crate::policy::light::Stream,
    /// Data blocks written by the current call (flushed together).
    pub(super) new_blocks: Vec<BlockNr>,
    /// New blocks of the current call still to be copied, with their input position.
    pub(super) copies: Vec<(BlockNr, usize)>,
    /// Entries created by the current call (persisted together after the data).
    pub(crate) created: Vec<write::Created>,
    /// Refcount fields changed by the current call (flushed together before the final fence).
    pub(super) touched: Vec<u64>,
    /// Compare buffer for media without a direct view.
    pub(crate) scratch: Vec<u8>,
    /// Blocks allocated ahead (in allocation order) while the stream writes new data, taken
    /// from the allocator in batches; given back at the end of a call.
    pub(super) ahead: std::collections::VecDeque<BlockNr>,
    /// Entry slots claimed ahead for this call's new blocks (returned at the end of the call).
    pub(super) slots: std::collections::VecDeque<u64>,
    /// Blocks of the current call not decided yet (bounds allocation batches).
    pub(super) blocks_left: usize,
    /// (stripe, entry) pairs to publish at the end of a call (kept to reuse its memory).
    pub(super) publish: Vec<(usize, u64)>,
    /// The previous block of the stream was new (not a duplicate).
    pub(super) last_new: bool,
    /// How often this stream's staged blocks turned out duplicates lately (see
    /// `write::STAGE_WASTE_OFF`): a copy made ahead of such a lookup is wasted media writes.
    pub(super) stage_waste: u32,
    /// Whether a block meeting another call's pending entry waits for it (see `write/join.rs`).
    pub(super) join: bool,
    /// Blocks of the current call waiting for another call's entry: (input position, fingerprint).
    pub(super) waiting: Vec<(usize, u64)>,
    /// Blocks the last call stored as new data (filled when the policy reports misses).
    pub misses: Vec<Miss>,
    /// The next calls may be split across threads (`OpenOptions::write_split`): true when a
    /// writer waits for them; a background flush, whose writer does not, clears it so it
    /// does not take a core the writer is using.
    pub may_split: bool,
}

impl Default for WriteCtx {
    fn default() -> Self {
        WriteCtx {
            id: 0,
            pool: 0,
            apool: 0,
            light: Default::default(),
            new_blocks: Vec::new(),
            copies: Vec::new(),
            created: Vec::new(),
            touched: Vec::new(),
            scratch: Vec::new(),
            ahead: std::collections::VecDeque::new(),
            slots: std::collections::VecDeque::new(),
            blocks_left: 0,
            publish: Vec::new(),
            last_new: true,
            stage_waste: 0,
            join: true,
            waiting: Vec::new(),
            misses: Vec::new(),
            may_split: true,
        }
    }
}
