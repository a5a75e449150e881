//! nodup on a block device (a loop device over a sparse file, root only): mkfs formats the
//! whole device after the same guard rails as for a file, and an image made over an old one
//! starts clean; mount and fsck --repair claim the device; dedup, fsck, a remount and the
//! recovery of a killed daemon work on it.

mod common;
use common::*;

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;

/// A loop device over a sparse file in /dev/shm, and a mount point for it; unmounted,
/// detached and removed on drop, also when the test fails.
struct Loop {
    dev: PathBuf,
    backing: PathBuf,
    mnt: PathBuf,
}

impl Loop {
    /// None (the test is skipped, saying why) when no loop device can be set up.
    fn new(tag: &str, len: u64) -> Option<Loop> {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let backing = PathBuf::from(format!(
            "/dev/shm/nodup-loop-{}-{tag}-{n}",
            std::process::id()
        ));
        fs::File::create(&backing).unwrap().set_len(len).unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&backing)
            .output();
        match out {
            Ok(o) if o.status.success() => {
                let dev = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
                let mnt = backing.with_extension("mnt");
                fs::create_dir_all(&mnt).unwrap();
                Some(Loop { dev, backing, mnt })
            }
            _ => {
                eprintln!("skipping: no loop device (losetup failed)");
                let _ = fs::remove_file(&backing);
                None
            }
        }
    }
    fn s(&self) -> &str {
        self.dev.to_str().unwrap()
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        detach(&self.mnt);
        // The daemon lets go of the device before it can be detached.
        wait_unlocked(&self.dev);
        let _ = fs::remove_dir(&self.mnt);
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).output();
        let _ = fs::remove_file(&self.backing);
    }
}

/// The exclusive open a mounted file system or mkfs.ext4 makes of a device.
fn exclusive(dev: &str) -> std::io::Result<fs::File> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(dev)
}

fn head(p: &Path) -> Vec<u8> {
    let mut v = vec![0u8; 1 << 20];
    std::os::unix::fs::FileExt::read_exact_at(&fs::File::open(p).unwrap(), &mut v, 0).unwrap();
    v
}

#[test]
fn mkfs_formats_a_block_device_whole_and_it_starts_clean() {
    if !fuse_available() || !is_root() {
        return;
    }
    let Some(lo) = Loop::new("mkfs", 96 << 20) else {
        return;
    };
    let d = lo.s();

    // Something on it that is not an image: refused without --force, left as it was.
    let mut junk = vec![0u8; 1 << 20];
    StdRng::seed_from_u64(5).fill(&mut junk);
    std::os::unix::fs::FileExt::write_all_at(&fs::File::create(d).unwrap(), &junk, 0).unwrap();
    one_line(&fail(&nodup(&["mkfs", d])), "is not empty");
    one_line(
        &fail(&nodup(&["mkfs", d, "--size", "64M", "--force"])),
        "takes the whole device",
    );
    one_line(
        &fail(&nodup(&["mkfs", d, "--medium", "pmem", "--force"])),
        "holds a blockfile image",
    );
    {
        // Held exclusively (as a mounted file system holds its device).
        let _held = exclusive(d).unwrap();
        one_line(&fail(&nodup(&["mkfs", d, "--force"])), "in use");
    }
    assert!(head(&lo.dev) == junk, "a refused mkfs changed the device");

    // An old image, used, then copied onto the device: its log and data are all there when
    // mkfs --force makes a new image over it.
    let old = Fixture::new("bdev-old", "96M", &["--medium", "blockfile"]);
    old.mount(&[]);
    let mut data = vec![0u8; 6 << 20];
    StdRng::seed_from_u64(6).fill(&mut data);
    fs::write(old.path("a"), &data).unwrap();
    fs::write(old.path("b"), &data).unwrap();
    old.umount_clean("the old image");
    fs::copy(&old.img, &lo.dev).unwrap();
    one_line(&fail(&nodup(&["mkfs", d])), "already holds a nodup image");
    let made = ok(nodup(&["mkfs", d, "--force"]));
    assert!(made.contains("block device, 96.0 MiB"), "{made}");

    // The new image is empty and clean: nothing of the old log replays into it.
    let st = nodup(&["stats", d, "--json"]);
    assert!(
        st.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let v = json(&st);
    assert_eq!(v["files"], 0, "{v}");
    let mnt = &lo.mnt;
    let m = mnt.to_str().unwrap();
    {
        let _held = exclusive(d).unwrap();
        one_line(&fail(&nodup(&["mount", d, m])), "in use");
    }
    let said = ok(nodup(&["mount", d, m]));
    assert!(said.contains("clean mount"), "{said}");
    assert_eq!(fs::read_dir(mnt).unwrap().count(), 0);
    // Claimed while mounted: a kernel file system or mkfs.ext4 cannot take it.
    let e = exclusive(d).map(|_| ()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBUSY), "{e}");
    one_line(&fail(&nodup(&["mkfs", d, "--force"])), "is mounted");
    fs::write(mnt.join("x"), &data).unwrap();
    fs::write(mnt.join("y"), &data).unwrap();
    let v = json(&nodup(&["stats", m, "--json"]));
    assert_eq!(v["bytes_saved"], data.len(), "{v}");
    ok(nodup(&["umount", m]));
    ok(nodup(&["fsck", d]));
    let said = ok(nodup(&["mount", d, m]));
    assert!(said.contains("clean mount"), "{said}");
    assert!(fs::read(mnt.join("x")).unwrap() == data);
    assert!(fs::read(mnt.join("y")).unwrap() == data);

    // A crash on a device: `fsck --repair` claims it as mount does, then recovers it.
    let f = fs::File::create(mnt.join("z")).unwrap();
    std::io::Write::write_all(&mut &f, &data).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let pid = daemon_pid(&lo.dev);
    // SAFETY: a signal to the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_unlocked(&lo.dev);
    ok(nodup(&["umount", m]));
    {
        let _held = exclusive(d).unwrap();
        one_line(&fail(&nodup(&["fsck", d, "--repair"])), "in use");
    }
    ok(nodup(&["fsck", d, "--repair"]));
    let said = ok(nodup(&["mount", d, m]));
    assert!(said.contains("clean mount"), "{said}");
    assert!(fs::read(mnt.join("z")).unwrap() == data);
    ok(nodup(&["umount", m]));
}

/// A device whose size is not whole 4 KiB blocks (a partition sized in sectors) gets an image
/// of its whole blocks, as mkfs.ext4 does; the tail sectors stay unused.
#[test]
fn mkfs_takes_the_whole_blocks_of_an_odd_sized_device() {
    if !fuse_available() || !is_root() {
        return;
    }
    let Some(lo) = Loop::new("odd", (64 << 20) + 512) else {
        return;
    };
    let (d, m) = (lo.s(), lo.mnt.to_str().unwrap());
    let made = ok(nodup(&["mkfs", d]));
    assert!(made.contains("64.0 MiB, rounded down"), "{made}");
    ok(nodup(&["mount", d, m]));
    fs::write(lo.mnt.join("f"), b"on an odd device").unwrap();
    ok(nodup(&["umount", m]));
    ok(nodup(&["fsck", d]));
    ok(nodup(&["mount", d, m]));
    assert_eq!(fs::read(lo.mnt.join("f")).unwrap(), b"on an odd device");
    ok(nodup(&["umount", m]));
}
