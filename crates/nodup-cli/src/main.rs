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
    Mkfs(cmd::mkfs::MkfsArgs),
    /// Mount an image through FUSE (daemonizes unless --foreground).
    Mount(cmd::mount::MountArgs),
    /// Cleanly unmount a nodup mount point.
    Umount(cmd::mount::UmountArgs),
    /// List mounted nodup file systems: image, mount point, policy, daemon pid.
    List(cmd::list::ListArgs),
    /// Print dedup statistics of an image or a mount point.
    Stats(cmd::check::StatsArgs),
    /// Check (and optionally repair) an image; exit 0 only when consistent.
    Fsck(cmd::check::FsckArgs),
    /// Per file and directory on a mount: logical, exclusive (freed if deleted) and shared bytes.
    Du(cmd::du::DuArgs),
    /// Estimate the savings nodup would reach on these files (reads only).
    Estimate(cmd::estimate::EstimateArgs),
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
        Command::Mkfs(a) => cmd::mkfs::mkfs(a),
        Command::Mount(a) => cmd::mount::mount(a),
        Command::Umount(a) => cmd::mount::umount(a),
        Command::List(a) => cmd::list::list(a),
        Command::Stats(a) => cmd::check::stats(a),
        Command::Fsck(a) => cmd::check::fsck(a),
        Command::Du(a) => cmd::du::du(a),
        Command::Estimate(a) => cmd::estimate::estimate(a),
        Command::Replay(a) => cmd::trace::replay(a),
        Command::Trace(c) => cmd::trace::trace(c),
        Command::Bench(c) => cmd::bench::bench(c),
    };
    if let Err(e) = res {
        eprintln!("nodup: {}", cmd::plain_error(&e));
        std::process::exit(1);
    }
}
