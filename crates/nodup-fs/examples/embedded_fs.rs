//! The file system driven through its API, without FUSE: make an image, create a directory
//! and files, write the same data twice, copy a file by sharing its blocks, read the space
//! figures, check the image, unmount cleanly and open it again.
//!
//! Run: `cargo run --release -p nodup-fs --example embedded_fs [IMAGE]`
//! (default image: a temporary file, removed at the end).

use nodup_core::FormatOptions;
use nodup_fs::inode::{Kind, ROOT_INO};
use nodup_fs::{fsck, image, Caller, FileSystem, FsOptions, MediumKind};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = std::env::args().nth(1);
    let path = arg
        .clone()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("nodup-fs-example-{}.img", std::process::id()))
        });

    // A 64 MiB blockfile image (durable at sync, like ext4); owner of the root: uid/gid 0.
    let medium = image::create(&path, 64 << 20, MediumKind::BlockFile)?;
    let who = Caller::default();
    let fs = FileSystem::format(
        medium,
        MediumKind::BlockFile,
        &FormatOptions::default(),
        &FsOptions::default(),
        who,
    )?;

    // Inode numbers play the role of paths: (parent, name) -> inode.
    let (dir, _) = fs.mknod(ROOT_INO, b"docs", Kind::Dir, 0o755, 0, b"", who)?;
    let (a, _) = fs.mknod(dir, b"a.txt", Kind::File, 0o644, 0, b"", who)?;
    let (b, _) = fs.mknod(dir, b"b.txt", Kind::File, 0o644, 0, b"", who)?;
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    fs.write(a, 0, &data)?;
    fs.write(b, 0, &data)?; // same content: no new data blocks
    let (c, _) = fs.mknod(dir, b"c.txt", Kind::File, 0o644, 0, b"", who)?;
    let copied = fs.copy_range(a, 0, c, 0, data.len() as u64)?; // shares a's blocks
    fs.sync()?;

    let (found, attr) = fs.lookup(dir, b"c.txt")?;
    assert_eq!((found, attr.size), (c, data.len() as u64));
    assert_eq!(fs.read(c, 0, data.len())?, data);
    let s = fs.stats_json();
    println!(
        "3 files of {} KiB ({copied} bytes copied by sharing): logical {} KiB, physical {} KiB",
        data.len() >> 10,
        s["logical_bytes"].as_u64().unwrap_or(0) >> 10,
        s["physical_bytes"].as_u64().unwrap_or(0) >> 10
    );

    let report = fsck::check(&fs, false)?;
    assert!(report.consistent(), "{:?}", report.problems);
    // A clean unmount: final checkpoint, engine shutdown.
    fs.shutdown()?;
    drop(fs);

    let (medium, _) = image::open(&path)?;
    let fs = FileSystem::open(medium, &FsOptions::default())?;
    println!("reopened: {} mount", fs.recovery().kind);
    let (a2, _) = fs.lookup(dir, b"a.txt")?;
    assert_eq!(fs.read(a2, 0, 16)?, data[..16]);
    fs.shutdown()?;
    if arg.is_none() {
        std::fs::remove_file(&path)?;
    }
    Ok(())
}
