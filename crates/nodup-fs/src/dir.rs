//! Directories: name -> inode, plus a stable per-entry cookie so readdir offsets survive
//! concurrent inserts and removals (rm -rf reads and unlinks at the same time).

use crate::persist::ChunkSet;
use std::collections::BTreeMap;

/// Cookies per checkpoint unit of a directory: checkpoints persist a directory in units of
/// this many consecutive cookies, so a change rewrites one unit, not the whole directory.
pub const UNIT_COOKIES: u64 = 128;

/// One directory's entries.
#[derive(Debug, Clone, Default)]
pub struct Directory {
    /// Parent directory inode (the root is its own parent).
    pub parent: u64,
    by_name: BTreeMap<Vec<u8>, (u64, u64)>,
    by_cookie: BTreeMap<u64, Vec<u8>>,
    next_cookie: u64,
    /// Entries per checkpoint unit (only units that hold entries).
    unit_len: BTreeMap<u64, u32>,
    /// Checkpoint units changed since the last checkpoint took them.
    pub(crate) dirty: ChunkSet,
}

/// Two directories are equal when they hold the same names for the same inodes under the same
/// parent; cookies are a runtime detail.
impl PartialEq for Directory {
    fn eq(&self, o: &Directory) -> bool {
        self.parent == o.parent
            && self.by_name.len() == o.by_name.len()
            && self
                .by_name
                .iter()
                .all(|(n, &(ino, _))| o.by_name.get(n).map(|&(i, _)| i) == Some(ino))
    }
}
impl Eq for Directory {}

/// readdir offsets 1 and 2 are "." and ".."; entry cookies start above them.
pub const FIRST_COOKIE: u64 = 3;

impl Directory {
    /// An empty directory under `parent`.
    pub fn new(parent: u64) -> Directory {
        Directory {
            parent,
            by_name: BTreeMap::new(),
            by_cookie: BTreeMap::new(),
            next_cookie: FIRST_COOKIE,
            unit_len: BTreeMap::new(),
            dirty: ChunkSet::default(),
        }
    }
    /// Inode of `name`, if present.
    pub fn get(&self, name: &[u8]) -> Option<u64> {
        self.by_name.get(name).map(|&(ino, _)| ino)
    }
    /// Add or replace `name`; returns the inode it replaced.
    pub fn insert(&mut self, name: &[u8], ino: u64) -> Option<u64> {
        let old = self.remove(name);
        let c = self.next_cookie;
        self.next_cookie += 1;
        self.put(name, ino, c);
        old
    }
    fn put(&mut self, name: &[u8], ino: u64, c: u64) {
        self.put_owned(name.to_vec(), ino, c);
    }
    fn put_owned(&mut self, name: Vec<u8>, ino: u64, c: u64) {
        self.by_cookie.insert(c, name.clone());
        self.by_name.insert(name, (ino, c));
        *self.unit_len.entry(c / UNIT_COOKIES).or_default() += 1;
        self.dirty.insert(c / UNIT_COOKIES);
    }
    /// Rename `old` to `new` keeping its cookie, so a readdir in progress returns the entry
    /// once, at its old place (a renaming loop over readdir ends). `new` must be free; returns
    /// false when `old` is missing.
    pub fn rename_in_place(&mut self, old: &[u8], new: &[u8]) -> bool {
        let Some((ino, c)) = self.by_name.remove(old) else {
            return false;
        };
        self.by_name.insert(new.to_vec(), (ino, c));
        self.by_cookie.insert(c, new.to_vec());
        self.dirty.insert(c / UNIT_COOKIES);
        true
    }
    /// Remove `name`; returns its inode.
    pub fn remove(&mut self, name: &[u8]) -> Option<u64> {
        let (ino, c) = self.by_name.remove(name)?;
        self.by_cookie.remove(&c);
        let u = c / UNIT_COOKIES;
        if let Some(n) = self.unit_len.get_mut(&u) {
            *n -= 1;
            if *n == 0 {
                self.unit_len.remove(&u);
            }
        }
        self.dirty.insert(u);
        Some(ino)
    }
    /// Add an entry with a known cookie (loading a checkpoint). Refused (false) when the name or
    /// the cookie is taken, or the cookie is not below `next_cookie`.
    pub fn load_entry(&mut self, name: Vec<u8>, ino: u64, cookie: u64) -> bool {
        if cookie < FIRST_COOKIE
            || cookie >= self.next_cookie
            || self.by_name.contains_key(&name)
            || self.by_cookie.contains_key(&cookie)
        {
            return false;
        }
        self.put_owned(name, ino, cookie);
        true
    }
    /// Cookie the next entry gets.
    pub fn next_cookie(&self) -> u64 {
        self.next_cookie
    }
    /// Set the next cookie (loading a checkpoint).
    pub fn set_next_cookie(&mut self, c: u64) {
        self.next_cookie = c.max(FIRST_COOKIE);
    }
    /// Units that hold entries, ascending.
    pub fn units(&self) -> Vec<u64> {
        self.unit_len.keys().copied().collect()
    }
    /// Entries of unit `u`: (cookie, name, ino) in cookie order.
    pub fn unit_entries(&self, u: u64) -> impl Iterator<Item = (u64, &[u8], u64)> + '_ {
        let lo = u.saturating_mul(UNIT_COOKIES);
        let hi = lo.saturating_add(UNIT_COOKIES);
        self.by_cookie.range(lo..hi).filter_map(move |(&c, name)| {
            self.by_name
                .get(name)
                .map(|&(ino, _)| (c, name.as_slice(), ino))
        })
    }
    /// Number of entries (without "." and "..").
    pub fn len(&self) -> usize {
        self.by_name.len()
    }
    /// True when the directory has no entries.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
    /// Entries with a cookie greater than `after`, in cookie order: (cookie, name, ino).
    pub fn entries_after(&self, after: u64) -> impl Iterator<Item = (u64, &[u8], u64)> + '_ {
        self.by_cookie
            .range(after.saturating_add(1)..)
            .filter_map(move |(&c, name)| {
                self.by_name
                    .get(name)
                    .map(|&(ino, _)| (c, name.as_slice(), ino))
            })
    }
    /// Every (name, ino) in name order (checkpoints, fsck).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], u64)> + '_ {
        self.by_name
            .iter()
            .map(|(n, &(ino, _))| (n.as_slice(), ino))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_stay_stable_while_entries_are_removed() {
        let mut d = Directory::new(1);
        for i in 0..10u64 {
            d.insert(format!("f{i}").as_bytes(), 100 + i);
        }
        let first: Vec<(u64, Vec<u8>)> = d
            .entries_after(0)
            .take(4)
            .map(|(c, n, _)| (c, n.to_vec()))
            .collect();
        for (_, n) in &first {
            d.remove(n);
        }
        let last_cookie = first.last().unwrap().0;
        let rest: Vec<u64> = d.entries_after(last_cookie).map(|(_, _, i)| i).collect();
        assert_eq!(rest, (104..110).collect::<Vec<_>>());
        assert_eq!(d.insert(b"f5", 7), Some(105));
        assert_eq!(d.get(b"f5"), Some(7));
        assert_eq!(d.len(), 6);
    }
}
