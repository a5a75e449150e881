//! kill -9 of a real process (this test binary re-run as a child) in the middle of puts,
//! garbage collections, memtable flushes and compactions: after reopening, every acknowledged
//! write reads back and nothing else changed (the one write in flight may or may not be there).
//!
//! The child puts and deletes with `sync` on (acknowledged on return), printing `B i` before
//! and `A i` after operation i, and `G` before each garbage collection or flush. The parent
//! kills it with SIGKILL at a random moment, or when it reports reaching a crash point.

mod common;

use common::{key, scratch, small_caps, tiny_lsm, value};
use nodup_freewrite::fawn::{FawnOptions, FawnStore};
use nodup_freewrite::lsm::LsmStore;
use nodup_freewrite::Caps;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const KEYS: u64 = 150;

fn mix(a: u64, b: u64) -> u64 {
    let mut x = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_add(0xD1B5_4A32_D192_ED03);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 29)
}

/// Operation `i` of run `seed`: (key, value or `None` for a delete).
fn op(seed: u64, i: u64) -> (Vec<u8>, Option<Vec<u8>>) {
    let h = mix(seed, i);
    let k = key((h % KEYS) as u32);
    if (h >> 20) % 10 == 0 {
        (k, None)
    } else {
        (k, Some(value(30 + ((h >> 8) % 300) as usize, i as u32)))
    }
}

fn caps(seed: u64) -> Option<Caps> {
    (seed % 2 == 0).then(small_caps)
}

enum Store {
    Fawn(FawnStore),
    Lsm(LsmStore),
}

fn open(kind: &str, dir: &Path, seed: u64) -> Store {
    if kind == "fawn" {
        let o = FawnOptions {
            freewrite: caps(seed),
            sync: true,
        };
        Store::Fawn(FawnStore::open(dir, o).expect("open fawn"))
    } else {
        Store::Lsm(LsmStore::open(dir, tiny_lsm(caps(seed), true)).expect("open lsm"))
    }
}

