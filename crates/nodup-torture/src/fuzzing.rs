//! Fuzz target bodies (shared by the cargo-fuzz targets in `fuzz/` and the stable driver here)
//! and a seeded mutation driver for stable Rust.
//!
//! Image targets take a *patch script* rather than a whole image: a fixed, realistic base image
//! (built once per process) is patched at offsets aimed at the structures under test, so a
//! few bytes of fuzz input reach deep into superblocks, metadata tables, checkpoints and logs.
//! Script format, repeated: selector (1 byte) | offset (3 bytes LE) | length (1 byte) | bytes.
//! The selector picks a hot range of the base image; the offset wraps inside it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nodup_core::media::{Medium, MemMedium};
use nodup_core::{Engine, FormatOptions, OpenOptions, OpenState, BLOCK_SIZE};
use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::{fsck, Caller, FileSystem, FsOptions, MediumKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::workload::pattern_block;

/// Size of the base images: small, so each input copies and scans little (mkfs wants 4 MiB,
/// the library formats 1 MiB).
pub const BASE_BYTES: u64 = 1 << 20;
const BS: u64 = BLOCK_SIZE as u64;

/// A base image and the byte ranges worth patching.
pub struct BaseImage {
    /// Clean image (shut down).
    pub clean: Vec<u8>,
    /// Crashed image (not shut down: log records to replay, engine needs recovery).
    pub dirty: Vec<u8>,
    /// (offset, length) ranges the selector chooses from.
    pub hot: Vec<(u64, u64)>,
    /// Data blocks the files reference, sorted, each once.
    pub refs: Vec<u64>,
    /// Data-area blocks the engine's own metadata holds (layout regions, store groups; not
    /// listed for the `smart` base, whose fuzz body forges no block maps).
    pub engine_blocks: Vec<u64>,
}

/// A small tree with files, a hard link and a symlink, checkpointed and then changed again (so
/// the dirty twin has log records to replay), formatted with `fopts`.
fn build_fs_base_with(fopts: &FormatOptions) -> BaseImage {
    build_fs_base(fopts, BASE_BYTES, 0)
}

/// [`build_fs_base_with`] on a medium of `bytes`, with a file `big` of `big_blocks` distinct
/// blocks beside the tree.
fn build_fs_base(fopts: &FormatOptions, bytes: u64, big_blocks: u32) -> BaseImage {
    let mem = Arc::new(MemMedium::new(bytes));
    let mut opts = crate::verify::open_opts_for(fopts.encrypt.is_some());
    // The same base in every process, so a crashing input found in one replays in another.
    opts.first_log_seq = Some(1);
    let fs = FileSystem::format(
        mem.clone(),
        MediumKind::Pmem,
        fopts,
        &opts,
        Caller::default(),
    )
    .expect("format base image");
    let who = Caller::default();
    let (d, _) = fs
        .mknod(ROOT_INO, b"dir", Kind::Dir, 0o755, 0, b"", who)
        .expect("mkdir");
    for i in 0..4u64 {
        let parent = if i % 2 == 0 { ROOT_INO } else { d };
        let (ino, _) = fs
            .mknod(
                parent,
                format!("f{i}").as_bytes(),
                Kind::File,
                0o644,
                0,
                b"",
                who,
            )
            .expect("create");
        let mut data = pattern_block(i % 2);
        data.extend(pattern_block(100 + i));
        data.extend_from_slice(&pattern_block(7)[..1000]);
        fs.write(ino, 0, &data).expect("write");
    }
    fs.mknod(ROOT_INO, b"link", Kind::Symlink, 0o777, 0, b"f0", who)
        .expect("symlink");
    if big_blocks > 0 {
        let (ino, _) = fs
            .mknod(ROOT_INO, b"big", Kind::File, 0o644, 0, b"", who)
            .expect("create");
        let data: Vec<u8> = (0..big_blocks)
            .flat_map(|i| pattern_block(1000 + u64::from(i)))
            .collect();
        fs.write(ino, 0, &data).expect("write");
    }
    fs.checkpoint(false).expect("checkpoint");
    // Records after the checkpoint, so the dirty image has a log to replay.
    let (ino, _) = fs.lookup(ROOT_INO, b"f0").expect("lookup");
    fs.write(ino, 5000, &pattern_block(1)).expect("write");
    fs.rename(ROOT_INO, b"f2", d, b"g2", 0).expect("rename");
    fs.link(ino, d, b"h0").expect("link");
    fs.unlink(ROOT_INO, b"link").expect("unlink");
    let dirty = mem.snapshot();
    let area = fs.client_area();
    let mut hot = vec![(0, BS), (area * BS, 2 * BS)];
    for b in fs.meta_blocks().into_iter().take(8) {
        hot.push((b * BS, BS));
    }
    let (data_start, _) = fs.engine().data_area();
    // Engine metadata between the client area and the data area (reverse map, tables, save area).
    hot.push((
        (area + 2) * BS,
        (data_start.saturating_sub(area + 2)).max(1) * BS,
    ));
    let mut refs = fs.with_tables(|t| t.data_refs());
    if let Some(&b) = refs.first() {
        hot.push((b * BS, BS));
    }
    hot.push((0, bytes));
    refs.sort_unstable();
    refs.dedup();
    let mut engine_blocks = Vec::new();
    fs.engine()
        .with_engine_owned_blocks(&mut |b, _| engine_blocks.extend_from_slice(b));
    fs.shutdown().expect("shutdown");
    drop(fs);
    BaseImage {
        clean: mem.snapshot(),
        dirty,
        hot,
        refs,
        engine_blocks,
    }
}

/// The file-system base images (built once per process).
pub fn fs_base() -> &'static BaseImage {
    static B: OnceLock<BaseImage> = OnceLock::new();
    B.get_or_init(|| build_fs_base_with(&FormatOptions::default()))
}

