//! Random operations on the file system (no FUSE, MemMedium) against a simple in-memory model,
//! with clean reopen and crash reopen (failure recovery) in between; fsck after each reopen.

mod common;

use nodup_core::media::{Medium, MemMedium};
use nodup_core::BLOCK_SIZE;
use nodup_fs::fs::falloc;
use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::{fsck, Caller, FileSystem, FsOptions, MediumKind};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

const BS: u64 = BLOCK_SIZE as u64;
const NAMES: usize = 6;

#[derive(Clone, Default, Debug)]
struct MFile {
    size: u64,
    blocks: BTreeMap<u64, Vec<u8>>,
}

impl MFile {
    fn write(&mut self, off: u64, data: &[u8]) {
        let mut pos = off;
        let end = off + data.len() as u64;
        while pos < end {
            let fb = pos / BS;
            let bo = (pos % BS) as usize;
            let take = ((BS - bo as u64).min(end - pos)) as usize;
            let blk = self.blocks.entry(fb).or_insert_with(|| vec![0; BLOCK_SIZE]);
            let s = (pos - off) as usize;
            blk[bo..bo + take].copy_from_slice(&data[s..s + take]);
            pos += take as u64;
        }
        self.size = self.size.max(end);
    }
    fn truncate(&mut self, size: u64) {
        if size < self.size {
            let keep = size.div_ceil(BS);
            self.blocks.retain(|&fb, _| fb < keep);
            if !size.is_multiple_of(BS) {
                if let Some(b) = self.blocks.get_mut(&(size / BS)) {
                    b[(size % BS) as usize..].fill(0);
                }
            }
        }
        self.size = size;
    }
    fn punch(&mut self, off: u64, len: u64) {
        let end = (off + len).min(self.size);
        let mut pos = off;
        while pos < end {
            let fb = pos / BS;
            let bo = (pos % BS) as usize;
            let take = ((BS - bo as u64).min(end - pos)) as usize;
            if let Some(b) = self.blocks.get_mut(&fb) {
                b[bo..bo + take].fill(0);
            }
            pos += take as u64;
        }
    }
}

#[derive(Default, Debug)]
struct Model {
    names: HashMap<usize, u64>,
    files: HashMap<u64, MFile>,
    next: u64,
}

#[derive(Debug, Clone)]
enum Op {
    Create(usize),
    Write(usize, u64, usize, u8, bool),
    Truncate(usize, u64),
    Punch(usize, u64, u64),
    Rename(usize, usize),
    Link(usize, usize),
    Unlink(usize),
    Checkpoint,
    /// copy_file_range(a, off_in, b, off_out, len)
    Copy(usize, u64, usize, u64, u64),
    Reopen,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    let name = 0..NAMES;
    prop_oneof![
        2 => name.clone().prop_map(Op::Create),
        6 => (name.clone(), prop_oneof![4 => 0u64..80_000, 1 => (5u64 << 30)..(5u64 << 30) + 20_000],
              1usize..40_000, 0u8..4, any::<bool>())
            .prop_map(|(n, o, l, p, r)| Op::Write(n, o, l, p, r)),
        2 => (name.clone(), 0u64..90_000).prop_map(|(n, s)| Op::Truncate(n, s)),
        2 => (name.clone(), 0u64..80_000, 1u64..40_000).prop_map(|(n, o, l)| Op::Punch(n, o, l)),
        1 => (name.clone(), name.clone()).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => (name.clone(), name.clone()).prop_map(|(a, b)| Op::Link(a, b)),
        1 => name.clone().prop_map(Op::Unlink),
        2 => Just(Op::Checkpoint),
        2 => (name.clone(), prop_oneof![3 => (0u64..16).prop_map(|b| b * BS), 1 => 0u64..70_000],
              name.clone(), prop_oneof![3 => (0u64..16).prop_map(|b| b * BS), 1 => 0u64..70_000],
              1u64..90_000)
            .prop_map(|(a, oi, b, oo, l)| Op::Copy(a, oi, b, oo, l)),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
    ]
}

fn fname(i: usize) -> Vec<u8> {
    format!("f{i}").into_bytes()
}

/// Duplicate-heavy content: every block of one pattern is identical; `random` adds unique bytes.
fn content(off: u64, len: usize, pat: u8, random: bool, salt: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = off + i;
            if random {
                let mut z = (x / 8) ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                (z >> (8 * (x % 8))) as u8
            } else {
                pat.wrapping_mul(37).wrapping_add((x % 13) as u8)
            }
        })
        .collect()
}

