//! `nodup replay` and `nodup trace stats|gen|convert`.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// Arguments of `nodup replay`.
#[derive(Args)]
pub struct ReplayArgs {
    pub trace: PathBuf,
    #[arg(long)]
    pub dir: PathBuf,
}
/// `nodup trace ...`.
#[derive(Subcommand)]
pub enum TraceCommand {
    /// Trace statistics.
    Stats { trace: PathBuf },
}

pub fn replay(_a: ReplayArgs) -> Result<()> {
    bail!("replay: not implemented yet")
}
pub fn trace(_c: TraceCommand) -> Result<()> {
    bail!("trace: not implemented yet")
}
