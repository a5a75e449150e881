//! Encrypted images (`media::crypt`) through the file system, without FUSE: no plaintext, file
//! name or fingerprint on the image; the same dedup as a plain image; a wrong or missing key
//! refused without changing a byte; a clean remount and a crash recovery with the key.

mod common;

use nodup_core::media::MemMedium;
use nodup_core::policy::PolicyKind;
use nodup_core::{FormatOptions, KeyFile, OpenOptions, BLOCK_SIZE};
use nodup_fs::{fsck, Caller, FileSystem, FsOptions, MediumKind};
use std::sync::Arc;

const MARK: &[u8; 24] = b"PLAINTEXT-MARKER-7f3a9c!";
const NAME: &str = "secret-file-name-4b1d";

/// A block that starts with the marker and is otherwise pseudo-random, numbered `n`.
fn block(n: u64) -> Vec<u8> {
    let mut v = common::block(n);
    v[..MARK.len()].copy_from_slice(MARK);
    v
}

fn opts(key: Option<&[u8]>) -> FsOptions {
    FsOptions {
        open: OpenOptions {
            key: key.map(|k| KeyFile(k.to_vec())),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Two files of 64 blocks with 32 blocks in common.
fn fill(fs: &FileSystem) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    for (f, first) in [(0u64, 0u64), (1, 32)] {
        let ino = common::create(fs, &format!("{NAME}-{f}"));
        let data: Vec<u8> = (first..first + 64).flat_map(block).collect();
        fs.write(ino, 0, &data).unwrap();
        out.push((ino, data));
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn format(m: &Arc<MemMedium>, key: Option<&[u8]>, policy: PolicyKind) -> FileSystem {
    let fo = FormatOptions {
        policy,
        encrypt: key.map(|k| KeyFile(k.to_vec())),
        ..Default::default()
    };
    FileSystem::format(
        m.clone(),
        MediumKind::Pmem,
        &fo,
        &opts(key),
        Caller::default(),
    )
    .unwrap()
}

#[test]
fn encrypted_images_hide_everything_and_dedup_like_plain_ones() {
    let key = [0xc2u8; 32];
    for policy in [PolicyKind::Light, PolicyKind::Selective, PolicyKind::Smart] {
        let plain = Arc::new(MemMedium::new(32 << 20));
        let fs = format(&plain, None, policy);
        fill(&fs);
        let plain_stats = fs.engine().stats();
        fs.shutdown().unwrap();
        let img = plain.snapshot();
        assert!(
            contains(&img, MARK) && contains(&img, NAME.as_bytes()),
            "the markers are findable"
        );

        let enc = Arc::new(MemMedium::new(32 << 20));
        let fs = format(&enc, Some(&key), policy);
        let files = fill(&fs);
        let s = fs.engine().stats();
        assert_eq!(s.physical_bytes, plain_stats.physical_bytes, "{policy:?}");
        assert_eq!(s.dedup_hits, plain_stats.dedup_hits, "{policy:?}");
        // Before and after the final checkpoint: nothing readable anywhere on the image.
        for when in ["mounted", "unmounted"] {
            let img = enc.snapshot();
            assert!(
                !contains(&img, MARK),
                "{policy:?} {when}: plaintext on the image"
            );
            assert!(
                !contains(&img, NAME.as_bytes()),
                "{policy:?} {when}: a file name"
            );
            assert!(
                !contains(&img, &block(5)[32..64]),
                "{policy:?} {when}: block bytes"
            );
            if when == "mounted" {
                fs.shutdown().unwrap();
            }
        }
        drop(fs);
        // No key, a wrong key, a wrong passphrase: refused, not a byte changed.
        let before = enc.snapshot();
        for (k, why) in [
            (None, "give its key file"),
            (Some(&[0xc3u8; 32][..]), "wrong key"),
            (Some(&b"a passphrase\n"[..]), "32-byte key file"),
        ] {
            let e = FileSystem::open(enc.clone(), &opts(k))
                .err()
                .expect("refused");
            assert!(e.to_string().contains(why), "{e}");
        }
        assert!(enc.snapshot() == before, "a refused open changed the image");
        // A plain image refuses a key.
        let e = FileSystem::open(plain.clone(), &opts(Some(&key)))
            .err()
            .expect("refused");
        assert!(e.to_string().contains("not encrypted"), "{e}");
        // With the key: the files, then a crash (no shutdown) and recovery.
        let fs = FileSystem::open(enc.clone(), &opts(Some(&key))).unwrap();
        assert_eq!(fs.recovery().kind, "clean");
        for (ino, data) in &files {
            assert!(fs.read(*ino, 0, data.len()).unwrap() == *data);
        }
        let ino = common::create(&fs, "late");
        fs.write(ino, 0, &block(1)).unwrap();
        let crashed = Arc::new(MemMedium::from_bytes(enc.snapshot()));
        drop(fs);
        let fs = FileSystem::open(crashed, &opts(Some(&key))).unwrap();
        assert_eq!(fs.recovery().kind, "failure");
        for (ino, data) in &files {
            assert!(fs.read(*ino, 0, data.len()).unwrap() == *data);
        }
        assert!(fs.read(ino, 0, BLOCK_SIZE).unwrap() == block(1));
        assert!(fsck::check(&fs, false).unwrap().consistent());
    }
}

#[test]
fn a_passphrase_opens_its_image() {
    let m = Arc::new(MemMedium::new(16 << 20));
    let pass = b"correct horse battery staple\n";
    let fs = format(&m, Some(pass), PolicyKind::Light);
    let files = fill(&fs);
    fs.shutdown().unwrap();
    drop(fs);
    // The trailing newline is not part of the passphrase.
    let fs = FileSystem::open(m.clone(), &opts(Some(b"correct horse battery staple"))).unwrap();
    for (ino, data) in &files {
        assert!(fs.read(*ino, 0, data.len()).unwrap() == *data);
    }
    let st = fs.stats_json();
    assert_eq!(
        st["encryption"]["cipher"], "aes-256-xts+ctr",
        "{}",
        st["encryption"]
    );
    assert_eq!(st["encryption"]["key"], "argon2id");
}
