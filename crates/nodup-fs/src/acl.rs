//! POSIX access control lists: the `system.posix_acl_access` / `system.posix_acl_default`
//! values the kernel hands us, and the rules that keep an inode's mode bits and its ACL saying
//! the same thing (the kernel enforces ACLs once `FUSE_POSIX_ACL` is negotiated, but leaves
//! these rules to the file system).
//!
//! The rules are applied where records are applied ([`crate::state`]), so a mode change and
//! the matching ACL change are one record, atomic and the same on replay:
//!
//! - setting an access ACL sets the mode's permission bits from it; an ACL that says no more
//!   than the mode (no named users or groups) is not kept;
//! - a mode change rewrites an existing access ACL's owner, mask (or group) and other entries;
//! - a new inode in a directory with a default ACL gets the mode the ACL allows (no umask)
//!   and the ACL as its access ACL; a new directory also inherits the default ACL.

use crate::inode::Kind;
use nodup_core::codec::le_u32;

/// Name of the access ACL.
pub const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
/// Name of the default ACL (directories).
pub const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

// Value format (the kernel's `posix_acl_xattr`), little-endian:
//
// | offset      | size | field                                   |
// |-------------|------|-----------------------------------------|
// | 0           | 4    | version, 2                              |
// | 4 + 8·i     | 2    | entry i: tag (one of the `TAG_*` below) |
// | 6 + 8·i     | 2    | entry i: permissions, rwx in bits 2..0  |
// | 8 + 8·i     | 4    | entry i: uid or gid (named entries)     |
//
// Entries are sorted by tag, then by id; exactly one owner, owning-group and other entry; a
// mask entry exactly when there are named entries (the kernel accepts a lone mask too).
const VERSION: u32 = 2;
const HEADER: usize = 4;
const ENTRY: usize = 8;
const TAG_USER_OBJ: u16 = 0x01;
const TAG_USER: u16 = 0x02;
const TAG_GROUP_OBJ: u16 = 0x04;
const TAG_GROUP: u16 = 0x08;
const TAG_MASK: u16 = 0x10;
const TAG_OTHER: u16 = 0x20;
/// An id field of the entries that have none.
const NO_ID: u32 = u32::MAX;

/// One ACL entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

