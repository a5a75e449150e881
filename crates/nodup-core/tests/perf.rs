//! Throughput smoke check of the write path on Pmem in /dev/shm (ignored by default: run with
//! `cargo test -p nodup-core --release --test perf -- --ignored --nocapture`). The acceptance
//! figures come from `nodup bench engine`; this is the quick loop used while profiling.

use std::sync::Arc;
use std::time::Instant;

use nodup_core::engine::{FormatOptions, OpenOptions};
use nodup_core::media::{Medium, Pmem, PmemOptions};
use nodup_core::policy::{PolicyKind, PrefetchMode};
use nodup_core::{Engine, WriteCtx, BLOCK_SIZE};

fn stream(n: usize, salt: u64) -> Vec<u8> {
    let mut v = vec![0u8; n * BLOCK_SIZE];
    let mut x = salt | 1;
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
    v
}

/// CPU time of this thread (immune to the other processes sharing the cores).
fn cpu_now() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn run(policy: PolicyKind, pf: PrefetchMode, data: &[u8]) -> (f64, f64) {
    let path = format!("/dev/shm/nodup-core-perf-{}", std::process::id());
    let len = (data.len() as u64) * 3 + (64 << 20);
    let m: Arc<dyn Medium> = Arc::new(
        Pmem::create_with(
            &path,
            len,
            PmemOptions {
                populate: true,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let e = Engine::format(
        m,
        &FormatOptions {
            policy,
            ..Default::default()
        },
        &OpenOptions {
            prefetch: pf,
            ..Default::default()
        },
    )
    .unwrap();
    let blocks: Vec<&[u8]> = data.chunks(BLOCK_SIZE).collect();
    let mut mibs = [0.0; 2];
    let passes: usize = std::env::var("PERF_PASSES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    for (pass, out) in mibs.iter_mut().enumerate().take(passes) {
        let mut ctx = WriteCtx::default();
        let t = cpu_now();
        for call in blocks.chunks(512) {
            e.write(&mut ctx, call).unwrap();
        }
        let s = cpu_now() - t;
        *out = data.len() as f64 / s / (1 << 20) as f64;
        let _ = pass;
    }
    let _ = std::fs::remove_file(&path);
    (mibs[0], mibs[1])
}

#[test]
#[ignore]
fn perf_ratios() {
    let mb: usize = std::env::var("PERF_MB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    let only = std::env::var("PERF_ONLY").unwrap_or_default();
    let data = stream(mb * 256, 42);
    let cases: Vec<(PolicyKind, PrefetchMode)> = vec![
        (PolicyKind::None, PrefetchMode::None),
        (PolicyKind::Light, PrefetchMode::Cbp),
        (PolicyKind::Light, PrefetchMode::None),
        (PolicyKind::WeakVerify, PrefetchMode::None),
        (PolicyKind::Strong, PrefetchMode::None),
    ];
    let rounds: usize = std::env::var("PERF_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let cases: Vec<(PolicyKind, PrefetchMode)> = if only.is_empty() {
        cases
    } else {
        only.split(',')
            .filter_map(|o| {
                let (p, f) = o.split_once('-')?;
                let p = if p == "weak" { "weak-verify" } else { p };
                let f = f.strip_prefix("verify-").unwrap_or(f);
                Some((PolicyKind::from_name(p)?, PrefetchMode::from_name(f)?))
            })
            .collect()
    };
    let cases: Vec<_> = cases
        .into_iter()
        .filter(|(p, pf)| {
            only.is_empty()
                || only
                    .split(',')
                    .any(|o| o == format!("{}-{}", p.name(), pf.name()))
        })
        .collect();
    let mut best = vec![(0.0f64, 0.0f64); cases.len()];
    for _ in 0..rounds {
        for (i, &(p, pf)) in cases.iter().enumerate() {
            let (a, b) = run(p, pf, &data);
            best[i].0 = best[i].0.max(a);
            best[i].1 = best[i].1.max(b);
        }
    }
    for (i, (p, pf)) in cases.iter().enumerate() {
        println!("{:>12} {:>5}: pass1 {:8.0} MiB/s  pass2 {:8.0} MiB/s (best of {rounds}, thread CPU time)", p.name(), pf.name(), best[i].0, best[i].1);
    }
}

#[test]
#[ignore]
fn perf_parts() {
    let data = stream(64 * 256, 7);
    let blocks: Vec<&[u8]> = data.chunks(BLOCK_SIZE).collect();
    let t = Instant::now();
    let c0 = cpu_now();
    let mut acc = 0u64;
    for _ in 0..4 {
        for b in &blocks {
            acc ^= xxhash_rust_shim(b);
        }
    }
    let per = t.elapsed().as_secs_f64() / (4 * blocks.len()) as f64;
    let cpu = (cpu_now() - c0) / (4 * blocks.len()) as f64;
    println!(
        "xxh3 4 KiB (from memory, 64 MiB stream): wall {:.0} ns cpu {:.0} ns {acc}",
        per * 1e9,
        cpu * 1e9
    );
    let fp = nodup_core::fingerprint::fingerprinter(nodup_core::fingerprint::FpKind::Sha256);
    let t = Instant::now();
    for b in &blocks[..4096] {
        acc ^= fp.fingerprint(b);
    }
    println!(
        "sha256 4 KiB: {:.0} ns {acc}",
        t.elapsed().as_secs_f64() / 4096.0 * 1e9
    );
}

fn xxhash_rust_shim(b: &[u8]) -> u64 {
    nodup_core::fingerprint::fingerprinter(nodup_core::fingerprint::FpKind::Xxh3).fingerprint(b)
}

#[test]
#[ignore]
fn perf_hot_xxh3() {
    let data = stream(1, 9);
    let c0 = cpu_now();
    let mut acc = 0u64;
    for i in 0..200_000u64 {
        acc = acc.wrapping_add(xxhash_rust_shim(&data) ^ i);
    }
    println!(
        "xxh3 4 KiB hot: {:.0} ns {acc}",
        (cpu_now() - c0) / 200_000.0 * 1e9
    );
    let mut dst = vec![0u8; 4096];
    let c0 = cpu_now();
    for _ in 0..200_000u64 {
        dst.copy_from_slice(std::hint::black_box(&data));
    }
    println!(
        "memcpy 4 KiB hot: {:.0} ns",
        (cpu_now() - c0) / 200_000.0 * 1e9
    );
}
