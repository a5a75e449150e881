//! Tests of the memory-mapped medium: round trips, bounds, word accesses, holes and the backing
//! store, reopening, the store modes, concurrent writers.

use super::*;
use crate::media::small_disk::{FailingExt4, SmallDisk};
use std::sync::Arc;

#[test]
fn round_trip_and_direct() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let m = Pmem::create(dir.path().join("img"), 1 << 20).unwrap();
    assert_eq!(m.len(), 1 << 20);
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    m.write(4093, &data).unwrap();
    m.flush(4093, data.len() as u64);
    m.fence().unwrap();
    let mut back = vec![0; data.len()];
    m.read(4093, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(m.direct(4093, data.len()).unwrap(), &data[..]);
    m.prefetch(0, 4096, 256);
    m.prefetch(1 << 20, 4096, 0); // past the end: ignored
    #[cfg(target_arch = "x86_64")]
    assert_ne!(
        m.flush_instr(),
        FlushInstr::Msync,
        "x86_64 CPUs have clflush at least"
    );
}

/// A discarded range becomes a hole of the image file and reads as zeros; storing into it
/// again backs it again (the store lands, and the range is data once more).
#[test]
fn a_discard_punches_a_hole_and_stores_back_it_again() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let m = Pmem::create(dir.path().join("img"), 8 << 20).unwrap();
    let at = 3 << 20;
    m.write(at, &[7u8; 4096]).unwrap();
    m.flush(at, 4096);
    m.fence().unwrap();
    assert!(!m.known_zero(at, 4096));
    if !m.discard(at, 4096).unwrap() {
        eprintln!("skipping: this file system cannot punch holes");
        return;
    }
    assert!(m.known_zero(at, 4096), "no hole after the discard");
    let mut b = [1u8; 4096];
    m.read(at, &mut b).unwrap();
    assert_eq!(b, [0u8; 4096]);
    m.write(at, &[9u8; 4096]).unwrap();
    m.read(at, &mut b).unwrap();
    assert_eq!(b, [9u8; 4096]);
    assert!(
        !m.known_zero(at, 4096),
        "the store after the discard is not backed"
    );
}

/// On tmpfs, a chunk that holds data and holes (blocks given back) is backed page by
/// page: a store into one of its holes allocates that page (and a few after it) only, at
/// this mount and the next, instead of taking the chunk's other holes back; a chunk all
/// hole is still allocated whole.
#[test]
fn a_chunk_with_holes_is_backed_page_by_page() {
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("skipping: no /dev/shm");
        return;
    };
    let path = dir.path().join("img");
    let chunk = BACK_CHUNK;
    let m = Pmem::create(&path, 4 * chunk).unwrap();
    m.write(chunk, &vec![5u8; chunk as usize]).unwrap();
    if !m.discard(chunk, chunk / 2).unwrap() {
        eprintln!("skipping: this file system cannot punch holes");
        return;
    }
    let page = |m: &Pmem, at: u64, v: u8| {
        m.write(at, &[v; 4096]).unwrap();
        let mut b = [0u8; 4096];
        m.read(at, &mut b).unwrap();
        assert_eq!(b, [v; 4096]);
        assert!(!m.known_zero(at, 4096), "page {at} not backed");
    };
    page(&m, chunk + 8192, 6);
    // The data half takes stores as ever.
    page(&m, chunk + chunk / 2 + 4096, 7);
    // The pages a store into a hole allocates: its own and a few after it.
    let ahead = super::super::backing::PAGES_AHEAD * 4096;
    let holes = |m: &Pmem| {
        assert!(
            m.known_zero(chunk, 8192),
            "the holes before the page were filled"
        );
        let after = chunk + 8192 + ahead;
        assert!(
            m.known_zero(after, chunk + chunk / 2 - ahead - after),
            "the holes after the page were filled"
        );
    };
    holes(&m);
    drop(m);
    // The next mount finds the chunk's holes in the file.
    let m = Pmem::open(&path).unwrap();
    page(&m, chunk + chunk / 2 - ahead, 8);
    holes(&m);
    let mut b = vec![0u8; 4096];
    m.read(chunk + 8192, &mut b).unwrap();
    assert_eq!(b, vec![6u8; 4096]);
    // A chunk all hole is backed whole at its first store, as before.
    page(&m, 3 * chunk, 9);
    assert!(!m.known_zero(3 * chunk + chunk - 4096, 4096));
}

