//! The skipped buffer of `smart` (SmartDedup §3.3): the blocks inline dedup did not match —
//! inode, logical block and fingerprint when known — for the out-of-line worker. It is an
//! array-based hash table indexed by (inode, logical block): a block written again replaces its
//! entry. Its size is fixed by the budget (24 bytes an entry); when it fills up it converts to
//! a set of inode numbers (8 bytes each), so the worker processes those whole files instead.
//! When even that set is full, further files are counted as lost (not deduplicated out of
//! line until written again).

/// One pending block (24 bytes): `lbn`'s top bit says whether `fp` is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    ino: u64,
    lbn: u64,
    fp: u64,
}

const EMPTY: u64 = 0;
const TOMB: u64 = u64::MAX;

/// An inode field that holds an item (neither [`EMPTY`] nor [`TOMB`]).
fn is_live(ino: u64) -> bool {
    ino != EMPTY && ino != TOMB
}
const HAS_FP: u64 = 1 << 63;
/// In `lbn`: queued for a second visit.
const AGAIN: u64 = 1 << 62;
const FLAGS: u64 = HAS_FP | AGAIN;

/// What the worker takes from the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// One block of a file, with its fingerprint when inline dedup computed it; `again`: the
    /// worker left it in place once because its copy held more references than the other
    /// copy and not all of them were in that step, and moves it on this second visit.
    Block {
        ino: u64,
        lbn: u64,
        fp: Option<u64>,
        again: bool,
    },
    /// Every block of a file (the buffer overflowed).
    File { ino: u64 },
}

/// The buffer.
#[derive(Debug)]
pub struct SkippedBuffer {
    slots: Vec<Slot>,
    live: usize,
    /// Of `live`, entries queued for a second visit.
    again_live: usize,
    used: usize,
    cursor: usize,
    /// Inode-number set (open addressing, 0 empty, `TOMB` removed) after an overflow.
    inos: Vec<u64>,
    inos_live: usize,
    inos_used: usize,
    ino_cursor: usize,
    /// Files that found both the table and the inode set full.
    pub lost: u64,
    /// Times the table overflowed into the inode set.
    pub overflows: u64,
}

fn mix(a: u64, b: u64) -> usize {
    let mut h = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_add(0x632B_E59B_D9B4_E019);
    h ^= h >> 29;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (h ^ (h >> 32)) as usize
}

impl SkippedBuffer {
    /// A buffer of `bytes`: three quarters for block entries, a quarter for inode numbers.
    pub fn new(bytes: u64) -> SkippedBuffer {
        let slots = ((bytes as usize * 3 / 4) / std::mem::size_of::<Slot>()).max(16);
        let inos = ((bytes as usize / 4) / 8).max(16);
        SkippedBuffer {
            slots: vec![
                Slot {
                    ino: EMPTY,
                    lbn: 0,
                    fp: 0
                };
                slots
            ],
            live: 0,
            again_live: 0,
            used: 0,
            cursor: 0,
            inos: vec![EMPTY; inos],
            inos_live: 0,
            inos_used: 0,
            ino_cursor: 0,
            lost: 0,
            overflows: 0,
        }
    }

    /// Heap bytes.
    pub fn memory_bytes(&self) -> u64 {
        (self.slots.capacity() * std::mem::size_of::<Slot>() + self.inos.capacity() * 8) as u64
    }

    /// Block entries and inode numbers pending.
    pub fn pending(&self) -> (usize, usize) {
        (self.live, self.inos_live)
    }

    /// Block entries the table holds at most.
    pub fn capacity(&self) -> usize {
        self.slots.len() * 7 / 8
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.live == 0 && self.inos_live == 0
    }

    /// Note block `lbn` of `ino` (inode numbers start at 1), replacing an earlier entry.
    pub fn push(&mut self, ino: u64, lbn: u64, fp: Option<u64>) {
        if !is_live(ino) {
            return;
        }
        if self.inos_live > 0 || self.used >= self.capacity() {
            // Overflowed: whole files from now on, until the worker has drained the set.
            if self.inos_live == 0 {
                self.overflows += 1;
                self.spill();
            }
            self.push_ino(ino);
            return;
        }
        self.put(ino, lbn, fp, false);
    }

