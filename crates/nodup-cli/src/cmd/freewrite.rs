//! `nodup freewrite bench|debubble`: a thin edge over `nodup-freewrite` (Freewrite, SYSTOR'17).

use super::size::{bytes, parse_size};
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use nodup_freewrite::bench::{run, BenchSpec, Phase, StoreKind};
use nodup_freewrite::debubble::debubble;
use nodup_freewrite::workload::KeyDist;
use nodup_freewrite::Caps;
use std::path::PathBuf;

/// `nodup freewrite ...`.
#[derive(Subcommand)]
pub enum FreewriteCommand {
    /// Run a §4.1 workload on a FAWN or LSM store in DIR with freewrite on or off.
    Bench(BenchArgs),
    /// Rewrite a bubbled log or SSTable into the compact layout other tools read.
    Debubble(DebubbleArgs),
}

/// Arguments of `nodup freewrite bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Store: fawn (garbage collection is measured) or lsm (the load with its compactions).
    #[arg(long, value_parser = ["fawn", "lsm"])]
    pub store: String,
    /// Directory of the store (empty for a load).
    #[arg(long)]
    pub dir: PathBuf,
    /// FAWN: log bytes to fill before the collection; LSM: key and value bytes to put (e.g. 1G).
    #[arg(long)]
    pub size: String,
    /// Bytes of each value (the paper: 128, 256, 512, 1024).
    #[arg(long, default_value_t = 512)]
    pub value_size: usize,
    /// Key distribution.
    #[arg(long, default_value = "mixed", value_parser = ["uniform", "clustered", "mixed"])]
    pub keys: String,
    /// Bubbles in garbage collection / compaction output.
    #[arg(long, value_parser = ["on", "off"])]
    pub freewrite: String,
    /// Largest bubble per island block, as a fraction of a block (f/k).
    #[arg(long, default_value_t = 0.125)]
    pub bubble_cap: f64,
    /// Largest total of bubble bytes per file written, as a fraction of its size.
    #[arg(long, default_value_t = 0.05)]
    pub global_cap: f64,
    /// FAWN only: run the load and the collection (all) or one of them in this process.
    #[arg(long, default_value = "all", value_parser = ["all", "load", "gc"])]
    pub phase: String,
    /// Seed of the workload.
    #[arg(long, default_value_t = 19)]
    pub seed: u64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `nodup freewrite debubble`.
#[derive(Args)]
pub struct DebubbleArgs {
    /// A FAWN data log, write-ahead log or SSTable written by nodup-freewrite.
    pub file: PathBuf,
    /// The compact copy to create (must not exist).
    #[arg(short = 'o', long = "output")]
    pub out: PathBuf,
}

/// Run `nodup freewrite ...`.
pub fn freewrite(c: FreewriteCommand) -> Result<()> {
    match c {
        FreewriteCommand::Bench(a) => bench(a),
        FreewriteCommand::Debubble(a) => {
            let r = debubble(&a.file, &a.out)?;
            println!(
                "{} {}: {} records, {} bubbles ({}) removed, {} -> {}",
                r.kind,
                a.file.display(),
                r.records,
                r.bubbles,
                bytes(r.bubble_bytes),
                bytes(r.in_bytes),
                bytes(r.out_bytes)
            );
            Ok(())
        }
    }
}

fn bench(a: BenchArgs) -> Result<()> {
    let (Some(store), Some(keys), Some(phase)) = (
        StoreKind::from_name(&a.store),
        KeyDist::from_name(&a.keys),
        Phase::from_name(&a.phase),
    ) else {
        bail!("unknown store, key distribution or phase");
    };
    let spec = BenchSpec {
        store,
        dir: a.dir,
        size: parse_size(&a.size)?,
        value_size: a.value_size,
        keys,
        freewrite: a.freewrite == "on",
        caps: Caps::with_caps(a.bubble_cap, a.global_cap)?,
        phase,
        seed: a.seed,
    };
    let pb = super::progress_bar(spec.size, "{bar:40} {bytes}/{total_bytes} eta {eta}");
    let rep = run(&spec, &mut |done, total| {
        if let Some(pb) = &pb {
            pb.set_length(total);
            pb.set_position(done);
        }
    })?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if a.json {
        println!("{}", serde_json::to_string(&rep)?);
        return Ok(());
    }
    println!(
        "{} {} keys={} value={} freewrite={} (bubble cap {}, global cap {})",
        rep.store,
        rep.phase,
        rep.keys,
        rep.value_size,
        if rep.freewrite { "on" } else { "off" },
        rep.bubble_cap,
        rep.global_cap
    );
    println!(
        "  {:.0} ops/s ({} ops in {:.2} s), {} puts ({} overwrites)",
        rep.ops_per_sec, rep.ops, rep.seconds, rep.puts, rep.overwrites
    );
    println!(
        "  written {}, bubbles {} written / {} in {} of store files, {} gc/compactions",
        bytes(rep.app_bytes_written),
        bytes(rep.bubble_bytes),
        bytes(rep.bubble_space_bytes),
        bytes(rep.store_bytes),
        rep.gc_or_compaction_runs
    );
    let p = &rep.plan;
    println!(
        "  islands {} ({} blocks): aligned {} free + {} by {} bubbles; skipped: {} small, {} bubble cap, {} global cap",
        p.islands,
        p.island_blocks,
        p.aligned_free_blocks,
        p.bubbled_blocks,
        p.bubbles,
        p.skipped_small,
        p.skipped_bubble_cap,
        p.skipped_global_cap
    );
    Ok(())
}
