//! The encrypted PCM main memory as the schemes see it: logical lines (the trace's addresses)
//! mapped to physical lines that hold ciphertext, with a reference count per physical line.
//!
//! Every logical line has a *home* physical line (its own address, used in place by Baseline and
//! by any unique write while nobody else shares it). A deduplicated write remaps the logical line
//! to the physical line that already holds its content (an address mapping table entry); a unique
//! write to a logical line whose current physical line is shared goes to its home line if that is
//! free, else to a line from a spare pool. State grows with the lines the trace touches, never
//! with its length.

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

/// Logical-to-physical map, reference counts and encrypted contents.
pub struct Nvmm {
    cipher: LineCipher,
    banks: u32,
    lmap: FxHashMap<u64, u32>,
    l2p: Vec<u32>,
    home: Vec<u32>,
    ct: Vec<Line>,
    counter: Vec<u32>,
    refs: Vec<u32>,
    bank: Vec<u16>,
    written: Vec<bool>,
    /// Spare-pool line (reused by anyone once free) rather than some logical line's home.
    pool: Vec<bool>,
    pool_free: Vec<u32>,
    pool_lines: u64,
    remapped: u64,
}

impl Nvmm {
    /// Empty memory over `banks` banks, encrypting with `cipher`.
    pub fn new(banks: u32, cipher: LineCipher) -> Self {
        Nvmm {
            cipher,
            banks,
            lmap: FxHashMap::default(),
            l2p: Vec::new(),
            home: Vec::new(),
            ct: Vec::new(),
            counter: Vec::new(),
            refs: Vec::new(),
            bank: Vec::new(),
            written: Vec::new(),
            pool: Vec::new(),
            pool_free: Vec::new(),
            pool_lines: 0,
            remapped: 0,
        }
    }

    fn new_pid(&mut self, bank: u32) -> u32 {
        self.ct.push(ZERO_LINE);
        self.counter.push(0);
        self.refs.push(0);
        self.bank.push(bank as u16);
        self.written.push(false);
        self.pool.push(false);
        (self.ct.len() - 1) as u32
    }

    /// The logical id of trace line `line` (created, mapped to its home line, on first use).
    pub fn lid(&mut self, line: u64) -> u32 {
        if let Some(&l) = self.lmap.get(&line) {
            return l;
        }
        let pid = self.new_pid((line % self.banks as u64) as u32);
        self.refs[pid as usize] = 1;
        let lid = self.l2p.len() as u32;
        self.l2p.push(pid);
        self.home.push(pid);
        self.lmap.insert(line, lid);
        lid
    }

    /// Physical line logical `lid` maps to.
    pub fn mapped(&self, lid: u32) -> u32 {
        self.l2p[lid as usize]
    }

    /// Whether `lid` maps away from its home line (it has an AMT entry).
    pub fn is_remapped(&self, lid: u32) -> bool {
        self.l2p[lid as usize] != self.home[lid as usize]
    }

    /// Bank of physical line `pid`.
    pub fn bank(&self, pid: u32) -> u32 {
        self.bank[pid as usize] as u32
    }

    /// References to physical line `pid`.
    pub fn refs(&self, pid: u32) -> u32 {
        self.refs[pid as usize]
    }

    /// Logical lines with an AMT entry now.
    pub fn amt_entries(&self) -> u64 {
        self.remapped
    }

    /// Logical lines touched.
    pub fn logical_lines(&self) -> u64 {
        self.l2p.len() as u64
    }

    /// Physical lines holding written content that some logical line maps to.
    pub fn live_lines(&self) -> u64 {
        self.refs
            .iter()
            .zip(&self.written)
            .filter(|(&r, &w)| r > 0 && w)
            .count() as u64
    }

    /// Spare-pool lines ever allocated (physical space beyond the logical lines).
    pub fn pool_lines(&self) -> u64 {
        self.pool_lines
    }

    fn remap(&mut self, lid: u32, to: u32) -> bool {
        let from = self.l2p[lid as usize];
        let home = self.home[lid as usize];
        if from == to {
            return false;
        }
        match (from == home, to == home) {
            (true, false) => self.remapped += 1,
            (false, true) => self.remapped -= 1,
            _ => {}
        }
        self.l2p[lid as usize] = to;
        true
    }

    /// Drop one reference of `pid`; returns it when that was the last one of written content.
    fn unref(&mut self, pid: u32) -> Option<u32> {
        let r = &mut self.refs[pid as usize];
        *r -= 1;
        if *r > 0 {
            return None;
        }
        if self.pool[pid as usize] {
            self.pool_free.push(pid);
        }
        self.written[pid as usize].then_some(pid)
    }

    /// Encrypt `data` into `pid` with a fresh counter.
    fn put(&mut self, pid: u32, data: &Line) {
        let c = &mut self.counter[pid as usize];
        *c = c.wrapping_add(1);
        let ctr = *c;
        self.ct[pid as usize] = self.cipher.apply(pid as u64, ctr, data);
        self.written[pid as usize] = true;
    }

    /// Write `data` for `lid` as unique content (in place when its line is not shared).
    pub fn store_unique(&mut self, lid: u32, data: &Line) -> Stored {
        let cur = self.l2p[lid as usize];
        if self.refs[cur as usize] == 1 {
            let gone = self.written[cur as usize].then_some(cur);
            self.put(cur, data);
            return Stored {
                pid: cur,
                gone,
                amt_changed: false,
            };
        }
        self.refs[cur as usize] -= 1;
        let home = self.home[lid as usize];
        let pid = if self.refs[home as usize] == 0 {
            home
        } else if let Some(p) = self.pool_free.pop() {
            p
        } else {
            self.pool_lines += 1;
            let b = (self.ct.len() as u64 % self.banks as u64) as u32;
            let p = self.new_pid(b);
            self.pool[p as usize] = true;
            p
        };
        self.refs[pid as usize] = 1;
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
        let cur = self.l2p[lid as usize];
        if cur == target {
            return Stored {
                pid: cur,
                gone: None,
                amt_changed: false,
            };
        }
        self.refs[target as usize] += 1;
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
        if !self.written[pid as usize] {
            return ZERO_LINE;
        }
        let p = pid as usize;
        self.cipher.apply(pid as u64, self.counter[p], &self.ct[p])
    }

    /// Whether physical line `pid` holds `data` (decrypt, then compare byte by byte).
    pub fn matches(&self, pid: u32, data: &Line) -> bool {
        self.written[pid as usize] && self.plain(pid) == *data
    }

    /// What a read of trace line `line` returns (zero if never written).
    pub fn read_logical(&self, line: u64) -> Line {
        match self.lmap.get(&line) {
            Some(&lid) => self.plain(self.l2p[lid as usize]),
            None => ZERO_LINE,
        }
    }
}