/// The base images of `checkpoint_tree`: [`fs_base`]'s tree on 2 MiB with a file of 160
/// distinct blocks, more dedup entries than the region layout's fixed region holds, so the
/// layout has taken blocks of the data area for a block map to be forged onto.
pub fn tree_base() -> &'static BaseImage {
    static B: OnceLock<BaseImage> = OnceLock::new();
    B.get_or_init(|| build_fs_base(&FormatOptions::default(), 2 << 20, 160))
}

/// The encrypted base images: `selective` under [`crate::verify::TEST_KEY`] (built once per
/// process). The engine superblock (key check, KDF parameters, cipher) is in the clear; the
/// rest of the hot ranges is ciphertext, so a patch there decrypts to noise that every
/// checksum must catch.
pub fn crypt_base() -> &'static BaseImage {
    static B: OnceLock<BaseImage> = OnceLock::new();
    B.get_or_init(|| {
        build_fs_base_with(&FormatOptions {
            policy: nodup_core::policy::PolicyKind::Selective,
            encrypt: Some(nodup_core::KeyFile(crate::verify::TEST_KEY.to_vec())),
            ..FormatOptions::default()
        })
    })
}

/// Apply a patch script to `img`. The first byte picks the clean or the dirty base.
pub fn patch(base: &BaseImage, script: &[u8]) -> (Vec<u8>, bool) {
    let dirty = script.first().is_some_and(|b| b & 1 == 1);
    let mut img = if dirty {
        base.dirty.clone()
    } else {
        base.clean.clone()
    };
    let mut s = script.get(1..).unwrap_or(&[]);
    while s.len() >= 5 {
        let (off0, len0) = base.hot[s[0] as usize % base.hot.len()];
        let off = u32::from_le_bytes([s[1], s[2], s[3], 0]) as u64 % len0.max(1);
        let n = (s[4] as usize).min(s.len() - 5);
        let at = (off0 + off) as usize;
        let end = (at + n).min(img.len());
        img[at..end].copy_from_slice(&s[5..5 + (end - at)]);
        s = &s[5 + n..];
    }
    (img, dirty)
}

/// Fuzz body: open a patched image with the engine alone (superblock, metadata tables, saved
/// index), recover it when needed, and use it. Errors are fine; panics are bugs.
pub fn engine_image(script: &[u8]) {
    let (img, _) = patch(fs_base(), script);
    let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(img));
    let Ok((e, state)) = Engine::open(m, &OpenOptions::default()) else {
        return;
    };
    if state == OpenState::NeedsRecovery
        && e.recover(&mut std::iter::empty(), &mut std::iter::empty())
            .is_err()
    {
        return;
    }
    let _ = e.audit();
    let mut ctx = nodup_core::WriteCtx::default();
    let a = pattern_block(1);
    let b = pattern_block(2);
    if let Ok(blocks) = e.write(&mut ctx, &[&a, &b, &a]) {
        let mut buf = vec![0u8; BLOCK_SIZE];
        for blk in blocks {
            let _ = e.read(blk, &mut buf);
            let _ = e.release(blk);
        }
    }
    drop(ctx);
    let _ = e.shutdown();
}

/// Open `base` patched by `script` (bit 1 of its first byte: read-only), fsck it and read every
/// file; None when the open refuses the image (the expected outcome for most patches).
fn open_patched(base: &BaseImage, script: &[u8]) -> Option<(FileSystem, bool)> {
    let (img, _) = patch(base, script);
    open_image(img, script)
}

