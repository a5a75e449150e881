//! POSIX behaviour beyond pjdfstest and fsx (issue 14), on real mounts: set-id bits dropped by
//! an unprivileged punch or zero-range, an open directory that outlives its removal, readdir
//! under renames, and file handles that survive inode eviction and remounts.

mod common;
use common::*;

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::Command;

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn unprivileged_punch_and_zero_range_drop_setid_bits() {
    if !fuse_available() || !is_root() {
        eprintln!("skipping: needs FUSE and root (to act as another user)");
        return;
    }
    let fx = Fixture::new("setid", "32M", &[]);
    fx.mount(&[]);
    for (flag, what) in [("-p", "punch hole"), ("-z", "zero range")] {
        let f = fx.path(&format!("suid{flag}"));
        fs::write(&f, vec![7u8; 64 << 10]).unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o6777)).unwrap();
        assert_eq!(mode(&f), 0o6777);
        let st = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["fallocate", flag, "-o", "4096", "-l", "8192"])
            .arg(&f)
            .status()
            .unwrap();
        assert!(st.success(), "{what} as nobody failed");
        assert_eq!(
            mode(&f),
            0o777,
            "{what} by an unprivileged caller kept set-id bits"
        );
        // Root (CAP_FSETID) keeps them.
        fs::set_permissions(&f, fs::Permissions::from_mode(0o6777)).unwrap();
        let st = Command::new("fallocate")
            .args([flag, "-o", "4096", "-l", "8192"])
            .arg(&f)
            .status()
            .unwrap();
        assert!(st.success());
        assert_eq!(mode(&f), 0o6777, "{what} by root dropped set-id bits");
    }
    fx.umount();
}

#[test]
fn an_open_directory_outlives_its_removal() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("opendir", "32M", &[]);
    fx.mount(&[]);
    let d = fx.path("gone");
    fs::create_dir(&d).unwrap();
    let h = fs::File::open(&d).unwrap();
    fs::remove_dir(&d).unwrap();
    let m = h.metadata().expect("fstat of an open, removed directory");
    assert!(m.is_dir());
    assert_eq!(m.nlink(), 0);
    drop(h);
    // Replaced by a rename.
    fs::create_dir(fx.path("a")).unwrap();
    fs::create_dir(fx.path("b")).unwrap();
    let hb = fs::File::open(fx.path("b")).unwrap();
    fs::rename(fx.path("a"), fx.path("b")).unwrap();
    let m = hb
        .metadata()
        .expect("fstat of an open directory replaced by a rename");
    assert!(m.is_dir());
    assert_eq!(m.nlink(), 0);
    drop(hb);
    fx.umount();
    ok(fx.fsck());
}

#[test]
fn readdir_that_renames_every_entry_sees_each_once() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("rdren", "64M", &[]);
    fx.mount(&[]);
    let dir = fx.path("d");
    fs::create_dir(&dir).unwrap();
    let n = 5000;
    for i in 0..n {
        fs::write(dir.join(format!("f{i}")), b"").unwrap();
    }
    let mut seen = std::collections::HashSet::new();
    let mut count = 0;
    for e in fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        count += 1;
        assert!(count <= n, "readdir returned more than {n} entries");
        let name = e.file_name();
        assert!(seen.insert(name.clone()), "{name:?} returned twice");
        let mut to = b"r-".to_vec();
        to.extend_from_slice(name.as_bytes());
        fs::rename(e.path(), dir.join(std::ffi::OsStr::from_bytes(&to))).unwrap();
    }
    assert_eq!(count, n);
    assert_eq!(fs::read_dir(&dir).unwrap().count(), n);
    // The entries keep their order across a remount (cookies are persisted).
    let before: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    fx.umount();
    fx.mount(&[]);
    let after: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(before, after);
    fx.umount();
}

/// A `struct file_handle` with room for the handle bytes.
#[repr(C)]
struct Handle {
    bytes: u32,
    kind: i32,
    data: [u8; 128],
}

