//! Power loss with a real file system under the image: an image on ext4 (or btrfs), on a
//! loop device over the logging disk (`nodup-fuseref logdisk`), the stand-in for
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

use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::{fsck, image, Caller, FileSystem, FsOptions, MediumKind};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

mod common;
use common::{is_mounted, spawn_mount, BIN};
const IMAGE_LEN: u64 = 32 << 20;
const BS: usize = 4096;

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
    if !ok {
        eprintln!("skipping: needs root, /dev/fuse, fusermount3, losetup and {mkfs}");
    }
    ok
}

fn run(cmd: &str, args: &[&str]) -> String {
    let o = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        o.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// The logging disk's daemon, unmounted and waited for on drop.
struct LogDisk {
    child: Child,
    mnt: PathBuf,
}

impl LogDisk {
    fn start(log: &Path, mnt: &Path, len: usize) -> LogDisk {
        let (log, m, size) = (
            log.to_str().unwrap(),
            mnt.to_str().unwrap(),
            len.to_string(),
        );
        LogDisk {
            child: spawn_mount(&["logdisk", log, m, "--size", &size], mnt),
            mnt: mnt.to_owned(),
        }
    }
}

impl Drop for LogDisk {
    fn drop(&mut self) {
        // A loop device lets go of its file a moment after it is detached: the unmount is
        // `Mounted`'s (retried, then lazy), so the daemon always ends and the test never waits
        // for it forever.
        drop(Mounted(self.mnt.clone()));
        // Unmounted, the daemon ends by itself; a signal only if it does not.
        let t0 = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: a plain kill of the child we started.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        }
        let _ = self.child.wait();
    }
}

/// A loop device over a file, detached on drop.
struct Loop(String);

impl Loop {
    fn attach(file: &Path) -> Loop {
        Loop(run(
            "losetup",
            &["--find", "--show", file.to_str().unwrap()],
        ))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// A file system mounted at a directory, unmounted on drop.
struct Mounted(PathBuf);

impl Mounted {
    fn new(dev: &str, dir: &Path) -> Result<Mounted, String> {
        let o = Command::new("mount")
            .args([dev, dir.to_str().unwrap()])
            .output()
            .expect("mount");
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).into_owned());
        }
        Ok(Mounted(dir.to_owned()))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // Retried, then lazy: a failing check may still hold the image open for a moment.
        let t0 = Instant::now();
        while is_mounted(&self.0) && t0.elapsed() < Duration::from_secs(10) {
            let _ = Command::new("umount").arg(&self.0).output();
            if is_mounted(&self.0) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if is_mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).output();
        }
    }
}

/// xorshift64*: the workload's choices, reproducible from the seed.
struct Rng(u64);

impl Rng {
    /// A generator for `seed`, every seed its own sequence (splitmix64 of it, never zero).
    fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)).max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// File contents: whole blocks from a small palette (so the engine finds duplicates) or
/// unique, and sometimes a partial last block.
fn contents(rng: &mut Rng, blocks: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(blocks * BS);
    for _ in 0..blocks {
        let fill = if rng.below(2) == 0 {
            // One of eight duplicated patterns.
            vec![(rng.below(8) as u8).wrapping_mul(29).wrapping_add(1); BS]
        } else {
            (0..BS).map(|_| rng.next() as u8).collect()
        };
        v.extend_from_slice(&fill);
    }
    if rng.below(3) == 0 {
        v.truncate(v.len() - rng.below(BS as u64 - 1) as usize - 1);
    }
    v
}

/// What the workload did: the files after each mark, and the names each step touched.
struct History {
    /// `after[k]`: every file's contents when mark `k` was written.
    after: Vec<BTreeMap<String, Vec<u8>>>,
    /// `touched[k]`: the names step `k` changed (created, written, truncated, renamed from
    /// or to, unlinked); step 0 is the mkfs.
    touched: Vec<BTreeSet<String>>,
    /// The mark written once the file system was shut down cleanly.
    closed: usize,
}