/// [`open_patched`] on an image already patched.
fn open_image(img: Vec<u8>, script: &[u8]) -> Option<(FileSystem, bool)> {
    let read_only = script.first().is_some_and(|b| b & 2 == 2);
    let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(img));
    let opts = FsOptions {
        read_only,
        // The key when the (possibly patched) engine superblock says the image is encrypted.
        ..crate::verify::open_opts(&*m)
    };
    let fs = FileSystem::open(m, &opts).ok()?;
    let _ = fsck::check(&fs, false);
    walk(&fs, ROOT_INO, 0);
    Some((fs, read_only))
}

/// Fuzz body: open a patched file-system image (superblock pair, checkpoint chain, log chain,
/// engine), read-only or with recovery, then fsck and read every file.
pub fn fs_image(script: &[u8]) {
    let Some((fs, read_only)) = open_patched(fs_base(), script) else {
        return;
    };
    if !read_only {
        write_one(&fs);
        let _ = fsck::check(&fs, true);
    }
    let _ = fs.shutdown();
}

/// Create `/fuzz-new` and write a block to it (errors allowed): a fuzzed image that opened
/// must take a new file.
pub(crate) fn write_one(fs: &FileSystem) {
    let made = fs.mknod(
        ROOT_INO,
        b"fuzz-new",
        Kind::File,
        0o644,
        0,
        b"",
        Caller::default(),
    );
    if let Ok((ino, _)) = made {
        let _ = fs.write(ino, 0, &pattern_block(1));
    }
}

/// Read every file and symlink under `dir` (to depth 8).
pub(crate) fn walk(fs: &FileSystem, dir: u64, depth: usize) {
    if depth > 8 {
        return;
    }
    let Ok(ents) = fs.readdir(dir, 0, 256) else {
        return;
    };
    for (_, ino, kind, name) in ents {
        if name == b"." || name == b".." {
            continue;
        }
        match kind {
            Kind::Dir => walk(fs, ino, depth + 1),
            Kind::Symlink => {
                let _ = fs.readlink(ino);
            }
            _ => {
                if let Ok(a) = fs.getattr(ino) {
                    let _ = fs.read(ino, 0, a.size.min(1 << 20) as usize);
                }
            }
        }
    }
}

/// Fuzz body: FIU text lines (one by one and streamed) and the own binary trace format.
pub fn trace_parse(data: &[u8]) {
    use nodup_trace::format::fiu::{parse_line, FiuReader};
    use nodup_trace::format::own::OwnReader;
    use nodup_trace::record::DigestUnit;
    if data.first() == Some(&0xFF) {
        if let Ok(r) = OwnReader::new(&data[1..]) {
            for x in r.take(10_000) {
                if x.is_err() {
                    break;
                }
            }
        }
        return;
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let mut sticky = DigestUnit::Block;
        for line in text.lines().take(1000) {
            if let Ok(r) = parse_line(line, &mut sticky) {
                let _ = nodup_trace::format::fiu::format_line(&r);
                let _ = (r.first_block(), r.end_block(), r.bytes());
            }
        }
    }
    for x in FiuReader::new(data).take(10_000) {
        let _ = x;
    }
}

/// Size of the `smart` base image (room for groups on the medium).
pub const SMART_BASE_BYTES: u64 = 4 << 20;

