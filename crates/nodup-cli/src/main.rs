//! The `nodup` command: a thin edge over the library crates. Each subcommand lives in `cmd/`.

mod cmd;

use clap::{Parser, Subcommand};

/// nodup: an inline-deduplicating storage engine and file system for fast media.
#[derive(Parser)]
#[command(name = "nodup", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a nodup image.
    Mkfs(cmd::fs::MkfsArgs),
    /// Mount an image through FUSE (daemonizes unless --foreground).
    Mount(cmd::fs::MountArgs),
    /// Cleanly unmount a nodup mount point.
    Umount(cmd::fs::UmountArgs),
    /// Print dedup statistics of an image or a mount point.
    Stats(cmd::fs::StatsArgs),
    /// Check (and optionally repair) an image; exit 0 only when consistent.
    Fsck(cmd::fs::FsckArgs),
    /// Replay a block trace against a directory.
    Replay(cmd::trace::ReplayArgs),
    /// Trace tools: statistics, generation, conversion.
    #[command(subcommand)]
    Trace(cmd::trace::TraceCommand),
    /// Benchmarks of the engine (no FUSE).
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Mkfs(a) => cmd::fs::mkfs(a),
        Command::Mount(a) => cmd::fs::mount(a),
        Command::Umount(a) => cmd::fs::umount(a),
        Command::Stats(a) => cmd::fs::stats(a),
        Command::Fsck(a) => cmd::fs::fsck(a),
        Command::Replay(a) => cmd::trace::replay(a),
        Command::Trace(c) => cmd::trace::trace(c),
        Command::Bench(c) => cmd::bench::bench(c),
    };
    if let Err(e) = res {
        eprintln!("nodup: {e:#}");
        std::process::exit(1);
    }
}
