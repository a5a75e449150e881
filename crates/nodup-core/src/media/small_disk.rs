//! A small tmpfs for tests of what a full disk under an image does to the media over files,
//! and an ext4 over it whose write-back fails when the tmpfs is full. Root only: they mount.

use std::os::unix::fs::FileExt;
use std::process::Command;

/// A tmpfs on a temporary directory, unmounted on drop.
pub(crate) struct SmallDisk {
    pub(crate) dir: tempfile::TempDir,
}

impl SmallDisk {
    /// A tmpfs of `size` (as `mount -o size=` takes it); `None`, with a line on stderr, when
    /// not root.
    pub(crate) fn mount(size: &str) -> Option<SmallDisk> {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: mounting a small tmpfs needs root");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(mounted.success());
        Some(SmallDisk { dir })
    }

    /// Take every page left with a file of its own.
    pub(crate) fn fill(&self) {
        let f = std::fs::File::create(self.dir.path().join("filler")).unwrap();
        let mut at = 0u64;
        for size in [64usize << 10, 4096] {
            let chunk = vec![1u8; size];
            while f.write_all_at(&chunk, at).is_ok() {
                at += size as u64;
            }
        }
    }

    /// Give back what [`SmallDisk::fill`] took.
    pub(crate) fn unfill(&self) {
        std::fs::remove_file(self.dir.path().join("filler")).unwrap();
    }
}

/// An ext4 on a loop device over a file of a [`SmallDisk`], where writes of new data fail
/// while that tmpfs is full: its free blocks are holes of the file, everything else of it
/// (journal, inode tables, bitmaps) is allocated, so the ext4 itself keeps working and only the
/// write-back of data into blocks it newly took fails, with an I/O error, as on a failing disk.
pub(crate) struct FailingExt4 {
    pub(crate) disk: SmallDisk,
    /// Where the ext4 is mounted.
    pub(crate) dir: tempfile::TempDir,
    loop_dev: String,
}

impl FailingExt4 {
    /// An ext4 of `size_mib` MiB on a tmpfs 16 MiB larger; `None`, with a line on stderr,
    /// when not root, or without mkfs.ext4, loop devices or ext4 mounts here.
    pub(crate) fn mount(size_mib: u64) -> Option<FailingExt4> {
        let have = |tool: &str| Command::new(tool).arg("--version").output().is_ok();
        if let Some(tool) = ["mkfs.ext4", "losetup", "fstrim"]
            .into_iter()
            .find(|t| !have(t))
        {
            eprintln!("skipping: {tool} is missing");
            return None;
        }
        let disk = SmallDisk::mount(&format!("{}M", size_mib + 16))?;
        let file = disk.dir.path().join("ext4.img");
        let run = |cmd: &mut Command| {
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{cmd:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        std::fs::File::create(&file)
            .unwrap()
            .set_len(size_mib << 20)
            .unwrap();
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&file));
        // Allocate every hole mkfs left (it zeroes tables by punching them), so that only the
        // blocks the trim below gives back are holes.
        run(Command::new("fallocate")
            .args(["-l", &format!("{}M", size_mib)])
            .arg(&file));
        // A machine (a container) without loop devices or ext4 mounts skips, as without root.
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&file)
            .output()
            .unwrap();
        if !out.status.success() {
            eprintln!("skipping: no loop device ({out:?})");
            return None;
        }
        // Built before the mount, so that a failure from here on detaches the loop device.
        let me = FailingExt4 {
            disk,
            dir: tempfile::tempdir().unwrap(),
            loop_dev: String::from_utf8(out.stdout).unwrap().trim().to_owned(),
        };
        let mounted = Command::new("mount")
            .arg(&me.loop_dev)
            .arg(me.dir.path())
            .output()
            .unwrap();
        if !mounted.status.success() {
            eprintln!("skipping: ext4 does not mount here ({mounted:?})");
            return None;
        }
        run(Command::new("fstrim").arg(me.dir.path()));
        Some(me)
    }
}

/// Detach what is mounted on `dir`, lazily: a test that failed may still hold a file open there.
fn umount_lazy(dir: &std::path::Path) {
    let _ = Command::new("umount").arg("-l").arg(dir).status();
}

impl Drop for FailingExt4 {
    fn drop(&mut self) {
        umount_lazy(self.dir.path());
        let _ = Command::new("losetup")
            .args(["-d", &self.loop_dev])
            .status();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        umount_lazy(self.dir.path());
    }
}
