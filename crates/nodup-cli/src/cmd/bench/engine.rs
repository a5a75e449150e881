//! `nodup bench engine`: write throughput of the engine alone (Light-Dedup §5.2, §5.4 scaled down).
//!
//! Setup: one `Pmem` image in `--dir` (default `/dev/shm`, pre-faulted), 4 KiB blocks, one
//! thread, `--size` bytes written per point in calls of 2 MiB (512 blocks). A point is a fresh
//! format of the image followed by pass 1 (first write of the stream) and pass 2 (the same stream
//! written again, as a second file: the paper's "write the same data twice"). Each pass is
//! timed on its own; only `Engine::write` calls are inside the timed region.
//!
//! Points:
//! - policies `light` (prefetch `cbp`), `none`, `strong`, `weak-verify` at 0/50/75/100 %
//!   duplicates. For 0/50/75 % the stream has that share of duplicate blocks (of random earlier
//!   blocks of the same stream). 100 % follows the paper: a stream of unique blocks whose second
//!   write is the 100 % point (pass 1 of it is a first write of unique data, like 0 %);
//! - `light` with each of the seven prefetch variants on that same unique stream (pass 2 is the
//!   §5.4 "second write" experiment).
//!
//! Runs are interleaved (run 1 of every point, then run 2, ...) so that machine noise spreads
//! over all points alike; the median of `--runs` runs is reported.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use nodup_core::media::{FlushInstr, Medium, Pmem, PmemOptions};
use nodup_core::policy::{PolicyKind, PrefetchMode};
use nodup_core::{BlockNr, Engine, FormatOptions, OpenOptions, WriteCtx, BLOCK_SIZE};
use serde_json::json;

use super::data::{splitmix, Stream};
use super::{emit_json, median, progress, size_arg, CommonArgs, Stopwatch, TempImage};

/// Blocks per write call (2 MiB).
pub const BLOCKS_PER_CALL: usize = 512;
/// Duplication ratios measured.
pub const DUPS: [u32; 4] = [0, 50, 75, 100];
/// Policies measured.
pub const POLICIES: [PolicyKind; 4] = [
    PolicyKind::Light,
    PolicyKind::None,
    PolicyKind::Strong,
    PolicyKind::WeakVerify,
];

