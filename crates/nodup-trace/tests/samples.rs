//! Parser, statistics and conversion tests on the shared FIU samples (../shared/data/fiu).

use nodup_trace::format::fiu::FiuReader;
use nodup_trace::format::{convert, BadLinePolicy, Format, TraceReader};
use nodup_trace::stats::trace_stats;
use nodup_trace::{DigestUnit, Op, Record};
use std::collections::HashMap;
use std::path::PathBuf;

fn sample(name: &str) -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for base in [
        here.join("../../../shared/data/fiu"),
        PathBuf::from("/work/shared/data/fiu"),
    ] {
        let p = base.join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("shared FIU sample {name} not found (expected in ../shared/data/fiu)");
}

fn records(name: &str) -> Vec<Record> {
    let f = std::io::BufReader::new(std::fs::File::open(sample(name)).unwrap());
    FiuReader::new(f).map(|r| r.unwrap().1).collect()
}

const STRICT: BadLinePolicy<'static> = BadLinePolicy {
    strict: true,
    report: None,
};

#[test]
fn mail_sample_parses_exactly() {
    let r = records("mail-01-sample.blkparse");
    assert_eq!(r.len(), 1000);
    assert!(r
        .iter()
        .all(|x| x.unit == DigestUnit::Block && x.sectors == 8 && x.digests.len() == 1));
    assert_eq!(r.iter().filter(|x| x.op == Op::Write).count(), 16);
    assert_eq!(r.iter().filter(|x| x.op == Op::Read).count(), 984);
    assert!(r
        .iter()
        .all(|x| x.device() == (6, 0) && x.process == "nfsd" || x.op == Op::Read));
    assert_eq!(r[0].lba, 508516680);
    assert_eq!(r[0].ts, 89966527996712);
}

#[test]
fn homes_sample_has_one_digest_per_sector() {
    let r = records("homes-sample.1.blkparse");
    assert_eq!(r.len(), 1000);
    assert!(r
        .iter()
        .all(|x| x.unit == DigestUnit::Sector && x.sectors == 8));
    assert_eq!(r.iter().map(|x| x.digests.len()).sum::<usize>(), 8000);
    let mut per_dev: HashMap<(u32, u32), usize> = HashMap::new();
    for x in &r {
        *per_dev.entry(x.device()).or_default() += 1;
    }
    assert_eq!(per_dev, HashMap::from([((6, 0), 969), ((6, 16), 31)]));
    assert_eq!(r[0].lba, 160806224);
    assert_eq!(r[0].process, "kjournald");
}

#[test]
fn sample_statistics() {
    // Values cross-checked by tests/trace-dedup-ratio.py (scripts/trace-check.sh).
    let mut rd = TraceReader::open(&sample("mail-01-sample.blkparse"), None).unwrap();
    let s = trace_stats(&mut rd, &STRICT, |_| {}).unwrap();
    assert_eq!(
        (s.writes, s.reads, s.duplicate_writes, s.bad_lines),
        (16, 984, 5, 0)
    );
    assert_eq!(s.unique_blocks, 11);
    let mut rd = TraceReader::open(&sample("homes-sample.1.blkparse"), None).unwrap();
    let s = trace_stats(&mut rd, &STRICT, |_| {}).unwrap();
    assert_eq!((s.writes, s.reads, s.duplicate_writes), (1000, 0, 171));
    assert_eq!(s.devices, 2);
    assert_eq!(s.continuity_cdf.last().unwrap().cdf, 1.0);
}

#[test]
fn convert_round_trip_keeps_records() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["mail-01-sample.blkparse", "homes-sample.1.blkparse"] {
        let own = dir.path().join("t.own");
        let back = dir.path().join("t.fiu");
        assert_eq!(
            convert(&sample(name), &own, None, &STRICT).unwrap(),
            (1000, 0)
        );
        assert_eq!(nodup_trace::format::detect(&own).unwrap(), Format::Own);
        assert_eq!(convert(&own, &back, None, &STRICT).unwrap(), (1000, 0));
        let via_own: Vec<Record> = TraceReader::open(&own, None)
            .unwrap()
            .map(|r| r.unwrap().1)
            .collect();
        assert_eq!(via_own, records(name));
        let text = std::fs::read_to_string(sample(name)).unwrap();
        let again = std::fs::read_to_string(&back).unwrap();
        assert_eq!(again, text, "{name}: FIU -> own -> FIU changed the text");
        // The binary form is smaller than the text.
        assert!(std::fs::metadata(&own).unwrap().len() < text.len() as u64);
    }
}

#[test]
fn corrupted_lines_are_counted_or_fatal_with_strict() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(sample("homes-sample.1.blkparse")).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines[4] = lines[4].replacen(" W ", " X ", 1); // line 5: bad operation
    let cut = lines[9].len() - 5;
    lines[9].truncate(cut); // line 10: digest cut short
    let p = dir.path().join("bad.fiu");
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    let lenient = BadLinePolicy {
        strict: false,
        report: None,
    };
    let s = trace_stats(&mut TraceReader::open(&p, None).unwrap(), &lenient, |_| {}).unwrap();
    assert_eq!(s.bad_lines, 2);
    assert_eq!(s.records, 998);
    let seen = std::sync::Mutex::new(Vec::new());
    let report = |e: &nodup_trace::TraceError| seen.lock().unwrap().push(e.to_string());
    let strict = BadLinePolicy {
        strict: true,
        report: Some(&report),
    };
    let err = trace_stats(&mut TraceReader::open(&p, None).unwrap(), &strict, |_| {}).unwrap_err();
    assert!(
        matches!(err, nodup_trace::TraceError::Parse { line: 5, .. }),
        "{err}"
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert!(seen.lock().unwrap()[0].starts_with("line 5:"));
}