/// A clean `smart` image (16 KiB budget) whose fingerprint groups are on the medium, with
/// blocks still queued for the worker (so the skipped buffer's checkpoint is written), and its
/// dirty twin; hot ranges: the client area (superblocks and that checkpoint), the engine's
/// metadata and save area (the group directory), the blocks the store held before shutdown.
fn build_smart_base() -> BaseImage {
    use nodup_core::policy::smart::SmartOptions;
    use nodup_core::policy::{PolicyKind, PolicyOptions};
    let mem = Arc::new(MemMedium::new(SMART_BASE_BYTES));
    let fo = FormatOptions {
        policy: PolicyKind::Smart,
        meta_layout: nodup_core::meta::MetaLayoutKind::default_for(PolicyKind::Smart),
        mem_budget: 16 << 10,
        ..FormatOptions::default()
    };
    let opts = FsOptions {
        open: OpenOptions {
            policy: PolicyOptions {
                smart: SmartOptions {
                    fixed_selectivity: Some(0.5),
                    ..SmartOptions::default()
                },
                ..PolicyOptions::default()
            },
            ..OpenOptions::default()
        },
        ..FsOptions::default()
    };
    let fs = FileSystem::format(mem.clone(), MediumKind::Pmem, &fo, &opts, Caller::default())
        .expect("format smart base image");
    let who = Caller::default();
    for i in 0..3u64 {
        let (ino, _) = fs
            .mknod(
                ROOT_INO,
                format!("s{i}").as_bytes(),
                Kind::File,
                0o644,
                0,
                b"",
                who,
            )
            .expect("create");
        let data: Vec<u8> = (0..120u64)
            .flat_map(|k| pattern_block(1000 + (k + 40 * i) % 200))
            .collect();
        fs.write(ino, 0, &data).expect("write");
    }
    fs.smart_step(100).expect("worker step");
    let dirty = mem.snapshot();
    let area = fs.client_area();
    let (data_start, data_blocks) = fs.engine().data_area();
    let (save, _) = fs.engine().save_area();
    let mut hot = vec![
        (area * BS, 10 * BS),
        // The save area's header and payload, and the smart directory after the bitmap.
        (save * BS, 2 * BS),
        (
            (save + 1) * BS + 8 * nodup_core::alloc::Allocator::save_len_words(data_blocks) as u64,
            64,
        ),
        (
            (area + 2) * BS,
            (data_start.saturating_sub(area + 2)).max(1) * BS,
        ),
    ];
    let mut refs = fs.with_tables(|t| t.data_refs());
    refs.sort_unstable();
    refs.dedup();
    let mut held: std::collections::HashSet<u64> = refs.iter().copied().collect();
    held.extend(fs.meta_blocks());
    let alloc = fs.engine().allocator();
    for b in data_start..data_start + data_blocks {
        if alloc.is_allocated(b) && !held.contains(&b) && hot.len() < 24 {
            hot.push((b * BS, BS));
        }
    }
    hot.push((0, SMART_BASE_BYTES));
    fs.shutdown().expect("shutdown");
    drop(fs);
    BaseImage {
        clean: mem.snapshot(),
        dirty,
        hot,
        refs,
        engine_blocks: Vec::new(),
    }
}

/// The `smart` base images (built once per process).
pub fn smart_base() -> &'static BaseImage {
    static B: OnceLock<BaseImage> = OnceLock::new();
    B.get_or_init(build_smart_base)
}

/// Fuzz body: open a patched `smart` image (group directory, group blocks, skipped-buffer
/// checkpoint, the rest), read-only or with recovery; then fsck, the worker, a write.
pub fn smart_image(script: &[u8]) {
    let Some((fs, read_only)) = open_patched(smart_base(), script) else {
        return;
    };
    if !read_only {
        let _ = fs.smart_settle();
        if let Ok((ino, _)) = fs.lookup(ROOT_INO, b"s1") {
            let _ = fs.write(ino, 0, &pattern_block(1003));
        }
        let _ = fs.smart_settle();
        let _ = fsck::check(&fs, true);
    }
    let _ = fs.shutdown();
}

/// Fuzz body: open a patched encrypted image with the key (clear superblocks, ciphertext
/// metadata and data), read-only or with recovery; then fsck, read every file, write one.
/// Bit 2 of the script's first byte re-seals the engine superblock's checksum after patching,
/// so patches to its key-derivation, key-check and cipher fields reach their own validation
/// instead of stopping at the checksum.
pub fn crypt_image(script: &[u8]) {
    let (mut img, _) = patch(crypt_base(), script);
    if script.first().is_some_and(|b| b & 4 == 4) {
        reseal_engine_superblock(&mut img);
        // A sealed argon2id request is honoured up to 4 GiB and 64 passes (the bound a mount
        // accepts): seconds and gigabytes per input, which the harness cannot afford. Such
        // inputs are skipped; the bound itself is checked by the superblock's unit tests.
        let word = |o: usize| u32::from_le_bytes([img[o], img[o + 1], img[o + 2], img[o + 3]]);
        if word(164) == 2 && (word(168) > 64 << 10 || word(172) > 4) {
            return;
        }
    }
    let Some((fs, read_only)) = open_image(img, script) else {
        return;
    };
    if !read_only {
        if let Ok((ino, _)) = fs.lookup(ROOT_INO, b"f0") {
            let _ = fs.write(ino, 0, &pattern_block(3));
        }
        let _ = fsck::check(&fs, true);
    }
    let _ = fs.shutdown();
}

/// Recompute the checksum of the (current-format) engine superblock at the start of `img`
/// after a patch: xxh3 of everything before it, in its last 8 bytes.
pub fn reseal_engine_superblock(img: &mut [u8]) {
    let at = nodup_core::engine::superblock::SB_SIZE - 8;
    let sum = xxhash_rust::xxh3::xxh3_64(&img[..at]);
    img[at..at + 8].copy_from_slice(&sum.to_le_bytes());
}