fn fresh(medium: &Arc<MemMedium>) -> FileSystem {
    common::format(medium.clone(), MediumKind::Pmem)
}

fn check(fs: &FileSystem, m: &Model) {
    for i in 0..NAMES {
        let got = fs.lookup(ROOT_INO, &fname(i));
        match m.names.get(&i) {
            None => assert!(got.is_err(), "f{i} should not exist"),
            Some(id) => {
                let (ino, attr) = got.unwrap();
                let mf = &m.files[id];
                assert_eq!(attr.size, mf.size, "size of f{i}");
                let links = m.names.values().filter(|x| *x == id).count() as u32;
                assert_eq!(attr.nlink, links, "nlink of f{i}");
                // Every block the model has, plus the block after each of them (hole or tail).
                let mut fbs: Vec<u64> = mf.blocks.keys().flat_map(|&b| [b, b + 1]).collect();
                fbs.push(0);
                for fb in fbs {
                    if fb * BS >= mf.size {
                        continue;
                    }
                    let data = fs.read(ino, fb * BS, BLOCK_SIZE).unwrap();
                    let want_len = ((mf.size - fb * BS).min(BS)) as usize;
                    assert_eq!(data.len(), want_len);
                    match mf.blocks.get(&fb) {
                        Some(b) => assert!(data == b[..want_len], "f{i} block {fb} differs"),
                        None => assert!(data.iter().all(|&x| x == 0), "f{i} hole {fb} not zero"),
                    }
                }
            }
        }
    }
}

fn reopen(fs: FileSystem, medium: &Arc<MemMedium>, crash: bool) -> (FileSystem, Arc<MemMedium>) {
    let bytes = if crash {
        // Crash: the DRAM state is lost; the medium holds whatever was written.
        let b = medium.snapshot();
        drop(fs);
        b
    } else {
        fs.shutdown().unwrap();
        drop(fs);
        medium.snapshot()
    };
    let m2 = Arc::new(MemMedium::from_bytes(bytes));
    let fs = FileSystem::open(m2.clone(), &FsOptions::default()).unwrap();
    assert_eq!(fs.recovery().kind, if crash { "failure" } else { "clean" });
    let rep = fsck::check(&fs, false).unwrap();
    assert!(rep.consistent(), "fsck after reopen: {:?}", rep.problems);
    (fs, m2)
}

