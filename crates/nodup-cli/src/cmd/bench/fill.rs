//! `nodup bench fill`: write a file on a mount block by block from numbered contents — unique
//! blocks, the same numbered blocks again in a shuffled order, or phases of given duplicate
//! shares — so a dedup file system's savings, memory and CPU can be measured through FUSE with
//! data whose duplicates are known exactly (`bench/smart.sh`).
//!
//! Block content `k` is the same pseudo-random 4 KiB in every run ([`data::fill_unique`] with
//! seed `--salt` and id `k`), so two files written from the same numbers hold the same blocks.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

use super::data::{fill_unique, shuffle, splitmix};
use super::progress;

/// Arguments of `nodup bench fill`.
#[derive(Args, Debug)]
pub struct FillArgs {
    /// File to write (created or truncated).
    pub file: PathBuf,
    /// 4 KiB blocks to write.
    #[arg(long)]
    pub blocks: u64,
    /// Number of the first content (blocks use contents first.. first+blocks, or earlier ones
    /// for duplicates).
    #[arg(long, default_value_t = 0)]
    pub first: u64,
    /// Block order: seq (block i holds content first+i) or shuffle (a seeded permutation of
    /// the same contents).
    #[arg(long, default_value = "seq", value_parser = ["seq", "shuffle"])]
    pub order: String,
    /// Phases of `--phase-blocks` blocks each, cycling through these duplicate percentages
    /// (e.g. 0,75): a duplicate repeats a content written earlier in this run, the rest are
    /// new contents. Overrides --order.
    #[arg(long, value_delimiter = ',')]
    pub phase_dups: Vec<u32>,
    /// Blocks per phase.
    #[arg(long, default_value_t = 16384)]
    pub phase_blocks: u64,
    /// A duplicate repeats one of the last N new contents (temporal locality); 0 = any
    /// earlier one.
    #[arg(long, default_value_t = 0)]
    pub dup_window: u64,
    /// Blocks per write call (1 = one 4 KiB pwrite per block).
    #[arg(long, default_value_t = 1)]
    pub per_write: u64,
    /// Seed of the shuffle and of the duplicate choices.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seed of the block contents.
    #[arg(long, default_value_t = 0x5eed)]
    pub salt: u64,
    /// fsync at the end.
    #[arg(long)]
    pub fsync: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The content number of every block of the file.
fn plan(a: &FillArgs) -> Result<Vec<u64>> {
    if a.blocks == 0 {
        bail!("--blocks must be at least 1");
    }
    if !a.phase_dups.is_empty() {
        if a.phase_dups.iter().any(|&d| d > 100) || a.phase_blocks == 0 {
            bail!("--phase-dups are percentages 0-100 and --phase-blocks at least 1");
        }
        let mut st = a.seed;
        let mut next = a.first;
        let mut out = Vec::with_capacity(a.blocks as usize);
        for i in 0..a.blocks {
            let d = a.phase_dups[((i / a.phase_blocks) as usize) % a.phase_dups.len()];
            let dup = next > a.first && splitmix(&mut st) % 100 < d as u64;
            if dup {
                let span = next - a.first;
                let w = if a.dup_window == 0 {
                    span
                } else {
                    a.dup_window.min(span)
                };
                out.push(next - 1 - splitmix(&mut st) % w);
            } else {
                out.push(next);
                next += 1;
            }
        }
        return Ok(out);
    }
    let mut v: Vec<u64> = (a.first..a.first + a.blocks).collect();
    if a.order == "shuffle" {
        shuffle(&mut v, a.seed);
    }
    Ok(v)
}

/// `nodup bench fill`.
pub fn run(a: FillArgs) -> Result<()> {
    let contents = plan(&a)?;
    let per = a.per_write.max(1) as usize;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&a.file)
        .with_context(|| format!("{}", a.file.display()))?;
    let pb = progress(a.blocks, "fill");
    let mut buf = vec![0u8; per * 4096];
    let t0 = std::time::Instant::now();
    let unique = {
        let mut u = contents.clone();
        u.sort_unstable();
        u.dedup();
        u.len()
    };
    for (c, chunk) in contents.chunks(per).enumerate() {
        for (j, &k) in chunk.iter().enumerate() {
            fill_unique(&mut buf[j * 4096..(j + 1) * 4096], a.salt, k);
        }
        let off = (c * per) as u64 * 4096;
        f.write_all_at(&buf[..chunk.len() * 4096], off)
            .with_context(|| format!("{}: write at {off}", a.file.display()))?;
        pb.inc(chunk.len() as u64);
    }
    if a.fsync {
        f.sync_all()
            .with_context(|| format!("{}: fsync", a.file.display()))?;
    }
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let bytes = a.blocks * 4096;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "blocks": a.blocks,
                "bytes": bytes,
                "unique_contents": unique,
                "seconds": secs,
                "mib_per_s": bytes as f64 / 1048576.0 / secs,
            })
        );
    } else {
        let mut o = std::io::stdout().lock();
        writeln!(
            o,
            "{}: {} blocks ({} distinct contents) in {secs:.2} s, {:.1} MiB/s",
            a.file.display(),
            a.blocks,
            unique,
            bytes as f64 / 1048576.0 / secs
        )?;
    }
    Ok(())
}
