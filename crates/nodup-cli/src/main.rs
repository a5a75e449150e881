//! The `nodup` command: a thin edge over the library crates. Each subcommand lives in `cmd/`.

mod cmd;

use clap::{Parser, Subcommand};

/// nodup: an inline-deduplicating storage engine and file system for fast media.
#[derive(Parser)]
#[command(
    name = "nodup",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("NODUP_COMMIT"), ")"),
    about,
    propagate_version = true
)]
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
    /// Send a command to a mounted file system (checkpoint; smart's worker rate and resources).
    Ctl(cmd::ctl::CtlArgs),
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
    /// Benchmarks of the engine (no FUSE) and load generators for a mount.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// Freewrite: bubbles that keep rewritten data block aligned (FAWN and LSM stores).
    #[command(subcommand)]
    Freewrite(cmd::freewrite::FreewriteCommand),
    /// Cache-line dedup simulator for encrypted NVM main memory (FSDedup's evaluation).
    #[command(subcommand)]
    Sim(cmd::sim::SimCommand),
    /// Write the man pages (nodup.1 and one per subcommand) into DIR (`make install` does).
    #[command(hide = true)]
    Man {
        /// Directory for the pages.
        dir: std::path::PathBuf,
    },
}

/// Write a man page for `cmd` and each of its visible subcommands (`nodup-mkfs.1`, ...).
fn write_man_pages(cmd: &clap::Command, prefix: &str, dir: &std::path::Path) -> anyhow::Result<()> {
    let name = if prefix.is_empty() {
        cmd.get_name().to_string()
    } else {
        format!("{prefix}-{}", cmd.get_name())
    };
    let page = cmd.clone().name(name.clone());
    let mut out = Vec::new();
    clap_mangen::Man::new(page).render(&mut out)?;
    std::fs::write(dir.join(format!("{name}.1")), out)?;
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        write_man_pages(sub, &name, dir)?;
    }
    Ok(())
}

fn main() {
    // Called as mount(8)'s helper (`mount -t fuse.nodup`, fstab).
    let mut args = std::env::args_os();
    let name = args
        .next()
        .map(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .unwrap_or_default();
    if cmd::helper::NAMES.contains(&name.as_str()) {
        if let Err(e) = cmd::helper::run(args.collect()) {
            eprintln!("{name}: {}", cmd::plain_error(&e));
            std::process::exit(1);
        }
        return;
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            // One line, like every other error: the message without clap's usage block.
            let text = e.to_string();
            let msg: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(|l| l.trim())
                .collect();
            let msg = msg.join(" ");
            eprintln!("nodup: {} (see --help)", msg.trim_start_matches("error: "));
            std::process::exit(2);
        }
    };
    let res = match cli.command {
        Command::Mkfs(a) => cmd::mkfs::mkfs(a),
        Command::Mount(a) => cmd::mount::mount(a),
        Command::Umount(a) => cmd::mount::umount(a),
        Command::List(a) => cmd::list::list(a),
        Command::Stats(a) => cmd::check::stats(a),
        Command::Ctl(a) => cmd::ctl::ctl(a),
        Command::Fsck(a) => cmd::check::fsck(a),
        Command::Du(a) => cmd::du::du(a),
        Command::Estimate(a) => cmd::estimate::estimate(a),
        Command::Replay(a) => cmd::trace::replay(a),
        Command::Trace(c) => cmd::trace::trace(c),
        Command::Bench(c) => cmd::bench::bench(c),
        Command::Freewrite(c) => cmd::freewrite::freewrite(c),
        Command::Sim(c) => cmd::sim::sim(c),
        Command::Man { dir } => std::fs::create_dir_all(&dir)
            .map_err(anyhow::Error::from)
            .and_then(|()| {
                use clap::CommandFactory;
                write_man_pages(&Cli::command(), "", &dir)
            }),
    };
    if let Err(e) = res {
        eprintln!("nodup: {}", cmd::plain_error(&e));
        std::process::exit(1);
    }
}

/// fuser's request buffers on huge pages (cheaper for the kernel to copy WRITE data into).
#[global_allocator]
static ALLOC: nodup_fs::fuse::RequestBufferAlloc = nodup_fs::fuse::RequestBufferAlloc;