#[test]
fn file_handles_survive_eviction_and_remount() {
    if !fuse_available() || !is_root() {
        eprintln!("skipping: needs FUSE and root (open_by_handle_at)");
        return;
    }
    let fx = Fixture::new("fh", "32M", &[]);
    fx.mount(&[]);
    let f = fx.path("kept");
    fs::write(&f, b"reachable by handle").unwrap();
    let mut h = Handle {
        bytes: 128,
        kind: 0,
        data: [0; 128],
    };
    let mut mount_id = 0;
    let c = std::ffi::CString::new(f.as_os_str().as_bytes()).unwrap();
    // SAFETY: `h` has room for 128 handle bytes as declared; the path is NUL terminated.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            c.as_ptr(),
            &mut h as *mut Handle as *mut libc::file_handle,
            &mut mount_id,
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at: {}",
        std::io::Error::last_os_error()
    );
    let read_by_handle = |h: &mut Handle| -> std::io::Result<Vec<u8>> {
        let root = fs::File::open(&fx.mnt)?;
        // SAFETY: a handle filled by name_to_handle_at and a descriptor on the mount.
        let fd = unsafe {
            libc::open_by_handle_at(
                root.as_raw_fd(),
                h as *mut Handle as *mut libc::file_handle,
                libc::O_RDONLY,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let file = unsafe { <fs::File as std::os::unix::io::FromRawFd>::from_raw_fd(fd) };
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut v)?;
        Ok(v)
    };
    assert_eq!(read_by_handle(&mut h).unwrap(), b"reachable by handle");
    // The kernel forgets the inode (dentries and inodes dropped), then a remount.
    fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
    assert_eq!(
        read_by_handle(&mut h).expect("handle after the kernel dropped the inode"),
        b"reachable by handle"
    );
    fx.umount();
    fx.mount(&[]);
    assert_eq!(
        read_by_handle(&mut h).expect("handle after a remount"),
        b"reachable by handle"
    );
    fx.umount();
}

#[test]
fn copy_file_range_shares_blocks_and_copies_stay_independent() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("cfr", "256M", &[]);
    fx.mount(&[]);
    let mut rng = StdRng::seed_from_u64(time_seed());
    let mut data = vec![0u8; 64 << 20];
    rng.fill(&mut data);
    // An unaligned tail, so the last partial block goes through the write path.
    data.truncate((64 << 20) - 1000);
    let orig = fx.path("orig");
    fs::write(&orig, &data).unwrap();
    let before = fx.stats();
    let phys0 = before["physical_bytes"].as_u64().unwrap();
    let shared0 = before["copy_shared_bytes"].as_u64().unwrap();
    // coreutils cp uses copy_file_range; call it directly as well so the test does not depend
    // on cp's choice.
    let st = Command::new("cp")
        .arg(&orig)
        .arg(fx.path("by-cp"))
        .status()
        .unwrap();
    assert!(st.success());
    {
        let src = fs::File::open(&orig).unwrap();
        let dst = fs::File::create(fx.path("by-call")).unwrap();
        let mut left = data.len();
        while left > 0 {
            // SAFETY: two open descriptors; null offsets use and advance the file positions.
            let n = unsafe {
                libc::copy_file_range(
                    src.as_raw_fd(),
                    std::ptr::null_mut(),
                    dst.as_raw_fd(),
                    std::ptr::null_mut(),
                    left,
                    0,
                )
            };
            assert!(
                n > 0,
                "copy_file_range: {}",
                std::io::Error::last_os_error()
            );
            left -= n as usize;
        }
    }
    let after = fx.stats();
    let whole = (data.len() as u64 / 4096) * 4096;
    assert!(
        after["copy_shared_bytes"].as_u64().unwrap() - shared0 >= 2 * whole,
        "copies did not share blocks: {after}"
    );
    let grew = after["physical_bytes"].as_u64().unwrap() - phys0;
    assert!(grew < 1 << 20, "two copies grew physical bytes by {grew}");
    // Writing into the middle of one copy leaves the others intact.
    {
        let f = fs::OpenOptions::new()
            .write(true)
            .open(fx.path("by-cp"))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[0xA5; 4096], 32 << 20).unwrap();
        let f = fs::OpenOptions::new().write(true).open(&orig).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[0x5A; 4096], 16 << 20).unwrap();
    }
    let check = |fx: &Fixture| {
        let mut want_cp = data.clone();
        want_cp[32 << 20..(32 << 20) + 4096].fill(0xA5);
        let mut want_orig = data.clone();
        want_orig[16 << 20..(16 << 20) + 4096].fill(0x5A);
        assert!(
            fs::read(fx.path("by-call")).unwrap() == data,
            "by-call changed"
        );
        assert!(
            fs::read(fx.path("by-cp")).unwrap() == want_cp,
            "by-cp wrong"
        );
        assert!(fs::read(&orig).unwrap() == want_orig, "orig wrong");
    };
    check(&fx);
    fx.umount();
    ok(fx.fsck());
    fx.mount(&[]);
    check(&fx);
    fx.umount();
}