fn run(ops: Vec<Op>) {
    let mut medium = Arc::new(MemMedium::new(48 << 20));
    let mut fs = fresh(&medium);
    let mut m = Model::default();
    let who = Caller {
        uid: 0,
        gid: 0,
        umask: 0,
    };
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Create(i) => {
                let r = fs.mknod(ROOT_INO, &fname(i), Kind::File, 0o644, 0, b"", who);
                if let std::collections::hash_map::Entry::Vacant(e) = m.names.entry(i) {
                    r.unwrap();
                    m.next += 1;
                    e.insert(m.next);
                    m.files.insert(m.next, MFile::default());
                } else {
                    assert!(r.is_err());
                }
            }
            Op::Write(i, off, len, pat, random) => {
                if let Some(id) = m.names.get(&i) {
                    let (ino, _) = fs.lookup(ROOT_INO, &fname(i)).unwrap();
                    let data = content(off, len, pat, random, step as u64);
                    assert_eq!(fs.write(ino, off, &data).unwrap(), len);
                    m.files.get_mut(id).unwrap().write(off, &data);
                }
            }
            Op::Truncate(i, size) => {
                if let Some(id) = m.names.get(&i) {
                    let (ino, _) = fs.lookup(ROOT_INO, &fname(i)).unwrap();
                    fs.truncate(ino, size).unwrap();
                    m.files.get_mut(id).unwrap().truncate(size);
                }
            }
            Op::Punch(i, off, len) => {
                if let Some(id) = m.names.get(&i) {
                    let (ino, _) = fs.lookup(ROOT_INO, &fname(i)).unwrap();
                    fs.fallocate(ino, off, len, falloc::PUNCH_HOLE | falloc::KEEP_SIZE)
                        .unwrap();
                    m.files.get_mut(id).unwrap().punch(off, len);
                }
            }
            Op::Rename(a, b) => {
                let r = fs.rename(ROOT_INO, &fname(a), ROOT_INO, &fname(b), 0);
                match m.names.get(&a).copied() {
                    None => assert!(r.is_err()),
                    Some(id) => {
                        r.unwrap();
                        if a != b {
                            m.names.remove(&a);
                            if m.names.get(&b) == Some(&id) {
                                // Renaming onto another link of the same file: POSIX no-op.
                                m.names.insert(a, id);
                            } else {
                                m.names.insert(b, id);
                            }
                        }
                    }
                }
            }
            Op::Link(a, b) => {
                let r = fs
                    .lookup(ROOT_INO, &fname(a))
                    .and_then(|(ino, _)| fs.link(ino, ROOT_INO, &fname(b)));
                match (m.names.get(&a).copied(), m.names.contains_key(&b)) {
                    (Some(id), false) => {
                        r.unwrap();
                        m.names.insert(b, id);
                    }
                    _ => assert!(r.is_err()),
                }
            }
            Op::Unlink(i) => {
                let r = fs.unlink(ROOT_INO, &fname(i));
                match m.names.remove(&i) {
                    Some(_) => r.unwrap(),
                    None => assert!(r.is_err()),
                }
            }
            Op::Checkpoint => fs.checkpoint(false).unwrap(),
            Op::Copy(a, oi, b, oo, l) => {
                if let (Some(&ia), Some(&ib)) = (m.names.get(&a), m.names.get(&b)) {
                    let (sa, _) = fs.lookup(ROOT_INO, &fname(a)).unwrap();
                    let (sb, _) = fs.lookup(ROOT_INO, &fname(b)).unwrap();
                    let src = m.files[&ia].clone();
                    let n = l.min(src.size.saturating_sub(oi));
                    let overlap = ia == ib && n > 0 && oi < oo + n && oo < oi + n;
                    let r = fs.copy_range(sa, oi, sb, oo, l);
                    if overlap {
                        assert!(r.is_err(), "overlapping copy within one file accepted");
                    } else {
                        let n = r.unwrap();
                        let want = l.min(src.size.saturating_sub(oi));
                        assert_eq!(n, want);
                        if n > 0 {
                            let mut data = vec![0u8; n as usize];
                            for (fb, blk) in &src.blocks {
                                let (s0, e0) = (fb * BS, fb * BS + BS);
                                let (lo, hi) = (s0.max(oi), e0.min(oi + n));
                                if lo < hi {
                                    data[(lo - oi) as usize..(hi - oi) as usize].copy_from_slice(
                                        &blk[(lo - s0) as usize..(hi - s0) as usize],
                                    );
                                }
                            }
                            m.files.get_mut(&ib).unwrap().write(oo, &data);
                        }
                    }
                }
            }
            Op::Reopen | Op::Crash => {
                let (f2, m2) = reopen(fs, &medium, matches!(op, Op::Crash));
                fs = f2;
                medium = m2;
            }
        }
        m.files.retain(|id, _| m.names.values().any(|x| x == id));
        check(&fs, &m);
    }
    let rep = fsck::check(&fs, false).unwrap();
    assert!(rep.consistent(), "final fsck: {:?}", rep.problems);
    // Logical bytes are exactly the mapped blocks of the model's files (holes excluded).
    let (f2, _) = reopen(fs, &medium, true);
    check(&f2, &m);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn random_ops_match_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops);
    }
}

#[test]
fn duplicates_are_shared_and_stats_add_up() {
    let medium = Arc::new(MemMedium::new(32 << 20));
    let fs = fresh(&medium);
    let who = Caller::default();
    let data = content(0, 64 * BLOCK_SIZE, 1, true, 9);
    for i in 0..4 {
        let (ino, _) = fs
            .mknod(ROOT_INO, &fname(i), Kind::File, 0o644, 0, b"", who)
            .unwrap();
        fs.write(ino, 0, &data).unwrap();
    }
    let s = fs.stats_json();
    assert_eq!(s["logical_bytes"], 4 * 64 * BS);
    assert_eq!(s["physical_bytes"], 64 * BS);
    assert!((s["dedup_ratio"].as_f64().unwrap() - 0.75).abs() < 1e-9);
    for key in [
        "policy",
        "block_size",
        "blocks_written",
        "dedup_hits",
        "fp_collisions",
        "media_bytes_written",
        "media_bytes_read",
        "meta_bytes_written",
        "meta_bytes_read",
        "index_entries",
        "index_memory_bytes",
    ] {
        assert!(s.get(key).is_some(), "stats key {key} missing");
    }
    // Unlinking every copy gives every block back.
    for i in 0..4 {
        fs.unlink(ROOT_INO, &fname(i)).unwrap();
    }
    let s = fs.stats_json();
    assert_eq!(s["physical_bytes"], 0);
    assert_eq!(s["logical_bytes"], 0);
}