/// The changes the workload makes, through the library or through a mount.
trait Target {
    fn create(&mut self, name: &str, data: &[u8]);
    fn write_at(&mut self, name: &str, off: u64, data: &[u8]);
    fn truncate(&mut self, name: &str, len: u64);
    fn unlink(&mut self, name: &str);
    fn rename(&mut self, from: &str, to: &str);
    /// Make the step's changes durable (`touched`: the names it changed).
    fn sync(&mut self, touched: &BTreeSet<String>);
    /// Unmount cleanly.
    fn close(self);
}

/// The file system in this process, through `nodup-fs` (its `sync` is a whole-image fence).
struct Library(FileSystem);

impl Library {
    fn format(img: &Path, kind: MediumKind) -> Library {
        let medium = image::create(img, IMAGE_LEN, kind).unwrap();
        let fs = FileSystem::format(
            medium,
            kind,
            &nodup_core::FormatOptions::default(),
            &FsOptions::default(),
            Caller::default(),
        )
        .unwrap();
        fs.sync().unwrap();
        Library(fs)
    }

    fn ino(&self, name: &str) -> u64 {
        self.0.lookup(ROOT_INO, name.as_bytes()).unwrap().0
    }
}

impl Target for Library {
    fn create(&mut self, name: &str, data: &[u8]) {
        let (ino, _) = self
            .0
            .mknod(
                ROOT_INO,
                name.as_bytes(),
                Kind::File,
                0o644,
                0,
                b"",
                Caller::default(),
            )
            .unwrap();
        self.0.write(ino, 0, data).unwrap();
    }
    fn write_at(&mut self, name: &str, off: u64, data: &[u8]) {
        self.0.write(self.ino(name), off, data).unwrap();
    }
    fn truncate(&mut self, name: &str, len: u64) {
        self.0.truncate(self.ino(name), len).unwrap();
    }
    fn unlink(&mut self, name: &str) {
        self.0.unlink(ROOT_INO, name.as_bytes()).unwrap();
    }
    fn rename(&mut self, from: &str, to: &str) {
        self.0
            .rename(ROOT_INO, from.as_bytes(), ROOT_INO, to.as_bytes(), 0)
            .unwrap();
    }
    fn sync(&mut self, _touched: &BTreeSet<String>) {
        self.0.sync().unwrap();
    }
    fn close(self) {
        self.0.shutdown().unwrap();
    }
}

/// A `nodup mount` of the image (the daemon, through the kernel): every change is a system
/// call on the mount, and a step is made durable as POSIX asks, by fsync of each file it
/// changed and of the directory.
struct NodupMount {
    mnt: PathBuf,
}

/// The built `nodup` beside this package's binary (`cargo test --workspace` builds both),
/// built here when missing.
fn nodup_bin() -> PathBuf {
    let dir = Path::new(BIN).parent().unwrap();
    let bin = dir.join("nodup");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut c = Command::new(cargo);
        c.args(["build", "-q", "-p", "nodup-cli"]);
        if dir.ends_with("release") {
            c.arg("--release");
        }
        assert!(c.status().unwrap().success(), "building nodup");
    }
    bin
}

impl NodupMount {
    fn format(img: &Path, mnt: &Path, options: &[&str]) -> NodupMount {
        let nodup = nodup_bin();
        let (img, m) = (img.to_str().unwrap(), mnt.to_str().unwrap());
        run(nodup.to_str().unwrap(), &["mkfs", img, "--size", "32M"]);
        run(
            nodup.to_str().unwrap(),
            &[&["mount", img, m], options].concat(),
        );
        NodupMount {
            mnt: mnt.to_owned(),
        }
    }

    fn open(&self, name: &str) -> fs::File {
        fs::OpenOptions::new()
            .write(true)
            .open(self.mnt.join(name))
            .unwrap()
    }
}

