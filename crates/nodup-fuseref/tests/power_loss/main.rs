//! Power loss with a real file system under the image: an image on ext4 (or btrfs, or xfs), on
//! a loop device over the logging disk (`nodup-fuseref logdisk`), the stand-in for
//! dm-log-writes. A seeded workload changes files, through `nodup-fs` or a `nodup mount`, and
//! syncs; after each sync it writes a mark to the log. Then every flush in the log is replayed
//! into a fresh copy of the disk, alone and with a random part of the writes that followed it
//! (what a disk may have kept of them), and each such state is mounted (the host's journal
//! recovered) and opened as a nodup image. Every state must open and pass fsck, every file
//! synced before the state's mark and not touched since must read back exactly, no name
//! removed before it may come back, and after the clean unmount's mark the image must say it
//! was closed cleanly.
//!
//! This tests what the crash-state campaign (`nodup-torture`'s `crash.rs`) takes as given:
//! that the image's fences (a block file's `fdatasync`, a pmem image's `msync`) make its
//! writes durable on a host file system that journals its metadata; and, through a real
//! mount, that fsync(2) reaches them. Skipped (with a message) without root, FUSE, losetup or
//! the host's mkfs. The mounted cases run the `nodup` binary built beside this package's
//! (`cargo test --workspace` builds it; after `-p nodup-fuseref` alone, build `nodup-cli`
//! first, or they run an older one).

#[path = "../common/mod.rs"]
mod common;
mod guards;
mod replay;
mod workload;

use common::is_mounted;
use guards::{run, LogDisk, Loop, Mounted};
use nodup_fs::inode::ROOT_INO;
use nodup_fs::{fsck, image, FileSystem, FsOptions, MediumKind};
use replay::{apply_to_file, parse_log, Disk, Record};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::process::Command;
use workload::{workload, History, Library, NodupMount, Rng};

/// Whether the tools are here. Missing, the test is skipped with a message, unless
/// `POWER_LOSS_REQUIRED` is set (`make torture`): then it fails.
fn tools_available(mkfs: &str) -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let have = |tool: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let ok = root
        && Path::new("/dev/fuse").exists()
        && ["fusermount3", "losetup", mkfs].iter().all(|t| have(t));
    let why = format!("needs root, /dev/fuse, fusermount3, losetup and {mkfs}");
    if !ok && std::env::var_os("POWER_LOSS_REQUIRED").is_some() {
        panic!("POWER_LOSS_REQUIRED is set, but the test {why}");
    }
    if !ok {
        eprintln!("skipping: {why}");
    }
    ok
}

/// Attach `state_file` to a loop device, mount the host file system it holds at `dir` (its
/// journal recovered), run `check` on the image path there, then unmount and detach; `what`
/// names the state in failures.
fn on_state(state_file: &Path, dir: &Path, what: &str, check: impl FnOnce(&Path)) {
    let dev = Loop::attach(state_file);
    let m = Mounted::new(&dev.0, dir).unwrap_or_else(|e| panic!("{what}: host mount: {e}"));
    check(&dir.join("img"));
    m.unmount();
    drop(dev);
}

/// Check the image of a state against mark `k` of `h`; `what` names the state in failures.
fn check_state(img: &Path, h: &History, k: usize, what: &str) {
    let (medium, _) = image::open(img).unwrap_or_else(|e| panic!("{what}: open: {e}"));
    let fs = FileSystem::open(medium, &FsOptions::default())
        .unwrap_or_else(|e| panic!("{what}: mount: {e}"));
    if k == h.closed {
        assert_eq!(
            fs.recovery().kind,
            "clean",
            "{what}: after the clean unmount"
        );
    }
    // What the next step changed, durably or not: each such name holds what it held at mark
    // k or after one of the step's changes.
    let none = BTreeMap::new();
    let next = h.steps.get(k + 1).unwrap_or(&none);
    let names: BTreeSet<String> = fs
        .readdir(ROOT_INO, 2, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|(_, _, _, n)| String::from_utf8(n).unwrap())
        .collect();
    for n in &names {
        assert!(
            h.after[k].contains_key(n) || next.contains_key(n),
            "{what}: {n} is there, though neither synced at mark {k} nor made since"
        );
    }
    for n in h.after[k].keys().chain(next.keys()) {
        let got = names.contains(n).then(|| {
            let (ino, attr) = fs.lookup(ROOT_INO, n.as_bytes()).unwrap();
            let got = fs.read(ino, 0, attr.size as usize).unwrap();
            assert_eq!(got.len() as u64, attr.size, "{what}: {n} reads short");
            got
        });
        let synced = h.after[k].get(n);
        match next.get(n) {
            None => assert!(
                got.as_ref() == synced,
                "{what}: {n} differs from mark {k}'s ({} bytes there, {} synced)",
                got.as_ref().map_or(0, |g| g.len()),
                synced.map_or(0, |g| g.len())
            ),
            Some(versions) if h.whole_changes => assert!(
                got.as_ref() == synced || versions.iter().any(|v| v.as_ref() == got.as_ref()),
                "{what}: {n} is neither as synced at mark {k} nor as any change of the next \
                 step left it"
            ),
            Some(_) => {}
        }
    }
    let rep = fsck::check(&fs, false).unwrap();
    assert!(rep.consistent(), "{what}: fsck: {:?}", rep.problems);
    fs.shutdown().unwrap();
}

