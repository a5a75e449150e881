//! The encrypted PCM main memory as the schemes see it: logical lines (the trace's addresses)
//! mapped to physical lines that hold ciphertext, with a reference count per physical line.
//!
//! Every logical line has a *home* physical line (its own address, used in place by Baseline and
//! by any unique write while nobody else shares it). A deduplicated write remaps the logical line
//! to the physical line that already holds its content (an address mapping table entry); a unique
//! write to a logical line whose current physical line is shared goes to its home line if that is
//! free, else to a line from a spare pool. State grows with the lines the trace touches, never
//! with its length.
//!
//! Layout, for speed on traces of ~10^8 events: trace lines are mapped a 4 KiB page (64 lines) at a
//! time, so one hash lookup serves a run of neighbouring lines; a page's 64 home lines get 64
//! consecutive physical numbers, and a logical line is numbered like its home line (`lid` = home
//! `pid`); pool lines take the next free numbers. Per-line metadata sits in one 16-byte record.

use super::crypt::LineCipher;
use crate::trace::{Line, ZERO_LINE};
use rustc_hash::FxHashMap;

/// Result of a store: which physical line now holds the logical line's content, and what changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    /// Physical line mapped now.
    pub pid: u32,
    /// A physical line whose previous content no longer exists (overwritten in place, or its last
    /// reference dropped): metadata naming it must go.
    pub gone: Option<u32>,
    /// The mapping changed to or between remapped lines (an AMT update).
    pub amt_changed: bool,
}

const WRITTEN: u8 = 1;
const POOL: u8 = 2;
const HOME: u8 = 4;

/// Metadata of one physical line (and, for home lines, of the logical line numbered like it).
#[derive(Clone, Copy, Default)]
struct Meta {
    /// Logical line numbered like this home line: the physical line it maps to.
    l2p: u32,
    /// References to this physical line.
    refs: u32,
    /// Encryption counter.
    counter: u32,
    bank: u16,
    flags: u8,
}

/// Logical-to-physical map, reference counts and encrypted contents.
pub struct Nvmm {
    cipher: LineCipher,
    banks: u32,
    pages: FxHashMap<u64, u32>,
    last_page: (u64, u32),
    meta: Vec<Meta>,
    ct: Vec<Line>,
    pool_free: Vec<u32>,
    pool_lines: u64,
    logical: u64,
    remapped: u64,
}

impl Nvmm {
    /// Empty memory over `banks` banks, encrypting with `cipher`.
    pub fn new(banks: u32, cipher: LineCipher) -> Self {
        Nvmm {
            cipher,
            banks,
            pages: FxHashMap::default(),
            last_page: (u64::MAX, 0),
            meta: Vec::new(),
            ct: Vec::new(),
            pool_free: Vec::new(),
            pool_lines: 0,
            logical: 0,
            remapped: 0,
        }
    }

    /// The logical id of trace line `line` (its page mapped on first use, lines to their homes).
    pub fn lid(&mut self, line: u64) -> u32 {
        let page = line >> 6;
        let base = if self.last_page.0 == page {
            self.last_page.1
        } else {
            let next = self.meta.len() as u32;
            let base = *self.pages.entry(page).or_insert(next);
            if base == next {
                for i in 0..64u64 {
                    let pid = next + i as u32;
                    self.meta.push(Meta {
                        l2p: pid,
                        refs: 0,
                        counter: 0,
                        bank: (((page << 6) + i) % self.banks as u64) as u16,
                        flags: 0,
                    });
                    self.ct.push(ZERO_LINE);
                }
            }
            self.last_page = (page, base);
            base
        };
        let lid = base + (line & 63) as u32;
        let m = &mut self.meta[lid as usize];
        if m.flags & HOME == 0 {
            // First use of this logical line: it maps to its home line.
            m.flags |= HOME;
            m.refs += 1;
            self.logical += 1;
        }
        lid
    }

    /// Physical line logical `lid` maps to.
    pub fn mapped(&self, lid: u32) -> u32 {
        self.meta[lid as usize].l2p
    }

    /// Whether `lid` maps away from its home line (it has an AMT entry).
    pub fn is_remapped(&self, lid: u32) -> bool {
        self.meta[lid as usize].l2p != lid
    }

    /// Bank of physical line `pid`.
    pub fn bank(&self, pid: u32) -> u32 {
        self.meta[pid as usize].bank as u32
    }

    /// References to physical line `pid`.
    pub fn refs(&self, pid: u32) -> u32 {
        self.meta[pid as usize].refs
    }

