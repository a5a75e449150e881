//! The `nodup sim` command contract: `run --json` keys per scheme, errors on bad input.

use std::path::Path;

mod common;
use common::{json, nodup};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn gen_run_json_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("g.trace");
    let o = nodup(&[
        "sim",
        "gen",
        "--lines",
        "20000",
        "--dup-rate",
        "0.6",
        "--seed",
        "3",
        "-o",
        s(&t),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json(&nodup(&["sim", "run", s(&t), "--scheme", "all", "--json"]));
    for name in ["baseline", "sha1", "dewrite", "esd", "fsdedup"] {
        let r = &v["schemes"][name];
        for k in [
            "writes_eliminated_fraction",
            "mean_write_latency_ns",
            "p99_write_latency_ns",
            "mean_read_latency_ns",
            "energy_nj",
            "metadata_bytes",
        ] {
            assert!(
                r.get(k).is_some_and(|x| x.is_number()),
                "{name}: missing {k}"
            );
        }
    }
    assert_eq!(v["schemes"]["baseline"]["writes_eliminated_fraction"], 0.0);
    assert!(
        v["schemes"]["sha1"]["writes_eliminated_fraction"]
            .as_f64()
            .unwrap()
            > 0.3
    );
    let one = json(&nodup(&["sim", "run", s(&t), "--scheme", "esd", "--json"]));
    assert_eq!(one["schemes"].as_object().unwrap().len(), 1);
    let st = json(&nodup(&["sim", "stats", "--json", s(&t)]));
    assert_eq!(st["events"], 20000);

    // A cut trace: one clear line, non-zero exit.
    let bytes = std::fs::read(&t).unwrap();
    let cut = dir.path().join("cut.trace");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let o = nodup(&["sim", "run", s(&cut)]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("truncated") || err.contains("corrupt"),
        "{err}"
    );
    let o = nodup(&["sim", "run", s(&t), "--scheme", "nope"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown scheme"));
    let o = nodup(&["sim", "run", s(&t), "--set", "banks=0"]);
    assert!(!o.status.success());
    let o = nodup(&["sim", "run", "/nonexistent.trace"]);
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
}