/// The child: operations until killed. Runs only under the parent (environment variable).
#[test]
#[ignore = "the child process of the kill -9 tests"]
fn crash_child() {
    let Ok(spec) = std::env::var("FW_CRASH_CHILD") else {
        return;
    };
    let parts: Vec<&str> = spec.splitn(5, '|').collect();
    let (kind, seed, point, nth, dir) = (
        parts[0],
        parts[1].parse::<u64>().unwrap(),
        parts[2].to_string(),
        parts[3].parse::<u64>().unwrap(),
        Path::new(parts[4]),
    );
    let mut s = open(kind, dir, seed);
    let mut seen = 0;
    let hook = Box::new(move |name: &str| {
        if name == point {
            seen += 1;
            if seen == nth {
                println!("AT {name}");
                let _ = std::io::stdout().flush();
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    });
    match &mut s {
        Store::Fawn(f) => f.set_crash_hook(hook),
        Store::Lsm(l) => l.set_crash_hook(hook),
    }
    let mut out = std::io::stdout();
    // End the test harness's "test crash_child ... " line, so each report is a line of its own.
    writeln!(out).unwrap();
    for i in 0.. {
        if i % 40 == 39 {
            writeln!(out, "G").unwrap();
            out.flush().unwrap();
            match &mut s {
                Store::Fawn(f) => drop(f.gc().unwrap()),
                Store::Lsm(l) => l.flush().unwrap(),
            }
        }
        let (k, v) = op(seed, i);
        writeln!(out, "B {i}").unwrap();
        out.flush().unwrap();
        match (&mut s, v) {
            (Store::Fawn(f), Some(v)) => f.put(&k, &v).unwrap(),
            (Store::Fawn(f), None) => drop(f.delete(&k).unwrap()),
            (Store::Lsm(l), Some(v)) => l.put(&k, &v).unwrap(),
            (Store::Lsm(l), None) => l.delete(&k).unwrap(),
        }
        writeln!(out, "A {i}").unwrap();
        out.flush().unwrap();
    }
}

/// When to kill the child.
enum Kill {
    /// After `acks` acknowledged operations plus `ms` milliseconds.
    Random { acks: u64, ms: u64 },
    /// Right after the `n`-th report of a garbage collection or flush starting, plus `us`.
    InGc { n: u64, us: u64 },
    /// When it blocks at the `n`-th pass through crash point `name`.
    At { name: &'static str, n: u64 },
}

/// Run one child in a fresh store, kill it, reopen and check against the model.
fn crash_once(kind: &str, seed: u64, kill: Kill) {
    let dir = scratch();
    let (point, nth) = match kill {
        Kill::At { name, n } => (name, n),
        _ => ("none", 0),
    };
    let spec = format!("{kind}|{seed}|{point}|{nth}|{}", dir.path().display());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FW_CRASH_CHILD", spec)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let start = Instant::now();
    let mut acks = 0;
    let mut gcs = 0;
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "child never reached the kill"
        );
        let Ok(l) = rx.recv_timeout(Duration::from_secs(20)) else {
            panic!("child went quiet: {:?}", lines.last());
        };
        acks += u64::from(l.starts_with("A "));
        gcs += u64::from(l == "G");
        let at_point = l.starts_with("AT ");
        lines.push(l);
        let fire = match kill {
            Kill::Random { acks: a, ms } if acks >= a => {
                std::thread::sleep(Duration::from_millis(ms));
                true
            }
            Kill::InGc { n, us } if gcs >= n => {
                std::thread::sleep(Duration::from_micros(us));
                true
            }
            Kill::At { .. } => at_point,
            _ => false,
        };
        if fire {
            break;
        }
    }
    child.kill().expect("SIGKILL the child");
    let status = child.wait().unwrap();
    assert!(!status.success());
    reader.join().unwrap();
    lines.extend(rx.try_iter());
    if let Kill::At { name, .. } = kill {
        assert!(lines.iter().any(|l| *l == format!("AT {name}")));
    }

    // The model: acknowledged operations; the last begun but unacknowledged may be there.
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut in_flight = None;
    for l in &lines {
        if let Some(i) = l.strip_prefix("B ") {
            in_flight = Some(i.parse::<u64>().unwrap());
        } else if let Some(i) = l.strip_prefix("A ") {
            let i = i.parse::<u64>().unwrap();
            assert_eq!(in_flight, Some(i));
            in_flight = None;
            match op(seed, i) {
                (k, Some(v)) => model.insert(k, v),
                (k, None) => model.remove(&k),
            };
        }
    }
    let mut with = model.clone();
    let mut flight_key = None;
    if let Some(i) = in_flight {
        let (k, v) = op(seed, i);
        match v {
            Some(v) => with.insert(k.clone(), v),
            None => with.remove(&k),
        };
        flight_key = Some(k);
    }
    let s = open(kind, dir.path(), seed);
    let got: Vec<(Vec<u8>, Vec<u8>)> = match s {
        Store::Fawn(mut f) => f.scan(&[0], None).unwrap(),
        Store::Lsm(l) => l.scan(&[0], None).unwrap(),
    };
    let want: Vec<_> = model.into_iter().collect();
    let want_with: Vec<_> = with.into_iter().collect();
    assert!(
        got == want || got == want_with,
        "{kind} seed {seed}: {} keys read back, {} acknowledged (in flight: {flight_key:?})",
        got.len(),
        want.len()
    );
    assert!(acks > 0);
}

#[test]
fn fawn_kill9_during_puts_and_gc_loses_nothing_acknowledged() {
    for seed in 0..12 {
        crash_once(
            "fawn",
            seed,
            Kill::Random {
                acks: 60 + 37 * seed,
                ms: seed % 4,
            },
        );
        crash_once(
            "fawn",
            seed,
            Kill::InGc {
                n: 1 + seed % 3,
                us: 200 * seed,
            },
        );
    }
    for (i, name) in ["gc:new-log-synced", "gc:committed"]
        .into_iter()
        .enumerate()
    {
        for seed in 0..2 {
            crash_once(
                "fawn",
                10 + seed,
                Kill::At {
                    name,
                    n: 1 + i as u64 + seed,
                },
            );
        }
    }
}

#[test]
fn lsm_kill9_during_puts_flushes_and_compactions_loses_nothing_acknowledged() {
    for seed in 0..12 {
        crash_once(
            "lsm",
            seed,
            Kill::Random {
                acks: 60 + 37 * seed,
                ms: seed % 4,
            },
        );
        crash_once(
            "lsm",
            seed,
            Kill::InGc {
                n: 1 + seed % 3,
                us: 300 * seed,
            },
        );
    }
    let points = [
        "flush:table-written",
        "flush:committed",
        "compact:outputs-written",
        "compact:committed",
    ];
    for name in points {
        for seed in 0..2 {
            crash_once("lsm", 20 + seed, Kill::At { name, n: 2 + seed });
        }
    }
}
