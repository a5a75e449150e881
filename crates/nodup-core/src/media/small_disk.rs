//! A small tmpfs for tests of what a full disk under an image does to the media over files.
//! Root only: it mounts.

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
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}
