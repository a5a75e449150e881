//! Debubbled files are byte-identical to the compact layout: the same operations run on a
//! store with freewrite on and one with it off; the bubbled files, debubbled, equal the
//! compact ones byte for byte.

mod common;

use common::{key, scratch, small_caps, tiny_lsm, value};
use nodup_freewrite::debubble::debubble;
use nodup_freewrite::fawn::{FawnOptions, FawnStore};
use nodup_freewrite::lsm::table::table_name;
use nodup_freewrite::lsm::LsmStore;
use nodup_freewrite::Caps;
use std::path::{Path, PathBuf};

fn only_log(dir: &Path) -> PathBuf {
    let logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("log."))
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    logs[0].clone()
}

fn check_fawn(caps: Caps) {
    let (on, off, out) = (scratch(), scratch(), scratch());
    let open = |d: &Path, fw| {
        FawnStore::open(
            d,
            FawnOptions {
                freewrite: fw,
                sync: false,
            },
        )
        .unwrap()
    };
    let mut a = open(on.path(), Some(caps));
    let mut b = open(off.path(), None);
    let mut bubbles = 0;
    for round in 0..3u32 {
        for i in 0..3000u32 {
            if round > 0 && i % 9 != round {
                continue;
            }
            let (k, v) = (
                key(i % 2500),
                value(50 + (i as usize * 13) % 400, round * 7 + i),
            );
            if i % 31 == 5 && round > 0 {
                assert_eq!(a.delete(&k).unwrap(), b.delete(&k).unwrap());
            } else {
                a.put(&k, &v).unwrap();
                b.put(&k, &v).unwrap();
            }
        }
        bubbles += a.gc().unwrap().plan.bubble_bytes;
        b.gc().unwrap();
        let plain = out.path().join(format!("plain{round}"));
        let r = debubble(&only_log(on.path()), &plain).unwrap();
        assert_eq!(
            std::fs::read(&plain).unwrap(),
            std::fs::read(only_log(off.path())).unwrap()
        );
        assert_eq!(r.bubbles > 0, r.bubble_bytes > 0);
    }
    assert!(bubbles > 0, "the test must exercise bubbles");
}

#[test]
fn fawn_logs_debubble_to_the_compact_layout() {
    check_fawn(Caps::default());
    check_fawn(small_caps());
}

#[test]
fn lsm_tables_debubble_to_the_compact_layout() {
    let (on, off, out) = (scratch(), scratch(), scratch());
    let mut a = LsmStore::open(on.path(), tiny_lsm(Some(small_caps()), false)).unwrap();
    let mut b = LsmStore::open(off.path(), tiny_lsm(None, false)).unwrap();
    for i in 0..4000u32 {
        let k = key((i / 20) * 1009 % 6007 * 20 + i % 20);
        let v = value(40 + (i as usize % 7) * 20, i);
        a.put(&k, &v).unwrap();
        b.put(&k, &v).unwrap();
    }
    a.flush().unwrap();
    b.flush().unwrap();
    let (ma, mb) = (a.table_metas(), b.table_metas());
    let numbers = |m: &Vec<Vec<_>>| -> Vec<Vec<u64>> {
        m.iter()
            .map(|l: &Vec<nodup_freewrite::lsm::table::TableMeta>| {
                l.iter().map(|t| t.number).collect()
            })
            .collect()
    };
    // Freewrite changes no decision of the store: the same tables on the same levels.
    assert_eq!(numbers(&ma), numbers(&mb));
    let mut bubbled = 0;
    for t in ma.iter().flatten() {
        let name = table_name(t.number);
        let plain = out.path().join(&name);
        debubble(&on.path().join(&name), &plain).unwrap();
        assert_eq!(
            std::fs::read(&plain).unwrap(),
            std::fs::read(off.path().join(&name)).unwrap(),
            "table {name}"
        );
        bubbled += u64::from(t.bubble_bytes > 0);
    }
    assert!(bubbled > 0, "the test must exercise bubbles");
}

#[test]
fn debubble_refuses_damage_and_existing_outputs_and_leaves_nothing() {
    let d = scratch();
    let mut s = FawnStore::open(d.path(), FawnOptions::default()).unwrap();
    for i in 0..50 {
        s.put(&key(i), &value(100, i)).unwrap();
    }
    s.close().unwrap();
    let log = only_log(d.path());
    let out = d.path().join("out");
    std::fs::write(&out, b"keep me").unwrap();
    assert!(debubble(&log, &out).is_err());
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    std::fs::remove_file(&out).unwrap();
    let mut bytes = std::fs::read(&log).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xFF;
    let bad = d.path().join("bad");
    std::fs::write(&bad, &bytes).unwrap();
    assert!(debubble(&bad, &out).is_err());
    assert!(!out.exists());
    assert!(debubble(&d.path().join("LOCK"), &out).is_err());
    assert!(!out.exists());
    let files: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
    assert!(files.iter().all(|e| !e
        .as_ref()
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".tmp")));
}
