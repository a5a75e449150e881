//! `nodup estimate`: totals against hand-computed numbers and against the independent Python
//! model (tests/trace-dedup-ratio.py --files), error lines, and that it only reads.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{json, nodup, StdRng};

const BS: usize = 4096;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `n` random bytes.
fn bytes(r: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    r.fill(&mut v);
    v
}

/// A random 4 KiB block named by `seed`.
fn block(seed: u64) -> Vec<u8> {
    bytes(
        &mut StdRng::seed_from_u64(seed.wrapping_mul(7919).wrapping_add(1)),
        BS,
    )
}

fn write(path: &Path, data: &[u8]) {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).unwrap();
    }
    fs::write(path, data).unwrap();
}

/// A file of `len` bytes whose only data is `data` at `off` (the rest is a hole).
fn sparse(path: &Path, len: u64, off: u64, data: &[u8]) {
    let mut f = fs::File::create(path).unwrap();
    f.set_len(len).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(data).unwrap();
}

/// Whether the file system under `dir` reports holes through SEEK_DATA (ext4, xfs, tmpfs do).
fn reports_holes(dir: &Path) -> bool {
    let p = dir.join(".probe");
    sparse(&p, 1 << 20, 512 << 10, b"x");
    let f = fs::File::open(&p).unwrap();
    use std::os::unix::io::AsRawFd;
    // SAFETY: lseek on an open descriptor.
    let off = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    drop(f);
    fs::remove_file(&p).unwrap();
    off > 0
}

/// The independent model's answer.
fn python(dir: &Path) -> serde_json::Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/trace-dedup-ratio.py");
    let o = Command::new("python3")
        .arg(script)
        .arg("--files")
        .arg(dir)
        .output()
        .unwrap();
    json(&o)
}

/// The fixed tree of `fixed_tree_matches_hand_count`. Blocks A..F are random, Z is zero.
fn fixed_tree(root: &Path) {
    let (a, b, c, d, e) = (block(1), block(2), block(3), block(4), block(5));
    let f100 = &block(6)[..100];
    let z = vec![0u8; BS];
    let cat = |parts: &[&[u8]]| parts.concat();
    write(&root.join("a.bin"), &cat(&[&a, &b, &c]));
    write(&root.join("copy/a2.bin"), &cat(&[&a, &b, &c]));
    write(&root.join("shared.bin"), &cat(&[&d, &a, &e, &b]));
    // A partial last block is stored zero-padded: the same block as tail_pad.bin's only one.
    write(&root.join("tail.bin"), &cat(&[&a, f100]));
    write(&root.join("tail_pad.bin"), &cat(&[f100, &z[..BS - 100]]));
    write(&root.join("zeros.bin"), &cat(&[&z, &z, &z]));
    // 16 blocks, one random block written across the middle of blocks 5 and 6.
    sparse(
        &root.join("sparse.bin"),
        16 * BS as u64,
        5 * BS as u64 + 2048,
        &block(7),
    );
    write(&root.join("empty"), b"");
    write(&root.join("d1/d2/d3/deep.bin"), &cat(&[&c, &z, b"x"]));
    fs::hard_link(root.join("a.bin"), root.join("hard.link")).unwrap();
    std::os::unix::fs::symlink("a.bin", root.join("sym.link")).unwrap();
    std::os::unix::fs::symlink("copy", root.join("symdir")).unwrap();
}

#[test]
fn fixed_tree_matches_hand_count() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("tree");
    fixed_tree(&root);
    let v = json(&nodup(&["estimate", "--json", s(&root)]));
    // Files: a, a2, shared, tail, tail_pad, zeros, sparse, empty, deep (the hard link is a,
    // symlinks store nothing). Blocks: 3+3+4+2+1+3+2+0+3 = 21 with the sparse file's two data
    // blocks; distinct: A B C D E F' Z S5 S6 X = 10.
    let holes = reports_holes(t.path());
    let blocks: u64 = if holes { 21 } else { 35 };
    assert_eq!(v["files"], 9);
    assert_eq!(v["logical_bytes"], blocks * 4096);
    assert_eq!(v["physical_bytes"], 10 * 4096);
    assert_eq!(v["bytes_saved"], (blocks - 10) * 4096);
    assert_eq!(v["unique_blocks"], 10);
    assert_eq!(v["unreadable"], 0);
    let ratio = v["dedup_ratio"].as_f64().unwrap();
    assert!((ratio - (1.0 - 10.0 / blocks as f64)).abs() < 1e-12);
    let factor = v["dedup_factor"].as_f64().unwrap();
    assert!((factor - blocks as f64 / 10.0).abs() < 1e-12);
    assert_eq!(v["light_index_bytes"], nodup_core::index::memory_for(10));
    if holes {
        // Walk order a, a2, deep, empty, shared, sparse, tail, tail_pad, zeros gives the stream
        // ABC ABC CZX DAEB S5S6 AF' F' ZZZ; the duplicates' LRU depths are
        // 3 3 3 1 6 7 5 1 9 1 1, so all 11 (>= 95 %) need 9 entries.
        assert_eq!(v["smart_model_entries_95"], 9);
        assert_eq!(v["smart_model_bytes_95"], 9 * 16);
    }

    let py = python(&root);
    for k in ["files", "logical_bytes", "physical_bytes"] {
        assert_eq!(v[k], py[k], "{k}");
    }

    let o = nodup(&["estimate", s(&root)]);
    assert!(o.status.success());
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.starts_with("nodup estimate: 9 files, "), "{out}");
    assert!(out.contains("smart (LRU model"), "{out}");
}

