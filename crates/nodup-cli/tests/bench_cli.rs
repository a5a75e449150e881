//! The `nodup bench engine|aging` command contract: JSON keys other checks rely on, on a tiny size.

use std::process::{Command, Output};

mod common;
use common::json;

fn nodup(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut all: Vec<&str> = args.to_vec();
    let d = dir.path().to_str().unwrap().to_string();
    all.extend(["--dir", &d]);
    let o = Command::new(env!("CARGO_BIN_EXE_nodup"))
        .args(&all)
        .output()
        .unwrap();
    // The image is removed when the command ends.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    o
}

#[test]
fn bench_engine_json_contract() {
    let v = json(&nodup(&[
        "bench", "engine", "--size", "2MiB", "--runs", "1", "--json",
    ]));
    let runs = v["runs"].as_array().unwrap();
    // 4 policies x 4 dup levels x 2 passes + 6 more prefetch variants x 2 passes.
    assert_eq!(runs.len(), 4 * 4 * 2 + 6 * 2);
    for r in runs {
        for k in ["policy", "prefetch", "dup_percent", "pass", "mib_per_s"] {
            assert!(!r[k].is_null(), "missing {k} in {r}");
        }
        assert!(r["mib_per_s"].as_f64().unwrap() > 0.0);
        assert!([1, 2].contains(&r["pass"].as_u64().unwrap()));
    }
    let variants: std::collections::BTreeSet<&str> = runs
        .iter()
        .filter(|r| r["policy"] == "light" && r["dup_percent"] == 100)
        .map(|r| r["prefetch"].as_str().unwrap())
        .collect();
    assert_eq!(variants.len(), 7);
    // Every rewrite deduplicates everything (except `none`, and rare crc32c collisions).
    for r in runs
        .iter()
        .filter(|r| r["pass"] == 2 && r["policy"] != "none")
    {
        assert!(r["dedup_hits"].as_u64().unwrap() >= 500, "{r}");
    }
    assert!(v["acceptance"].as_object().unwrap().len() >= 4);
}

#[test]
fn bench_engine_table_and_filters() {
    let o = nodup(&[
        "bench",
        "engine",
        "--size",
        "1MiB",
        "--runs",
        "1",
        "--policy",
        "light,none",
        "--dup",
        "0",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("| light | cbp | 0 |"), "{out}");
    assert!(out.contains("| none | none | 0 |"), "{out}");
    assert!(!out.contains("| strong |"), "{out}");
    let bad = nodup(&["bench", "engine", "--size", "1MiB", "--policy", "smart"]);
    assert!(!bad.status.success());
}

#[test]
fn bench_aging_json_contract() {
    let v = json(&nodup(&["bench", "aging", "--size", "4MiB", "--json"]));
    for layout in ["region", "entry", "hashtable"] {
        let l = &v["layouts"][layout];
        for k in [
            "fresh_read_bytes_per_block",
            "fresh_write_bytes_per_block",
            "aged_read_bytes_per_block",
            "aged_write_bytes_per_block",
            "index_memory_bytes_per_unique_block",
        ] {
            assert!(l[k].as_f64().is_some(), "{layout}: missing {k} in {l}");
        }
        assert!(l["fresh_write_bytes_per_block"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn bench_sizes_are_refused_saying_why() {
    for (args, what) in [
        (
            vec!["bench", "engine", "--size", "1Q"],
            "--size: invalid size \"1Q\" (a number with an optional K, M, G or T)",
        ),
        (
            vec!["bench", "aging", "--size=-4M"],
            "--size: invalid size \"-4M\": negative",
        ),
        (
            vec![
                "bench",
                "race",
                "--size",
                "1M",
                "--call",
                "99999999999999999999",
            ],
            "--call: invalid size \"99999999999999999999\": too large",
        ),
    ] {
        let o = nodup(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} accepted");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(what), "{args:?}: {err}");
    }
}