impl Target for NodupMount {
    fn create(&mut self, name: &str, data: &[u8]) {
        fs::write(self.mnt.join(name), data).unwrap();
    }
    fn write_at(&mut self, name: &str, off: u64, data: &[u8]) {
        self.open(name).write_all_at(data, off).unwrap();
    }
    fn truncate(&mut self, name: &str, len: u64) {
        self.open(name).set_len(len).unwrap();
    }
    fn unlink(&mut self, name: &str) {
        fs::remove_file(self.mnt.join(name)).unwrap();
    }
    fn rename(&mut self, from: &str, to: &str) {
        fs::rename(self.mnt.join(from), self.mnt.join(to)).unwrap();
    }
    fn sync(&mut self, touched: &BTreeSet<String>) {
        for n in touched {
            fs::File::open(self.mnt.join(n))
                .unwrap()
                .sync_all()
                .unwrap();
        }
        fs::File::open(&self.mnt).unwrap().sync_all().unwrap();
    }
    fn close(self) {
        run(
            nodup_bin().to_str().unwrap(),
            &["umount", self.mnt.to_str().unwrap()],
        );
    }
}

impl Drop for NodupMount {
    fn drop(&mut self) {
        // A failed test: detach, so the host file system can be unmounted after it.
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.mnt)
                .output();
        }
    }
}

/// Run `steps` steps of one to three changes on `target` (formatted and synced: mark 0),
/// each followed by a sync and a mark; close it cleanly and write a last mark. Marks are their
/// index, written to `mark` as text.
fn workload(mut target: impl Target, mark: &Path, seed: u64, steps: usize) -> History {
    let mut mark_file = fs::OpenOptions::new().write(true).open(mark).unwrap();
    let mut write_mark = |k: usize| {
        mark_file.write_all(k.to_string().as_bytes()).unwrap();
    };
    let mut h = History {
        after: vec![BTreeMap::new()],
        touched: vec![BTreeSet::new()],
        closed: 0,
    };
    write_mark(0);
    let mut rng = Rng::new(seed);
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut next_name = 0;
    for k in 1..=steps {
        let mut touched = BTreeSet::new();
        for _ in 0..1 + rng.below(3) {
            let names: Vec<String> = model.keys().cloned().collect();
            let pick = |rng: &mut Rng| names[rng.below(names.len() as u64) as usize].clone();
            match if names.len() < 3 { 0 } else { rng.below(6) } {
                0 | 1 => {
                    let name = format!("f{next_name}");
                    next_name += 1;
                    let blocks = 1 + rng.below(12) as usize;
                    let data = contents(&mut rng, blocks);
                    target.create(&name, &data);
                    touched.insert(name.clone());
                    model.insert(name, data);
                }
                2 => {
                    let name = pick(&mut rng);
                    let data = model.get_mut(&name).unwrap();
                    let off = rng.below(data.len() as u64 + BS as u64) as usize;
                    let blocks = 1 + rng.below(4) as usize;
                    let new = contents(&mut rng, blocks);
                    target.write_at(&name, off as u64, &new);
                    if data.len() < off + new.len() {
                        data.resize(off + new.len(), 0);
                    }
                    data[off..off + new.len()].copy_from_slice(&new);
                    touched.insert(name);
                }
                3 => {
                    let name = pick(&mut rng);
                    let data = model.get_mut(&name).unwrap();
                    let len = rng.below(data.len() as u64 + 1) as usize;
                    target.truncate(&name, len as u64);
                    data.truncate(len);
                    touched.insert(name);
                }
                4 => {
                    let name = pick(&mut rng);
                    target.unlink(&name);
                    model.remove(&name);
                    touched.insert(name);
                }
                _ => {
                    // Onto an existing name or a new one.
                    let from = pick(&mut rng);
                    let to = if rng.below(2) == 0 {
                        pick(&mut rng)
                    } else {
                        next_name += 1;
                        format!("f{}", next_name - 1)
                    };
                    if from == to {
                        continue;
                    }
                    target.rename(&from, &to);
                    let data = model.remove(&from).unwrap();
                    model.insert(to.clone(), data);
                    touched.insert(from);
                    touched.insert(to);
                }
            }
        }
        // Only what is still there can be synced by name.
        let live: BTreeSet<String> = touched
            .iter()
            .filter(|n| model.contains_key(*n))
            .cloned()
            .collect();
        target.sync(&live);
        h.after.push(model.clone());
        h.touched.push(touched);
        write_mark(k);
    }
    target.close();
    h.after.push(model);
    h.touched.push(BTreeSet::new());
    h.closed = steps + 1;
    write_mark(h.closed);
    h
}