    /// Queue block `lbn` of `ino` once more for the worker's second visit (see
    /// [`Item::Block`]'s `again`). Only into free room of the block table: never spills (a
    /// whole-file scan would lose the mark), and refused while the buffer holds inode numbers
    /// (overflowed); false when refused. A block queued meanwhile (written again) keeps its
    /// entry. Second visits are handed out only once no first visit is pending (see
    /// [`SkippedBuffer::take_into`]).
    pub fn push_again(&mut self, ino: u64, lbn: u64, fp: Option<u64>) -> bool {
        if !is_live(ino) || self.inos_live > 0 || self.used >= self.capacity() {
            return false;
        }
        self.put(ino, lbn, fp, true);
        true
    }

    fn put(&mut self, ino: u64, lbn: u64, fp: Option<u64>, again: bool) {
        let flags = fp.map_or(0, |_| HAS_FP) | if again { AGAIN } else { 0 };
        let n = self.slots.len();
        let mut i = mix(ino, lbn) % n;
        let mut free = None;
        loop {
            let s = self.slots[i];
            if s.ino == EMPTY {
                break;
            }
            if s.ino == TOMB {
                free.get_or_insert(i);
            } else if s.ino == ino && s.lbn & !FLAGS == lbn {
                // Written again: the newer fingerprint replaces the entry (a second visit
                // does not replace a write's).
                if !again {
                    if s.lbn & AGAIN != 0 {
                        self.again_live -= 1;
                    }
                    self.slots[i] = Slot {
                        ino,
                        lbn: lbn | flags,
                        fp: fp.unwrap_or(0),
                    };
                }
                return;
            }
            i = (i + 1) % n;
        }
        // A reused tombstone is counted in `used` already; an empty slot is not.
        let at = free.unwrap_or(i);
        if self.slots[at].ino == EMPTY {
            self.used += 1;
        }
        self.slots[at] = Slot {
            ino,
            lbn: lbn | flags,
            fp: fp.unwrap_or(0),
        };
        self.live += 1;
        self.again_live += usize::from(again);
    }

    /// Note every block of file `ino` (a checkpoint of an overflowed buffer).
    pub fn push_file(&mut self, ino: u64) {
        if !is_live(ino) {
            return;
        }
        if self.inos_live == 0 && self.live > 0 {
            self.overflows += 1;
            self.spill();
        }
        self.push_ino(ino);
    }

    /// Move every block entry's inode into the inode set and empty the table (in place: an
    /// overflow allocates nothing).
    fn spill(&mut self) {
        for k in 0..self.slots.len() {
            let ino = self.slots[k].ino;
            if is_live(ino) {
                self.push_ino(ino);
            }
        }
        self.reset_table();
    }

    fn reset_table(&mut self) {
        for s in self.slots.iter_mut() {
            s.ino = EMPTY;
        }
        self.live = 0;
        self.again_live = 0;
        self.used = 0;
        self.cursor = 0;
    }

    fn push_ino(&mut self, ino: u64) {
        let n = self.inos.len();
        if self.inos_used >= n * 7 / 8 {
            if !self.inos.contains(&ino) {
                self.lost += 1;
            }
            return;
        }
        let mut i = mix(ino, 0) % n;
        loop {
            match self.inos[i] {
                EMPTY => break,
                x if x == ino => return,
                _ => i = (i + 1) % n,
            }
        }
        self.inos[i] = ino;
        self.inos_used += 1;
        self.inos_live += 1;
    }

    /// Take up to `max` items, a sweep of the table, then at most one whole file.
    #[cfg(test)]
    pub fn take(&mut self, max: usize) -> Vec<Item> {
        let mut out = Vec::new();
        self.take_into(max, true, &mut out);
        out
    }

