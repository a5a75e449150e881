//! Checkpoints whose every unit decodes (valid checksums, possible attributes) but which
//! together describe a tree the file system cannot hold: the open refuses them without
//! writing, naming the problem and the way out; fsck reports them, `--repair` fixes them, and
//! the repaired image opens. The forgeries are written by the checkpoint writer itself, from an
//! inode table changed by hand, so they are exactly what a bug in the live paths would leave.

use crate::error::FsError;
use crate::fs::{FileSystem, FsOptions};
use crate::fsck;
use crate::inode::{Kind, ROOT_INO};
use crate::state::Tables;
use crate::superblock::MediumKind;
use crate::Caller;
use nodup_core::media::MemMedium;
use nodup_core::meta::MetaLayoutKind;
use nodup_core::policy::PolicyKind;
use nodup_core::FormatOptions;
use proptest::prelude::*;
use std::sync::Arc;

/// Inode numbers of the seeded tree: `/a/b/` and `/f`, also linked as `/a/g` (two blocks).
struct Tree {
    a: u64,
    b: u64,
    f: u64,
}

/// A cleanly unmounted 16 MiB image holding the seeded tree.
fn seeded() -> (Vec<u8>, Tree) {
    seeded_with(&FormatOptions::default())
}

/// [`seeded`], formatted with `fopts`.
fn seeded_with(fopts: &FormatOptions) -> (Vec<u8>, Tree) {
    let medium = Arc::new(MemMedium::new(16 << 20));
    let fs = FileSystem::format(
        medium.clone(),
        MediumKind::Pmem,
        fopts,
        &FsOptions::default(),
        Caller::default(),
    )
    .unwrap();
    let mk = |parent, name: &[u8], kind| {
        fs.mknod(parent, name, kind, 0o755, 0, b"", Caller::default())
            .unwrap()
            .0
    };
    let a = mk(ROOT_INO, b"a", Kind::Dir);
    let b = mk(a, b"b", Kind::Dir);
    let f = mk(ROOT_INO, b"f", Kind::File);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    fs.write(f, 0, &data).unwrap();
    fs.link(f, a, b"g").unwrap();
    fs.shutdown().unwrap();
    (medium.snapshot(), Tree { a, b, f })
}

fn open(img: &[u8], opts: &FsOptions) -> crate::error::Result<(Arc<MemMedium>, FileSystem)> {
    let m = Arc::new(MemMedium::from_bytes(img.to_vec()));
    let fs = FileSystem::open(m.clone(), opts)?;
    Ok((m, fs))
}

fn fsck_opts(read_only: bool) -> FsOptions {
    FsOptions {
        read_only,
        fsck: true,
        ..FsOptions::default()
    }
}

/// `img` with its checkpoint rewritten from its inode table changed by `forge`.
fn forged(img: &[u8], forge: impl FnOnce(&Tables)) -> Vec<u8> {
    let (m, fs) = open(img, &FsOptions::default()).unwrap();
    let t = fs.with_tables(|t| t.deep_copy());
    forge(&t);
    fs.replace_tables(t).unwrap();
    fs.shutdown().unwrap();
    drop(fs);
    m.snapshot()
}

/// `img` with block 1 of `/f` (inode `f`) mapped to `b`.
fn remapped(img: &[u8], f: u64, b: u64) -> Vec<u8> {
    forged(img, |tb| {
        tb.get(f).unwrap().write().map_mut().unwrap().set(1, b);
    })
}

/// The open refuses `img` as corrupt, writing nothing; returns the message.
fn refused(img: &[u8]) -> String {
    let m = Arc::new(MemMedium::from_bytes(img.to_vec()));
    let err = match FileSystem::open(m.clone(), &FsOptions::default()) {
        Ok(_) => panic!("the forged checkpoint was accepted"),
        Err(e) => e,
    };
    assert!(matches!(err, FsError::Corrupt(_)), "{err}");
    assert!(m.snapshot() == img, "a refused open wrote to the image");
    err.to_string()
}

