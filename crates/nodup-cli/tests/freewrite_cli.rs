//! The `nodup freewrite bench|debubble` command contract: JSON keys other checks rely on, the
//! FAWN phases as separate processes, debubble of a GC log, one-line errors.

use std::path::Path;

mod common;
use common::{json, nodup};

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap())
}

fn bench(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let d = dir.to_str().unwrap();
    let mut args = vec!["freewrite", "bench", "--dir", d, "--json"];
    args.extend(extra);
    json(&nodup(&args))
}

#[test]
fn bench_json_contract_for_both_stores() {
    let t = scratch();
    for (store, size, runs) in [("fawn", "4M", 1), ("lsm", "20M", 1)] {
        let v = bench(
            &t.path().join(store),
            &[
                "--store",
                store,
                "--size",
                size,
                "--value-size",
                "1024",
                "--keys",
                "mixed",
                "--freewrite",
                "on",
            ],
        );
        for k in [
            "ops_per_sec",
            "app_bytes_written",
            "bubble_bytes",
            "gc_or_compaction_runs",
        ] {
            assert!(!v[k].is_null(), "{store}: no {k} in {v}");
        }
        assert!(v["ops_per_sec"].as_f64().unwrap() > 0.0);
        assert!(v["gc_or_compaction_runs"].as_u64().unwrap() >= runs, "{v}");
        assert!(v["app_bytes_written"].as_u64().unwrap() > 0);
    }
}

#[test]
fn fawn_phases_run_as_separate_processes_and_the_log_debubbles() {
    let t = scratch();
    let dir = t.path().join("s");
    let common = [
        "--store",
        "fawn",
        "--size",
        "4M",
        "--value-size",
        "512",
        "--keys",
        "uniform",
        "--freewrite",
        "on",
    ];
    let load = bench(&dir, &[&common[..], &["--phase", "load"]].concat());
    assert_eq!(load["gc_or_compaction_runs"], 0);
    assert!(load["puts"].as_u64().unwrap() > 7000);
    let gc = bench(&dir, &[&common[..], &["--phase", "gc"]].concat());
    assert_eq!(gc["gc_or_compaction_runs"], 1);
    let bubbles = gc["bubble_bytes"].as_u64().unwrap();
    assert!(bubbles > 0, "{gc}");
    // A second load into the same store is refused.
    let o = nodup(
        &[
            &["freewrite", "bench", "--dir", dir.to_str().unwrap()][..],
            &common[..],
            &["--phase", "load"],
        ]
        .concat(),
    );
    assert!(!o.status.success());
    let log = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("log."))
        .unwrap();
    let out = t.path().join("plain");
    let debubble = || {
        nodup(&[
            "freewrite",
            "debubble",
            log.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
    };
    let o = debubble();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (a, b) = (
        std::fs::metadata(&log).unwrap().len(),
        std::fs::metadata(&out).unwrap().len(),
    );
    assert_eq!(a - b, bubbles);
    // Again onto the existing output: refused, in one line, output untouched.
    let o = debubble();
    assert!(!o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stderr).trim().lines().count(), 1);
    assert_eq!(std::fs::metadata(&out).unwrap().len(), b);
}

#[test]
fn bad_arguments_get_one_line() {
    let t = scratch();
    let d = t.path().to_str().unwrap();
    for args in [
        vec!["--store", "btree", "--size", "1M", "--freewrite", "on"],
        vec!["--store", "fawn", "--size", "1M", "--freewrite", "maybe"],
        vec![
            "--store",
            "fawn",
            "--size",
            "1M",
            "--freewrite",
            "on",
            "--bubble-cap",
            "0",
        ],
        vec![
            "--store",
            "lsm",
            "--size",
            "1M",
            "--freewrite",
            "on",
            "--phase",
            "gc",
        ],
        vec!["--store", "fawn", "--size", "lots", "--freewrite", "on"],
    ] {
        let o = nodup(&[&["freewrite", "bench", "--dir", d][..], &args[..]].concat());
        assert!(!o.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
