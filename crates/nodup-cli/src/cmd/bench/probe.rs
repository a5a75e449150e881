//! `nodup bench probe FILE`: a latency probe — 4 KiB write + fsync in a loop, each timed — that
//! can force checkpoints of the nodup mount under it meanwhile, to show how long operations
//! wait for one.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::{Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Arguments of `nodup bench probe`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// File to write to (created; 4 KiB at a time over its first MiB).
    pub file: PathBuf,
    /// How long to probe.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Mount point of the nodup file system to checkpoint while probing.
    #[arg(long)]
    pub mount: Option<PathBuf>,
    /// Milliseconds between forced checkpoints (with --mount).
    #[arg(long, default_value_t = 200)]
    pub checkpoint_every: u64,
}

/// Run the probe; prints one JSON line (operations, percentiles and maximum in ms, checkpoints).
pub fn run(a: ProbeArgs) -> Result<()> {
    if a.seconds.is_nan() || a.seconds <= 0.0 {
        bail!("--seconds must be positive");
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(&a.file)
        .with_context(|| format!("{}", a.file.display()))?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let forcer = a.mount.clone().map(|mnt| {
        let stop = stop.clone();
        let every = Duration::from_millis(a.checkpoint_every.max(1));
        std::thread::spawn(move || -> Result<(u64, f64)> {
            let mut n = 0u64;
            let mut worst = 0f64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                nodup_fs::ctl::command(&mnt, "checkpoint")
                    .with_context(|| format!("{}: forcing a checkpoint", mnt.display()))?;
                worst = worst.max(t.elapsed().as_secs_f64());
                n += 1;
                std::thread::sleep(every);
            }
            Ok((n, worst))
        })
    });
    let mut lat = Vec::new();
    let block = vec![0x5au8; 4096];
    let t0 = Instant::now();
    let mut i = 0u64;
    while t0.elapsed().as_secs_f64() < a.seconds {
        let t = Instant::now();
        f.seek(SeekFrom::Start((i % 256) * 4096))?;
        f.write_all(&block)?;
        f.sync_data()?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        i += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ckpts, ckpt_worst) = match forcer {
        Some(h) => h
            .join()
            .map_err(|_| anyhow::anyhow!("checkpoint thread panicked"))??,
        None => (0, 0.0),
    };
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
    println!(
        "{}",
        serde_json::json!({
            "ops": lat.len(),
            "p50_ms": pct(0.5),
            "p99_ms": pct(0.99),
            "p999_ms": pct(0.999),
            "max_ms": lat.last().copied().unwrap_or(0.0),
            "checkpoints_forced": ckpts,
            "longest_checkpoint_call_ms": ckpt_worst * 1e3,
        })
    );
    Ok(())
}
