//! Policy `selective` through the command line and a real mount: mkfs picks the ECC
//! fingerprint, the cache options reach the daemon, hot content written among unique data is
//! deduplicated, the stats report both caches, the options are refused where they mean
//! nothing, and the data is intact across a remount and fsck.

mod common;
use common::*;
use std::fs;

fn one_line_error(o: &std::process::Output, has: &str) {
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains(has), "{e}");
}

/// `n` blocks: every other one is one of 4 hot contents, the rest random.
fn data(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut hot = vec![vec![0u8; 4096]; 4];
    let mut hrng = StdRng::seed_from_u64(7);
    for h in &mut hot {
        hrng.fill(&mut h[..]);
    }
    let mut out = vec![0u8; n * 4096];
    for (k, b) in out.chunks_mut(4096).enumerate() {
        if k % 2 == 0 {
            b.copy_from_slice(&hot[k / 2 % 4]);
        } else {
            rng.fill(b);
        }
    }
    out
}

#[test]
fn selective_through_a_mount() {
    if !fuse_available() {
        return;
    }
    let f = Fixture::new("selective", "256M", &["--policy", "selective"]);
    f.mount(&[
        "--fp-cache",
        "16K",
        "--prefetch-cache",
        "64K",
        "--refresh-ops",
        "500",
    ]);
    let a = data(2000, 1);
    let b = data(2000, 2);
    fs::write(f.path("a"), &a).unwrap();
    fs::write(f.path("b"), &b).unwrap();
    let s = f.stats();
    assert_eq!(s["policy"], "selective", "{s}");
    let sel = &s["selective"];
    assert!(sel["fp_cache"]["budget_bytes"] == 16 << 10, "{sel}");
    assert!(
        sel["fp_cache"]["memory_bytes"].as_u64().unwrap() <= 16 << 10,
        "{sel}"
    );
    assert!(sel["fp_cache"]["refreshes"].as_u64().unwrap() > 0, "{sel}");
    assert!(sel["prefetch"]["hits"].as_u64().unwrap() > 0, "{sel}");
    // 4 hot contents + 2000 unique blocks stored out of 4000.
    let ratio = s["dedup_ratio"].as_f64().unwrap();
    assert!(ratio > 0.49, "{ratio}");
    f.umount();
    assert!(f.fsck().status.success());
    f.mount(&[]);
    assert_eq!(fs::read(f.path("a")).unwrap(), a);
    assert_eq!(fs::read(f.path("b")).unwrap(), b);
    // The defaults: the paper's 512 KiB caches.
    assert_eq!(
        f.stats()["selective"]["fp_cache"]["budget_bytes"],
        512 << 10
    );
    f.umount();
}

#[test]
fn selective_options_are_refused_where_they_mean_nothing() {
    if !fuse_available() {
        return;
    }
    let f = Fixture::new("light", "64M", &[]);
    one_line_error(
        &nodup(&[
            "mount",
            f.img.to_str().unwrap(),
            f.mnt.to_str().unwrap(),
            "--fp-cache",
            "64K",
        ]),
        "options of policy selective",
    );
    let g = Fixture::new("selective", "64M", &["--policy", "selective"]);
    one_line_error(
        &nodup(&[
            "mount",
            g.img.to_str().unwrap(),
            g.mnt.to_str().unwrap(),
            "--fp-cache",
            "1K",
        ]),
        "at least 4K",
    );
    one_line_error(
        &nodup(&[
            "mount",
            g.img.to_str().unwrap(),
            g.mnt.to_str().unwrap(),
            "--prefetch-cache",
            "lots",
        ]),
        "--prefetch-cache",
    );
}