/// One record of the logging disk's log (its format: `src/logdisk.rs`).
enum Record {
    Write(u64, Vec<u8>),
    Zero(u64, u64),
    Flush,
    Mark(String),
}

fn parse_log(bytes: &[u8]) -> Vec<Record> {
    let mut out = Vec::new();
    let mut i = 0;
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap()) as usize;
    while i < bytes.len() {
        let tag = bytes[i];
        i += 1;
        match tag {
            b'W' => {
                let (off, len) = (u64_at(i), u32_at(i + 8));
                out.push(Record::Write(off, bytes[i + 12..i + 12 + len].to_vec()));
                i += 12 + len;
            }
            b'Z' => {
                out.push(Record::Zero(u64_at(i), u64_at(i + 8)));
                i += 16;
            }
            b'F' => out.push(Record::Flush),
            b'M' => {
                let len = u32_at(i);
                let text = String::from_utf8(bytes[i + 4..i + 4 + len].to_vec()).unwrap();
                out.push(Record::Mark(text));
                i += 4 + len;
            }
            t => panic!("log record tag {t} at byte {}", i - 1),
        }
    }
    out
}

/// The disk as the log rebuilds it: its bytes, and which 64 KiB pieces were ever written.
struct Disk {
    bytes: Vec<u8>,
    written: BTreeSet<usize>,
}

const PIECE: usize = 64 << 10;

impl Disk {
    fn apply(&mut self, r: &Record) {
        let (off, len) = match r {
            Record::Write(off, data) => {
                let off = *off as usize;
                self.bytes[off..off + data.len()].copy_from_slice(data);
                (off, data.len())
            }
            Record::Zero(off, len) => {
                let (off, len) = (*off as usize, *len as usize);
                self.bytes[off..off + len].fill(0);
                (off, len)
            }
            Record::Flush | Record::Mark(_) => return,
        };
        self.written
            .extend(off / PIECE..(off + len).div_ceil(PIECE));
    }

    /// Write the disk to a new sparse file at `path` (the pieces ever written).
    fn save(&self, path: &Path) -> fs::File {
        let _ = fs::remove_file(path);
        let f = fs::File::create(path).unwrap();
        f.set_len(self.bytes.len() as u64).unwrap();
        for &i in &self.written {
            let end = ((i + 1) * PIECE).min(self.bytes.len());
            f.write_all_at(&self.bytes[i * PIECE..end], (i * PIECE) as u64)
                .unwrap();
        }
        f
    }
}

/// Apply a write or zeroed range of the log to a saved disk.
fn apply_to_file(f: &fs::File, r: &Record) {
    match r {
        Record::Write(off, data) => f.write_all_at(data, *off).unwrap(),
        Record::Zero(off, len) => f.write_all_at(&vec![0; *len as usize], *off).unwrap(),
        Record::Flush | Record::Mark(_) => {}
    }
}

