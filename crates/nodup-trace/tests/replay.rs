//! Replay against a temporary directory, checked against independently computed file contents.

use nodup_trace::content::SectorContent;
use nodup_trace::format::fiu::{format_line, FiuReader};
use nodup_trace::replay::{replay, Mode, ReplayOptions, ReplayReport};
use nodup_trace::{BadLinePolicy, DigestUnit, Op, Record};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

/// A random trace over a small LBA space: two devices, both digest variants, unaligned
/// requests, overlapping rewrites, duplicate digests, reads of written and unwritten space.
fn random_trace(seed: u64, n: usize) -> String {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = String::new();
    for i in 0..n {
        let sectors = if rng.gen_bool(0.5) {
            8 * rng.gen_range(1..6)
        } else {
            rng.gen_range(1..30)
        };
        let lba = if rng.gen_bool(0.5) {
            8 * rng.gen_range(0..40)
        } else {
            rng.gen_range(0..320)
        };
        let unit = if rng.gen_bool(0.5) {
            DigestUnit::Block
        } else {
            DigestUnit::Sector
        };
        let digests = (0..Record::expected_digests(unit, sectors))
            .map(|_| [rng.gen_range(0..12u8); 16]) // few distinct digests: many duplicates
            .collect();
        let r = Record {
            ts: i as u64,
            pid: 1 + (i % 3) as u32,
            process: "t".into(),
            lba,
            sectors,
            op: if rng.gen_bool(0.7) {
                Op::Write
            } else {
                Op::Read
            },
            major: 8,
            minor: if rng.gen_bool(0.8) { 0 } else { 16 },
            unit,
            digests,
        };
        out.push_str(&format_line(&r));
        out.push('\n');
    }
    out
}

/// Expected file contents, computed sector by sector straight from the records.
fn expected_files(trace: &str) -> BTreeMap<String, Vec<u8>> {
    let mut sectors: BTreeMap<String, BTreeMap<u64, SectorContent>> = BTreeMap::new();
    for item in FiuReader::new(trace.as_bytes()) {
        let (_, r) = item.unwrap();
        if r.op != Op::Write {
            continue;
        }
        let m = sectors
            .entry(format!("dev-{}-{}.img", r.major, r.minor))
            .or_default();
        for i in 0..r.sectors {
            m.insert(r.lba + i as u64, r.sector_content(i));
        }
    }
    sectors
        .into_iter()
        .map(|(name, m)| {
            // Files end at the end of the last written 4 KiB block; the rest reads as zeros.
            let end = (m.keys().next_back().unwrap() / 8 + 1) * 4096;
            let mut v = vec![0u8; end as usize];
            for (s, sc) in m {
                sc.fill(&mut v[s as usize * 512..(s as usize + 1) * 512]);
            }
            (name, v)
        })
        .collect()
}

/// Options of a strict replay into `dir`.
fn options(dir: &Path, mode: Mode, threads: usize) -> ReplayOptions<'static> {
    ReplayOptions {
        dir: dir.to_path_buf(),
        mode,
        threads,
        no_reads: false,
        overwrite: false,
        format: None,
        policy: BadLinePolicy {
            strict: true,
            report: None,
        },
        progress: None,
    }
}

fn run(trace: &Path, dir: &Path, mode: Mode, threads: usize) -> ReplayReport {
    replay(trace, &options(dir, mode, threads)).unwrap()
}

