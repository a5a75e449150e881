//! /proc/self/mountinfo: the mounts of this namespace (device, mount point, type, source),
//! with its escaped path fields undone.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One mount, as a line of /proc/self/mountinfo gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The mount's id (as `/proc/PID/fdinfo` gives it for a descriptor on the mount).
    pub id: u64,
    /// `major:minor` of the mounted file system.
    pub device: String,
    /// The directory of the file system the mount shows (`/` unless a bind mount of a part).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// Its type (`fuse.nodup`, `ext4`, ...).
    pub fstype: String,
    /// Its source (a nodup mount's image).
    pub source: PathBuf,
}

/// Every mount of this namespace, oldest first (empty when mountinfo cannot be read).
pub fn entries() -> Vec<Entry> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|info| info.lines().filter_map(parse).collect())
        .unwrap_or_default()
}

/// One line: `id parent major:minor root mountpoint options [optional...] - type source super`.
fn parse(line: &str) -> Option<Entry> {
    let f: Vec<&str> = line.split(' ').collect();
    let sep = f.iter().position(|x| *x == "-")?;
    if sep < 5 || f.len() < sep + 3 {
        return None;
    }
    let path = |s: &str| PathBuf::from(OsStr::from_bytes(&unescape(s)));
    Some(Entry {
        id: f[0].parse().ok()?,
        device: f[2].to_string(),
        root: path(f[3]),
        mountpoint: path(f[4]),
        fstype: f[sep + 1].to_string(),
        source: path(f[sep + 2]),
    })
}

/// `major:minor` of the newest mount on `mountpoint`, from /proc/self/mountinfo.
pub fn mount_device(mountpoint: &Path) -> Option<String> {
    let want = std::fs::canonicalize(mountpoint).ok()?;
    entries()
        .into_iter()
        .rev()
        .find(|e| e.mountpoint == want)
        .map(|e| e.device)
}

/// Undo mountinfo's octal escapes (`\040` for a space).
pub fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{parse, unescape, Entry};
    use std::path::PathBuf;

    #[test]
    fn lines() {
        let l = r"45 27 0:40 / /tmp/a\040b rw,relatime shared:1 - fuse.nodup /dev/shm/x\040y.img rw,user_id=0";
        assert_eq!(
            parse(l),
            Some(Entry {
                id: 45,
                device: "0:40".into(),
                root: PathBuf::from("/"),
                mountpoint: PathBuf::from("/tmp/a b"),
                fstype: "fuse.nodup".into(),
                source: PathBuf::from("/dev/shm/x y.img"),
            })
        );
        assert_eq!(parse("45 27 0:40 / /tmp/a rw - fuse.nodup"), None);
        assert_eq!(parse("garbage"), None);
    }

    #[test]
    fn escapes() {
        assert_eq!(unescape(r"/a\040b\134c"), b"/a b\\c".to_vec());
        assert_eq!(unescape(r"/x\04"), b"/x\\04".to_vec());
        assert_eq!(unescape("/plain"), b"/plain".to_vec());
    }
}