/// The fuzz targets by name.
pub const TARGETS: [&str; 7] = [
    "engine_image",
    "fs_image",
    "trace_parse",
    "smart_image",
    "crypt_image",
    "log_records",
    "checkpoint_tree",
];

/// The body of target `name`.
pub fn body(name: &str) -> Option<fn(&[u8])> {
    match name {
        "engine_image" => Some(engine_image),
        "fs_image" => Some(fs_image),
        "trace_parse" => Some(trace_parse),
        "smart_image" => Some(smart_image),
        "crypt_image" => Some(crypt_image),
        "log_records" => Some(crate::forged_log::log_records),
        "checkpoint_tree" => Some(crate::forged_checkpoint::checkpoint_tree),
        _ => None,
    }
}

/// Result of a stable fuzz run.
#[derive(Debug, Clone, Default)]
pub struct FuzzStats {
    /// Inputs executed.
    pub execs: u64,
    /// Inputs that panicked.
    pub crashes: u64,
    /// Slowest single input.
    pub slowest: Duration,
    /// First crashing inputs (hex) for reproduction.
    pub examples: Vec<String>,
}

/// One random mutation of `input` (byte flips, random bytes, insert, delete, splice of a patch).
pub fn mutate(rng: &mut StdRng, input: &[u8], target: &str) -> Vec<u8> {
    let mut v = input.to_vec();
    let rounds = rng.gen_range(1..=4);
    for _ in 0..rounds {
        match rng.gen_range(0..6) {
            0 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                v[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                v[i] = rng.gen();
            }
            2 => {
                let i = rng.gen_range(0..=v.len());
                let n = rng.gen_range(1..=8);
                for _ in 0..n {
                    v.insert(i, rng.gen());
                }
            }
            3 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                let n = rng.gen_range(1..=8).min(v.len() - i);
                v.drain(i..i + n);
            }
            4 if target != "trace_parse" => {
                // A fresh patch: selector, offset, a few interesting bytes.
                if v.is_empty() {
                    v.push(rng.gen());
                }
                let n = rng.gen_range(1..=8u8);
                v.extend([rng.gen(), rng.gen(), rng.gen(), rng.gen(), n]);
                let special = [0u8, 0xFF, 0x7F, 0x80, 1];
                for _ in 0..n {
                    v.push(if rng.gen_bool(0.5) {
                        special[rng.gen_range(0..special.len())]
                    } else {
                        rng.gen()
                    });
                }
            }
            _ => {
                // Text-ish edits for the trace parser: a digit, a space or a newline.
                let c = [b'0', b'9', b' ', b'\n', b'W', b'R', b'-', b'f'];
                let i = rng.gen_range(0..=v.len());
                v.insert(i, c[rng.gen_range(0..c.len())]);
            }
        }
    }
    v
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Run `target` over `corpus`, then over seeded random mutations until `max_execs` or
/// `deadline`. Panics are caught and counted.
pub fn run_stable(
    target: &str,
    corpus: &[Vec<u8>],
    seed: u64,
    max_execs: u64,
    deadline: Instant,
) -> FuzzStats {
    let f = body(target).expect("known target");
    let mut st = FuzzStats::default();
    let mut rng = StdRng::seed_from_u64(seed);
    let empty = [Vec::new()];
    let corpus = if corpus.is_empty() {
        &empty[..]
    } else {
        corpus
    };
    // Panics are the signal here; keep the default hook from flooding stderr.
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut i = 0u64;
    while st.execs < max_execs && Instant::now() < deadline {
        let input = if (i as usize) < corpus.len() {
            corpus[i as usize].clone()
        } else {
            let base = &corpus[rng.gen_range(0..corpus.len())];
            mutate(&mut rng, base, target)
        };
        i += 1;
        let t0 = Instant::now();
        let r = catch_unwind(AssertUnwindSafe(|| f(&input)));
        st.slowest = st.slowest.max(t0.elapsed());
        st.execs += 1;
        if r.is_err() {
            st.crashes += 1;
            if st.examples.len() < 10 {
                st.examples.push(hex(&input));
            }
        }
    }
    std::panic::set_hook(prev);
    st
}

/// Read a corpus directory (missing directory = empty corpus).
pub fn load_corpus(dir: &std::path::Path) -> Vec<Vec<u8>> {
    let mut v: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read(e.path()).ok().map(|b| (e.path(), b)))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.into_iter().map(|(_, b)| b).collect()
}