/// The mark written once the host file system is made, before the image's mkfs.
const HOST_MADE: &str = "host";

/// A state from the image's mkfs (before its first mark): the image, if there is one, is
/// refused with an error or opens empty and passes fsck.
fn check_mkfs_state(img: &Path, what: &str) {
    let opened = img
        .exists()
        .then(|| image::open(img))
        .and_then(|r| r.ok())
        .and_then(|(medium, _)| FileSystem::open(medium, &FsOptions::default()).ok());
    if let Some(fs) = opened {
        let names = fs.readdir(ROOT_INO, 2, usize::MAX).unwrap();
        assert!(
            names.is_empty(),
            "{what}: a new image holds {} names",
            names.len()
        );
        let rep = fsck::check(&fs, false).unwrap();
        assert!(rep.consistent(), "{what}: fsck: {:?}", rep.problems);
        fs.shutdown().unwrap();
    }
}

/// The test's directory in /dev/shm, kept when the test fails (the log and the failing
/// state, to look at: the seed alone does not replay the host's own commits).
struct Scratch(Option<tempfile::TempDir>);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            if std::thread::panicking() {
                eprintln!("power loss: kept {} (log, state)", t.keep().display());
            }
        }
    }
}

/// A file system to put under the image: its name, the command that makes it on a device
/// (the device is appended), and the disk it needs.
struct Host {
    name: &'static str,
    mkfs: &'static [&'static str],
    disk_len: usize,
}

const EXT4: Host = Host {
    name: "ext4",
    // Inode tables and journal written at mkfs, not by a background thread during the run;
    // and no discard of the whole disk at mkfs (a 128 MiB zeroed range in the log).
    mkfs: &[
        "mkfs.ext4",
        "-q",
        "-F",
        "-E",
        "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
    ],
    disk_len: 128 << 20,
};

const BTRFS: Host = Host {
    name: "btrfs",
    // -K: no discard of the whole disk at mkfs.
    mkfs: &["mkfs.btrfs", "-q", "-f", "-K"],
    disk_len: 256 << 20,
};

/// xfs logs metadata its own way (delayed logging, no data ordering): the image's fences must
/// hold there too.
const XFS: Host = Host {
    name: "xfs",
    // -K: no discard of the whole disk at mkfs. 300 MiB is mkfs.xfs's smallest.
    mkfs: &["mkfs.xfs", "-q", "-f", "-K"],
    disk_len: 320 << 20,
};

/// How the workload reaches the image.
#[derive(Clone, Copy)]
enum Via {
    /// `nodup-fs` in this process, on an image of this medium.
    Library(MediumKind),
    /// `nodup mkfs` and `nodup mount` with these options (a block-file image), and system
    /// calls on the mount.
    Mount(&'static [&'static str]),
}

impl Via {
    fn name(self) -> String {
        match self {
            Via::Library(k) => k.name().to_owned(),
            Via::Mount(options) => ["mounted"]
                .iter()
                .chain(options)
                .map(|o| o.trim_start_matches('-'))
                .collect::<Vec<_>>()
                .join("-"),
        }
    }
}

#[test]
fn synced_files_survive_a_power_loss_at_every_flush_of_the_disk_under_ext4() {
    power_loss_under(&EXT4, Via::Library(MediumKind::BlockFile));
}

/// A pmem image on a disk's file system: its fences are `msync`s of the mapping.
#[test]
fn a_pmem_image_on_ext4_survives_a_power_loss_at_every_flush() {
    power_loss_under(&EXT4, Via::Library(MediumKind::Pmem));
}

/// The whole stack: what a nodup mount has answered for must be on the disk under ext4 (a
/// kill -9 keeps the page cache, so only a power loss shows a sync that stops short of it).
#[test]
fn fsynced_files_on_a_mount_survive_a_power_loss_at_every_flush_under_ext4() {
    power_loss_under(&EXT4, Via::Mount(&[]));
}

/// With the writeback cache, written data waits in the kernel until fsync sends it: fsync
/// must then reach the disk.
#[test]
fn fsynced_files_on_a_writeback_cache_mount_survive_a_power_loss_under_ext4() {
    power_loss_under(&EXT4, Via::Mount(&["--writeback-cache"]));
}

/// btrfs writes a rewritten block elsewhere and recovers through its log tree: the image's
/// fences must hold there too.
#[test]
fn synced_files_survive_a_power_loss_at_every_flush_of_the_disk_under_btrfs() {
    power_loss_under(&BTRFS, Via::Library(MediumKind::BlockFile));
}