/// A named pipe in `dir` and the thread writing `text` into it (its write fails if the
/// reader gives up early).
fn piped(dir: &Path, text: &str) -> (PathBuf, JoinHandle<std::io::Result<()>>) {
    let fifo = dir.join("pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (f, text) = (fifo.clone(), text.to_string());
    (fifo, std::thread::spawn(move || std::fs::write(f, text)))
}

#[test]
fn replay_files_match_independent_expectation() {
    for seed in [1u64, 2, 3] {
        println!("seed {seed}");
        let text = random_trace(seed, 400);
        let expected = expected_files(&text);
        let tmp = tempfile::tempdir().unwrap();
        let trace = tmp.path().join("t.fiu");
        std::fs::write(&trace, &text).unwrap();
        for (mode, threads) in [
            (Mode::Block, 1),
            (Mode::Batch, 1),
            (Mode::Batch, 3),
            (Mode::Block, 2),
        ] {
            let dir = tmp.path().join(format!("{mode:?}-{threads}"));
            let rep = run(&trace, &dir, mode, threads);
            assert_eq!(
                rep.verify_errors, 0,
                "seed {seed} {mode:?}/{threads}: {:?}",
                rep.verify_error_samples
            );
            assert!(rep.verified_blocks > 0);
            assert_eq!(rep.records, 400);
            for (name, want) in &expected {
                let got = std::fs::read(dir.join(name)).unwrap();
                assert!(
                    got == *want,
                    "seed {seed} {mode:?}/{threads}: {name} differs from the expectation"
                );
            }
        }
    }
}

#[test]
fn batch_mode_merges_consecutive_blocks() {
    // 600 consecutive one-block writes then 600 reads of them: batch = 2 + 2 calls (512 + 88 each).
    let mut text = String::new();
    for op in ["W", "R"] {
        for i in 0..600u64 {
            text.push_str(&format!("{i} 1 p {} 8 {op} 8 0 {:032x}\n", i * 8, i % 7));
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("t.fiu");
    std::fs::write(&trace, &text).unwrap();
    let b = run(&trace, &tmp.path().join("batch"), Mode::Batch, 1);
    assert_eq!((b.write_ops, b.read_ops), (2, 2));
    assert_eq!(b.verified_blocks, 600);
    let k = run(&trace, &tmp.path().join("block"), Mode::Block, 1);
    assert_eq!((k.write_ops, k.read_ops), (600, 600));
    assert_eq!(k.bytes, 2 * 600 * 4096);
    assert!(k.latency_us.max >= k.latency_us.p50);
}

#[test]
fn own_format_and_no_reads_replay_the_same_writes() {
    let text = random_trace(11, 300);
    let expected = expected_files(&text);
    let tmp = tempfile::tempdir().unwrap();
    let fiu = tmp.path().join("t.fiu");
    let own = tmp.path().join("t.own");
    std::fs::write(&fiu, &text).unwrap();
    let policy = BadLinePolicy {
        strict: true,
        report: None,
    };
    nodup_trace::format::convert(&fiu, &own, None, &policy).unwrap();
    let reads = text
        .lines()
        .filter(|l| l.split_whitespace().nth(5) == Some("R"))
        .count() as u64;
    assert!(reads > 0);
    let o = ReplayOptions {
        dir: tmp.path().join("own"),
        mode: Mode::Batch,
        threads: 2,
        no_reads: true,
        overwrite: false,
        format: None,
        policy,
        progress: None,
    };
    let rep = replay(&own, &o).unwrap();
    assert_eq!(
        (rep.read_ops, rep.skipped_reads, rep.records),
        (0, reads, 300 - reads)
    );
    for (name, want) in &expected {
        assert!(
            std::fs::read(tmp.path().join("own").join(name)).unwrap() == *want,
            "{name} differs"
        );
    }
}

/// A trace that can be read only once (a pipe) cannot be read first to see which device files
/// it writes: over files holding data it is refused, even with `overwrite`, rather than drained
/// by that first pass and then "replayed" as an empty trace.
#[test]
fn a_pipe_over_device_files_with_data_is_refused() {
    let text = random_trace(4, 50);
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("t.fiu");
    std::fs::write(&trace, &text).unwrap();
    let dir = tmp.path().join("d");
    run(&trace, &dir, Mode::Block, 1);
    let before = expected_files(&text);
    let (fifo, writer) = piped(tmp.path(), &text);
    let o = ReplayOptions {
        overwrite: true,
        ..options(&dir, Mode::Block, 1)
    };
    let err = replay(&fifo, &o).expect_err("a pipe over files with data");
    assert!(err.to_string().contains("not a regular file"), "{err}");
    let _ = writer.join();
    for (name, want) in &before {
        assert!(
            std::fs::read(dir.join(name)).unwrap() == *want,
            "{name} changed"
        );
    }
}

/// A trace read from a pipe, its format detected, replays whole: the bytes read to tell the
/// formats apart are not lost (the pipe cannot be opened and read a second time).
#[test]
fn a_trace_from_a_pipe_replays_whole() {
    let text = random_trace(5, 300);
    assert!(text.len() > 8192, "longer than what the detection reads");
    let expected = expected_files(&text);
    let tmp = tempfile::tempdir().unwrap();
    let (fifo, writer) = piped(tmp.path(), &text);
    let dir = tmp.path().join("d");
    let rep = run(&fifo, &dir, Mode::Batch, 1);
    writer.join().unwrap().unwrap();
    assert_eq!(rep.records, 300);
    for (name, want) in &expected {
        assert!(std::fs::read(dir.join(name)).unwrap() == *want, "{name}");
    }
}
