//! `nodup bench churn DIR`: create, write and delete small files in a loop (what a mail spool,
//! a build tree or a package manager does to a file system), through the ordinary syscalls, and
//! report the rate. The first error stops the loop and is reported with its cycle number.

use anyhow::{bail, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `nodup bench churn`.
#[derive(Args, Debug)]
pub struct ChurnArgs {
    /// Directory to churn in (usually on a nodup mount).
    pub dir: PathBuf,
    /// Create/write/delete cycles.
    #[arg(long, default_value_t = 100_000)]
    pub cycles: u64,
    /// Bytes written into each file (unique content per cycle).
    #[arg(long, default_value_t = 100)]
    pub bytes: usize,
    /// Distinct file names used in turn.
    #[arg(long, default_value_t = 4)]
    pub names: u64,
}

/// Run the loop; prints one JSON line with the cycles done and the rate.
pub fn run(a: ChurnArgs) -> Result<()> {
    if a.names == 0 || a.bytes == 0 {
        bail!("--names and --bytes must be at least 1");
    }
    let bar = super::progress(a.cycles, "churn");
    let t0 = Instant::now();
    let mut buf = vec![0u8; a.bytes];
    for i in 0..a.cycles {
        let p = a.dir.join(format!("churn-{}", i % a.names));
        for (k, b) in buf.iter_mut().enumerate() {
            *b = (i.wrapping_mul(0x9e37_79b9) >> (k % 24)) as u8 ^ k as u8;
        }
        let r = std::fs::File::create(&p)
            .and_then(|mut f| f.write_all(&buf))
            .and_then(|()| std::fs::remove_file(&p));
        if let Err(e) = r {
            bar.finish_and_clear();
            bail!("cycle {i}: {}: {}", p.display(), crate::cmd::plain(&e));
        }
        if i % 1024 == 0 {
            bar.set_position(i);
        }
    }
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "cycles": a.cycles,
            "seconds": secs,
            "cycles_per_second": a.cycles as f64 / secs.max(1e-9),
        })
    );
    Ok(())
}