/// Mount the state in `state_file` as ext4 and check its image against mark `k` of `h`;
/// `what` names the state in failures.
fn check_state(state_file: &Path, dir: &Path, h: &History, k: usize, what: &str) {
    let dev = Loop::attach(state_file);
    let m = Mounted::new(&dev.0, dir).unwrap_or_else(|e| panic!("{what}: host mount: {e}"));
    let img = dir.join("img");
    let (medium, _) = image::open(&img).unwrap_or_else(|e| panic!("{what}: open: {e}"));
    let fs = FileSystem::open(medium, &FsOptions::default())
        .unwrap_or_else(|e| panic!("{what}: mount: {e}"));
    if k == h.closed {
        assert_eq!(
            fs.recovery().kind,
            "clean",
            "{what}: after the clean unmount"
        );
    }
    // What the next step may have changed, durably or not.
    let unsure = h.touched.get(k + 1).cloned().unwrap_or_default();
    let names: BTreeSet<String> = fs
        .readdir(ROOT_INO, 2, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|(_, _, _, n)| String::from_utf8(n).unwrap())
        .collect();
    for n in &names {
        assert!(
            h.after[k].contains_key(n) || unsure.contains(n),
            "{what}: {n} is there, though neither synced at mark {k} nor made since"
        );
    }
    for (n, want) in &h.after[k] {
        if unsure.contains(n) {
            continue;
        }
        assert!(
            names.contains(n),
            "{what}: {n}, synced at mark {k}, is gone"
        );
        let (ino, attr) = fs.lookup(ROOT_INO, n.as_bytes()).unwrap();
        assert_eq!(attr.size, want.len() as u64, "{what}: size of {n}");
        let got = fs.read(ino, 0, want.len()).unwrap();
        assert!(
            got == *want,
            "{what}: {n}'s contents differ from mark {k}'s"
        );
    }
    let rep = fsck::check(&fs, false).unwrap();
    assert!(rep.consistent(), "{what}: fsck: {:?}", rep.problems);
    fs.shutdown().unwrap();
    drop(fs);
    drop(m);
    drop(dev);
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
    // Inode tables and journal written at mkfs, not by a background thread during the run.
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
    mkfs: &["mkfs.btrfs", "-q", "-f", "-K"],
    disk_len: 256 << 20,
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
            Via::Mount(options) => ["mounted"].iter().chain(options).copied().collect(),
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

fn power_loss_under(host: &Host, via: Via) {
    if !tools_available(host.mkfs[0]) {
        return;
    }
    let seed: u64 = std::env::var("POWER_LOSS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0046);
    let t = tempfile::Builder::new()
        .prefix(&format!("nodup-power-loss-{}-{}", host.name, via.name()))
        .tempdir_in("/dev/shm")
        .unwrap();
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
        let h = match via {
            Via::Library(kind) => workload(Library::format(&img, kind), &mark, seed, 24),
            Via::Mount(options) => {
                let nmnt = t.path().join("n");
                fs::create_dir(&nmnt).unwrap();
                workload(NodupMount::format(&img, &nmnt, options), &mark, seed, 24)
            }
        };
        drop(m);
        drop(dev);
        drop(disk);
        h
    };
    assert!(!is_mounted(&dmnt) && !is_mounted(&emnt), "left mounted");
    let records = parse_log(&fs::read(&log).unwrap());
    // Each flush's state holds every mark logged before the next flush: a sync returned
    // after its last flush, so the mark's flushes are all at or before it.
    let flushes: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r, Record::Flush))
        .map(|(i, _)| i)
        .collect();
    let mark_before = |end: usize| -> Option<usize> {
        records[..end].iter().rev().find_map(|r| match r {
            Record::Mark(s) => Some(s.parse().unwrap()),
            _ => None,
        })
    };
    let mut disk = Disk {
        bytes: vec![0u8; host.disk_len],
        written: BTreeSet::new(),
    };
    let mut rng = Rng::new(!seed);
    let state_file = t.path().join("state");
    let mut applied = 0;
    let mut states = 0;
    let mut marks_seen = BTreeSet::new();
    for (n, &f) in flushes.iter().enumerate() {
        for r in &records[applied..f] {
            disk.apply(r);
        }
        applied = f;
        let next = flushes.get(n + 1).copied().unwrap_or(records.len());
        let Some(k) = mark_before(next) else { continue };
        marks_seen.insert(k);
        disk.save(&state_file);
        check_state(&state_file, &emnt, &h, k, &format!("flush {n} (mark {k})"));
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
            let what = format!("flush {n} (mark {k}) with part of what followed");
            check_state(&state_file, &emnt, &h, k, &what);
        }
        states += 1;
    }
    eprintln!(
        "power loss, {} image under {}: {} records, {} flushes, {states} flush states checked (and torn variants), \
         marks {:?}..{:?}",
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