#[test]
fn full_device_gives_enospc_and_keeps_old_data() {
    let medium = Arc::new(MemMedium::new(8 << 20));
    let fs = fresh(&medium);
    let (ino, _) = fs
        .mknod(
            ROOT_INO,
            b"big",
            Kind::File,
            0o644,
            0,
            b"",
            Caller::default(),
        )
        .unwrap();
    let mut off = 0u64;
    let err = loop {
        let chunk = content(off, 256 * 1024, 0, true, off);
        match fs.write(ino, off, &chunk) {
            Ok(n) => off += n as u64,
            Err(e) => break e,
        }
        assert!(off < (16 << 20), "never ran out of space");
    };
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(off > 0);
    let back = fs.read(ino, 0, off as usize).unwrap();
    assert!(
        back == content(0, off as usize, 0, true, 0)[..] || {
            // Each chunk had its own salt; compare chunk by chunk.
            (0..off).step_by(256 * 1024).all(|o| {
                let want = content(o, 256 * 1024, 0, true, o);
                back[o as usize..o as usize + 256 * 1024] == want[..]
            })
        }
    );
    // A clean unmount still works on the full device, and the data survives it.
    fs.shutdown().unwrap();
    drop(fs);
    let m2 = Arc::new(MemMedium::from_bytes(medium.snapshot()));
    let fs = FileSystem::open(m2, &FsOptions::default()).unwrap();
    let (ino, attr) = fs.lookup(ROOT_INO, b"big").unwrap();
    assert_eq!(attr.size, off);
    let again = fs.read(ino, 0, off as usize).unwrap();
    assert!(again == back);
}

