//! `nodup-uring-null MOUNTPOINT [--classic]`: mount the null file system (root only) and serve
//! it until SIGTERM/SIGINT/SIGHUP or an unmount. Prints `ready ...` on stdout once the mount
//! serves requests, and `served ring=N classic=M ops=OPCODE:COUNT,... sink_bytes=N
//! sink_fold=HEX` at the end.

use anyhow::{bail, Context, Result};
use clap::Parser;
use nodup_uring_null::abi::init_flags;
use nodup_uring_null::init::{self, Wanted};
use nodup_uring_null::ring::{self, QueueSetup, TaskRun};
use nodup_uring_null::sink::{Sink, SinkKind};
use nodup_uring_null::{classic, mount, nullfs::NullFs, Served};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

/// A null FUSE file system served over FUSE-over-io_uring (default) or classic /dev/fuse.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Where to mount (an existing directory).
    mountpoint: PathBuf,
    /// Serve over classic /dev/fuse read/write instead of io_uring.
    #[arg(long)]
    classic: bool,
    /// Serving threads with --classic (nodup's default is 4).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: u16,
    /// Let the kernel cache writes (FUSE_WRITEBACK_CACHE).
    #[arg(long)]
    writeback_cache: bool,
    /// Ring entries per queue (requests one CPU's queue holds at once).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    depth: u16,
    /// How the rings run the kernel's task work.
    #[arg(long, value_enum, default_value = "default")]
    taskrun: TaskRun,
    /// Where WRITE data goes: discard (the null file system) or a reference
    /// data path (see `sink.rs`: copy, land, store).
    #[arg(long, value_enum, default_value = "discard")]
    sink: SinkKind,
    /// Open every file with FOPEN_DIRECT_IO: reads and writes skip the page cache, so a
    /// write's data goes from the writer's pages straight into the request.
    #[arg(long)]
    direct_io: bool,
    /// Let the scheduler place the queue threads instead of pinning each to its CPU.
    #[arg(long)]
    no_pin: bool,
}

/// Block the termination signals in this thread and every thread it starts; `wait_signal`
/// takes them synchronously.
fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// On the first termination signal, unmount (which ends every serving thread).
fn unmount_on_signal(set: libc::sigset_t, mountpoint: PathBuf) {
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: `set` is an initialised signal set, `sig` a valid out pointer.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
            if let Err(e) = mount::unmount(&mountpoint) {
                eprintln!("nodup-uring-null: unmount {}: {e}", mountpoint.display());
            }
        }
    });
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("nodup-uring-null: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<()> {
    if args.sink == SinkKind::Land && !args.classic {
        bail!("--sink land needs --classic (a ring entry's payload buffer is the kernel's)");
    }
    let set = block_signals();
    let dev = mount::mount(&args.mountpoint).with_context(|| {
        format!(
            "mount {} (needs root and /dev/fuse)",
            args.mountpoint.display()
        )
    })?;
    let wanted = Wanted {
        writeback_cache: args.writeback_cache,
        uring: !args.classic,
    };
    let result = init::handshake(&dev, wanted)
        .context("FUSE INIT")
        .and_then(|neg| serve(args, &dev, neg.flags, set));
    if result.is_err() {
        // Leave no dead mount behind (it may already be gone).
        let _ = mount::unmount(&args.mountpoint);
    }
    result
}

/// A serving thread that fails leaves requests waiting for it forever (a ring queue's CPU
/// has no other server): report, unmount, and exit, which closes our /dev/fuse descriptors and
/// so aborts the connection (callers get errors instead of hanging).
fn fail_fast(
    mountpoint: &Path,
    what: &str,
    served: &Served,
    r: std::io::Result<()>,
) -> std::io::Result<()> {
    if let Err(e) = &r {
        eprintln!("nodup-uring-null: {what} failed: {e}; unmounting");
        let _ = mount::unmount(mountpoint);
        let _ = writeln!(std::io::stdout(), "served {}", served.summary());
        std::process::exit(1);
    }
    r
}