fn times(p: &Path) -> (i64, i64) {
    let m = fs::metadata(p).unwrap();
    (
        m.atime() * 1_000_000_000 + m.atime_nsec(),
        m.mtime() * 1_000_000_000 + m.mtime_nsec(),
    )
}

/// Set atime and mtime of `p` to seconds since the epoch.
fn set_times(p: &Path, atime: i64, mtime: i64) {
    let f = fs::File::open(p).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: atime,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: mtime,
            tv_nsec: 0,
        },
    ];
    // SAFETY: an open descriptor and two valid timespecs.
    assert_eq!(unsafe { libc::futimens(f.as_raw_fd(), ts.as_ptr()) }, 0);
}

#[test]
fn a_later_write_never_carries_an_earlier_mtime() {
    if !fuse_available() {
        return;
    }
    // With the writeback cache the kernel stamps written files itself, from its coarse clock.
    let fx = Fixture::new("clock", "64M", &[]);
    fx.mount(&["--writeback-cache"]);
    let d = fx.path("d");
    fs::create_dir(&d).unwrap();
    for i in 0..300 {
        let p = d.join(format!("f{i}"));
        let f = fs::File::create(&p).unwrap();
        let created = f.metadata().unwrap();
        let dir_after_create = fs::metadata(&d).unwrap();
        std::io::Write::write_all(&mut &f, b"x").unwrap();
        let written = f.metadata().unwrap();
        let t = |m: &fs::Metadata| m.mtime() * 1_000_000_000 + m.mtime_nsec();
        assert!(
            t(&written) >= t(&created),
            "file {i}: write stamped mtime {} before its creation {}",
            t(&written),
            t(&created)
        );
        assert!(
            t(&written) >= t(&dir_after_create),
            "file {i}: write stamped mtime {} before the directory change {} that preceded it",
            t(&written),
            t(&dir_after_create)
        );
    }
    fx.umount();
}

#[test]
fn reads_update_atime_as_relatime_strictatime_and_noatime_say() {
    if !fuse_available() {
        return;
    }
    let read = |p: &Path| {
        fs::read(p).unwrap();
    };
    let long_ago = 1_000_000_000; // 2001
    for mode in ["relatime", "strictatime", "noatime"] {
        let fx = Fixture::new("atime", "32M", &[]);
        fx.mount(&["--atime", mode]);
        let f = fx.path("f");
        fs::write(&f, b"data").unwrap();
        // atime older than mtime: relatime and strictatime update it on the next read.
        set_times(&f, long_ago, long_ago + 10);
        // Past the tick of the ctime that set_times stamped (an atime equal to ctime is
        // "not newer" and relatime would refresh it again).
        std::thread::sleep(std::time::Duration::from_millis(30));
        read(&f);
        let (a1, _) = times(&f);
        match mode {
            "noatime" => assert_eq!(a1, long_ago * 1_000_000_000, "{mode}: read set atime"),
            _ => assert!(
                a1 > (long_ago + 10) * 1_000_000_000,
                "{mode}: read after a change left atime at {a1}"
            ),
        }
        // A second read, later: only strictatime updates again.
        std::thread::sleep(std::time::Duration::from_millis(30));
        read(&f);
        let (a2, _) = times(&f);
        match mode {
            "strictatime" => assert!(a2 > a1, "{mode}: second read kept atime"),
            _ => assert_eq!(a2, a1, "{mode}: second read changed atime"),
        }
        // A listing is an access of the directory.
        let d = fx.path("d");
        fs::create_dir(&d).unwrap();
        set_times(&d, long_ago, long_ago + 10);
        fs::read_dir(&d).unwrap().for_each(drop);
        let (da, _) = times(&d);
        assert_eq!(
            da > (long_ago + 10) * 1_000_000_000,
            mode != "noatime",
            "{mode}: listing left directory atime at {da}"
        );
        // The updated atime is persistent.
        fx.umount();
        fx.mount(&["--atime", "noatime"]);
        assert_eq!(times(&f).0, a2, "{mode}: atime lost at remount");
        fx.umount();
    }
}