#[test]
fn parallel_writers_of_identical_content() {
    let medium = Arc::new(MemMedium::new(64 << 20));
    let fs = Arc::new(fresh(&medium));
    let data = Arc::new(content(0, 256 * BLOCK_SIZE, 3, true, 77));
    let mut inos = Vec::new();
    for i in 0..4 {
        inos.push(
            fs.mknod(
                ROOT_INO,
                &fname(i),
                Kind::File,
                0o644,
                0,
                b"",
                Caller::default(),
            )
            .unwrap()
            .0,
        );
    }
    let handles: Vec<_> = inos
        .iter()
        .map(|&ino| {
            let fs = fs.clone();
            let data = data.clone();
            std::thread::spawn(move || {
                for chunk in 0..4u64 {
                    let s = (chunk * 64 * BS) as usize;
                    fs.write(ino, chunk * 64 * BS, &data[s..s + 64 * BLOCK_SIZE])
                        .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for &ino in &inos {
        assert!(fs.read(ino, 0, data.len()).unwrap() == *data);
    }
    let s = fs.stats_json();
    // Racing first writes of the same block may both be written (engine behaviour), so the
    // amount shared depends on scheduling; never more than was written.
    let phys = s["physical_bytes"].as_u64().unwrap();
    assert!((256 * BS..=4 * 256 * BS).contains(&phys), "{s}");
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

#[test]
fn not_nodup_and_corrupt_images_are_refused_without_writes() {
    let junk = Arc::new(MemMedium::from_bytes(vec![7u8; 8 << 20]));
    let before = junk.snapshot();
    let err = FileSystem::open(junk.clone(), &FsOptions::default())
        .err()
        .unwrap();
    assert!(matches!(err, nodup_fs::FsError::NotNodup(_)), "{err}");
    assert!(junk.snapshot() == before);

    let medium = Arc::new(MemMedium::new(16 << 20));
    let fs = fresh(&medium);
    let (ino, _) = fs
        .mknod(ROOT_INO, b"a", Kind::File, 0o644, 0, b"", Caller::default())
        .unwrap();
    fs.write(ino, 0, b"hello").unwrap();
    fs.shutdown().unwrap();
    drop(fs);
    // Corrupt a unit of the checkpoint: open must fail and leave the image untouched.
    let mut bytes = medium.snapshot();
    let m = MemMedium::from_bytes(bytes.clone());
    let (sb, _, _) = nodup_fs::superblock::probe_medium(&m).unwrap();
    let (man, _) = nodup_fs::persist::load::read_manifest(&m, sb.ckpt_head, sb.ckpt_gen).unwrap();
    let at = (man.segs[0].head * BS) as usize
        + nodup_fs::chain::off::PAYLOAD
        + nodup_fs::persist::unit::UNIT_HEADER
        + 3;
    bytes[at] ^= 0xff;
    let bad = Arc::new(MemMedium::from_bytes(bytes));
    let before = bad.snapshot();
    let err = FileSystem::open(bad.clone(), &FsOptions::default())
        .err()
        .unwrap();
    assert!(matches!(err, nodup_fs::FsError::Corrupt(_)), "{err}");
    assert!(bad.snapshot() == before);
    let _ = bad.len();
}

/// Timing of a normal (clean) open with a kernel-tree-sized namespace; run with --ignored.
#[test]
#[ignore]
fn clean_open_time_many_files() {
    let path = std::path::PathBuf::from(format!(
        "/dev/shm/nodup-open-time-{}.img",
        std::process::id()
    ));
    let medium = nodup_fs::image::create(&path, 4 << 30, MediumKind::Pmem).unwrap();
    let fs = common::format(medium, MediumKind::Pmem);
    let t0 = std::time::Instant::now();
    let mut dir = ROOT_INO;
    for i in 0..160_000u64 {
        if i % 16 == 0 {
            dir = fs
                .mknod(
                    ROOT_INO,
                    format!("d{i}").as_bytes(),
                    Kind::Dir,
                    0o755,
                    0,
                    b"",
                    Caller::default(),
                )
                .unwrap()
                .0;
        }
        let (ino, _) = fs
            .mknod(
                dir,
                format!("f{i}").as_bytes(),
                Kind::File,
                0o644,
                0,
                b"",
                Caller::default(),
            )
            .unwrap();
        let len = 1 + (i % 5) as usize * 3000;
        fs.write(ino, 0, &content(0, len, (i % 200) as u8, i % 2 == 0, i))
            .unwrap();
    }
    eprintln!("populate: {:?}", t0.elapsed());
    let t0 = std::time::Instant::now();
    fs.shutdown().unwrap();
    eprintln!("clean shutdown: {:?}", t0.elapsed());
    drop(fs);
    let (m, _) = nodup_fs::image::open(&path).unwrap();
    let t0 = std::time::Instant::now();
    let fs = FileSystem::open(m, &FsOptions::default()).unwrap();
    eprintln!("clean open: {:?} ({:?})", t0.elapsed(), fs.recovery());
    drop(fs);
    let (m, _) = nodup_fs::image::open(&path).unwrap();
    let t0 = std::time::Instant::now();
    let fs = FileSystem::open(m, &FsOptions::default()).unwrap();
    eprintln!("crash open: {:?} ({:?})", t0.elapsed(), fs.recovery().kind);
    drop(fs);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn fsck_finds_and_repairs_damage() {
    let medium = Arc::new(MemMedium::new(32 << 20));
    let fs = fresh(&medium);
    let who = Caller::default();
    let (a, _) = fs
        .mknod(ROOT_INO, b"a", Kind::File, 0o644, 0, b"", who)
        .unwrap();
    fs.write(a, 0, &content(0, 10 * BLOCK_SIZE, 1, true, 1))
        .unwrap();
    let (d, _) = fs
        .mknod(ROOT_INO, b"d", Kind::Dir, 0o755, 0, b"", who)
        .unwrap();
    fs.link(a, d, b"a2").unwrap();
    assert!(fsck::check(&fs, false).unwrap().consistent());
    // Damage: a wrong link count, a block that is not a data block, a dangling entry.
    fs.with_tables(|t| {
        t.get(a).unwrap().write().attr.nlink = 5;
        t.get(a).unwrap().write().map_mut().unwrap().set(3, 1);
        t.get(d)
            .unwrap()
            .write()
            .dir_mut()
            .unwrap()
            .insert(b"ghost", 999_999);
    });
    let rep = fsck::check(&fs, false).unwrap();
    assert!(!rep.consistent());
    assert!(
        rep.problems.iter().any(|p| p.contains("link count")),
        "{:?}",
        rep.problems
    );
    assert!(
        rep.problems
            .iter()
            .any(|p| p.contains("invalid physical block")),
        "{:?}",
        rep.problems
    );
    assert!(
        rep.problems.iter().any(|p| p.contains("missing inode")),
        "{:?}",
        rep.problems
    );
    let rep = fsck::check(&fs, true).unwrap();
    assert!(!rep.repaired.is_empty());
    assert!(rep.consistent(), "after repair: {:?}", rep.problems);
    let rep = fsck::check(&fs, false).unwrap();
    assert!(rep.consistent(), "recheck: {:?}", rep.problems);
    assert_eq!(fs.getattr(a).unwrap().nlink, 2);
    // The repaired state survives a crash reopen.
    let m2 = Arc::new(MemMedium::from_bytes(medium.snapshot()));
    drop(fs);
    let fs = FileSystem::open(m2, &FsOptions::default()).unwrap();
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

#[test]
fn directory_operations_survive_replay() {
    let medium = Arc::new(MemMedium::new(32 << 20));
    let fs = fresh(&medium);
    let who = Caller::default();
    let mk = |p: u64, n: &[u8]| fs.mknod(p, n, Kind::Dir, 0o755, 0, b"", who).unwrap().0;
    let a = mk(ROOT_INO, b"a");
    let b = mk(ROOT_INO, b"b");
    let c = mk(a, b"c");
    let e = mk(b, b"e");
    let (f, _) = fs.mknod(c, b"f", Kind::File, 0o644, 0, b"", who).unwrap();
    fs.write(f, 0, b"data in a/c/f").unwrap();
    fs.mknod(c, b"l", Kind::Symlink, 0o777, 0, b"../../b", who)
        .unwrap();
    fs.mknod(c, b"p", Kind::Fifo, 0o600, 0, b"", who).unwrap();
    fs.setxattr(c, b"user.k", b"v", 0).unwrap();
    // Move a/c under b, replacing the empty directory b/e.
    assert_eq!(
        fs.rename(a, b"c", b, b"e", 0).map_err(|e| e.errno()),
        Ok(())
    );
    assert_eq!(
        fs.getattr(e).map_err(|x| x.errno()),
        Err(libc::ENOENT),
        "replaced dir is gone"
    );
    assert_eq!(
        fs.rename(ROOT_INO, b"b", c, b"x", 0).map_err(|e| e.errno()),
        Err(libc::EINVAL)
    );
    assert_eq!(
        fs.rmdir(ROOT_INO, b"b").map_err(|e| e.errno()),
        Err(libc::ENOTEMPTY)
    );
    assert_eq!(
        fs.rename(
            ROOT_INO,
            b"a",
            ROOT_INO,
            b"b",
            nodup_fs::fs::rename_flags::NOREPLACE
        )
        .map_err(|e| e.errno()),
        Err(libc::EEXIST)
    );
    fs.rmdir(ROOT_INO, b"a").unwrap();
    let expect = |fs: &FileSystem| {
        assert!(fs.lookup(ROOT_INO, b"a").is_err());
        let (b2, battr) = fs.lookup(ROOT_INO, b"b").unwrap();
        assert_eq!(b2, b);
        assert_eq!(battr.nlink, 3, "b has one subdirectory");
        let (c2, cattr) = fs.lookup(b, b"e").unwrap();
        assert_eq!(c2, c, "e is the moved directory");
        assert_eq!(cattr.nlink, 2);
        assert_eq!(fs.lookup(c, b"..").unwrap().0, b);
        assert_eq!(
            fs.readlink(fs.lookup(c, b"l").unwrap().0).unwrap(),
            b"../../b"
        );
        assert_eq!(fs.lookup(c, b"p").unwrap().1.kind, Kind::Fifo);
        assert_eq!(fs.getxattr(c, b"user.k").unwrap(), b"v");
        let (f2, _) = fs.lookup(c, b"f").unwrap();
        assert_eq!(fs.read(f2, 0, 100).unwrap(), b"data in a/c/f");
        assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 3);
        let names: Vec<Vec<u8>> = fs
            .readdir(c, 0, 100)
            .unwrap()
            .into_iter()
            .map(|e| e.3)
            .collect();
        assert_eq!(names.len(), 5, "., .., f, l, p");
        assert!(fsck::check(fs, false).unwrap().consistent());
    };
    expect(&fs);
    let (fs, m2) = reopen(fs, &medium, true);
    expect(&fs);
    let (fs, _) = reopen(fs, &m2, false);
    expect(&fs);
}

/// An ACL value: (tag, perm, id) entries in the kernel's xattr format (the id of entries
/// other than named users and groups is written as "undefined", as the kernel does).
fn acl_value(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        let id = if tag == 2 || tag == 8 { id } else { u32::MAX };
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

#[test]
fn acl_rules_are_the_same_after_replay() {
    use nodup_fs::acl::{ACL_ACCESS, ACL_DEFAULT};
    let medium = Arc::new(MemMedium::new(32 << 20));
    let fs = fresh(&medium);
    let who = Caller {
        uid: 0,
        gid: 0,
        umask: 0o022,
    };
    let (d, _) = fs
        .mknod(ROOT_INO, b"d", Kind::Dir, 0o777, 0, b"", who)
        .unwrap();
    assert_eq!(
        fs.getattr(d).unwrap().perm,
        0o755,
        "umask applies without a default ACL"
    );
    let def = acl_value(&[(1, 7, 0), (2, 7, 99), (4, 5, 0), (0x10, 7, 0), (0x20, 0, 0)]);
    fs.setxattr(d, ACL_DEFAULT, &def, 0).unwrap();
    // Invalid ACLs are refused before anything is logged.
    assert_eq!(
        fs.setxattr(d, ACL_ACCESS, b"\x02\0\0\0junk", 0)
            .map_err(|e| e.errno()),
        Err(libc::EINVAL)
    );
    let (f, _) = fs.mknod(d, b"f", Kind::File, 0o666, 0, b"", who).unwrap();
    let (s, _) = fs.mknod(d, b"s", Kind::Dir, 0o777, 0, b"", who).unwrap();
    let (g, _) = fs
        .mknod(ROOT_INO, b"g", Kind::File, 0o644, 0, b"", who)
        .unwrap();
    fs.setxattr(
        g,
        ACL_ACCESS,
        &acl_value(&[(1, 6, 0), (2, 4, 7), (4, 4, 0), (0x10, 4, 0), (0x20, 0, 0)]),
        0,
    )
    .unwrap();
    let set = |ino, mode| {
        let req = nodup_fs::fs::SetAttr {
            mode: Some(mode),
            ..Default::default()
        };
        fs.setattr(ino, &req).unwrap();
    };
    set(g, 0o751);
    let (h, _) = fs
        .mknod(ROOT_INO, b"h", Kind::File, 0o644, 0, b"", who)
        .unwrap();
    // An ACL of the base entries only sets the mode and is not kept.
    fs.setxattr(
        h,
        ACL_ACCESS,
        &acl_value(&[(1, 4, 0), (4, 0, 0), (0x20, 0, 0)]),
        0,
    )
    .unwrap();
    let state = |fs: &FileSystem| {
        [d, f, s, g, h]
            .iter()
            .map(|&i| {
                (
                    fs.getattr(i).unwrap().perm,
                    fs.getxattr(i, ACL_ACCESS).ok(),
                    fs.getxattr(i, ACL_DEFAULT).ok(),
                )
            })
            .collect::<Vec<_>>()
    };
    let before = state(&fs);
    assert_eq!(
        before[1].0, 0o660,
        "file mode from the default ACL, not the umask"
    );
    assert!(before[1].1.is_some() && before[1].2.is_none());
    assert_eq!(before[2].0, 0o770);
    assert_eq!(
        before[2].2.as_deref(),
        Some(&def[..]),
        "subdirectory inherits the default"
    );
    assert_eq!(before[3].0, 0o751, "chmod after the ACL");
    assert_eq!(
        before[3].1.as_deref(),
        Some(&acl_value(&[(1, 7, 0), (2, 4, 7), (4, 4, 0), (0x10, 5, 0), (0x20, 1, 0)])[..]),
        "chmod rewrote owner, mask and other"
    );
    assert_eq!((before[4].0, before[4].1.is_none()), (0o400, true));
    // The same after a crash (log replay) and after a clean reopen (checkpoint).
    let (fs, m2) = reopen(fs, &medium, true);
    assert_eq!(state(&fs), before, "after replay");
    let (fs, _) = reopen(fs, &m2, false);
    assert_eq!(state(&fs), before, "after a checkpoint");
}