#[test]
fn synced_files_survive_a_power_loss_at_every_flush_of_the_disk_under_xfs() {
    power_loss_under(&XFS, Via::Library(MediumKind::BlockFile));
}

fn power_loss_under(host: &Host, via: Via) {
    if !tools_available(host.mkfs[0]) {
        return;
    }
    let seed: u64 = match std::env::var("POWER_LOSS_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("POWER_LOSS_SEED={s:?} is not a number")),
        Err(_) => 0x5eed_0046,
    };
    let scratch = Scratch(Some(
        tempfile::Builder::new()
            .prefix(&format!("nodup-power-loss-{}-{}-", host.name, via.name()))
            .tempdir_in("/dev/shm")
            .unwrap(),
    ));
    let t = scratch.0.as_ref().unwrap();
    let (log, dmnt, emnt) = (t.path().join("log"), t.path().join("d"), t.path().join("e"));
    fs::create_dir(&dmnt).unwrap();
    fs::create_dir(&emnt).unwrap();
    let h = {
        let disk = LogDisk::start(&log, &dmnt, host.disk_len);
        let dev = Loop::attach(&dmnt.join("disk"));
        let (mkfs, args) = host.mkfs.split_first().unwrap();
        run(mkfs, &[args, &[dev.0.as_str()]].concat());
        let m = Mounted::new(&dev.0, &emnt).unwrap();
        let (img, mark) = (emnt.join("img"), dmnt.join("mark"));
        // The host file system made and durable: from here on every flush is a crash point,
        // those of the image's mkfs included.
        run("sync", &["-f", emnt.to_str().unwrap()]);
        fs::write(&mark, HOST_MADE).unwrap();
        let h = match via {
            Via::Library(kind) => workload(Library::format(&img, kind), true, &mark, seed, 24),
            Via::Mount(options) => {
                let nmnt = t.path().join("n");
                fs::create_dir(&nmnt).unwrap();
                let target = NodupMount::format(&img, &nmnt, options);
                let whole = !options.contains(&"--writeback-cache");
                workload(target, whole, &mark, seed, 24)
            }
        };
        m.unmount();
        drop(dev);
        drop(disk);
        h
    };
    assert!(!is_mounted(&dmnt), "the logging disk is still mounted");
    let records = parse_log(&fs::read(&log).unwrap());
    // Each flush's state holds every mark logged before the next flush: a sync returned
    // after its last flush, so the mark's flushes are all at or before it.
    let flushes: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r, Record::Flush))
        .map(|(i, _)| i)
        .collect();
    let mark_before = |end: usize| -> Option<&str> {
        records[..end].iter().rev().find_map(|r| match r {
            Record::Mark(s) => Some(s.as_str()),
            _ => None,
        })
    };
    let mut disk = Disk::new(host.disk_len);
    let mut rng = Rng::new(!seed);
    let state_file = t.path().join("state");
    let mut applied = 0;
    let (mut states, mut torn, mut mkfs_states) = (0, 0, 0);
    let mut marks_seen = BTreeSet::new();
    for (n, &f) in flushes.iter().enumerate() {
        for r in &records[applied..f] {
            disk.apply(r);
        }
        applied = f;
        let next = flushes.get(n + 1).copied().unwrap_or(records.len());
        // The mark this state answers to: none before the host's, then the host's (the
        // image's mkfs), then a step's.
        let k = match mark_before(next) {
            None => continue,
            Some(HOST_MADE) => None,
            Some(k) => Some(k.parse::<usize>().unwrap()),
        };
        let check = |what: &str| {
            on_state(&state_file, &emnt, what, |img| match k {
                None => check_mkfs_state(img, what),
                Some(k) => check_state(img, &h, k, what),
            })
        };
        if let Some(k) = k {
            marks_seen.insert(k);
        } else {
            mkfs_states += 1;
        }
        let at = k.map_or("during mkfs".to_owned(), |k| format!("mark {k}"));
        disk.save(&state_file);
        check(&format!("flush {n} ({at})"));
        // The same flush with part of what was written after it.
        let after: Vec<&Record> = records[f..next]
            .iter()
            .filter(|r| matches!(r, Record::Write(..) | Record::Zero(..)))
            .collect();
        if !after.is_empty() {
            let file = disk.save(&state_file);
            for r in after {
                if rng.below(2) == 0 {
                    apply_to_file(&file, r);
                }
            }
            drop(file);
            check(&format!("flush {n} ({at}) with part of what followed"));
            torn += 1;
        }
        states += 1;
    }
    eprintln!(
        "power loss, {} image under {} (seed {seed}): {} records, {} flushes, {states} flush \
         states checked ({mkfs_states} of them during mkfs, {torn} also torn), marks {:?}..{:?}",
        via.name(),
        host.name,
        records.len(),
        flushes.len(),
        marks_seen.first(),
        marks_seen.last()
    );
    assert!(
        marks_seen.contains(&0) && marks_seen.contains(&h.closed),
        "the states span the workload: {marks_seen:?}"
    );
}