/// `fuse_open_out.open_flags` bit: bypass the page cache for this open file.
const FOPEN_DIRECT_IO: u32 = 1;

fn serve(args: &Args, dev: &std::fs::File, flags: u64, set: libc::sigset_t) -> Result<()> {
    let mut fs = NullFs::new();
    if args.direct_io {
        fs.open_flags = FOPEN_DIRECT_IO;
    }
    let served = Served::default();
    let wb = flags & init_flags::WRITEBACK_CACHE != 0;
    let outcome = std::thread::scope(|s| -> Result<()> {
        let mut workers = Vec::new();
        let transport = if args.classic {
            // Every descriptor and sink first: a failure then returns before any thread
            // waits in read(2) (the scope would wait for them, and nothing would unmount).
            let mut parts = Vec::new();
            for i in 0..args.threads {
                let fd = if i == 0 {
                    dev.try_clone()?
                } else {
                    mount::clone_fd(dev)?
                };
                let sink = Sink::new(args.sink).context("setting up the sink")?;
                parts.push((fd, sink));
            }
            for (fd, sink) in parts {
                let (fs, served, mnt) = (&fs, &served, &args.mountpoint);
                workers.push(s.spawn(move || {
                    fail_fast(
                        mnt,
                        "classic thread",
                        served,
                        classic::serve_into(&fd, fs, served, sink),
                    )
                }));
            }
            format!("classic threads={} sink={:?}", args.threads, args.sink)
        } else {
            let queues = ring::possible_cpus()?;
            // Every sink first, for the reason above.
            let sinks = (0..queues)
                .map(|_| Sink::new(args.sink))
                .collect::<std::io::Result<Vec<_>>>()
                .context("setting up the sink")?;
            let (tx, rx) = mpsc::channel();
            for (qid, sink) in sinks.into_iter().enumerate() {
                let setup = QueueSetup {
                    qid: u16::try_from(qid).context("too many CPUs")?,
                    depth: usize::from(args.depth),
                    payload: init::MAX_WRITE as usize,
                    taskrun: args.taskrun,
                    pin: !args.no_pin,
                };
                let (fs, served, tx, fd) = (&fs, &served, tx.clone(), dev.as_raw_fd());
                let mnt = &args.mountpoint;
                workers.push(s.spawn(move || {
                    let r = ring::serve_queue(fd, setup, fs, served, sink, |r| {
                        let _ = tx.send(r);
                    });
                    fail_fast(mnt, &format!("ring queue {qid}"), served, r)
                }));
            }
            // FORGET and INTERRUPT still come over /dev/fuse.
            let side = mount::clone_fd(dev)?;
            let (fs2, served2, mnt) = (&fs, &served, &args.mountpoint);
            workers.push(s.spawn(move || {
                let r = classic::serve(&side, fs2, served2);
                fail_fast(mnt, "classic side thread", served2, r)
            }));
            for _ in 0..queues {
                if let Err(e) = rx.recv().context("a queue thread died")? {
                    let _ = mount::unmount(&args.mountpoint);
                    return Err(e).context("registering the ring");
                }
            }
            format!(
                "uring queues={queues} depth={} taskrun={:?} pinned={} sink={:?}",
                args.depth, args.taskrun, !args.no_pin, args.sink
            )
        };
        // Whoever started us may be gone (a closed pipe): the mount still gets served.
        let mut out = std::io::stdout();
        let _ = writeln!(
            out,
            "ready {} transport={transport} writeback_cache={wb}",
            args.mountpoint.display()
        );
        let _ = out.flush();
        unmount_on_signal(set, args.mountpoint.clone());
        let mut first_err = None;
        for w in workers {
            match w.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => bail!("a serving thread panicked"),
            }
        }
        match first_err {
            Some(e) => Err(e).context("serving"),
            None => Ok(()),
        }
    });
    let _ = writeln!(std::io::stdout(), "served {}", served.summary());
    outcome
}