/// fsck reports a problem in `img` without writing, `--repair` fixes it, and the repaired
/// image opens normally and checks consistent. Returns the problems reported and the repaired
/// image.
fn repaired(img: &[u8]) -> (Vec<String>, Vec<u8>) {
    let (m, fs) = open(img, &fsck_opts(true)).unwrap();
    let rep = fsck::check(&fs, false).unwrap();
    assert!(!rep.consistent(), "fsck found nothing");
    drop(fs);
    assert!(m.snapshot() == img, "a read-only fsck wrote to the image");
    let (m, fs) = open(img, &fsck_opts(false)).unwrap();
    let fixed = fsck::check(&fs, true).unwrap();
    assert!(fixed.consistent(), "after repair: {:?}", fixed.problems);
    fs.shutdown().unwrap();
    drop(fs);
    let fixed_img = m.snapshot();
    let (_, fs) = open(&fixed_img, &FsOptions::default()).expect("repaired image opens");
    let again = fsck::check(&fs, false).unwrap();
    assert!(again.consistent(), "{:?}", again.problems);
    (rep.problems, fixed_img)
}

/// Refused at open with `what` in the message; fsck reports `what` and repairs it.
fn refused_then_repaired(img: &[u8], what: &str) {
    let msg = refused(img);
    assert!(
        msg.contains(what) && msg.contains("fsck --repair"),
        "message: {msg}"
    );
    let (problems, _) = repaired(img);
    assert!(
        problems.iter().any(|p| p.contains(what)),
        "fsck: {problems:?}"
    );
}

/// A read-only open neither allocates nor frees: it takes `bad` (with a warning), so the data
/// of file `f` can be read or copied off before the repair, and writes nothing.
fn read_only_takes_it(bad: &[u8], f: u64) {
    let ro = FsOptions {
        read_only: true,
        ..FsOptions::default()
    };
    let (m, fs) = open(bad, &ro).expect("a read-only open");
    assert_eq!(fs.read(f, 0, 4096).unwrap().len(), 4096);
    drop(fs);
    assert!(m.snapshot() == bad, "a read-only open wrote to the image");
}

#[test]
fn the_unforged_image_opens() {
    let (img, _) = seeded();
    let same = forged(&img, |_| {});
    let (_, fs) = open(&same, &FsOptions::default()).unwrap();
    assert!(fsck::check(&fs, false).unwrap().consistent());
}

#[test]
fn a_second_name_for_a_directory_is_refused() {
    let (img, t) = seeded();
    // The second name comes after the first in the walk from the root: the first is kept.
    let bad = forged(&img, |tb| {
        let a = tb.get(t.a).unwrap();
        a.write().dir_mut().unwrap().insert(b"b2", t.b);
    });
    refused_then_repaired(&bad, "more than one parent");
}

#[test]
fn a_directory_holding_the_root_is_refused() {
    let (img, t) = seeded();
    let bad = forged(&img, |tb| {
        let a = tb.get(t.a).unwrap();
        a.write().dir_mut().unwrap().insert(b"up", ROOT_INO);
    });
    refused_then_repaired(&bad, "directory 1 has more than one parent");
}

#[test]
fn a_wrong_parent_pointer_is_refused() {
    let (img, t) = seeded();
    let bad = forged(&img, |tb| {
        tb.get(t.b).unwrap().write().dir_mut().unwrap().parent = ROOT_INO;
    });
    refused_then_repaired(&bad, "parent pointer is not");
}

#[test]
fn a_wrong_link_count_is_refused() {
    let (img, t) = seeded();
    let bad = forged(&img, |tb| tb.get(t.f).unwrap().write().attr.nlink = 1);
    refused_then_repaired(&bad, "link count 1 but 2 links");
}

#[test]
fn a_block_outside_the_data_area_is_refused() {
    let (img, t) = seeded();
    // Block 1 is the engine's client area, where the file system's superblocks live.
    let bad = remapped(&img, t.f, 1);
    refused_then_repaired(&bad, "invalid physical block 1");
}

/// A block of the engine's metadata layout (the region holding the dedup entries) is inside
/// the data area and off the file system's metadata, so the loader's bounds pass it; the open
/// checks the maps against the engine once both are read. Accepted, an unlink of `/f` would
/// free the region under the engine.
#[test]
fn a_block_of_the_engine_metadata_layout_is_refused() {
    let (img, t) = seeded();
    // More dedup entries than the fixed region holds: the layout takes data-area blocks.
    let (m, fs) = open(&img, &FsOptions::default()).unwrap();
    let big = crate::testing::create(&fs, b"big");
    let data: Vec<u8> = (0..300 * 4096u32)
        .map(|i| (i / 4096 + i % 7) as u8)
        .collect();
    fs.write(big, 0, &data).unwrap();
    let region = *fs
        .engine()
        .layout_blocks()
        .first()
        .expect("the light policy's region layout holds a block");
    fs.shutdown().unwrap();
    drop(fs);
    let img = m.snapshot();
    let bad = remapped(&img, t.f, region);
    assert!(refused(&bad).contains("(the engine's metadata holds it)"));
    refused_then_repaired(&bad, &format!("invalid physical block {region}"));
}

