//! The seeded workload and what it did: changes through `nodup-fs` or a `nodup mount`, a
//! sync and a mark after each step.

use super::common::{create_file, is_mounted, BIN};
use super::guards::run;
use nodup_fs::inode::ROOT_INO;
use nodup_fs::{image, Caller, FileSystem, FsOptions, MediumKind};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const IMAGE_LEN: u64 = 32 << 20;
const BS: usize = 4096;

/// xorshift64*: the workload's choices, reproducible from the seed.
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`, every seed its own sequence (splitmix64 of it, never zero).
    pub fn new(seed: u64) -> Rng {
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
    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
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

/// What the workload did: the files after each mark, and what each step did to the names it
/// touched.
pub struct History {
    /// `after[k]`: every file's contents when mark `k` was written.
    pub after: Vec<BTreeMap<String, Vec<u8>>>,
    /// `steps[k]`: for each name step `k` changed (created, written, truncated, renamed from
    /// or to, unlinked), what it held after each change of the step, `None` when gone. Step 0
    /// is the mkfs.
    pub steps: Vec<BTreeMap<String, Vec<Option<Vec<u8>>>>>,
    /// Whether a crash inside a step leaves each touched name as it was before the step or
    /// after one of its changes (every change is one record of nodup's log). Not through the
    /// writeback cache, which sends a file's pages to the daemon in its own pieces.
    pub whole_changes: bool,
    /// The mark written once the file system was shut down cleanly.
    pub closed: usize,
}

/// The changes the workload makes, through the library or through a mount.
pub trait Target {
    /// Make file `name` in the root directory holding `data`.
    fn create(&mut self, name: &str, data: &[u8]);
    /// Write `data` at `off` of file `name`.
    fn write_at(&mut self, name: &str, off: u64, data: &[u8]);
    /// Cut or extend file `name` to `len` bytes.
    fn truncate(&mut self, name: &str, len: u64);
    /// Remove file `name`.
    fn unlink(&mut self, name: &str);
    /// Rename `from` to `to`, replacing `to` when it exists.
    fn rename(&mut self, from: &str, to: &str);
    /// Make the step's changes durable (`touched`: the names it changed).
    fn sync(&mut self, touched: &BTreeSet<String>);
    /// Unmount cleanly.
    fn close(self);
}

/// The file system in this process, through `nodup-fs` (its `sync` is a whole-image fence).
pub struct Library(FileSystem);

impl Library {
    /// Format an image of `kind` at `img` and sync it.
    pub fn format(img: &Path, kind: MediumKind) -> Library {
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
        let ino = create_file(&self.0, name).unwrap();
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
pub struct NodupMount {
    /// The `nodup` binary, its path as text.
    nodup: String,
    mnt: PathBuf,
}

/// The built `nodup` beside this package's binary. Not built here: `cargo test --workspace`
/// (and `make test`) builds it first. After `cargo test -p nodup-fuseref` alone it may be
/// older than the tree, so its path and age are printed.
fn nodup_bin() -> PathBuf {
    let bin = Path::new(BIN).with_file_name("nodup");
    let age = fs::metadata(&bin)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .unwrap_or_else(|| {
            panic!(
                "{} is missing: build it first (cargo build --release -p nodup-cli)",
                bin.display()
            )
        });
    eprintln!(
        "power loss: mounting with {} (built {} s ago)",
        bin.display(),
        age.as_secs()
    );
    bin
}

impl NodupMount {
    /// `nodup mkfs` an image at `img`, then `nodup mount` it at `mnt` with `options`.
    pub fn format(img: &Path, mnt: &Path, options: &[&str]) -> NodupMount {
        let nodup = nodup_bin().to_str().unwrap().to_owned();
        let (img, m) = (img.to_str().unwrap(), mnt.to_str().unwrap());
        run(&nodup, &["mkfs", img, "--size", "32M"]);
        run(&nodup, &[&["mount", img, m], options].concat());
        NodupMount {
            nodup,
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
        run(&self.nodup, &["umount", self.mnt.to_str().unwrap()]);
    }
}

impl Drop for NodupMount {
    fn drop(&mut self) {
        // A failed test: detach, so the host file system can be unmounted after it (the
        // daemon then ends; if it hangs, the logging disk's guard kills what is below it).
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
pub fn workload(
    mut target: impl Target,
    whole_changes: bool,
    mark: &Path,
    seed: u64,
    steps: usize,
) -> History {
    let mut mark_file = fs::OpenOptions::new().write(true).open(mark).unwrap();
    let mut write_mark = |k: usize| {
        mark_file.write_all(k.to_string().as_bytes()).unwrap();
    };
    let mut h = History {
        after: vec![BTreeMap::new()],
        steps: vec![BTreeMap::new()],
        whole_changes,
        closed: 0,
    };
    write_mark(0);
    let mut rng = Rng::new(seed);
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut next_name = 0;
    for k in 1..=steps {
        let mut step: BTreeMap<String, Vec<Option<Vec<u8>>>> = BTreeMap::new();
        let seen = |step: &mut BTreeMap<_, Vec<_>>, model: &BTreeMap<String, Vec<u8>>, n: &str| {
            step.entry(n.to_owned())
                .or_default()
                .push(model.get(n).cloned())
        };
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
                    // Created empty, then written: two changes.
                    model.insert(name.clone(), Vec::new());
                    seen(&mut step, &model, &name);
                    model.insert(name.clone(), data);
                    seen(&mut step, &model, &name);
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
                    seen(&mut step, &model, &name);
                }
                3 => {
                    let name = pick(&mut rng);
                    let data = model.get_mut(&name).unwrap();
                    let len = rng.below(data.len() as u64 + 1) as usize;
                    target.truncate(&name, len as u64);
                    data.truncate(len);
                    seen(&mut step, &model, &name);
                }
                4 => {
                    let name = pick(&mut rng);
                    target.unlink(&name);
                    model.remove(&name);
                    seen(&mut step, &model, &name);
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
                    seen(&mut step, &model, &from);
                    seen(&mut step, &model, &to);
                }
            }
        }
        // Only what is still there can be synced by name.
        let live: BTreeSet<String> = step
            .keys()
            .filter(|n| model.contains_key(*n))
            .cloned()
            .collect();
        target.sync(&live);
        h.after.push(model.clone());
        h.steps.push(step);
        write_mark(k);
    }
    target.close();
    h.after.push(model);
    h.steps.push(BTreeMap::new());
    h.closed = steps + 1;
    write_mark(h.closed);
    h
}