/// A validated ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Parse and validate an xattr value; `None` when it is not a valid ACL.
    pub fn parse(b: &[u8]) -> Option<Acl> {
        if b.len() < HEADER || !(b.len() - HEADER).is_multiple_of(ENTRY) {
            return None;
        }
        if le_u32(b, 0) != VERSION {
            return None;
        }
        let entries: Vec<Entry> = b[HEADER..]
            .chunks_exact(ENTRY)
            .map(|c| Entry {
                tag: u16::from_le_bytes([c[0], c[1]]),
                perm: u16::from_le_bytes([c[2], c[3]]),
                id: le_u32(c, 4),
            })
            .collect();
        let count = |t| entries.iter().filter(|e| e.tag == t).count();
        let named = count(TAG_USER) + count(TAG_GROUP);
        if count(TAG_USER_OBJ) != 1
            || count(TAG_GROUP_OBJ) != 1
            || count(TAG_OTHER) != 1
            || count(TAG_MASK) > 1
            || (named > 0 && count(TAG_MASK) == 0)
        {
            return None;
        }
        let known = [
            TAG_USER_OBJ,
            TAG_USER,
            TAG_GROUP_OBJ,
            TAG_GROUP,
            TAG_MASK,
            TAG_OTHER,
        ];
        if entries
            .iter()
            .any(|e| e.perm > 7 || !known.contains(&e.tag))
        {
            return None;
        }
        // Sorted by tag, named entries by id, no duplicates.
        let sorted = entries.windows(2).all(|w| {
            w[0].tag < w[1].tag
                || (w[0].tag == w[1].tag
                    && matches!(w[0].tag, TAG_USER | TAG_GROUP)
                    && w[0].id < w[1].id)
        });
        sorted.then_some(Acl { entries })
    }

    /// The xattr value.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER + ENTRY * self.entries.len());
        v.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            v.extend_from_slice(&e.tag.to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            let id = if matches!(e.tag, TAG_USER | TAG_GROUP) {
                e.id
            } else {
                NO_ID
            };
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    fn has(&self, tag: u16) -> bool {
        self.entries.iter().any(|e| e.tag == tag)
    }

    /// The entry that stands for the group class: the mask when there is one.
    fn group_class(&self) -> u16 {
        if self.has(TAG_MASK) {
            TAG_MASK
        } else {
            TAG_GROUP_OBJ
        }
    }

    /// The rwx bits of the mode this ACL implies (owner, group class, other).
    pub fn mode_bits(&self) -> u32 {
        let gc = self.group_class();
        self.entries.iter().fold(0, |m, e| match e.tag {
            TAG_USER_OBJ => m | (e.perm as u32) << 6,
            TAG_OTHER => m | e.perm as u32,
            t if t == gc => m | (e.perm as u32) << 3,
            _ => m,
        })
    }

    /// This ACL with its owner, group-class and other entries taken from `perm` (chmod).
    pub fn with_mode(&self, perm: u32) -> Acl {
        let gc = self.group_class();
        let mut a = self.clone();
        for e in &mut a.entries {
            match e.tag {
                TAG_USER_OBJ => e.perm = ((perm >> 6) & 7) as u16,
                TAG_OTHER => e.perm = (perm & 7) as u16,
                t if t == gc => e.perm = ((perm >> 3) & 7) as u16,
                _ => {}
            }
        }
        a
    }

    /// True when the mode says everything this ACL says (no named users or groups, no mask:
    /// a mask below the owning group's entry limits that group, which the mode cannot say);
    /// such an access ACL is not kept once set.
    pub fn is_equivalent_to_mode(&self) -> bool {
        !self.has(TAG_USER) && !self.has(TAG_GROUP) && !self.has(TAG_MASK)
    }

    /// The permission bits of a new inode asked with `mode` under this default ACL: the rwx
    /// bits the ACL allows (no umask); set-id and sticky bits as asked.
    pub fn create_mode(&self, mode: u32) -> u32 {
        (mode & !0o777) | (mode & 0o777 & self.mode_bits())
    }
}

/// The mode bits (set-id and sticky kept) after an access ACL `value` is set on an inode with
/// `perm`, and whether the ACL is to be kept; `None` when `value` is not a valid ACL.
pub fn on_set_access(perm: u32, value: &[u8]) -> Option<(u32, bool)> {
    let acl = Acl::parse(value)?;
    Some((
        (perm & !0o777) | acl.mode_bits(),
        !acl.is_equivalent_to_mode(),
    ))
}

/// An access ACL `value` rewritten for a chmod to `perm`; `None` when it is not a valid ACL.
pub fn on_chmod(value: &[u8], perm: u32) -> Option<Vec<u8>> {
    Acl::parse(value).map(|a| a.with_mode(perm).encode())
}