/// A block of a `smart` image's on-media fingerprint groups, which the open does not check (it
/// would read every group): fsck reports it as held twice, and --repair keeps the file's block
/// (the groups are only a finding aid) and rebuilds the groups elsewhere.
#[test]
fn a_block_of_the_store_groups_is_repaired_by_fsck() {
    let fo = FormatOptions {
        policy: PolicyKind::Smart,
        mem_budget: 64 << 10,
        meta_layout: MetaLayoutKind::default_for(PolicyKind::Smart),
        ..Default::default()
    };
    let (img, t) = seeded_with(&fo);
    let held = |img: &[u8]| {
        let (_, fs) = open(img, &fsck_opts(true)).unwrap();
        let mut v = Vec::new();
        fs.engine()
            .with_engine_owned_blocks(&mut |b, _| v.extend_from_slice(b));
        v
    };
    let group = *held(&img)
        .first()
        .expect("a clean shutdown leaves smart's groups on the medium");
    let bad = remapped(&img, t.f, group);
    assert!(
        held(&bad).contains(&group),
        "the forging shutdown moved the group"
    );
    let (problems, fixed) = repaired(&bad);
    assert!(
        problems.iter().any(|p| p.contains("held twice")),
        "{problems:?}"
    );
    // The file keeps the block; the groups moved off it.
    let (_, fs) = open(&fixed, &FsOptions::default()).unwrap();
    let mapped = fs.with_tables(|tb| tb.get(t.f).unwrap().read().map().unwrap().get(1));
    assert_eq!(mapped, group, "the file's block after repair");
    drop(fs);
    assert!(
        !held(&fixed).contains(&group),
        "a group still holds the file's block"
    );
}

/// A map onto a block the engine's allocator holds free: the next write could take the block
/// and overwrite the file.
#[test]
fn a_block_free_in_the_allocator_is_refused() {
    let (img, t) = seeded();
    let (_, fs) = open(&img, &fsck_opts(true)).unwrap();
    let (start, len) = fs.engine().data_area();
    let meta = fs.meta_blocks();
    // From the top: the forging checkpoint takes the lowest free blocks.
    let free = (start..start + len)
        .rev()
        .find(|&b| !fs.engine().allocator().is_allocated(b) && !meta.contains(&b))
        .expect("a free block");
    drop(fs);
    let bad = remapped(&img, t.f, free);
    let msg = refused(&bad);
    assert!(
        msg.contains(&format!("block {free} is mapped but free")),
        "{msg}"
    );
    refused_then_repaired(&bad, "free in the allocator");
    read_only_takes_it(&bad, t.f);
}

/// A reverse-map slot of a block in use overwritten (a torn write, a stray one): the first
/// release of the block would fail after its file let go of it.
#[test]
fn a_torn_reverse_map_is_refused() {
    let (img, t) = seeded();
    let (m, fs) = open(&img, &fsck_opts(true)).unwrap();
    let b = fs.with_tables(|tb| tb.get(t.f).unwrap().read().map().unwrap().get(0));
    assert!(fs.engine().block_refcount(b).unwrap().is_some(), "an entry");
    let esb = nodup_core::engine::superblock::Superblock::load(&*m).unwrap();
    drop(fs);
    let off = (esb.revmap_start * nodup_core::BLOCK_SIZE as u64 + b * 8) as usize;
    let mut bad = img.clone();
    bad[off..off + 8].copy_from_slice(&3u64.to_le_bytes());
    let msg = refused(&bad);
    assert!(
        msg.contains(&format!("reverse map of block {b} names 3")),
        "{msg}"
    );
    refused_then_repaired(&bad, "reverse map of");
    read_only_takes_it(&bad, t.f);
}

/// A map moved onto a block its file already maps: every block is allocated, but one the
/// engine counts in use is mapped by nothing (and the other is mapped twice on a count of one).
#[test]
fn a_block_the_maps_lost_is_refused() {
    let (img, t) = seeded();
    let (_, fs) = open(&img, &fsck_opts(true)).unwrap();
    let first = fs.with_tables(|tb| tb.get(t.f).unwrap().read().map().unwrap().get(0));
    drop(fs);
    let bad = remapped(&img, t.f, first);
    refused_then_repaired(&bad, "distinct blocks");
}