/// Arguments of `nodup bench engine`.
#[derive(Args, Debug)]
pub struct EngineArgs {
    /// Bytes written per point and pass (K/M/G suffixes).
    #[arg(long, default_value = "1GiB")]
    pub size: String,
    /// Runs per point; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Print `{"runs": [...]}` JSON instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// Only these policies (comma-separated; default all four), e.g. for profiling one point.
    #[arg(long, value_delimiter = ',')]
    pub policy: Vec<String>,
    /// Only these duplication percentages (comma-separated; default 0,50,75,100).
    #[arg(long, value_delimiter = ',')]
    pub dup: Vec<u32>,
    /// Skip the prefetch-variant table (only `light`/`cbp` among the variants).
    #[arg(long)]
    pub no_variants: bool,
    /// Write data blocks with non-temporal (streaming) stores instead of the default ordinary
    /// stores + cache-line flush, for every policy.
    #[arg(long)]
    pub stream_data: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One measured configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Point {
    dup: u32,
    policy: u32,
    prefetch: usize,
}

impl Point {
    fn policy(&self) -> PolicyKind {
        PolicyKind::from_u32(self.policy).expect("valid policy")
    }
    fn prefetch(&self) -> PrefetchMode {
        PrefetchMode::ALL[self.prefetch]
    }
}

fn prefetch_index(p: PrefetchMode) -> usize {
    PrefetchMode::ALL
        .iter()
        .position(|&q| q == p)
        .expect("known prefetch mode")
}

/// The points measured on the stream of duplication `dup`.
fn points_for(dup: u32, a: &EngineArgs) -> Vec<Point> {
    let wanted = |p: PolicyKind| a.policy.is_empty() || a.policy.iter().any(|n| n == p.name());
    let mut v: Vec<Point> = POLICIES
        .iter()
        .filter(|&&p| wanted(p))
        .map(|&p| Point {
            dup,
            policy: p as u32,
            prefetch: prefetch_index(if p == PolicyKind::Light {
                PrefetchMode::Cbp
            } else {
                PrefetchMode::None
            }),
        })
        .collect();
    if dup == 100 && !a.no_variants && wanted(PolicyKind::Light) {
        for pf in PrefetchMode::ALL {
            if pf != PrefetchMode::Cbp {
                v.push(Point {
                    dup,
                    policy: PolicyKind::Light as u32,
                    prefetch: prefetch_index(pf),
                });
            }
        }
    }
    v
}

/// Samples of one point.
#[derive(Default, Debug)]
struct Samples {
    /// Wall-clock throughput per pass.
    mib_s: [Vec<f64>; 2],
    /// Throughput over the thread's CPU time per pass.
    cpu_mib_s: [Vec<f64>; 2],
    hits: [u64; 2],
    index_memory_bytes: u64,
    index_entries: u64,
    unique_blocks: u64,
}

/// Format, write the stream twice, time both passes.
fn measure(
    medium: &Arc<dyn Medium>,
    pt: Point,
    stream: &Stream,
    calls: &[Vec<&[u8]>],
    check_seed: u64,
    s: &mut Samples,
) -> Result<()> {
    let fopts = FormatOptions {
        policy: pt.policy(),
        ..FormatOptions::default()
    };
    let oopts = OpenOptions {
        prefetch: pt.prefetch(),
        ..OpenOptions::default()
    };
    let engine = Engine::format(Arc::clone(medium), &fopts, &oopts)
        .with_context(|| format!("format for {}", pt.policy().name()))?;
    let mib = (stream.len() * BLOCK_SIZE) as f64 / (1 << 20) as f64;
    let mut prev_hits = engine.stats().dedup_hits;
    for pass in 0..2 {
        let mut ctx = WriteCtx::default();
        // Touch the result vector's pages now, so their page faults stay out of the timing
        // (`vec![0; n]` would map zero pages lazily, which is what is to be avoided here).
        #[allow(clippy::slow_vector_initialization)]
        let mut out: Vec<BlockNr> = {
            let mut v = Vec::with_capacity(stream.len());
            v.resize(stream.len(), 0);
            v
        };
        out.clear();
        let t0 = super::monotonic_secs();
        let sw = Stopwatch::start();
        for call in calls {
            let r = engine.write(&mut ctx, call)?;
            out.extend_from_slice(&r);
        }
        let (secs, cpu) = sw.elapsed();
        super::trace_window(
            &format!(
                "{} {} {}% pass {}",
                pt.policy().name(),
                pt.prefetch().name(),
                pt.dup,
                pass + 1
            ),
            t0,
        );
        s.mib_s[pass].push(mib / secs);
        s.cpu_mib_s[pass].push(mib / cpu);
        let st = engine.stats();
        s.hits[pass] = st.dedup_hits - prev_hits;
        prev_hits = st.dedup_hits;
        if pass == 0 {
            s.index_memory_bytes = st.index_memory_bytes;
            s.index_entries = st.index_entries;
            s.unique_blocks = stream.unique() as u64;
        }
        // Sanity (untimed): the engine returned a block per input, holding that input.
        if out.len() != stream.len() {
            bail!(
                "{}: write returned {} blocks for {}",
                pt.policy().name(),
                out.len(),
                stream.len()
            );
        }
        let mut st = check_seed ^ pass as u64;
        let mut buf = vec![0u8; BLOCK_SIZE];
        for _ in 0..64 {
            let i = (splitmix(&mut st) % stream.len() as u64) as usize;
            engine.read(out[i], &mut buf)?;
            if buf != stream.block(i) {
                bail!(
                    "{} prefetch {} dup {} pass {}: block {i} reads back wrong",
                    pt.policy().name(),
                    pt.prefetch().name(),
                    pt.dup,
                    pass + 1
                );
            }
        }
    }
    Ok(())
}

/// Reference costs of the data path on this medium, measured without the engine (ns per block),
/// each step done one after the other: copy + flush (what a `none` first write pays at least),
/// xxh3 + copy + flush (a fingerprinting first write without any overlap), xxh3 fused into the
/// copy (one pass over the block, as the engine stages new data), xxh3 + compare (a
/// verified rewrite), SHA-256 (a cryptographic rewrite). They put the engine's ratios in context
/// (how expensive fingerprinting is next to the copy on this machine); an engine that overlaps
/// the steps can beat their ratios.
#[derive(Default, Debug)]
struct Floors {
    copy: Vec<f64>,
    hash_copy: Vec<f64>,
    fused: Vec<f64>,
    hash_compare: Vec<f64>,
    sha256: Vec<f64>,
}

const FLOOR_NAMES: [&str; 5] = [
    "block write (none floor)",
    "xxh3 + block write (light first-write floor, not overlapped)",
    "xxh3 fused into the block write (one pass, as the engine stages new blocks)",
    "xxh3+compare (light rewrite floor)",
    "sha256 (strong rewrite floor)",
];

fn measure_floors(medium: &Arc<dyn Medium>, stream: &Stream, f: &mut Floors) -> Result<()> {
    use nodup_core::fingerprint::{fingerprinter, FpKind};
    let xxh3 = fingerprinter(FpKind::Xxh3);
    let sha = fingerprinter(FpKind::Sha256);
    let n = stream.len();
    let bs = BLOCK_SIZE as u64;
    let per_block = |t: Stopwatch| t.elapsed().1 * 1e9 / n as f64;
    let mut acc = 0u64;
    for hash in [false, true] {
        let t = Stopwatch::start();
        for i in 0..n {
            let b = stream.block(i);
            if hash {
                acc ^= xxh3.fingerprint(b);
            }
            // The engine's data path: stores + flush, or streaming stores with --stream-data.
            medium.write_stream(i as u64 * bs, b)?;
            if i % BLOCKS_PER_CALL == BLOCKS_PER_CALL - 1 {
                medium.fence()?;
            }
        }
        medium.fence()?;
        if hash {
            f.hash_copy.push(per_block(t));
        } else {
            f.copy.push(per_block(t));
        }
    }
    // The engine's staging: the fingerprint computed in the same pass that stores the block.
    let t = Stopwatch::start();
    for i in 0..n {
        let b = stream.block(i);
        let mut fp = 0;
        let direct = medium.fill_with(i as u64 * bs, BLOCK_SIZE, &mut |dst| {
            // SAFETY: `dst.ptr` covers this block of the mapping (bounds-checked, line-aligned)
            // and nothing else touches it meanwhile; the store kind is the medium's.
            fp = unsafe { xxh3.fingerprint_into(b, dst) };
        })?;
        if !direct {
            medium.write_stream(i as u64 * bs, b)?;
            fp = xxh3.fingerprint(b);
        }
        acc ^= fp;
        if i % BLOCKS_PER_CALL == BLOCKS_PER_CALL - 1 {
            medium.fence()?;
        }
    }
    medium.fence()?;
    f.fused.push(per_block(t));
    let mut scratch = vec![0u8; BLOCK_SIZE];
    let t = Stopwatch::start();
    let mut equal = 0usize;
    for i in 0..n {
        let b = stream.block(i);
        acc ^= xxh3.fingerprint(b);
        let same = match medium.direct(i as u64 * bs, BLOCK_SIZE) {
            Some(d) => d == b,
            None => {
                medium.read(i as u64 * bs, &mut scratch)?;
                scratch == b
            }
        };
        equal += same as usize;
    }
    f.hash_compare.push(per_block(t));
    if equal != n {
        bail!(
            "floor measurement: {} of {n} blocks read back different",
            n - equal
        );
    }
    let t = Stopwatch::start();
    for i in 0..n {
        acc ^= sha.fingerprint(stream.block(i));
    }
    f.sha256.push(per_block(t));
    std::hint::black_box(acc);
    Ok(())
}

/// One acceptance check: `value >= threshold`.
fn check(name: &str, value: f64, threshold: f64) -> (String, serde_json::Value) {
    (
        name.to_string(),
        json!({"value": value, "threshold": threshold, "ok": value >= threshold}),
    )
}

pub fn run(a: EngineArgs) -> Result<()> {
    let size = size_arg("--size", &a.size)?;
    let nblocks = (size / BLOCK_SIZE as u64) as usize;
    if nblocks == 0 || a.runs == 0 {
        bail!("--size must be at least one block and --runs at least 1");
    }
    for p in &a.policy {
        if !POLICIES.iter().any(|q| q.name() == p) {
            bail!("--policy {p}: not one of light, none, strong, weak-verify");
        }
    }
    let dups: Vec<u32> = if a.dup.is_empty() {
        DUPS.to_vec()
    } else {
        a.dup.clone()
    };
    if let Some(d) = dups.iter().find(|&&d| d > 100) {
        bail!("--dup {d}: a percentage is at most 100");
    }
    // Room for two passes of unique blocks (`none` writes everything twice) plus metadata.
    let img_len = (2 * nblocks as u64 + nblocks as u64 / 4) * BLOCK_SIZE as u64 + (64 << 20);
    let img = TempImage::new(&a.common.dir, "engine");
    let pmem = Pmem::create_with(
        &img.0,
        img_len,
        PmemOptions {
            populate: true,
            stream_data: a.stream_data,
            ..PmemOptions::default()
        },
    )
    .with_context(|| format!("creating {}", img.0.display()))?;
    let flush = pmem.flush_instr();
    let medium: Arc<dyn Medium> = Arc::new(pmem);

    let total: usize = dups.iter().map(|&d| points_for(d, &a).len()).sum::<usize>() * a.runs;
    let pb = progress(total as u64, "bench engine");
    let mut results: BTreeMap<Point, Samples> = BTreeMap::new();
    let mut actual_dup: BTreeMap<u32, f64> = BTreeMap::new();
    let mut floors = Floors::default();
    for (k, &dup) in dups.iter().enumerate() {
        pb.set_message(format!("generating {dup}% stream"));
        // 100 % = rewrite of a unique stream (pass 2), as in the paper.
        let gen_dup = if dup == 100 { 0 } else { dup };
        let stream = Stream::generate(nblocks, gen_dup, 0x5EED_0000 + dup as u64);
        // At 100 % the measured pass rewrites the stream, so every block it writes is a
        // duplicate; the stream itself holds none.
        let measured = if dup == 100 {
            100.0
        } else {
            stream.dup_percent()
        };
        actual_dup.insert(dup, measured);
        let calls = stream.calls(BLOCKS_PER_CALL);
        let points = points_for(dup, &a);
        for run in 0..a.runs {
            if k == 0 {
                pb.set_message(format!("data-path floors run {}", run + 1));
                measure_floors(&medium, &stream, &mut floors)?;
            }
            for &pt in &points {
                pb.set_message(format!(
                    "{} {} {}% run {}",
                    pt.policy().name(),
                    pt.prefetch().name(),
                    dup,
                    run + 1
                ));
                let s = results.entry(pt).or_default();
                measure(&medium, pt, &stream, &calls, run as u64 * 7919, s)?;
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();

    // Medians: `cpu` selects throughput over thread CPU time instead of wall-clock time.
    let med = |p: PolicyKind, pf: PrefetchMode, dup: u32, pass: usize, cpu: bool| -> f64 {
        results
            .get(&Point {
                dup,
                policy: p as u32,
                prefetch: prefetch_index(pf),
            })
            .map_or(f64::NAN, |s| {
                median(if cpu {
                    &s.cpu_mib_s[pass]
                } else {
                    &s.mib_s[pass]
                })
            })
    };
    let mut rows = Vec::new();
    for (pt, s) in &results {
        for pass in 0..2 {
            rows.push(json!({
                "policy": pt.policy().name(),
                "prefetch": pt.prefetch().name(),
                "dup_percent": pt.dup,
                "pass": pass + 1,
                "mib_per_s": median(&s.mib_s[pass]),
                "mib_per_s_cpu": median(&s.cpu_mib_s[pass]),
                "samples_mib_per_s": s.mib_s[pass],
                "samples_mib_per_s_cpu": s.cpu_mib_s[pass],
                "dedup_hits": s.hits[pass],
                "blocks": nblocks,
            }));
        }
    }
    let light_pf = |pf, cpu| med(PolicyKind::Light, pf, 100, 1, cpu);
    let light0 = results.get(&Point {
        dup: 0,
        policy: PolicyKind::Light as u32,
        prefetch: prefetch_index(PrefetchMode::Cbp),
    });
    let idx_per_unique = light0.map_or(f64::NAN, |s| {
        s.index_memory_bytes as f64 / s.unique_blocks.max(1) as f64
    });
    let (l, n, st) = (PolicyKind::Light, PolicyKind::None, PolicyKind::Strong);
    let (cbp, pnone) = (PrefetchMode::Cbp, PrefetchMode::None);
    let checks = |cpu: bool| -> Vec<(String, serde_json::Value)> {
        vec![
            check(
                "light@0% pass1 / none@0% pass1",
                med(l, cbp, 0, 0, cpu) / med(n, pnone, 0, 0, cpu),
                0.92,
            ),
            check(
                "light@100% pass2 / light@100% pass1",
                med(l, cbp, 100, 1, cpu) / med(l, cbp, 100, 0, cpu),
                1.3,
            ),
            check(
                "light@100% pass2 / strong@100% pass2",
                med(l, cbp, 100, 1, cpu) / med(st, pnone, 100, 1, cpu),
                1.5,
            ),
            check(
                "cbp pass2 / prefetch-none pass2",
                light_pf(cbp, cpu) / light_pf(pnone, cpu),
                1.1,
            ),
        ]
    };
    let (wall_checks, cpu_checks) = (checks(false), checks(true));
    let value = json!({
        "runs": rows,
        "size_bytes": nblocks as u64 * BLOCK_SIZE as u64,
        "block_size": BLOCK_SIZE,
        "blocks_per_call": BLOCKS_PER_CALL,
        "runs_per_point": a.runs,
        "medium": "pmem",
        "image_dir": a.common.dir,
        "flush_instr": flush.name(),
        "data_stores": if a.stream_data { "streaming" } else { "store+flush" },
        "actual_dup_percent": actual_dup,
        "index_memory_bytes_per_unique_block": idx_per_unique,
        "reference_costs_cpu_ns_per_block": {
            "copy_flush": median(&floors.copy),
            "xxh3_copy_flush": median(&floors.hash_copy),
            "xxh3_fused_copy_flush": median(&floors.fused),
            "xxh3_compare": median(&floors.hash_compare),
            "sha256": median(&floors.sha256),
        },
        "acceptance": wall_checks.iter().cloned().collect::<serde_json::Map<_, _>>(),
        "acceptance_cpu_time": cpu_checks.iter().cloned().collect::<serde_json::Map<_, _>>(),
    });
    emit_json(&value, a.json, a.common.json_out.as_ref())?;
    if a.json {
        return Ok(());
    }

    // Tables (markdown).
    println!(
        "Engine only, Pmem image in {} ({}), {} MiB per pass, 4 KiB blocks, 2 MiB calls, 1 thread, \
         median of {} runs. \"wall\" = bytes / elapsed time; \"cpu\" = bytes / CPU time of the writing \
         thread (leaves out the time the thread was descheduled on this shared machine).\n",
        a.common.dir.display(),
        flush_desc(flush, a.stream_data),
        (nblocks * BLOCK_SIZE) >> 20,
        a.runs
    );
    println!("### Throughput per policy (MiB/s)\n");
    println!(
        "| policy | prefetch | dup % | pass 1 wall | pass 2 wall | pass 1 cpu | pass 2 cpu | pass-2 dedup hits |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for &dup in &dups {
        for p in POLICIES {
            let pf = if p == PolicyKind::Light { cbp } else { pnone };
            let Some(hits) = results
                .get(&Point {
                    dup,
                    policy: p as u32,
                    prefetch: prefetch_index(pf),
                })
                .map(|s| s.hits[1])
            else {
                continue;
            };
            println!(
                "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
                p.name(),
                pf.name(),
                dup,
                med(p, pf, dup, 0, false),
                med(p, pf, dup, 1, false),
                med(p, pf, dup, 0, true),
                med(p, pf, dup, 1, true),
                hits
            );
        }
    }
    println!(
        "\n### Speculative prefetch variants, `light`, second write of the same data (MiB/s)\n"
    );
    println!("| variant | pass 2 wall | x none | pass 2 cpu | x none (cpu) |");
    println!("|---|---:|---:|---:|---:|");
    for pf in PrefetchMode::ALL {
        if light_pf(pf, false).is_nan() {
            continue;
        }
        println!(
            "| {} | {:.0} | {:.2} | {:.0} | {:.2} |",
            pf.name(),
            light_pf(pf, false),
            light_pf(pf, false) / light_pf(pnone, false),
            light_pf(pf, true),
            light_pf(pf, true) / light_pf(pnone, true),
        );
    }
    println!("\n### Acceptance\n");
    println!("| ratio | wall | cpu | threshold | ok (wall) | ok (cpu) |");
    println!("|---|---:|---:|---:|---|---|");
    let ok = |v: &serde_json::Value| {
        if v["ok"].as_bool() == Some(true) {
            "yes"
        } else {
            "**no**"
        }
    };
    for ((name, w), (_, c)) in wall_checks.iter().zip(&cpu_checks) {
        println!(
            "| {} | {:.3} | {:.3} | >= {} | {} | {} |",
            name,
            w["value"].as_f64().unwrap_or(f64::NAN),
            c["value"].as_f64().unwrap_or(f64::NAN),
            w["threshold"],
            ok(w),
            ok(c)
        );
    }
    println!(
        "\n### Data-path reference costs (medium + fingerprint only, no engine; CPU ns per block, median)\n"
    );
    println!("| operation | ns/block | MiB/s |");
    println!("|---|---:|---:|");
    for (name, v) in FLOOR_NAMES.iter().zip([
        &floors.copy,
        &floors.hash_copy,
        &floors.fused,
        &floors.hash_compare,
        &floors.sha256,
    ]) {
        let ns = median(v);
        println!(
            "| {name} | {ns:.0} | {:.0} |",
            BLOCK_SIZE as f64 / ns * 1e9 / (1 << 20) as f64
        );
    }
    println!(
        "\nDone one after the other, fingerprinting adds {:.0} % to writing a block \
         (write / (xxh3 + write) = {:.3}); an engine beats that ratio only by overlapping the two.",
        100.0 * (median(&floors.hash_copy) / median(&floors.copy) - 1.0),
        median(&floors.copy) / median(&floors.hash_copy)
    );
    println!(
        "In one pass (what the engine's staging does) the ratio is {:.3}: what `light@0%` loses \
         beyond that is the engine's own work per new block (index, entry, reverse map).",
        median(&floors.copy) / median(&floors.fused)
    );
    println!(
        "\nIndex memory after the first write of unique data: {idx_per_unique:.2} B per unique block (light, dup 0 %)."
    );
    Ok(())
}

fn flush_desc(f: FlushInstr, stream_data: bool) -> String {
    if stream_data {
        format!(
            "data: non-temporal stores + sfence; metadata: stores + {} + sfence",
            f.name()
        )
    } else {
        format!("data and metadata: stores + {} + sfence", f.name())
    }
}
