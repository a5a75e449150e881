//! `nodup bench aging`: dedup metadata I/O per written block, fresh and aged, per metadata layout
//! (Light-Dedup §5.5 and its Table 4, scaled down).
//!
//! Per layout (`region`, `entry`, `hashtable`), on a freshly formatted `Pmem` image with the
//! engine's metadata accesses routed through the access meter at 256 B granularity (16 KiB read
//! buffer, 16 KiB write-combining buffer):
//! 1. **fresh**: write `--size` of unique blocks (one file, 2 MiB calls);
//! 2. **punch**: release randomly chosen blocks of that file until half of it is gone;
//! 3. **aged**: write `--size / 2` of new unique blocks (they fill the holes).
//!
//! Reported: metadata bytes read and written at the media per written block in steps 1 and 3
//! (the paper's "Reads/Writes Per Block"), with the amplification over the ideal 40 B
//! (a 32 B entry + an 8 B reverse-map slot), the throughput of both steps (metered, so only
//! comparable between layouts), and the DRAM index memory per unique block.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use nodup_core::media::{Medium, Pmem, PmemOptions};
use nodup_core::meta::MetaLayoutKind;
use nodup_core::{BlockNr, Engine, EngineStats, FormatOptions, OpenOptions, WriteCtx, BLOCK_SIZE};
use serde_json::json;

use super::data::{shuffle, Stream};
use super::engine::BLOCKS_PER_CALL;
use super::{emit_json, progress, size_arg, CommonArgs, TempImage};

/// Metering granularity (Optane XPLine).
pub const GRANULARITY: usize = 256;
/// Ideal metadata bytes per block: one 32 B entry + one 8 B reverse-map slot.
pub const IDEAL_BYTES: f64 = 40.0;
/// Layouts compared, in table order.
pub const LAYOUTS: [MetaLayoutKind; 3] = [
    MetaLayoutKind::Region,
    MetaLayoutKind::Entry,
    MetaLayoutKind::Hashtable,
];