/// A random tree with known kinds of sharing, hard links, symlinks, holes and nesting.
fn random_tree(root: &Path, seed: u64) {
    let mut r = StdRng::seed_from_u64(seed);
    let pool: Vec<Vec<u8>> = (0..12).map(|i| block(seed * 100 + i)).collect();
    let mut made: Vec<PathBuf> = Vec::new();
    for i in 0..60 {
        let depth = r.gen_range(0..4u64);
        let mut p = root.to_path_buf();
        for _ in 0..depth {
            p.push(format!("d{}", r.gen_range(0..3u64)));
        }
        p.push(format!("f{i}"));
        match r.gen_range(0..8u64) {
            // Identical copy of an earlier file.
            0 if !made.is_empty() => {
                let src = &made[r.gen_range(0..made.len() as u64) as usize];
                let data = fs::read(src).unwrap();
                write(&p, &data);
            }
            // Hard link or symlink to an earlier file.
            1 if !made.is_empty() => {
                let src = made[r.gen_range(0..made.len() as u64) as usize].clone();
                fs::create_dir_all(p.parent().unwrap()).unwrap();
                if r.gen_range(0..2u64) == 0 {
                    fs::hard_link(&src, &p).unwrap();
                } else {
                    std::os::unix::fs::symlink(&src, &p).unwrap();
                }
                continue;
            }
            // Sparse: a hole-y file with a few random writes.
            2 => {
                fs::create_dir_all(p.parent().unwrap()).unwrap();
                let len = (1 + r.gen_range(0..40u64)) * BS as u64 + r.gen_range(0..BS as u64);
                let off = r.gen_range(0..len);
                let n = 1 + r.gen_range(0..3 * BS as u64) as usize;
                let data = bytes(&mut r, n);
                sparse(&p, len, off, &data);
            }
            // Pool blocks at aligned offsets, zero blocks, and maybe a partial tail.
            _ => {
                let mut data = Vec::new();
                for _ in 0..r.gen_range(0..8u64) {
                    match r.gen_range(0..6u64) {
                        0 => data.extend_from_slice(&[0u8; BS]),
                        _ => data.extend_from_slice(&pool[r.gen_range(0..12u64) as usize]),
                    }
                }
                if r.gen_range(0..2u64) == 0 {
                    let n = r.gen_range(0..BS as u64) as usize;
                    data.extend_from_slice(&pool[r.gen_range(0..12u64) as usize][..n]);
                }
                write(&p, &data);
            }
        }
        made.push(p);
    }
}

#[test]
fn random_trees_match_the_python_model() {
    for seed in 1..=4u64 {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("tree");
        random_tree(&root, seed);
        let v = json(&nodup(&["estimate", "--json", s(&root)]));
        let py = python(&root);
        for k in ["files", "logical_bytes", "physical_bytes"] {
            assert_eq!(v[k], py[k], "seed {seed}: {k}");
        }
        let (a, b) = (v["dedup_ratio"].as_f64(), py["dedup_ratio"].as_f64());
        assert!((a.unwrap() - b.unwrap()).abs() <= 1e-12, "seed {seed}");
        assert!(v["physical_bytes"].as_u64() < v["logical_bytes"].as_u64());
    }
}

#[test]
fn missing_path_is_one_line_and_fails() {
    let t = tempfile::tempdir().unwrap();
    let missing = t.path().join("nope");
    let o = nodup(&["estimate", s(t.path()), s(&missing)]);
    assert!(!o.status.success());
    assert!(o.stdout.is_empty());
    let err = String::from_utf8(o.stderr).unwrap();
    assert_eq!(
        err,
        format!("nodup: {}: No such file or directory\n", missing.display())
    );
}

/// Mode, size, mtime (s, ns), inode, and contents or link target of one tree entry.
type Observed = (u32, u64, i64, i64, u64, Vec<u8>);

/// Everything observable about a tree: type, size, mtime, inode, contents, link targets.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Observed> {
    let mut m = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = fs::symlink_metadata(&p).unwrap();
        let body = if md.file_type().is_file() {
            fs::read(&p).unwrap()
        } else if md.file_type().is_symlink() {
            fs::read_link(&p)
                .unwrap()
                .into_os_string()
                .into_encoded_bytes()
        } else {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
            Vec::new()
        };
        let key = (
            md.mode(),
            md.len(),
            md.mtime(),
            md.mtime_nsec(),
            md.ino(),
            body,
        );
        m.insert(p, key);
    }
    m
}

#[test]
fn estimate_only_reads() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("tree");
    fixed_tree(&root);
    random_tree(&root.join("rnd"), 9);
    let before = snapshot(t.path());
    json(&nodup(&["estimate", "--json", s(&root)]));
    assert!(nodup(&["estimate", s(&root)]).status.success());
    assert_eq!(snapshot(t.path()), before);
}

#[test]
fn unreadable_file_is_skipped_with_one_warning() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        eprintln!("skipped: root reads files whatever their mode");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    write(&t.path().join("ok"), &block(1));
    let bad = t.path().join("secret");
    write(&bad, &block(2));
    fs::set_permissions(&bad, fs::Permissions::from_mode(0o000)).unwrap();
    let o = nodup(&["estimate", "--json", s(t.path())]);
    let v = json(&o);
    assert_eq!(v["files"], 1);
    assert_eq!(v["unreadable"], 1);
    assert_eq!(v["logical_bytes"], 4096);
    let err = String::from_utf8(o.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("secret") && err.contains("Permission denied"),
        "{err}"
    );
}