/// The ACL xattrs a new inode of `kind` with `perm` inherits from its parent's default ACL
/// `default` (value as stored): the access ACL unless it would say no more than the mode,
/// and for a directory the default ACL itself.
pub fn inherited(default: &[u8], kind: Kind, perm: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Some(acl) = Acl::parse(default) else {
        return Vec::new();
    };
    if kind == Kind::Symlink {
        return Vec::new();
    }
    let mut out = Vec::new();
    if !acl.is_equivalent_to_mode() {
        out.push((ACL_ACCESS.to_vec(), acl.with_mode(perm).encode()));
    }
    if kind == Kind::Dir {
        out.push((ACL_DEFAULT.to_vec(), default.to_vec()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        Acl {
            entries: entries
                .iter()
                .map(|&(tag, perm, id)| Entry {
                    tag,
                    perm,
                    id: if matches!(tag, TAG_USER | TAG_GROUP) {
                        id
                    } else {
                        NO_ID
                    },
                })
                .collect(),
        }
        .encode()
    }

    #[test]
    fn parse_checks_shape_and_order() {
        let base = acl(&[
            (TAG_USER_OBJ, 6, 0),
            (TAG_GROUP_OBJ, 4, 0),
            (TAG_OTHER, 4, 0),
        ]);
        assert!(Acl::parse(&base).is_some());
        assert_eq!(Acl::parse(&base).unwrap().encode(), base);
        // Named entry without a mask; unsorted; duplicate owner; bad perm; bad version.
        assert!(Acl::parse(&acl(&[
            (TAG_USER_OBJ, 6, 0),
            (TAG_USER, 6, 5),
            (TAG_GROUP_OBJ, 4, 0),
            (TAG_OTHER, 4, 0)
        ]))
        .is_none());
        assert!(Acl::parse(&acl(&[
            (TAG_GROUP_OBJ, 4, 0),
            (TAG_USER_OBJ, 6, 0),
            (TAG_OTHER, 4, 0)
        ]))
        .is_none());
        assert!(Acl::parse(&acl(&[
            (TAG_USER_OBJ, 6, 0),
            (TAG_USER_OBJ, 6, 0),
            (TAG_GROUP_OBJ, 4, 0),
            (TAG_OTHER, 4, 0)
        ]))
        .is_none());
        assert!(Acl::parse(&acl(&[
            (TAG_USER_OBJ, 9, 0),
            (TAG_GROUP_OBJ, 4, 0),
            (TAG_OTHER, 4, 0)
        ]))
        .is_none());
        let mut v = base.clone();
        v[0] = 1;
        assert!(Acl::parse(&v).is_none());
        assert!(Acl::parse(&base[..7]).is_none());
    }

    #[test]
    fn mode_and_acl_follow_each_other() {
        let full = acl(&[
            (TAG_USER_OBJ, 7, 0),
            (TAG_USER, 6, 1000),
            (TAG_GROUP_OBJ, 5, 0),
            (TAG_MASK, 4, 0),
            (TAG_OTHER, 1, 0),
        ]);
        // Setting: group bits come from the mask; set-id bits stay.
        assert_eq!(on_set_access(0o4000, &full), Some((0o4741, true)));
        let minimal = acl(&[
            (TAG_USER_OBJ, 6, 0),
            (TAG_GROUP_OBJ, 0, 0),
            (TAG_OTHER, 0, 0),
        ]);
        assert_eq!(on_set_access(0o777, &minimal), Some((0o600, false)));
        // chmod rewrites owner, mask, other; the owning group entry stays under a mask.
        let a = Acl::parse(&on_chmod(&full, 0o750).unwrap()).unwrap();
        assert_eq!(a.mode_bits(), 0o750);
        assert!(a.entries.contains(&Entry {
            tag: TAG_GROUP_OBJ,
            perm: 5,
            id: NO_ID
        }));
        assert!(a.entries.contains(&Entry {
            tag: TAG_USER,
            perm: 6,
            id: 1000
        }));
    }

    #[test]
    fn new_inodes_inherit_the_default_acl() {
        let def = acl(&[
            (TAG_USER_OBJ, 7, 0),
            (TAG_GROUP_OBJ, 5, 0),
            (TAG_GROUP, 7, 50),
            (TAG_MASK, 7, 0),
            (TAG_OTHER, 0, 0),
        ]);
        let d = Acl::parse(&def).unwrap();
        // open(O_CREAT, 0666): the ACL, not the umask, limits the mode.
        let perm = d.create_mode(0o666);
        assert_eq!(perm, 0o660);
        let f = inherited(&def, Kind::File, perm);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].0, ACL_ACCESS);
        assert_eq!(Acl::parse(&f[0].1).unwrap().mode_bits(), 0o660);
        let dir = inherited(&def, Kind::Dir, d.create_mode(0o2777));
        assert_eq!(d.create_mode(0o2777), 0o2770);
        assert_eq!(dir.len(), 2);
        assert_eq!(dir[1], (ACL_DEFAULT.to_vec(), def.clone()));
        assert!(inherited(&def, Kind::Symlink, 0o777).is_empty());
        // A default ACL of the base entries only gives no access ACL.
        let base = acl(&[
            (TAG_USER_OBJ, 7, 0),
            (TAG_GROUP_OBJ, 5, 0),
            (TAG_OTHER, 5, 0),
        ]);
        assert!(inherited(&base, Kind::File, 0o644).is_empty());
    }
}
