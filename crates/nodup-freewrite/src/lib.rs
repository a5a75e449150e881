//! Freewrite (Liu et al., SYSTOR'17) for nodup: applications that rewrite files keep the data
//! they did not change block aligned by inserting small *bubbles*, so the block-level dedup of
//! a nodup mount recognises those blocks and does not write them again.
//!
//! - [`planner`]: where bubbles go, under the bubble cap and the global cap (§2);
//! - [`record`]: the record format, in which a bubble is a record with the reserved empty key;
//! - [`fawn`]: a FAWN-like log store whose garbage collection uses bubbles (§3.2);
//! - [`lsm`]: an LSM store whose compactions use bubbles on the level k+1 output (§3.1);
//! - [`workload`]: the key distributions and value sizes of §4.1;
//! - [`debubble`]: rewrite a bubbled file into the compact layout other tools read.

pub mod error;
pub mod planner;
pub mod record;

pub use error::{Error, Result};
pub use planner::{Caps, IslandSize, PlanStats};
pub mod bench;
pub mod debubble;
pub mod fawn;
mod fsutil;
pub mod logfile;
pub mod lsm;
pub mod workload;
