//! Who makes a request: the ids, groups and umask of the calling process, and the set-id
//! bits the kernel's rules take away when such a caller modifies a file.

use crate::fs::Caller;
use fuser::Request;

/// `perm` without the set-id bits the kernel would drop when a file is modified by a caller in
/// group `gid` (suid always; sgid when group-executable or the caller is not in the group).
pub(super) fn killed_suidgid(perm: u32, file_gid: u32, gid: u32) -> u32 {
    let mut kill = libc::S_ISUID;
    if perm & libc::S_IXGRP != 0 || file_gid != gid {
        kill |= libc::S_ISGID;
    }
    perm & !kill
}

/// The caller of `req` (no umask: for requests that create nothing).
pub(super) fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        umask: 0,
    }
}

/// Whether the process behind `req` has `gid` as its group or a supplementary group.
pub(super) fn in_group(req: &Request, gid: u32) -> bool {
    if req.gid() == gid {
        return true;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", req.pid())) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(gid)))
}

/// Whether the process behind `req` holds CAP_SYS_ADMIN, which Linux asks of whoever may see
/// `trusted.*` attributes or trim a file system. Read from its effective capabilities, which
/// count only in the daemon's own user namespace (in one it made itself, as with `unshare
/// -Ur`, any user holds them all); when they cannot be read (the process is gone), root is
/// taken to hold it.
pub(super) fn has_sys_admin(req: &Request) -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    let proc = format!("/proc/{}", req.pid());
    let Ok(status) = std::fs::read_to_string(format!("{proc}/status")) else {
        return req.uid() == 0;
    };
    let ours = std::fs::read_link("/proc/self/ns/user");
    let theirs = std::fs::read_link(format!("{proc}/ns/user"));
    if !matches!((ours, theirs), (Ok(a), Ok(b)) if a == b) {
        return false;
    }
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| (caps >> CAP_SYS_ADMIN) & 1 == 1)
}

/// The caller of a request that creates an inode with `umask` (FUSE_DONT_MASK: the kernel
/// leaves the umask to us, so that a default ACL can take its place).
pub(super) fn creator(req: &Request, umask: u32) -> Caller {
    Caller {
        umask,
        ..caller(req)
    }
}

#[cfg(test)]
mod tests {
    use super::killed_suidgid;

    #[test]
    fn setid_bits_dropped_like_the_kernel() {
        // suid always goes; sgid when group-executable ...
        assert_eq!(killed_suidgid(0o6777, 0, 0), 0o777);
        assert_eq!(killed_suidgid(0o4755, 0, 0), 0o755);
        // ... or when the modifier is not in the file's group (no group-exec: lock marker).
        assert_eq!(killed_suidgid(0o6767, 0, 0), 0o2767);
        assert_eq!(killed_suidgid(0o6767, 0, 65534), 0o767);
        assert_eq!(killed_suidgid(0o644, 0, 65534), 0o644);
    }
}
