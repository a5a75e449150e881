//! Extended attributes as the adapter serves them: the virtual ones (`user.nodup.stats`,
//! `user.nodup.du`, `user.nodup.ctl`, `user.nodup.worker`) answered here, the rest stored by
//! the file system, and the set-group-ID rule of setting an access ACL.

use super::caller::in_group;
use super::Adapter;
use crate::acl::{Acl, ACL_ACCESS};
use crate::ctl::{CTL_XATTR, STATS_XATTR, USAGE_XATTR, WORKER_XATTR};
use crate::error::{errno, Result};
use crate::fs::SetAttr;
use crate::inode::ROOT_INO;
use fuser::Request;

impl Adapter {
    /// setxattr: refuse writing the read-only virtual attributes, run `user.nodup.ctl`
    /// commands, store the rest.
    pub(super) fn set_xattr(
        &self,
        req: &Request,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        if (ino == ROOT_INO && (name == STATS_XATTR.as_bytes() || name == WORKER_XATTR.as_bytes()))
            || name == USAGE_XATTR.as_bytes()
        {
            return errno(libc::EPERM);
        }
        if ino == ROOT_INO && name == CTL_XATTR.as_bytes() {
            return match value {
                b"checkpoint" => self.fs.checkpoint(false),
                v => match std::str::from_utf8(v) {
                    Ok(cmd) => self.fs.smart_control(cmd),
                    Err(_) => errno(libc::EINVAL),
                },
            };
        }
        // Setting an access ACL drops set-group-ID when the caller is neither in the file's
        // group nor privileged (the kernel would tell us with FUSE_SETXATTR_EXT, which fuser
        // does not parse). Only for a valid ACL: an invalid one changes nothing.
        if name == ACL_ACCESS && req.uid() != 0 && Acl::parse(value).is_some() {
            let a = self.fs.getattr(ino)?;
            if a.perm & libc::S_ISGID != 0 && !in_group(req, a.gid) {
                let sa = SetAttr {
                    mode: Some(a.perm & !libc::S_ISGID),
                    ..Default::default()
                };
                self.fs.setattr(ino, &sa)?;
            }
        }
        self.fs.setxattr(ino, name, value, flags)
    }

    /// getxattr: the virtual attributes computed now, the rest as stored.
    pub(super) fn get_xattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        if ino == ROOT_INO && name == STATS_XATTR.as_bytes() {
            let mut v = self.fs.stats_json();
            if let Some(o) = v.as_object_mut() {
                // The daemon's own memory (anonymous), apart from the pages of a mapped (pmem)
                // image that show in its resident set too.
                o.insert("daemon_rss_bytes".into(), status_bytes("VmRSS").into());
                o.insert("daemon_anon_bytes".into(), status_bytes("RssAnon").into());
                o.insert("writes_answered_early".into(), self.answered.count().into());
            }
            Ok(v.to_string().into_bytes())
        } else if ino == ROOT_INO && name == WORKER_XATTR.as_bytes() {
            match self.fs.worker_idle() {
                Some(true) => Ok(b"idle".to_vec()),
                Some(false) => Ok(b"busy".to_vec()),
                None => errno(libc::ENODATA),
            }
        } else if name == USAGE_XATTR.as_bytes() {
            self.fs
                .usage(ino)
                .map(|u| serde_json::json!(u).to_string().into_bytes())
        } else {
            self.fs.getxattr(ino, name)
        }
    }
}

/// A field of /proc/self/status in bytes (`VmRSS`, `RssAnon`, ...), 0 when it cannot tell.
fn status_bytes(field: &str) -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