#[test]
fn bounds_are_errors() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let m = Pmem::create(dir.path().join("img"), 8192).unwrap();
    let mut b = [0u8; 16];
    assert!(matches!(m.read(8190, &mut b), Err(Error::Invalid(_))));
    assert!(matches!(m.write(8190, &b), Err(Error::Invalid(_))));
    assert!(matches!(m.write(u64::MAX - 3, &b), Err(Error::Invalid(_))));
    assert!(m.read(8176, &mut b).is_ok());
    assert!(m.direct(8180, 16).is_none());
    m.flush(8000, 1 << 40); // clamped, no panic
    assert!(matches!(
        Pmem::create(dir.path().join("zero"), 0),
        Err(Error::Invalid(_))
    ));
}

#[test]
fn word_and_entry_accesses_match_the_byte_ones() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let m = Pmem::create(dir.path().join("img"), 8192).unwrap();
    let bytes: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(37) ^ 0x5A).collect();
    m.write(8100, &bytes).unwrap();
    // Unaligned offsets on purpose: entries and words need no alignment of their own.
    let mut w = [0u8; 8];
    m.read(8103, &mut w).unwrap();
    assert_eq!(m.read_u64(8103).unwrap(), u64::from_le_bytes(w));
    let mut e = [0u8; 32];
    m.read(8101, &mut e).unwrap();
    assert_eq!(m.read_32(8101).unwrap(), e);
    m.write_u64(8105, 0x0123_4567_89AB_CDEF).unwrap();
    m.read(8105, &mut w).unwrap();
    assert_eq!(w, 0x0123_4567_89AB_CDEFu64.to_le_bytes());
    // The bytes around the word are untouched.
    let mut all = [0u8; 40];
    m.read(8100, &mut all).unwrap();
    assert_eq!(all[..5], bytes[..5]);
    assert_eq!(all[13..], bytes[13..]);
    // The end of the medium bounds them as it bounds `read` and `write`.
    assert!(m.read_u64(8184).is_ok());
    assert!(matches!(m.read_u64(8185), Err(Error::Invalid(_))));
    assert!(matches!(m.write_u64(8185, 1), Err(Error::Invalid(_))));
    assert!(matches!(m.read_32(8161), Err(Error::Invalid(_))));
    assert!(matches!(m.read_u64(u64::MAX - 3), Err(Error::Invalid(_))));
}

#[test]
fn reopen_persists() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let p = dir.path().join("img");
    for opts in [
        PmemOptions {
            sync_on_fence: true,
            populate: true,
            stream_data: false,
        },
        PmemOptions::default(),
    ] {
        {
            let m = Pmem::create_with(&p, 64 * 1024, opts).unwrap();
            m.write(100, b"hello pmem").unwrap();
            m.write(40000, b"second page").unwrap();
            m.flush(100, 10);
            m.flush(40000, 11);
            m.fence().unwrap();
            m.sync_all().unwrap();
        }
        let m = Pmem::open_with(&p, opts).unwrap();
        assert_eq!(m.len(), 64 * 1024);
        let mut b = [0u8; 10];
        m.read(100, &mut b).unwrap();
        assert_eq!(&b, b"hello pmem");
        let mut b = [0u8; 11];
        m.read(40000, &mut b).unwrap();
        assert_eq!(&b, b"second page");
    }
    assert!(Pmem::open(dir.path().join("missing")).is_err());
}

