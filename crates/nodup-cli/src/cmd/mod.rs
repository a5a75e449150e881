//! Subcommands, one module per area (each owned by the crate it drives).

pub mod bench;
pub mod fs;
pub mod trace;