#[test]
fn a_block_past_the_end_of_file_is_refused() {
    let (img, t) = seeded();
    let bad = forged(&img, |tb| tb.get(t.f).unwrap().write().attr.size = 4096);
    refused_then_repaired(&bad, "mapped beyond the end of file");
}

#[test]
fn an_entry_for_a_missing_inode_is_refused() {
    let (img, t) = seeded();
    let bad = forged(&img, |tb| {
        tb.get(t.a)
            .unwrap()
            .write()
            .dir_mut()
            .unwrap()
            .insert(b"ghost", 99);
    });
    refused_then_repaired(&bad, "inode 99");
}

/// A checkpoint flaw that a later log record removes from the table: the open still refuses
/// the checkpoint (the log is checked against it), so fsck reports it though the table after
/// the log is sound, and --repair writes a checkpoint of that table.
#[test]
fn a_checkpoint_flaw_the_log_removed_is_reported_and_repaired() {
    let (img, t) = seeded();
    // `/f` maps two blocks but says 4096 bytes; the log then truncates it to nothing.
    let bad = forged(&img, |tb| tb.get(t.f).unwrap().write().attr.size = 4096);
    let (m, fs) = open(&bad, &fsck_opts(false)).unwrap();
    let shrink = crate::fs::SetAttr {
        size: Some(0),
        ..Default::default()
    };
    fs.setattr(t.f, &shrink).unwrap();
    let crashed = m.snapshot();
    drop(fs);
    let msg = refused(&crashed);
    assert!(msg.contains("mapped beyond the end of file"), "{msg}");
    let (_, fs) = open(&crashed, &fsck_opts(true)).unwrap();
    assert!(fsck::check_tree(&fs).is_empty(), "the table after the log");
    let rep = fsck::check(&fs, false).unwrap();
    assert!(
        rep.problems
            .iter()
            .any(|p| p.starts_with("checkpoint, before the log") && p.contains("beyond the end")),
        "{:?}",
        rep.problems
    );
    drop(fs);
    repaired(&crashed);
}

/// A change to an inode table, by hand.
type Forger<'a> = dyn Fn(&Tables) + 'a;

/// Attributes no inode can have fail the unit's decoding, for fsck too: there is no sound
/// table to repair towards.
#[test]
fn impossible_attributes_fail_decoding() {
    let (img, t) = seeded();
    let cases: [(&str, Box<Forger<'_>>); 4] = [
        (
            "mode bits beyond",
            Box::new(|tb| tb.get(t.f).unwrap().write().attr.perm = 0o170644),
        ),
        (
            "a size past the largest file",
            Box::new(|tb| tb.get(t.f).unwrap().write().attr.size = u64::MAX),
        ),
        (
            "a timestamp out of range",
            Box::new(|tb| tb.get(t.a).unwrap().write().attr.mtime.nsec = u32::MAX),
        ),
        (
            "an extended attribute of an impossible size",
            Box::new(|tb| {
                let n = tb.get(t.f).unwrap();
                n.write()
                    .xattrs
                    .insert(b"user.big".to_vec(), vec![7; 65537]);
            }),
        ),
    ];
    for (what, forge) in cases {
        let bad = forged(&img, forge);
        let msg = refused(&bad);
        assert!(msg.contains(what), "{what}: {msg}");
        let fsck_open = open(&bad, &fsck_opts(true));
        assert!(fsck_open.is_err(), "{what}: fsck opened it");
    }
}

/// One change to a table, aimed by indices into its inodes (taken modulo their count).
#[derive(Debug, Clone)]
enum Forge {
    /// Add an entry to a directory naming any inode (the root too).
    Entry(usize, usize),
    /// Remove a directory's entry.
    Unlink(usize),
    Nlink(usize, u32),
    /// Point a directory's parent at any inode.
    Parent(usize, usize),
    /// Map file block `.1` of a file to physical block `.2`.
    Block(usize, u64, u64),
    Size(usize, u64),
}

fn forge_strategy() -> impl Strategy<Value = Forge> {
    prop_oneof![
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Forge::Entry(a, b)),
        any::<usize>().prop_map(Forge::Unlink),
        // Not 0: the writer deletes an inode without links instead of writing it.
        (any::<usize>(), 1u32..5).prop_map(|(a, n)| Forge::Nlink(a, n)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Forge::Parent(a, b)),
        (any::<usize>(), 0u64..4, 0u64..4200).prop_map(|(a, f, b)| Forge::Block(a, f, b)),
        (any::<usize>(), 0u64..16384).prop_map(|(a, s)| Forge::Size(a, s)),
    ]
}

