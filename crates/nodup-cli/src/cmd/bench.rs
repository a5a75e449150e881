//! `nodup bench engine|aging`: engine-only benchmarks (no FUSE).

use anyhow::{bail, Result};
use clap::Subcommand;

/// `nodup bench ...`.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Policies x duplication x prefetch variants.
    Engine,
    /// Metadata I/O per block, fresh and aged, per layout.
    Aging,
}

pub fn bench(_c: BenchCommand) -> Result<()> {
    bail!("bench: not implemented yet")
}
