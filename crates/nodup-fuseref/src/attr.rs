//! Attribute conversions shared by both file systems: file types from mode bits, `stat` to
//! the kernel's attributes, and times in and out of `timespec`.

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The file type of `mode`'s `S_IFMT` bits (regular file when unknown).
pub fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

/// A time from seconds and nanoseconds since the epoch (before it for negative seconds).
pub fn from_timespec(sec: i64, nsec: i64) -> SystemTime {
    let nsec = nsec.clamp(0, 999_999_999) as u32;
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec)
    } else {
        UNIX_EPOCH - Duration::new(sec.unsigned_abs(), 0) + Duration::new(0, nsec)
    }
}

/// `t` as a `timespec` for `utimensat`: UTIME_NOW for "now", UTIME_OMIT when not given.
pub fn to_timespec(t: Option<TimeOrNow>) -> libc::timespec {
    let (tv_sec, tv_nsec) = match t {
        None => (0, libc::UTIME_OMIT),
        Some(TimeOrNow::Now) => (0, libc::UTIME_NOW),
        Some(TimeOrNow::SpecificTime(s)) => match s.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i64),
            Err(e) => {
                let d = e.duration();
                let (mut sec, mut nsec) = (-(d.as_secs() as i64), -(d.subsec_nanos() as i64));
                if nsec < 0 {
                    sec -= 1;
                    nsec += 1_000_000_000;
                }
                (sec, nsec)
            }
        },
    };
    libc::timespec { tv_sec, tv_nsec }
}

/// The kernel's attributes of `st`, reported under inode number `ino`.
pub fn from_stat(ino: u64, st: &libc::stat) -> FileAttr {
    let ctime = from_timespec(st.st_ctime, st.st_ctime_nsec);
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: from_timespec(st.st_atime, st.st_atime_nsec),
        mtime: from_timespec(st.st_mtime, st.st_mtime_nsec),
        ctime,
        crtime: ctime,
        kind: kind_of(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

/// Mode bits after a change by a caller in group `caller_gid`, as the kernel does on local file
/// systems: suid always goes, sgid goes when group-executable or the caller is not in the
/// file's group `file_gid` (only the primary group is known here).
pub fn killed_suidgid(perm: u32, file_gid: u32, caller_gid: u32) -> u32 {
    let mut p = perm & !libc::S_ISUID;
    if p & libc::S_ISGID != 0 && (p & 0o010 != 0 || file_gid != caller_gid) {
        p &= !libc::S_ISGID;
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timespecs_round_trip() {
        for (s, n) in [(0, 0), (1_700_000_000, 123_456_789), (-5, 250_000_000)] {
            let t = from_timespec(s, n);
            let ts = to_timespec(Some(TimeOrNow::SpecificTime(t)));
            assert_eq!((ts.tv_sec, ts.tv_nsec), (s, n), "{s}.{n}");
        }
        assert_eq!(to_timespec(None).tv_nsec, libc::UTIME_OMIT);
        assert_eq!(to_timespec(Some(TimeOrNow::Now)).tv_nsec, libc::UTIME_NOW);
    }

    #[test]
    fn kinds_and_setid_rules() {
        assert_eq!(kind_of(libc::S_IFDIR | 0o755), FileType::Directory);
        assert_eq!(kind_of(libc::S_IFLNK | 0o777), FileType::Symlink);
        assert_eq!(kind_of(libc::S_IFREG | 0o644), FileType::RegularFile);
        assert_eq!(
            killed_suidgid(0o6755, 5, 5),
            0o0755,
            "group-executable sgid goes"
        );
        assert_eq!(
            killed_suidgid(0o6745, 5, 5),
            0o2745,
            "sgid without g+x stays in-group"
        );
        assert_eq!(
            killed_suidgid(0o6745, 5, 6),
            0o0745,
            "other group: sgid goes"
        );
    }
}
