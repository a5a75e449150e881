//! `nodup mkfs|mount|umount|stats|fsck`: the file-system commands.

use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `nodup mkfs`.
#[derive(Args)]
pub struct MkfsArgs {
    pub image: PathBuf,
    #[arg(long)]
    pub size: String,
}
/// Arguments of `nodup mount`.
#[derive(Args)]
pub struct MountArgs {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
}
/// Arguments of `nodup umount`.
#[derive(Args)]
pub struct UmountArgs {
    pub mountpoint: PathBuf,
}
/// Arguments of `nodup stats`.
#[derive(Args)]
pub struct StatsArgs {
    pub target: PathBuf,
    #[arg(long)]
    pub json: bool,
}
/// Arguments of `nodup fsck`.
#[derive(Args)]
pub struct FsckArgs {
    pub image: PathBuf,
    #[arg(long)]
    pub repair: bool,
}

pub fn mkfs(_a: MkfsArgs) -> Result<()> {
    bail!("mkfs: not implemented yet")
}
pub fn mount(_a: MountArgs) -> Result<()> {
    bail!("mount: not implemented yet")
}
pub fn umount(_a: UmountArgs) -> Result<()> {
    bail!("umount: not implemented yet")
}
pub fn stats(_a: StatsArgs) -> Result<()> {
    bail!("stats: not implemented yet")
}
pub fn fsck(_a: FsckArgs) -> Result<()> {
    bail!("fsck: not implemented yet")
}
