//! `nodup mount --direct-writes` (the default without the writeback cache): handles open for
//! writing bypass the kernel's page cache. These tests check it through a real mount: what a
//! writer writes is not left in the page cache (and is with `--direct-writes=false`), readers
//! keep their cache and still see every direct write, a shared mapping of a read-write handle
//! works both ways, odd-sized and appending writes land where a model says, and the option
//! refuses the writeback cache with one clear line.
//!
//! Skipped (with a message) when /dev/fuse or fusermount3 is missing.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

mod common;
use common::*;

const MIB: usize = 1 << 20;

/// Pages of `p` in the page cache (mincore(2) of a read-only shared mapping, which does not
/// fault anything in).
fn resident_pages(p: &Path) -> usize {
    let f = File::open(p).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    assert!(len > 0, "{}: empty", p.display());
    // SAFETY: a fresh read-only mapping of `len` bytes of an open file, unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(
        addr,
        libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    let mut vec = vec![0u8; len.div_ceil(4096)];
    // SAFETY: `addr` maps `len` bytes; `vec` has a byte per page of them.
    let r = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = std::io::Error::last_os_error();
    // SAFETY: unmapping exactly what was mapped above.
    unsafe { libc::munmap(addr, len) };
    assert_eq!(r, 0, "mincore: {err}");
    vec.iter().filter(|b| *b & 1 == 1).count()
}

fn random(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v);
    v
}

#[test]
fn writers_leave_nothing_in_the_page_cache_and_readers_keep_it() {
    if !fuse_available() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(31);
    let data = random(&mut rng, 4 * MIB);
    for (opts, direct) in [(&[][..], true), (&["--direct-writes=false"][..], false)] {
        let fx = Fixture::new("direct", "128M", &[]);
        fx.mount(opts);
        let p = fx.path("f");
        // O_WRONLY (cp) and O_RDWR (fio, databases): both direct by default on this kernel.
        fs::write(&p, &data).unwrap();
        let q = fx.path("g");
        let mut g = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&q)
            .unwrap();
        g.write_all(&data).unwrap();
        drop(g);
        let pages = data.len() / 4096;
        for f in [&p, &q] {
            let after_write = resident_pages(f);
            if direct {
                assert_eq!(
                    after_write, 0,
                    "{opts:?}: a direct writer left pages cached"
                );
            } else {
                assert_eq!(
                    after_write, pages,
                    "{opts:?}: write-through pages not cached"
                );
            }
            // A read-only handle goes through the page cache either way.
            assert!(fs::read(f).unwrap() == data, "{opts:?}: read back differs");
            assert_eq!(
                resident_pages(f),
                pages,
                "{opts:?}: reader's pages not cached"
            );
        }
        fx.umount_clean("direct writes");
    }
}

#[test]
fn cached_readers_and_shared_mappings_see_direct_writes() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("direct-coherent", "128M", &[]);
    fx.mount(&[]);
    let mut rng = StdRng::seed_from_u64(32);
    let mut model = random(&mut rng, 2 * MIB);
    let p = fx.path("f");
    fs::write(&p, &model).unwrap();
    // A reader caches the whole file, then a writer overwrites part of it directly.
    let reader = File::open(&p).unwrap();
    let mut seen = vec![0u8; model.len()];
    reader.read_exact_at(&mut seen, 0).unwrap();
    assert!(seen == model);
    assert_eq!(resident_pages(&p), model.len() / 4096);
    let patch = random(&mut rng, 3 * 4096 + 17);
    let at = 4096 * 5 + 100;
    let w = OpenOptions::new().write(true).open(&p).unwrap();
    w.write_all_at(&patch, at as u64).unwrap();
    model[at..at + patch.len()].copy_from_slice(&patch);
    reader.read_exact_at(&mut seen, 0).unwrap();
    assert!(seen == model, "a cached reader missed a direct write");

    // A shared mapping of a read-write handle: stores reach the file, and a direct write
    // through the same handle reaches the mapping.
    let rw = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let len = model.len();
    // SAFETY: a fresh read-write shared mapping of `len` bytes of an open file; every access
    // below stays within it, and it is unmapped before the handle closes.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            rw.as_raw_fd(),
            0,
        )
    };
    assert_ne!(
        map,
        libc::MAP_FAILED,
        "mmap shared of a direct handle: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `map` is `len` bytes, readable and writable, and nothing else aliases it here.
    let mapped = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), len) };
    assert!(mapped == &model[..], "the mapping differs from the file");
    let stored = random(&mut rng, 8192);
    mapped[MIB..MIB + stored.len()].copy_from_slice(&stored);
    model[MIB..MIB + stored.len()].copy_from_slice(&stored);
    // SAFETY: syncing the mapping made above.
    assert_eq!(unsafe { libc::msync(map, len, libc::MS_SYNC) }, 0);
    let mut again = vec![0u8; len];
    File::open(&p)
        .unwrap()
        .read_exact_at(&mut again, 0)
        .unwrap();
    assert!(
        again == model,
        "a store through the mapping did not reach the file"
    );
    let direct = random(&mut rng, 4096 * 2 + 5);
    rw.write_all_at(&direct, 4096 * 40 + 3).unwrap();
    model[4096 * 40 + 3..4096 * 40 + 3 + direct.len()].copy_from_slice(&direct);
    assert!(mapped == &model[..], "the mapping missed a direct write");
    // SAFETY: unmapping exactly what was mapped above; `mapped` is not used after this.
    unsafe { libc::munmap(map, len) };
    drop((rw, w, reader));
    fx.umount();
    fx.mount(&[]);
    assert!(fs::read(&p).unwrap() == model, "after remount");
    fx.umount_clean("coherence");
}