#[test]
fn fill_with_stores_survive_reopen_in_every_store_mode() {
    // On tmpfs: on a disk's file system every fence is an msync, and nothing streams.
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let p = dir.path().join("img");
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 5) as u8).collect();
    for (stream_data, sync_on_fence) in [(false, false), (true, false), (false, true)] {
        let opts = PmemOptions {
            stream_data,
            sync_on_fence,
            populate: false,
        };
        {
            let m = Pmem::create_with(&p, 64 * 1024, opts).unwrap();
            let mut seen = None;
            let took = m
                .fill_with(8192, 4096, &mut |dst| {
                    seen = Some(dst.streaming);
                    // SAFETY: the medium hands out 4096 writable bytes at `dst.ptr`.
                    unsafe { std::ptr::copy_nonoverlapping(block.as_ptr(), dst.ptr, block.len()) };
                })
                .unwrap();
            assert!(took);
            // Streaming is used exactly when asked for and durability comes from the CPU.
            assert_eq!(
                seen,
                Some(stream_data && !sync_on_fence && cfg!(target_arch = "x86_64"))
            );
            m.fence().unwrap();
            m.sync_all().unwrap();
            let mut called = false;
            assert!(matches!(
                m.fill_with(64 * 1024 - 100, 4096, &mut |_| called = true),
                Err(Error::Invalid(_))
            ));
            assert!(!called, "an out-of-range fill must not call the closure");
        }
        let m = Pmem::open_with(&p, opts).unwrap();
        let mut back = vec![0u8; 4096];
        m.read(8192, &mut back).unwrap();
        assert_eq!(
            back, block,
            "stream_data {stream_data} sync_on_fence {sync_on_fence}"
        );
    }
}

#[test]
fn concurrent_disjoint_writers() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let m = Arc::new(Pmem::create(dir.path().join("img"), 8 * 4096).unwrap());
    let handles: Vec<_> = (0..8u8)
        .map(|t| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    let v = [t.wrapping_add(i as u8); 4096];
                    m.write(t as u64 * 4096, &v).unwrap();
                    m.flush(t as u64 * 4096, 4096);
                    m.fence().unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for t in 0..8u8 {
        let mut b = vec![0; 4096];
        m.read(t as u64 * 4096, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == t.wrapping_add(199)));
    }
}

/// A three-chunk image on a small tmpfs of `size` (root only), its first page written with
/// ones and `[hole, chunk)` given back; `None` (with a line) when that cannot be set up.
fn image_with_a_hole(size: &str, hole: u64) -> Option<(SmallDisk, Pmem)> {
    let disk = SmallDisk::mount(size)?;
    // Three chunks: fewer than a store asks to have backed ahead of it, so no background
    // backing runs (one failing after the disk was filled gives its pages back, and a store
    // into a hole could then find room).
    let m = Pmem::create(disk.dir.path().join("img"), 3 * BACK_CHUNK).unwrap();
    m.write(0, &[1u8; 4096]).unwrap();
    if !m.discard(hole, BACK_CHUNK - hole).unwrap() {
        eprintln!("skipping: this file system cannot punch holes");
        return None;
    }
    Some((disk, m))
}

/// On a full disk (a small tmpfs, root only): a range reserved before takes stores, and so
/// does a page with data in a chunk with holes (given back), although the pages after it
/// cannot be allocated; a store into a hole gets ENOSPC and stores nothing.
#[test]
fn a_full_disk_takes_stores_into_space_the_image_holds() {
    let Some((disk, m)) = image_with_a_hole("8M", 8192) else {
        return;
    };
    let chunk = BACK_CHUNK;
    let reserved = 2 * chunk + 4096;
    m.reserve(reserved, 4096).unwrap();
    disk.fill();
    let no_space =
        |r: Result<()>| matches!(r, Err(Error::Io(e)) if e.raw_os_error() == Some(libc::ENOSPC));
    m.write(reserved, &[2u8; 4096]).unwrap();
    m.write(0, &[3u8; 4096]).unwrap();
    assert!(no_space(m.write(8192, &[4u8; 4096])), "a hole in the chunk");
    assert!(no_space(m.write(chunk, &[4u8; 4096])), "a chunk all hole");
    assert!(no_space(m.reserve(chunk + 8192, 4096)));
    let mut b = [0u8; 4096];
    m.read(reserved, &mut b).unwrap();
    assert_eq!(b, [2u8; 4096]);
    m.read(0, &mut b).unwrap();
    assert_eq!(b, [3u8; 4096]);
    // Holes read as zeros, through the file: a load from one through the mapping would be a
    // SIGBUS on a full tmpfs (see `backing.rs`), and no view of one is lent.
    let holes_read_as_zeros = |m: &Pmem| {
        let mut b = [7u8; 4096];
        for at in [8192, chunk, chunk + 8192] {
            m.read(at, &mut b).unwrap();
            assert_eq!(b, [0u8; 4096], "hole at {at}");
            assert_eq!(m.read_u64(at + 8).unwrap(), 0);
            assert_eq!(m.read_32(at + 64).unwrap(), [0u8; 32]);
            assert!(m.direct(at, 4096).is_none(), "a view of the hole at {at}");
        }
        // A range over data and a hole, and one across chunks.
        let mut two = vec![7u8; 8192];
        m.read(4096, &mut two).unwrap();
        assert_eq!(two, [0u8; 8192]);
        m.read(chunk - 4096, &mut two).unwrap();
        assert_eq!(two, [0u8; 8192]);
        assert_eq!(m.direct(0, 4096), Some(&[3u8; 4096][..]));
        assert_eq!(m.direct(reserved, 4096), Some(&[2u8; 4096][..]));
    };
    holes_read_as_zeros(&m);
    // Still so after the medium is opened again, knowing nothing of its holes, read-only or
    // not, with the disk still full.
    m.sync_all().unwrap();
    drop(m);
    let path = disk.dir.path().join("img");
    holes_read_as_zeros(&Pmem::open_read_only(&path).unwrap());
    holes_read_as_zeros(&Pmem::open(&path).unwrap());
}

