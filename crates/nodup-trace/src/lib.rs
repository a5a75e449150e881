//! nodup-trace: block traces (FIU formats and an own binary format), content synthesis, replay
//! against any directory, statistics (Light-Dedup Table 3 / Fig. 8) and a synthetic generator.
//!
//! Commands built on it (crates/nodup-cli/src/cmd/trace.rs):
//! - `nodup trace stats TRACE [--format fiu|own] [--json] [--plot OUT.png]` — `stats`, `plot`;
//! - `nodup trace gen --size SIZE --dup-ratio R [--run-length DIST] [--read-ratio R] [--seed K]
//!   [--popularity uniform|zipf:S] [--phases N] -o TRACE` — `gen`, `popularity`;
//! - `nodup trace convert TRACE -o OUT [--to fiu|own]` — `format`;
//! - `nodup replay TRACE --dir DIR [--mode block|batch] [--threads N] [--no-reads] [--strict] [--json]` — `replay`.
//!
//! Data flow: `format` streams `record::Record`s (never the whole file); `model` keeps, per touched
//! 4 KiB block, the interned identity of each sector's content; `content` turns an identity into
//! bytes only at the moment a worker writes or verifies it.

pub mod content;
pub mod error;
pub mod format;
pub mod gen;
pub mod model;
pub mod output;
pub mod plot;
pub mod popularity;
pub mod record;
pub mod replay;
pub mod stats;

pub use error::{Result, TraceError};
pub use format::{BadLinePolicy, Format, TraceReader};
pub use record::{DigestUnit, Op, Record};