    /// Take up to `max` items into `out` (emptied first): a sweep of the table, then at most
    /// one whole file. Second visits wait until no first visit is pending (no block entry, no
    /// file to scan, and `allow_again`: the caller's step holds nothing yet), and are never
    /// taken with first visits: a block kept in place for another copy's queued references
    /// must not move before those references had their first visit (they would tie and move
    /// the other way, leaving two copies).
    pub fn take_into(&mut self, max: usize, allow_again: bool, out: &mut Vec<Item>) {
        out.clear();
        let n = self.slots.len();
        let mut seen = 0;
        // Decided once per call, so that one step never holds both kinds.
        let firsts_only = !allow_again || self.live > self.again_live || self.inos_live > 0;
        while out.len() < max && self.live > 0 && seen < n {
            let i = self.cursor;
            self.cursor = (self.cursor + 1) % n;
            seen += 1;
            let s = self.slots[i];
            if !is_live(s.ino) {
                continue;
            }
            let again = s.lbn & AGAIN != 0;
            if again && firsts_only {
                continue;
            }
            out.push(Item::Block {
                ino: s.ino,
                lbn: s.lbn & !FLAGS,
                fp: (s.lbn & HAS_FP != 0).then_some(s.fp),
                again,
            });
            self.slots[i].ino = TOMB;
            self.live -= 1;
            self.again_live -= usize::from(again);
        }
        if self.live == 0 && self.used > 0 {
            self.reset_table();
        }
        let m = self.inos.len();
        let mut seen = 0;
        while out.len() < max && self.inos_live > 0 && seen < m {
            let i = self.ino_cursor;
            self.ino_cursor = (self.ino_cursor + 1) % m;
            seen += 1;
            let x = self.inos[i];
            if !is_live(x) {
                continue;
            }
            out.push(Item::File { ino: x });
            self.inos[i] = TOMB;
            self.inos_live -= 1;
            // One whole file at a time: the worker scans it before taking more.
            break;
        }
        if self.inos_live == 0 && self.inos_used > 0 {
            self.inos.iter_mut().for_each(|x| *x = EMPTY);
            self.inos_used = 0;
            self.ino_cursor = 0;
        }
    }