#[test]
fn enospc_with_the_writeback_cache_is_reported_by_write() {
    if !fuse_available() {
        return;
    }
    let fx = Fixture::new("wbfull", "64M", &[]);
    fx.mount(&["--writeback-cache"]);
    let mut rng = StdRng::seed_from_u64(time_seed());
    for round in 0..2 {
        let p = fx.path("fill");
        let mut f = fs::File::create(&p).unwrap();
        let mut kept = Vec::new();
        let err = loop {
            let mut chunk = vec![0u8; 1 << 20];
            rng.fill(&mut chunk);
            match std::io::Write::write_all(&mut f, &chunk) {
                Ok(()) => kept.extend_from_slice(&chunk),
                Err(e) => break e,
            }
            assert!(
                kept.len() <= 64 << 20,
                "round {round}: wrote past the image size"
            );
        };
        assert_eq!(
            err.raw_os_error(),
            Some(libc::ENOSPC),
            "round {round}: {err}"
        );
        // What write(2) accepted is stored: fsync and close report nothing.
        f.sync_all()
            .unwrap_or_else(|e| panic!("round {round}: fsync after ENOSPC: {e}"));
        drop(f);
        let got = fs::read(&p).unwrap();
        assert!(
            got.len() >= kept.len() && got[..kept.len()] == kept[..],
            "round {round}: accepted data lost"
        );
        assert!(
            kept.len() > 48 << 20,
            "round {round}: only {} bytes fit",
            kept.len()
        );
        // Deleting the file makes room again.
        fs::remove_file(&p).unwrap();
    }
    fx.umount();
    ok(fx.fsck());
}

/// Run the ACL workload in `dir` and return what it printed.
fn acl_workload(dir: &Path) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/acl-script.sh");
    let out = Command::new("bash").arg(script).arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// ACLs and modes of everything under `dir`, in name order.
fn acl_listing(dir: &Path) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg("find . | sort | xargs -d '\\n' getfacl -p; find . -printf '%p %M %u %g\\n' | sort")
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn posix_acls_behave_as_on_tmpfs() {
    if !fuse_available() || !is_root() {
        eprintln!("skipping: needs FUSE and root (to act as another user)");
        return;
    }
    // tmpfs (which implements POSIX ACLs in the kernel) is the reference.
    let reference =
        std::path::PathBuf::from(format!("/dev/shm/nodup-acl-ref-{}", std::process::id()));
    let _ = fs::remove_dir_all(&reference);
    fs::create_dir(&reference).unwrap();
    fs::set_permissions(&reference, fs::Permissions::from_mode(0o777)).unwrap();
    let want = acl_workload(&reference);
    fs::remove_dir_all(&reference).unwrap();
    assert!(
        want.contains("user:nobody:rw-"),
        "the reference has no ACLs:\n{want}"
    );

    let fx = Fixture::new("acl", "64M", &[]);
    fx.mount(&[]);
    fs::set_permissions(&fx.mnt, fs::Permissions::from_mode(0o777)).unwrap();
    let got = acl_workload(&fx.mnt);
    if got != want {
        let (w, g) = (want.lines(), got.lines());
        let first = w
            .zip(g)
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(got.lines().count()));
        panic!("ACLs differ from tmpfs from line {first}:\n--- tmpfs\n{want}\n--- nodup\n{got}");
    }
    // They are persistent, and the image checks clean.
    let before = acl_listing(&fx.mnt);
    fx.umount();
    ok(fx.fsck());
    fx.mount(&[]);
    assert_eq!(
        acl_listing(&fx.mnt),
        before,
        "ACLs changed across a remount"
    );
    fx.umount();
}