#[test]
fn a_hole_read_with_room_takes_a_page_and_a_punch_forgets_it() {
    let Some((disk, m)) = image_with_a_hole("100M", 4096) else {
        return;
    };
    let chunk = BACK_CHUNK;
    let fd = m.file.as_raw_fd();
    // With room, a load from a hole goes through the mapping and takes a page, and so does a
    // view of one, whether or not its holder reads it.
    let mut b = [7u8; 4096];
    m.read(8192, &mut b).unwrap();
    assert_eq!(b, [0u8; 4096]);
    assert!(!crate::media::file_hole(fd, 8192, 4096), "the page read");
    assert!(m.direct(12288, 4096).is_some());
    assert!(
        !crate::media::file_hole(fd, 12288, 4096),
        "the page under the view"
    );
    // Given back again, then the disk fills: those pages are holes once more, and once the
    // last look at the room is old they read as zeros from the file (their marks went with
    // the punch, or this is a SIGBUS; a look that never expires is one too).
    assert!(m.discard(8192, 8192).unwrap());
    assert!(crate::media::file_hole(fd, 8192, 8192));
    disk.fill();
    std::thread::sleep(std::time::Duration::from_millis(5));
    for at in [8192, 12288, chunk + 4096] {
        let mut b = [7u8; 4096];
        m.read(at, &mut b).unwrap();
        assert_eq!(b, [0u8; 4096], "hole at {at}");
        assert!(m.direct(at, 4096).is_none(), "a view of the hole at {at}");
    }
    assert_eq!(m.read_u64(0).unwrap(), u64::from_le_bytes([1; 8]));
}

/// A pmem image on a file system with a page cache (ext4 here) fences by `msync`: a fence
/// writes the store back, so on a disk that cannot take it the fence fails, where an `sfence`
/// alone succeeded and left the store in the cache. On tmpfs a fence stays a store fence.
#[test]
fn a_fence_on_a_disk_file_system_writes_the_store_back() {
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let m = Pmem::create(shm.path().join("img"), 1 << 20).unwrap();
    assert_eq!(m.syncs_on_fence(), m.flush_instr() == FlushInstr::Msync);
    let Some(ext4) = FailingExt4::mount(48) else {
        return;
    };
    let m = Pmem::create(ext4.dir.path().join("img"), 16 << 20).unwrap();
    assert!(m.syncs_on_fence());
    assert!(!m.streams_data());
    let data = vec![0x3cu8; 64 << 10];
    m.write(0, &data).unwrap();
    m.flush(0, data.len() as u64);
    m.fence().unwrap();
    ext4.disk.fill();
    m.write(8 << 20, &data).unwrap();
    m.flush(8 << 20, data.len() as u64);
    assert!(
        m.fence().is_err(),
        "the fence left the store in the page cache"
    );
    drop(m);
    ext4.disk.unfill();
    let m = Pmem::open(ext4.dir.path().join("img")).unwrap();
    let mut got = vec![0u8; data.len()];
    m.read(0, &mut got).unwrap();
    assert!(got == data);
}