    /// Logical lines with an AMT entry now.
    pub fn amt_entries(&self) -> u64 {
        self.remapped
    }

    /// Logical lines touched.
    pub fn logical_lines(&self) -> u64 {
        self.logical
    }

    /// Physical lines holding written content that some logical line maps to.
    pub fn live_lines(&self) -> u64 {
        self.meta
            .iter()
            .filter(|m| m.refs > 0 && m.flags & WRITTEN != 0)
            .count() as u64
    }

    /// Spare-pool lines ever allocated (physical space beyond the logical lines).
    pub fn pool_lines(&self) -> u64 {
        self.pool_lines
    }

    fn remap(&mut self, lid: u32, to: u32) -> bool {
        let from = self.meta[lid as usize].l2p;
        if from == to {
            return false;
        }
        match (from == lid, to == lid) {
            (true, false) => self.remapped += 1,
            (false, true) => self.remapped -= 1,
            _ => {}
        }
        self.meta[lid as usize].l2p = to;
        true
    }

    /// Drop one reference of `pid`; returns it when that was the last one of written content.
    fn unref(&mut self, pid: u32) -> Option<u32> {
        let m = &mut self.meta[pid as usize];
        m.refs -= 1;
        if m.refs > 0 {
            return None;
        }
        let written = m.flags & WRITTEN != 0;
        if m.flags & POOL != 0 {
            self.pool_free.push(pid);
        }
        written.then_some(pid)
    }

    /// Encrypt `data` into `pid` with a fresh counter.
    fn put(&mut self, pid: u32, data: &Line) {
        let m = &mut self.meta[pid as usize];
        m.counter = m.counter.wrapping_add(1);
        m.flags |= WRITTEN;
        let ctr = m.counter;
        self.ct[pid as usize] = self.cipher.apply(pid as u64, ctr, data);
    }

    /// Write `data` for `lid` as unique content (in place when its line is not shared).
    pub fn store_unique(&mut self, lid: u32, data: &Line) -> Stored {
        let cur = self.meta[lid as usize].l2p;
        if self.meta[cur as usize].refs == 1 {
            let gone = (self.meta[cur as usize].flags & WRITTEN != 0).then_some(cur);
            self.put(cur, data);
            return Stored {
                pid: cur,
                gone,
                amt_changed: false,
            };
        }
        self.meta[cur as usize].refs -= 1;
        let pid = if self.meta[lid as usize].refs == 0 {
            lid
        } else if let Some(p) = self.pool_free.pop() {
            p
        } else {
            self.pool_lines += 1;
            let p = self.meta.len() as u32;
            self.meta.push(Meta {
                l2p: p,
                refs: 0,
                counter: 0,
                bank: (p % self.banks) as u16,
                flags: POOL,
            });
            self.ct.push(ZERO_LINE);
            p
        };
        self.meta[pid as usize].refs = 1;
        self.put(pid, data);
        let amt_changed = self.remap(lid, pid);
        Stored {
            pid,
            gone: None,
            amt_changed,
        }
    }

    /// Map `lid` to `target`, which already holds its content (a write eliminated).
    pub fn store_dup(&mut self, lid: u32, target: u32) -> Stored {
        let cur = self.meta[lid as usize].l2p;
        if cur == target {
            return Stored {
                pid: cur,
                gone: None,
                amt_changed: false,
            };
        }
        self.meta[target as usize].refs += 1;
        let amt_changed = self.remap(lid, target);
        let gone = self.unref(cur);
        Stored {
            pid: target,
            gone,
            amt_changed,
        }
    }

    /// Decrypt physical line `pid`.
    pub fn plain(&self, pid: u32) -> Line {
        let m = &self.meta[pid as usize];
        if m.flags & WRITTEN == 0 {
            return ZERO_LINE;
        }
        self.cipher
            .apply(pid as u64, m.counter, &self.ct[pid as usize])
    }

    /// Whether physical line `pid` holds `data` (decrypt, then compare byte by byte).
    pub fn matches(&self, pid: u32, data: &Line) -> bool {
        self.meta[pid as usize].flags & WRITTEN != 0 && self.plain(pid) == *data
    }

    /// What a read of trace line `line` returns (zero if never written).
    pub fn read_logical(&self, line: u64) -> Line {
        match self.pages.get(&(line >> 6)) {
            Some(&base) => {
                let lid = base + (line & 63) as u32;
                if self.meta[lid as usize].flags & HOME == 0 {
                    return ZERO_LINE;
                }
                self.plain(self.meta[lid as usize].l2p)
            }
            None => ZERO_LINE,
        }
    }
}
