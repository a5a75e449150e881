//! The in-memory index of the FAWN store: a hash table from a 64-bit hash of the key to the
//! place of its live record in the log, as FAWN keeps (key fragment → log offset). The full
//! key lives only in the log: a lookup reads the candidate records and compares keys, so two
//! keys with the same hash are told apart at the cost of a read.

use std::collections::HashMap;
use xxhash_rust::xxh3::xxh3_64;

/// Where a live record sits in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    /// Offset of the record.
    pub off: u64,
    /// Its encoded length.
    pub len: u32,
}

/// The records of one hash: almost always one.
#[derive(Debug, Clone)]
enum Slot {
    One(Loc),
    Many(Vec<Loc>),
}

/// Hash → live record locations, with the count and bytes of live records.
#[derive(Debug, Default)]
pub struct Index {
    map: HashMap<u64, Slot>,
    keys: u64,
    bytes: u64,
}

/// The index hash of a key.
pub fn key_hash(key: &[u8]) -> u64 {
    xxh3_64(key)
}

impl Index {
    /// An empty index with room for `n` keys.
    pub fn with_capacity(n: usize) -> Self {
        Index {
            map: HashMap::with_capacity(n),
            keys: 0,
            bytes: 0,
        }
    }

    /// Live keys.
    pub fn keys(&self) -> u64 {
        self.keys
    }

    /// Encoded bytes of the live records.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Locations of the live records whose key has hash `h`.
    pub fn candidates(&self, h: u64) -> &[Loc] {
        match self.map.get(&h) {
            None => &[],
            Some(Slot::One(l)) => std::slice::from_ref(l),
            Some(Slot::Many(v)) => v,
        }
    }

    /// Whether the record at `off` is live (its key has hash `h`).
    pub fn contains(&self, h: u64, off: u64) -> bool {
        self.candidates(h).iter().any(|l| l.off == off)
    }

    /// Add a live record of a key not in the index.
    pub fn add(&mut self, h: u64, loc: Loc) {
        self.keys += 1;
        self.bytes += u64::from(loc.len);
        match self.map.get_mut(&h) {
            None => {
                self.map.insert(h, Slot::One(loc));
            }
            Some(Slot::One(l)) => {
                let first = *l;
                self.map.insert(h, Slot::Many(vec![first, loc]));
            }
            Some(Slot::Many(v)) => v.push(loc),
        }
    }

    /// Replace the live record at `old` (hash `h`) with `loc`.
    pub fn replace(&mut self, h: u64, old: Loc, loc: Loc) {
        self.remove(h, old);
        self.add(h, loc);
    }

    /// Drop the live record at `old` (hash `h`).
    pub fn remove(&mut self, h: u64, old: Loc) {
        let gone = match self.map.get_mut(&h) {
            Some(Slot::One(l)) if l.off == old.off => {
                self.map.remove(&h);
                true
            }
            Some(Slot::Many(v)) => {
                let n = v.len();
                v.retain(|l| l.off != old.off);
                let gone = v.len() < n;
                if v.len() == 1 {
                    let last = v[0];
                    self.map.insert(h, Slot::One(last));
                }
                gone
            }
            _ => false,
        };
        if gone {
            self.keys -= 1;
            self.bytes -= u64::from(old.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colliding_hashes_keep_every_record() {
        let mut ix = Index::default();
        let a = Loc { off: 10, len: 5 };
        let b = Loc { off: 20, len: 7 };
        let c = Loc { off: 30, len: 9 };
        ix.add(1, a);
        ix.add(1, b);
        assert_eq!(ix.candidates(1), &[a, b]);
        ix.replace(1, a, c);
        assert_eq!(ix.candidates(1), &[b, c]);
        assert!(ix.contains(1, 30) && !ix.contains(1, 10));
        ix.remove(1, b);
        assert_eq!(ix.candidates(1), &[c]);
        assert_eq!((ix.keys(), ix.bytes()), (1, 9));
        ix.remove(1, c);
        assert!(ix.candidates(1).is_empty());
        assert_eq!((ix.keys(), ix.bytes()), (0, 0));
    }
}