/// `path` as a C string for the libc calls below.
fn c_path(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// setxattr(2) of `name` on `p`: its errno on failure.
fn set_xattr(p: &Path, name: &str, value: &[u8]) -> Result<(), i32> {
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings and a value buffer of the length passed.
    let r = unsafe {
        libc::setxattr(
            c_path(p).as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// listxattr(2) of `p`, called by a thread that first drops to uid and gid 65534 when
/// `unprivileged` (raw setresuid/setresgid change the calling thread only, and leaving uid 0
/// clears its effective capabilities).
fn list_xattrs(p: &Path, unprivileged: bool) -> Vec<String> {
    let path = c_path(p);
    std::thread::scope(|s| {
        s.spawn(|| {
            if unprivileged {
                // SAFETY: plain system calls on this thread's own credentials.
                unsafe {
                    assert_eq!(libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534), 0);
                    assert_eq!(libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534), 0);
                }
            }
            let mut buf = vec![0u8; 4096];
            // SAFETY: a valid C string and a buffer of the length passed.
            let n = unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            buf.truncate(usize::try_from(n).expect("listxattr"));
            let mut names: Vec<String> = buf
                .split(|&b| b == 0)
                .filter(|n| !n.is_empty())
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect();
            names.sort();
            names
        })
        .join()
        .unwrap()
    })
}

/// Corners where nodup answered otherwise than ext4 and tmpfs (session 35's differential run):
/// times before 1970 with nanoseconds, `trusted.*` names listed to anyone, names in no
/// namespace accepted, a write across the largest file size refused whole, and a negative
/// SEEK_HOLE offset.
#[test]
fn corner_cases_answer_as_ext4_and_tmpfs_do() {
    if !fuse_available() || !is_root() {
        eprintln!("skipping: needs FUSE and root (to act as another user)");
        return;
    }
    let fx = Fixture::new("corners", "32M", &[]);
    fx.mount(&[]);
    let f = fx.path("f");
    fs::write(&f, b"x").unwrap();

    // 0.75 s and 999.999999995 s before the epoch.
    let ts = [
        libc::timespec {
            tv_sec: -1,
            tv_nsec: 250_000_000,
        },
        libc::timespec {
            tv_sec: -1000,
            tv_nsec: 5,
        },
    ];
    // SAFETY: a valid C string and two valid timespecs.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c_path(&f).as_ptr(), ts.as_ptr(), 0) };
    assert_eq!(r, 0);
    let times = |p: &Path| {
        let m = fs::metadata(p).unwrap();
        (m.atime(), m.atime_nsec(), m.mtime(), m.mtime_nsec())
    };
    assert_eq!(times(&f), (-1, 250_000_000, -1000, 5), "times before 1970");

    assert_eq!(set_xattr(&f, "trusted.t", b"1"), Ok(()));
    assert_eq!(set_xattr(&f, "user.u", b"2"), Ok(()));
    assert_eq!(list_xattrs(&f, false), ["trusted.t", "user.u"]);
    assert_eq!(
        list_xattrs(&f, true),
        ["user.u"],
        "trusted.* listed to a caller without CAP_SYS_ADMIN"
    );
    assert_eq!(set_xattr(&f, "user.", b"v"), Err(libc::EINVAL));
    assert_eq!(set_xattr(&f, "foo.bar", b"v"), Err(libc::EOPNOTSUPP));
    assert_eq!(set_xattr(&f, "system.foo", b"v"), Err(libc::EOPNOTSUPP));

    let big = fx.path("big");
    let h = fs::File::create(&big).unwrap();
    let limit: i64 = 1 << 50;
    let buf = [7u8; 8192];
    // SAFETY: an open descriptor and a buffer of the length passed.
    let n = unsafe { libc::pwrite(h.as_raw_fd(), buf.as_ptr().cast(), buf.len(), limit - 4096) };
    assert_eq!(
        n, 4096,
        "a write across the largest file size writes what fits"
    );
    // SAFETY: as above.
    let n = unsafe { libc::pwrite(h.as_raw_fd(), buf.as_ptr().cast(), buf.len(), limit) };
    assert_eq!(n, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EFBIG)
    );
    assert_eq!(fs::metadata(&big).unwrap().len(), limit as u64);
    // SAFETY: an open descriptor.
    let r = unsafe { libc::lseek(h.as_raw_fd(), -1, libc::SEEK_HOLE) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENXIO)
    );
    drop(h);
    fs::remove_file(&big).unwrap();

    fx.umount();
    fx.mount(&[]);
    assert_eq!(times(&f), (-1, 250_000_000, -1000, 5), "after a remount");
    fx.umount_clean("corner cases");
}