/// Arguments of `nodup bench aging`.
#[derive(Args, Debug)]
pub struct AgingArgs {
    /// Size of the fresh file (the aged write is half of it).
    #[arg(long, default_value = "1GiB")]
    pub size: String,
    /// Print `{"layouts": {...}}` JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Per-layout figures.
#[derive(Debug, Clone, Default)]
struct Figures {
    fresh_read: f64,
    fresh_write: f64,
    punch_read: f64,
    punch_write: f64,
    aged_read: f64,
    aged_write: f64,
    fresh_mib_s: f64,
    aged_mib_s: f64,
    index_per_unique: f64,
    index_entries: u64,
}

fn write_all(engine: &Engine, stream: &Stream) -> Result<(Vec<BlockNr>, f64)> {
    let mut ctx = WriteCtx::default();
    let mut out = Vec::with_capacity(stream.len());
    let calls = stream.calls(BLOCKS_PER_CALL);
    let t = Instant::now();
    for c in &calls {
        out.extend_from_slice(&engine.write(&mut ctx, c)?);
    }
    let secs = t.elapsed().as_secs_f64();
    let mib = (stream.len() * BLOCK_SIZE) as f64 / (1 << 20) as f64;
    Ok((out, mib / secs))
}

fn per_block(a: &EngineStats, b: &EngineStats, blocks: usize) -> (f64, f64) {
    let n = blocks.max(1) as f64;
    (
        (b.meta_bytes_read - a.meta_bytes_read) as f64 / n,
        (b.meta_bytes_written - a.meta_bytes_written) as f64 / n,
    )
}

fn measure(medium: &Arc<dyn Medium>, layout: MetaLayoutKind, nblocks: usize) -> Result<Figures> {
    let fopts = FormatOptions {
        meta_layout: layout,
        ..FormatOptions::default()
    };
    let oopts = OpenOptions {
        meter_granularity: Some(GRANULARITY),
        ..OpenOptions::default()
    };
    let engine = Engine::format(Arc::clone(medium), &fopts, &oopts)
        .with_context(|| format!("format with layout {}", layout.name()))?;
    let mut f = Figures::default();

    // 1. Fresh: one file of unique blocks.
    let fresh = Stream::generate(nblocks, 0, 0xF8E5);
    let s0 = engine.stats();
    let (file, mib_s) = write_all(&engine, &fresh)?;
    let s1 = engine.stats();
    (f.fresh_read, f.fresh_write) = per_block(&s0, &s1, nblocks);
    f.fresh_mib_s = mib_s;
    f.index_per_unique = s1.index_memory_bytes as f64 / fresh.unique().max(1) as f64;
    f.index_entries = s1.index_entries;
    drop(fresh);

    // 2. Punch random holes until half of the file is gone.
    let mut order: Vec<usize> = (0..file.len()).collect();
    shuffle(&mut order, 0xA6E);
    let punched = file.len() / 2;
    for &i in &order[..punched] {
        engine.release(file[i])?;
    }
    let s2 = engine.stats();
    (f.punch_read, f.punch_write) = per_block(&s1, &s2, punched);

    // 3. Aged: write half a file of new unique blocks into the holes.
    let aged = Stream::generate(nblocks / 2, 0, 0xA6ED);
    let (_, mib_s) = write_all(&engine, &aged)?;
    let s3 = engine.stats();
    (f.aged_read, f.aged_write) = per_block(&s2, &s3, aged.len());
    f.aged_mib_s = mib_s;
    Ok(f)
}

fn cell(bytes: f64) -> String {
    format!("{bytes:.2} ({:.2}x)", bytes / IDEAL_BYTES)
}

pub fn run(a: AgingArgs) -> Result<()> {
    let size = size_arg("--size", &a.size)?;
    let nblocks = (size / BLOCK_SIZE as u64) as usize;
    if nblocks < 2 {
        bail!("--size must be at least two blocks");
    }
    let img_len = (2 * nblocks as u64) * BLOCK_SIZE as u64 + (64 << 20);
    let img = TempImage::new(&a.common.dir, "aging");
    let pmem = Pmem::create_with(
        &img.0,
        img_len,
        PmemOptions {
            populate: true,
            ..PmemOptions::default()
        },
    )
    .with_context(|| format!("creating {}", img.0.display()))?;
    let medium: Arc<dyn Medium> = Arc::new(pmem);

    let pb = progress(LAYOUTS.len() as u64, "bench aging");
    let mut figs: BTreeMap<&'static str, Figures> = BTreeMap::new();
    for layout in LAYOUTS {
        pb.set_message(layout.name().to_string());
        figs.insert(layout.name(), measure(&medium, layout, nblocks)?);
        pb.inc(1);
    }
    pb.finish_and_clear();

    let mut layouts = serde_json::Map::new();
    for (name, f) in &figs {
        layouts.insert(
            name.to_string(),
            json!({
                "fresh_read_bytes_per_block": f.fresh_read,
                "fresh_write_bytes_per_block": f.fresh_write,
                "aged_read_bytes_per_block": f.aged_read,
                "aged_write_bytes_per_block": f.aged_write,
                "punch_read_bytes_per_released_block": f.punch_read,
                "punch_write_bytes_per_released_block": f.punch_write,
                "fresh_mib_per_s": f.fresh_mib_s,
                "aged_mib_per_s": f.aged_mib_s,
                "index_memory_bytes_per_unique_block": f.index_per_unique,
                "index_entries": f.index_entries,
            }),
        );
    }
    let region = &figs["region"];
    let entry = &figs["entry"];
    let ratio = region.aged_write / entry.aged_write;
    let max_index = figs
        .values()
        .map(|f| f.index_per_unique)
        .fold(f64::NAN, f64::max);
    let acceptance = json!({
        "region aged write / entry aged write": {"value": ratio, "threshold": 0.5, "ok": ratio <= 0.5},
        "index memory bytes per unique block (max over layouts)":
            {"value": max_index, "threshold": 16.0, "ok": max_index <= 16.0},
    });
    let value = json!({
        "layouts": layouts,
        "granularity": GRANULARITY,
        "read_buffer_bytes": 16384,
        "wc_buffer_bytes": 16384,
        "ideal_bytes_per_block": IDEAL_BYTES,
        "fresh_bytes": nblocks as u64 * BLOCK_SIZE as u64,
        "aged_bytes": (nblocks / 2) as u64 * BLOCK_SIZE as u64,
        "acceptance": acceptance,
    });
    emit_json(&value, a.json, a.common.json_out.as_ref())?;
    if a.json {
        return Ok(());
    }

    let fresh_mib = (nblocks * BLOCK_SIZE) >> 20;
    println!(
        "Metadata I/O per written block at {GRANULARITY} B granularity (16 KiB read buffer, 16 KiB WC buffer, LRU); \
         x = over the ideal {IDEAL_BYTES:.0} B (32 B entry + 8 B reverse map).\n"
    );
    println!("### Table 4 (scaled down): metadata layouts under the aging workload\n");
    print!("| Dimension |");
    for l in LAYOUTS {
        print!(" Fresh ({fresh_mib} MiB) {} |", l.name());
    }
    for l in LAYOUTS {
        print!(" Aged ({} MiB) {} |", fresh_mib / 2, l.name());
    }
    println!();
    println!("|---|{}", "---:|".repeat(2 * LAYOUTS.len()));
    let row = |label: &str, get: &dyn Fn(&Figures) -> (String, String)| {
        print!("| {label} |");
        for l in LAYOUTS {
            print!(" {} |", get(&figs[l.name()]).0);
        }
        for l in LAYOUTS {
            print!(" {} |", get(&figs[l.name()]).1);
        }
        println!();
    };
    row("Reads Per Block (B)", &|f| {
        (cell(f.fresh_read), cell(f.aged_read))
    });
    row("Writes Per Block (B)", &|f| {
        (cell(f.fresh_write), cell(f.aged_write))
    });
    row("Throughput (MiB/s, metered)", &|f| {
        (
            format!("{:.0}", f.fresh_mib_s),
            format!("{:.0}", f.aged_mib_s),
        )
    });
    println!("\n### Punching (per released block) and index memory\n");
    println!("| layout | punch read (B) | punch write (B) | index memory (B / unique block) | index entries |");
    println!("|---|---:|---:|---:|---:|");
    for l in LAYOUTS {
        let f = &figs[l.name()];
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {} |",
            l.name(),
            f.punch_read,
            f.punch_write,
            f.index_per_unique,
            f.index_entries
        );
    }
    println!("\n### Acceptance\n");
    println!("| check | value | threshold | ok |");
    println!("|---|---:|---:|---|");
    println!(
        "| region aged write / entry aged write | {ratio:.3} | <= 0.5 | {} |",
        if ratio <= 0.5 { "yes" } else { "**no**" }
    );
    println!(
        "| index memory per unique block (max over layouts) | {max_index:.2} B | <= 16 B | {} |",
        if max_index <= 16.0 { "yes" } else { "**no**" }
    );
    Ok(())
}