    /// What a checkpoint records, into `out`, without copying the buffer (a checkpoint runs
    /// every 30 s while blocks wait; a copy of a full buffer was 1.7 times its size): the
    /// pending (inode, block) pairs, flattened, when every item is a block and at most
    /// `room_pairs` are pending; else the smallest `room_inos` distinct inode numbers, `extra`
    /// (a file being scanned) among them, ascending. `out` never holds more than
    /// `room_inos + room_inos / 4 + 1` words (or `2 * room_pairs`). Returns true for pairs.
    pub fn checkpoint_words(
        &self,
        extra: Option<u64>,
        room_pairs: usize,
        room_inos: usize,
        out: &mut Vec<u64>,
    ) -> bool {
        out.clear();
        let room = room_inos.max(1);
        let compact_at = room + room / 4 + 1;
        let as_pairs = extra.is_none() && self.inos_live == 0 && self.live <= room_pairs;
        // Reserved once at what this checkpoint can need (the buffer's contents or the
        // compaction bound, whichever is less): pushes below never grow it past that.
        let inodes = self.live + self.inos_live + usize::from(extra.is_some());
        out.reserve_exact(if as_pairs {
            2 * self.live
        } else {
            compact_at.min(inodes)
        });
        if as_pairs {
            for s in self.slots.iter().filter(|s| is_live(s.ino)) {
                out.push(s.ino);
                out.push(s.lbn & !FLAGS);
            }
            return true;
        }
        // Once the kept set was cut to `room`, only a smaller inode can still make the cut.
        let mut limit = u64::MAX;
        let all = self
            .slots
            .iter()
            .map(|s| s.ino)
            .chain(self.inos.iter().copied())
            .filter(|&x| is_live(x))
            .chain(extra);
        for ino in all {
            if ino >= limit {
                continue;
            }
            out.push(ino);
            if out.len() >= compact_at {
                out.sort_unstable();
                out.dedup();
                if out.len() > room {
                    out.truncate(room);
                    limit = out[room - 1];
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out.truncate(room);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn replaces_then_overflows_into_inodes() {
        let mut b = SkippedBuffer::new(24 * 32 * 4 / 3 + 8 * 16 * 4);
        let cap = b.capacity();
        b.push(5, 1, Some(10));
        b.push(5, 1, Some(11));
        assert_eq!(b.pending(), (1, 0));
        assert_eq!(
            b.take(10),
            vec![Item::Block {
                ino: 5,
                lbn: 1,
                fp: Some(11),
                again: false,
            }]
        );
        // A second visit is marked; it does not replace a block a write queued meanwhile, and
        // it comes out only once no first visit is pending.
        assert!(b.push_again(5, 2, Some(12)));
        b.push(5, 3, None);
        assert!(b.push_again(5, 3, Some(13)));
        assert_eq!(
            b.take(10),
            vec![Item::Block {
                ino: 5,
                lbn: 3,
                fp: None,
                again: false,
            }]
        );
        assert_eq!(
            b.take(10),
            vec![Item::Block {
                ino: 5,
                lbn: 2,
                fp: Some(12),
                again: true,
            }]
        );
        // A write to a block waiting for its second visit makes it a first visit again.
        assert!(b.push_again(6, 1, None));
        b.push(6, 1, Some(14));
        assert_eq!(
            b.take(10),
            vec![Item::Block {
                ino: 6,
                lbn: 1,
                fp: Some(14),
                again: false,
            }]
        );
        assert!(b.is_empty());
        for lbn in 0..cap as u64 + 5 {
            b.push(7 + lbn % 3, lbn, None);
        }
        // Full: converted to the three inode numbers; no room for a second visit.
        assert!(!b.push_again(5, 4, None));
        assert_eq!(b.overflows, 1);
        assert_eq!(b.pending(), (0, 3));
        // One whole file per take.
        let mut inos: Vec<Item> = (0..3).flat_map(|_| b.take(10)).collect();
        inos.sort_by_key(|i| match i {
            Item::File { ino } => *ino,
            _ => 0,
        });
        assert_eq!(
            inos,
            vec![
                Item::File { ino: 7 },
                Item::File { ino: 8 },
                Item::File { ino: 9 }
            ]
        );
        assert!(b.is_empty());
        // Drained: back to block entries.
        b.push(3, 3, None);
        assert_eq!(b.pending(), (1, 0));
    }

    proptest! {
        #[test]
        fn every_pushed_block_comes_out_once_as_itself_or_its_file(
            ops in proptest::collection::vec((1u64..6, 0u64..40, any::<bool>(), 0usize..8), 1..300)
        ) {
            let mut b = SkippedBuffer::new(2048);
            let mut want: BTreeSet<(u64, u64)> = BTreeSet::new();
            let mut got_blocks: BTreeSet<(u64, u64)> = BTreeSet::new();
            let mut got_files: BTreeSet<u64> = BTreeSet::new();
            for (ino, lbn, take, n) in ops {
                if take {
                    for it in b.take(n) {
                        match it {
                            Item::Block { ino, lbn, .. } => { got_blocks.insert((ino, lbn)); }
                            Item::File { ino } => { got_files.insert(ino); }
                        }
                    }
                } else {
                    b.push(ino, lbn, None);
                    want.insert((ino, lbn));
                    // It must come out (again) after this push.
                    got_blocks.remove(&(ino, lbn));
                    got_files.remove(&ino);
                }
            }
            for it in b.take(usize::MAX) {
                match it {
                    Item::Block { ino, lbn, .. } => { got_blocks.insert((ino, lbn)); }
                    Item::File { ino } => { got_files.insert(ino); }
                }
            }
            prop_assert!(b.is_empty());
            prop_assert_eq!(b.lost, 0);
            for (ino, lbn) in want {
                prop_assert!(got_blocks.contains(&(ino, lbn)) || got_files.contains(&ino));
            }
        }
    }
}
