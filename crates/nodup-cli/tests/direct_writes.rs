//! `nodup mount --direct-writes` (write-only handles by default without the writeback cache,
//! read-write ones too with `read-write`): such handles bypass the kernel's page cache. These
//! tests check it through a real mount: what goes through a direct handle is not left in the
//! page cache (and what goes through a cached one is), readers keep their cache and still see
//! every direct write, a shared mapping of a direct read-write handle works both ways,
//! odd-sized and appending writes land where a model says, a write drops the file's
//! capability as the kernel's cached path does, and the mode refuses the writeback cache with
//! one clear line.
//!
//! Skipped (with a message) when /dev/fuse or fusermount3 is missing.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
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

/// Whether this kernel lets nodup's direct modes work (6.6 for write-only handles, 6.9 for
/// read-write ones); the tests that need them skip with a message otherwise.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let r = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = r
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let have = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    let ok = have >= (major, minor);
    if !ok {
        eprintln!(
            "skipped: kernel {} has no direct writes for this mode",
            r.trim()
        );
    }
    ok
}

/// At least 90 % of `pages` (the kernel may evict a few under memory pressure).
fn mostly(n: usize, pages: usize) -> bool {
    n * 10 >= pages * 9
}

fn random(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v);
    v
}

#[test]
fn direct_handles_leave_nothing_in_the_page_cache_and_readers_keep_it() {
    if !fuse_available() || !kernel_at_least(6, 9) {
        return;
    }
    let mut rng = StdRng::seed_from_u64(31);
    let data = random(&mut rng, 4 * MIB);
    // (mount options, write-only handle direct, read-write handle direct)
    let modes: [(&[&str], bool, bool); 3] = [
        (&[], true, false),
        (&["--direct-writes=read-write"], true, true),
        (&["--direct-writes=off"], false, false),
    ];
    for (opts, wronly, rdwr) in modes {
        let fx = Fixture::new("direct", "128M", &[]);
        fx.mount(opts);
        // O_WRONLY (cp, dd) and O_RDWR (fio, databases).
        let p = fx.path("f");
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
        for (f, direct) in [(&p, wronly), (&q, rdwr)] {
            let after_write = resident_pages(f);
            if direct {
                assert_eq!(
                    after_write, 0,
                    "{opts:?} {f:?}: a direct writer left pages cached"
                );
            } else {
                assert_eq!(
                    after_write, pages,
                    "{opts:?} {f:?}: write-through pages not cached"
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
    if !fuse_available() || !kernel_at_least(6, 9) {
        return;
    }
    let fx = Fixture::new("direct-coherent", "128M", &[]);
    let mode = ["--direct-writes=read-write"];
    fx.mount(&mode);
    let mut rng = StdRng::seed_from_u64(32);
    let mut model = random(&mut rng, 2 * MIB);
    let p = fx.path("f");
    fs::write(&p, &model).unwrap();
    // A reader caches the whole file, then a writer overwrites part of it directly.
    let reader = File::open(&p).unwrap();
    let mut seen = vec![0u8; model.len()];
    reader.read_exact_at(&mut seen, 0).unwrap();
    assert!(seen == model);
    assert!(mostly(resident_pages(&p), model.len() / 4096));
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
    fx.mount(&mode);
    assert!(fs::read(&p).unwrap() == model, "after remount");
    fx.umount_clean("coherence");
}

#[test]
fn odd_and_appending_direct_writes_match_a_model() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("direct-model", "256M", &[]);
    fx.mount(&["--direct-writes=read-write"]);
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

/// `security.capability` of `p`, if any.
fn capability(p: &Path) -> Option<Vec<u8>> {
    getxattr(p, "security.capability").ok()
}

#[test]
fn a_write_drops_the_file_capability_as_the_cached_path_does() {
    // SAFETY: geteuid cannot fail.
    if !fuse_available() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs FUSE and root (setting a file capability)");
        return;
    }
    // VFS_CAP_REVISION_2 with cap_net_raw (13) permitted: 20 bytes.
    let mut cap = Vec::new();
    cap.extend_from_slice(&0x0200_0000u32.to_le_bytes());
    cap.extend_from_slice(&(1u32 << 13).to_le_bytes());
    cap.extend_from_slice(&[0u8; 12]);
    for opts in [&[][..], &["--direct-writes=off"][..]] {
        let fx = Fixture::new("direct-cap", "64M", &[]);
        fx.mount(opts);
        let p = fx.path("tool");
        fs::write(&p, vec![1u8; 8192]).unwrap();
        let path = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid C strings and a value of the length passed.
        let r = unsafe {
            libc::setxattr(
                path.as_ptr(),
                c"security.capability".as_ptr(),
                cap.as_ptr().cast(),
                cap.len(),
                0,
            )
        };
        assert_eq!(
            r,
            0,
            "{opts:?}: setxattr: {}",
            std::io::Error::last_os_error()
        );
        assert!(capability(&p).is_some(), "{opts:?}: capability not set");
        // A write-only handle: direct by default, cached with =off.
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(b"patched", 100).unwrap();
        drop(f);
        assert_eq!(
            capability(&p),
            None,
            "{opts:?}: the capability survived a write"
        );
        fx.umount_clean("capability");
    }
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
    let o = nodup(&[
        "mount",
        fx.img.to_str().unwrap(),
        fx.mnt.to_str().unwrap(),
        "--direct-writes=sometimes",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("off, write-only or read-write"), "{err}");
    // Nothing was mounted, and the image still mounts (the writeback cache alone: cached).
    fx.mount(&["--writeback-cache"]);
    let p = fx.path("f");
    fs::write(&p, vec![7u8; MIB]).unwrap();
    assert!(mostly(resident_pages(&p), MIB / 4096));
    fx.umount_clean("writeback");
}

#[test]
fn asked_on_a_blockfile_image_direct_writes_replace_its_writeback_cache() {
    if !fuse_available() || !kernel_at_least(6, 6) {
        return;
    }
    let fx = Fixture::new("direct-blockfile", "64M", &["--medium", "blockfile"]);
    // The writeback cache is that medium's default: a write-only writer's pages stay cached.
    fx.mount(&[]);
    let p = fx.path("f");
    fs::write(&p, vec![5u8; MIB]).unwrap();
    assert_eq!(
        resident_pages(&p),
        MIB / 4096,
        "blockfile default: writeback cache"
    );
    fx.umount_clean("blockfile default");
    fx.mount(&["--direct-writes"]);
    let q = fx.path("g");
    fs::write(&q, vec![6u8; MIB]).unwrap();
    assert_eq!(
        resident_pages(&q),
        0,
        "--direct-writes on blockfile left pages cached"
    );
    // O_DSYNC through a direct handle is answered after the daemon syncs the image. That it
    // is durable would take a power cut to see; this checks the path answers and keeps data.
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .open(&q)
        .unwrap();
    f.write_all_at(&[9u8; 4096], 0).unwrap();
    drop(f);
    assert_eq!(fs::read(&q).unwrap()[..4096], [9u8; 4096]);
    fx.umount_clean("blockfile direct");
}

#[test]
fn readers_racing_direct_writes_never_keep_old_data() {
    if !fuse_available() || !kernel_at_least(6, 6) {
        return;
    }
    // xfstests generic/209's shape: readers fill the page cache while a direct writer
    // overwrites the file; once a write has returned, every read must see it. Kernels that
    // drop cached pages only before a direct write fail this without the daemon's own
    // invalidation (`fuse/direct.rs`); this one (6.18.44) passed without it too.
    let fx = Fixture::new("direct-race", "128M", &[]);
    fx.mount(&[]);
    let p = fx.path("f");
    fs::write(&p, vec![0u8; MIB]).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Stops the readers however this test ends, so a failure does not leave them spinning.
    struct Stop(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let _stop = Stop(stop.clone());
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (p, stop) = (p.clone(), stop.clone());
            std::thread::spawn(move || {
                let f = File::open(&p).unwrap();
                let mut buf = vec![0u8; MIB];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = f.read_at(&mut buf, 0);
                }
            })
        })
        .collect();
    let w = OpenOptions::new().write(true).open(&p).unwrap();
    let check = File::open(&p).unwrap();
    let mut seen = vec![0u8; MIB];
    for k in 1..=150u8 {
        w.write_all_at(&vec![k; MIB], 0).unwrap();
        check.read_exact_at(&mut seen, 0).unwrap();
        if let Some(i) = seen.iter().position(|&b| b != k) {
            panic!(
                "write {k}: byte {i} reads {} after the write returned",
                seen[i]
            );
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    drop((w, check));
    fx.umount_clean("race");
}
