//! Attributes and extended attributes of one inode: setattr (chmod, chown, utimens,
//! truncate) and the xattr calls; each change is one record (see `acl.rs` for the rules the
//! state machine adds to them).

use crate::acl::{Acl, ACL_ACCESS, ACL_DEFAULT};
use crate::error::{errno, FsError, Result};
use crate::fs::{FileSystem, SetAttr};
use crate::inode::{Attr, Kind, Ts};
use crate::log::check::XATTR_VALUE_MAX;
use crate::log::record::Record;

impl FileSystem {
    /// chmod / chown / utimens / truncate in one call.
    pub fn setattr(&self, ino: u64, req: &SetAttr) -> Result<Attr> {
        if let Some(size) = req.size {
            let attr = self.getattr(ino)?;
            if attr.size != size || attr.kind == Kind::File {
                self.truncate(ino, size)?;
            }
        }
        if req.mode.is_none()
            && req.uid.is_none()
            && req.gid.is_none()
            && req.atime.is_none()
            && req.mtime.is_none()
            && req.ctime.is_none()
        {
            return self.getattr(ino);
        }
        self.inode_op(ino, 128, |n| {
            let now = Ts::now();
            let a = &n.attr;
            let rec = Record::SetAttr {
                ino,
                perm: req.mode.map_or(a.perm, |m| m & 0o7777),
                uid: req.uid.unwrap_or(a.uid),
                gid: req.gid.unwrap_or(a.gid),
                atime: req.atime.unwrap_or(a.atime),
                mtime: req.mtime.unwrap_or(a.mtime),
                ctime: req.ctime.unwrap_or(now),
            };
            Ok((Some(rec), ()))
        })?;
        self.getattr(ino)
    }

    /// Value of an extended attribute.
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let node = self.node(ino)?;
        let n = node.read();
        n.xattrs
            .get(name)
            .cloned()
            .ok_or(FsError::Errno(libc::ENODATA))
    }

    /// Names of the extended attributes.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        let node = self.node(ino)?;
        let n = node.read();
        Ok(n.xattrs.keys().cloned().collect())
    }

    /// Set an extended attribute (`flags`: XATTR_CREATE / XATTR_REPLACE).
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        if name.is_empty() || name.len() > 255 {
            return errno(libc::ERANGE);
        }
        check_xattr_name(name)?;
        if value.len() > XATTR_VALUE_MAX {
            return errno(libc::E2BIG);
        }
        if (name == ACL_ACCESS || name == ACL_DEFAULT) && Acl::parse(value).is_none() {
            return errno(libc::EINVAL);
        }
        self.inode_op(ino, 64 + name.len() + value.len(), |n| {
            let exists = n.xattrs.contains_key(name);
            if flags & libc::XATTR_CREATE != 0 && exists {
                return errno(libc::EEXIST);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return errno(libc::ENODATA);
            }
            let rec = Record::SetXattr {
                ino,
                name: name.to_vec(),
                value: value.to_vec(),
                now: Ts::now(),
            };
            Ok((Some(rec), ()))
        })
    }

    /// Remove an extended attribute.
    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        self.inode_op(ino, 64 + name.len(), |n| {
            if !n.xattrs.contains_key(name) {
                return errno(libc::ENODATA);
            }
            Ok((
                Some(Record::RemoveXattr {
                    ino,
                    name: name.to_vec(),
                    now: Ts::now(),
                }),
                (),
            ))
        })
    }
}

/// The namespaces a name may be set in. `system.` holds only the two ACLs.
const XATTR_PREFIXES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

/// Refuse a name no Linux file system would store, as ext4 and tmpfs do: a namespace other than
/// user, trusted, security or the two POSIX ACLs is not supported (EOPNOTSUPP), and a name
/// that is only its namespace's prefix is invalid (EINVAL). Names already stored (by a build
/// before this check) can still be read, listed and removed.
fn check_xattr_name(name: &[u8]) -> Result<()> {
    if name == ACL_ACCESS || name == ACL_DEFAULT {
        return Ok(());
    }
    match XATTR_PREFIXES.iter().find(|p| name.starts_with(p)) {
        Some(p) if name.len() == p.len() => errno(libc::EINVAL),
        Some(_) => Ok(()),
        None => errno(libc::EOPNOTSUPP),
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{create, fresh};

    #[test]
    fn xattr_names_outside_the_linux_namespaces_are_refused() {
        let fs = fresh();
        let f = create(&fs, b"f");
        let set = |name: &[u8]| fs.setxattr(f, name, b"v", 0).map_err(|e| e.errno());
        for name in [&b"user."[..], b"trusted.", b"security."] {
            assert_eq!(set(name), Err(libc::EINVAL), "{name:?}");
        }
        for name in [
            &b"foo.bar"[..],
            b"system.foo",
            b"system.",
            b"user",
            b"nouser.x",
        ] {
            assert_eq!(set(name), Err(libc::EOPNOTSUPP), "{name:?}");
        }
        for name in [&b"user.a"[..], b"trusted.b", b"security.c"] {
            assert_eq!(set(name), Ok(()), "{name:?}");
        }
        let mut names = fs.listxattr(f).unwrap();
        names.sort();
        assert_eq!(names, [&b"security.c"[..], b"trusted.b", b"user.a"]);
    }
}
