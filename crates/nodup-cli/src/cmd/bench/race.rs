//! `nodup bench race`: several threads write the same new data at the same time (issue 15,
//! item 7). Each thread writes the same `--size` stream of unique blocks, in the same order, in
//! calls of `--call` bytes, all released by one barrier; the figure is the physical space used
//! divided by `--size` (1.0 = stored once; before the hash lock the losers of the races stored
//! their own copies).

use std::sync::{Arc, Barrier};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use nodup_core::media::{Medium, Pmem, PmemOptions};
use nodup_core::{Engine, FormatOptions, OpenOptions, WriteCtx, BLOCK_SIZE};
use serde_json::json;

use super::data::Stream;
use super::{emit_json, median, size_arg, CommonArgs, TempImage};

/// `nodup bench race` options.
#[derive(Args, Debug)]
pub struct RaceArgs {
    /// Bytes each thread writes (the same data for every thread).
    #[arg(long, default_value = "256MiB")]
    pub size: String,
    /// Writer threads.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Bytes per write call.
    #[arg(long, default_value = "1MiB")]
    pub call: String,
    /// Runs (fresh image each); the median ratio is reported.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    #[command(flatten)]
    pub common: CommonArgs,
    /// Print the JSON result on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: RaceArgs) -> Result<()> {
    let size = size_arg("--size", &a.size)?;
    let call = size_arg("--call", &a.call)?;
    let nblocks = (size / BLOCK_SIZE as u64) as usize;
    let per_call = (call / BLOCK_SIZE as u64) as usize;
    if nblocks == 0 || per_call == 0 || a.threads == 0 || a.runs == 0 {
        bail!("--size and --call must be at least one block, --threads and --runs at least 1");
    }
    let stream = Arc::new(Stream::generate(nblocks, 0, 0x7ACE));
    // Room for every thread's copy (what happens without deduplication) plus metadata.
    let img_len =
        (a.threads as u64 * nblocks as u64 + nblocks as u64 / 4) * BLOCK_SIZE as u64 + (64 << 20);
    let img = TempImage::new(&a.common.dir, "race");
    let mut ratios = Vec::new();
    let mut secs = Vec::new();
    for _ in 0..a.runs {
        let pmem = Pmem::create_with(&img.0, img_len, PmemOptions::default())
            .with_context(|| format!("creating {}", img.0.display()))?;
        let medium: Arc<dyn Medium> = Arc::new(pmem);
        let e = Arc::new(Engine::format(
            medium,
            &FormatOptions::default(),
            &OpenOptions::default(),
        )?);
        let barrier = Arc::new(Barrier::new(a.threads));
        let t0 = Instant::now();
        let workers: Vec<_> = (0..a.threads)
            .map(|_| {
                let (e, barrier, stream) = (e.clone(), barrier.clone(), stream.clone());
                std::thread::spawn(move || -> Result<()> {
                    let mut ctx = WriteCtx::default();
                    barrier.wait();
                    for c in stream.calls(per_call) {
                        e.write(&mut ctx, &c)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("a writer thread panicked"))??;
        }
        secs.push(t0.elapsed().as_secs_f64());
        let s = e.stats();
        ratios.push(s.physical_bytes as f64 / size as f64);
        e.shutdown()?;
    }
    let ratio = median(&ratios);
    let worst = ratios.iter().copied().fold(f64::NAN, f64::max);
    let v = json!({
        "size_bytes": size, "threads": a.threads, "call_bytes": call, "runs": a.runs,
        "physical_over_size": ratios, "median": ratio, "max": worst, "seconds": secs,
    });
    emit_json(&v, a.json, a.common.json_out.as_ref())?;
    if !a.json {
        println!(
            "{} threads x {} (same data, {} calls): physical / size median {:.4}, max {:.4} ({} runs; per run {})",
            a.threads,
            a.size,
            a.call,
            ratio,
            worst,
            a.runs,
            ratios.iter().map(|r| format!("{r:.4}")).collect::<Vec<_>>().join(" ")
        );
    }
    Ok(())
}
