//! nodup-trace: block traces (FIU formats and an own binary format), content synthesis, replay
//! against any directory, statistics (Light-Dedup Table 3 / Fig. 8) and a synthetic generator.

pub mod content;
pub mod error;
pub mod format;
pub mod gen;
pub mod model;
pub mod plot;
pub mod record;
pub mod replay;
pub mod stats;

pub use error::{Result, TraceError};
pub use format::{BadLinePolicy, Format, TraceReader};
pub use record::{DigestUnit, Op, Record};