fn apply(tb: &Tables, f: &Forge) {
    let mut inos: Vec<u64> = tb.inodes.keys().copied().collect();
    inos.sort_unstable();
    let dirs: Vec<u64> = inos
        .iter()
        .copied()
        .filter(|&i| tb.get(i).unwrap().read().dir().is_some())
        .collect();
    let files: Vec<u64> = inos
        .iter()
        .copied()
        .filter(|&i| tb.get(i).unwrap().read().map().is_some())
        .collect();
    let pick = |v: &[u64], i: usize| v[i % v.len()];
    match *f {
        Forge::Entry(d, i) => {
            let name = format!("x{}", i % 97);
            let n = tb.get(pick(&dirs, d)).unwrap();
            n.write()
                .dir_mut()
                .unwrap()
                .insert(name.as_bytes(), pick(&inos, i));
        }
        Forge::Unlink(d) => {
            let n = tb.get(pick(&dirs, d)).unwrap();
            let mut n = n.write();
            let dir = n.dir_mut().unwrap();
            let first = dir.iter().next().map(|(k, _)| k.to_vec());
            if let Some(name) = first {
                dir.remove(&name);
            }
        }
        Forge::Nlink(i, k) => tb.get(pick(&inos, i)).unwrap().write().attr.nlink = k,
        Forge::Parent(d, p) => {
            let n = tb.get(pick(&dirs, d)).unwrap();
            n.write().dir_mut().unwrap().parent = pick(&inos, p);
        }
        Forge::Block(i, fb, b) => {
            if !files.is_empty() {
                let n = tb.get(pick(&files, i)).unwrap();
                n.write().map_mut().unwrap().set(fb, b);
            }
        }
        Forge::Size(i, s) => {
            if !files.is_empty() {
                tb.get(pick(&files, i)).unwrap().write().attr.size = s;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Whatever a checkpoint's units say together, the open either accepts a table fsck's
    /// table check finds sound, or refuses it without writing and fsck reports a problem; and
    /// fsck --repair always leaves an image that opens and checks consistent.
    #[test]
    fn any_forged_tree_is_refused_or_sound_and_repair_converges(
        forges in prop::collection::vec(forge_strategy(), 1..6)
    ) {
        let (img, _) = seeded();
        let bad = forged(&img, |tb| {
            for f in &forges {
                apply(tb, f);
            }
        });
        let m = Arc::new(MemMedium::from_bytes(bad.clone()));
        match FileSystem::open(m.clone(), &FsOptions::default()) {
            Ok(fs) => {
                // What the open promises: a sound tree, every mapped block allocated and as many
                // distinct ones as the engine counts (reference counts block by block, which a
                // map moved onto another file's block upsets, are fsck's).
                let problems = fsck::check_tree(&fs);
                prop_assert!(problems.is_empty(), "accepted: {:?}", problems);
                let engine = fsck::check(&fs, false).unwrap().problems;
                prop_assert!(
                    !engine.iter().any(|p| p.contains("free in the allocator") || p.contains("distinct blocks")),
                    "accepted: {:?}", engine
                );
            }
            Err(e) => {
                prop_assert!(matches!(e, FsError::Corrupt(_)), "{e}");
                prop_assert!(m.snapshot() == bad, "a refused open wrote to the image");
                // Never stricter than fsck: what the open refuses, fsck reports.
                let (_, fs) = open(&bad, &fsck_opts(true)).unwrap();
                let problems = fsck::check(&fs, false).unwrap().problems;
                prop_assert!(!problems.is_empty(), "refused ({e}) but fsck finds nothing");
            }
        }
        let (m, fs) = open(&bad, &fsck_opts(false)).unwrap();
        let fixed = fsck::check(&fs, true).unwrap();
        prop_assert!(fixed.consistent(), "after repair: {:?}", fixed.problems);
        fs.shutdown().unwrap();
        drop(fs);
        let (_, fs) = open(&m.snapshot(), &FsOptions::default()).unwrap();
        let again = fsck::check(&fs, false).unwrap();
        prop_assert!(again.consistent(), "{:?}", again.problems);
    }
}