#[test]
fn odd_and_appending_direct_writes_match_a_model() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("direct-model", "256M", &[]);
    fx.mount(&[]);
    let mut rng = StdRng::seed_from_u64(33);
    let p = fx.path("f");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    let mut model: Vec<u8> = Vec::new();
    // Duplicate content too, so some writes deduplicate against others.
    let pool: Vec<Vec<u8>> = (0..4).map(|_| random(&mut rng, 64 * 1024)).collect();
    for i in 0..400 {
        let len = match rng.gen_range(0u64..4) {
            0 => rng.gen_range(1u64..600),
            1 => rng.gen_range(1u64..9000),
            2 => 4096 * rng.gen_range(1u64..16),
            _ => rng.gen_range(100_000u64..1_200_000),
        } as usize;
        let buf: Vec<u8> = if rng.gen_bool(0.5) {
            let src = &pool[rng.gen_range(0..pool.len() as u64) as usize];
            src.iter().cycle().take(len).copied().collect()
        } else {
            random(&mut rng, len)
        };
        let max = model.len() as u64 + 8192;
        let at = rng.gen_range(0..max) as usize;
        f.write_all_at(&buf, at as u64).unwrap();
        if model.len() < at + len {
            model.resize(at + len, 0);
        }
        model[at..at + len].copy_from_slice(&buf);
        if i % 50 == 49 {
            let cut = rng.gen_range(0..model.len() as u64) as usize;
            f.set_len(cut as u64).unwrap();
            model.truncate(cut);
        }
    }
    // O_APPEND through a direct handle lands at the end each time.
    let mut a = OpenOptions::new().append(true).open(&p).unwrap();
    for _ in 0..20 {
        let len = rng.gen_range(1u64..70_000) as usize;
        let buf = random(&mut rng, len);
        a.write_all(&buf).unwrap();
        model.extend_from_slice(&buf);
    }
    drop(a);
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back.len(), model.len());
    assert!(
        back == model,
        "read through the direct handle differs from the model"
    );
    drop(f);
    fx.umount();
    fx.mount(&[]);
    assert!(fs::read(&p).unwrap() == model, "after remount");
    fx.umount_clean("model");
}

#[test]
fn direct_writes_refuse_the_writeback_cache() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("direct-wb", "64M", &[]);
    let o = nodup(&[
        "mount",
        fx.img.to_str().unwrap(),
        fx.mnt.to_str().unwrap(),
        "--writeback-cache",
        "--direct-writes",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("exclude each other") && err.lines().count() == 1,
        "{err}"
    );
    // Nothing was mounted, and the image still mounts (the writeback cache alone: cached).
    fx.mount(&["--writeback-cache"]);
    let p = fx.path("f");
    fs::write(&p, vec![7u8; MIB]).unwrap();
    assert_eq!(resident_pages(&p), MIB / 4096);
    fx.umount_clean("writeback");
}
