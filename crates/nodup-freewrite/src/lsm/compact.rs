//! Compaction of the LSM store, as LevelDB picks it: the level whose size (or level-0 table
//! count) is furthest over its limit; one table of it chosen round-robin by key (for level 0,
//! with every level-0 table overlapping it) and the tables of the next level overlapping those.
//! A lone table with nothing under it just moves down. Otherwise the inputs are merged, the
//! newest version of each key kept, DELETE markers dropped where no deeper level holds the key,
//! and the result cut into tables of about 2 MiB.
//!
//! Freewrite (§3.1) is applied to the level k+1 list: every record copied from a level k+1
//! input keeps its old table and offset as its source, so runs of them form islands, and each
//! output table is planned (bubbles before islands, under the caps) before it is written.
//! Table cuts and level sizes use the compact byte counts, so a store with freewrite on makes
//! exactly the decisions of one with it off: their tables differ only by bubbles.

use super::table::{table_name, Table, TableBuilder, TableRecord, TABLE_HEADER};
use super::{LsmStore, LEVELS};
use crate::error::Result;
use crate::fsutil::{remove, sync_dir};
use crate::planner::{plan, Item, Src};

/// One record of the merge: which input buffer, where in it, where it sat on disk.
struct Merged<'a> {
    key: &'a [u8],
    raw: &'a [u8],
    /// Its old table and offset when it comes from level k+1 (freewrite sources).
    src: Option<Src>,
    delete: bool,
}

impl LsmStore {
    /// Compact while any level is over its limit.
    pub(super) fn maybe_compact(&mut self) -> Result<()> {
        loop {
            let mut best = (1.0, None);
            for l in 0..LEVELS - 1 {
                let s = self.score(l);
                if s >= best.0 {
                    best = (s, Some(l));
                }
            }
            match best.1 {
                Some(l) => self.compact_level(l)?,
                None => return Ok(()),
            }
        }
    }

    /// How far level `l` is over its limit (≥ 1: compact it).
    fn score(&self, l: usize) -> f64 {
        if l == 0 {
            return self.levels[0].len() as f64 / self.opts.l0_trigger as f64;
        }
        let bytes: u64 = self.levels[l].iter().map(|t| t.meta.data_bytes).sum();
        let limit = self.opts.l1_bytes as f64 * (self.opts.fanout as f64).powi(l as i32 - 1);
        bytes as f64 / limit
    }

    /// Indices of the tables of level `l` overlapping `[lo, hi]`.
    fn overlapping(&self, l: usize, lo: &[u8], hi: &[u8]) -> Vec<usize> {
        (0..self.levels[l].len())
            .filter(|&i| {
                let m = &self.levels[l][i].meta;
                m.largest.as_slice() >= lo && m.smallest.as_slice() <= hi
            })
            .collect()
    }

    /// Key range of the tables `idx` of level `l`.
    fn range_of(&self, l: usize, idx: &[usize]) -> (Vec<u8>, Vec<u8>) {
        let t = &self.levels[l];
        let lo = idx.iter().map(|&i| &t[i].meta.smallest).min();
        let hi = idx.iter().map(|&i| &t[i].meta.largest).max();
        (
            lo.cloned().unwrap_or_default(),
            hi.cloned().unwrap_or_default(),
        )
    }

    /// Whether a level below `l` may hold `key` (a DELETE marker must then be kept).
    fn deeper_may_hold(&self, l: usize, key: &[u8]) -> bool {
        self.levels[l + 1..].iter().any(|tables| {
            tables
                .iter()
                .any(|t| t.meta.smallest.as_slice() <= key && key <= t.meta.largest.as_slice())
        })
    }

    fn compact_level(&mut self, k: usize) -> Result<()> {
        let ptr = &self.pointers[k];
        let tables = &self.levels[k];
        let first = tables
            .iter()
            .position(|t| ptr.is_empty() || t.meta.largest > *ptr)
            .unwrap_or(0);
        let mut inputs = vec![first];
        let (mut lo, mut hi) = self.range_of(k, &inputs);
        if k == 0 {
            // Level-0 tables overlap each other: take every one that overlaps, transitively.
            loop {
                let more = self.overlapping(0, &lo, &hi);
                if more.len() == inputs.len() {
                    break;
                }
                inputs = more;
                (lo, hi) = self.range_of(0, &inputs);
            }
        }
        let next = self.overlapping(k + 1, &lo, &hi);
        self.pointers[k] = hi.clone();
        if inputs.len() == 1 && next.is_empty() {
            let t = self.levels[k].remove(inputs[0]);
            let at = self.levels[k + 1].partition_point(|x| x.meta.smallest < t.meta.smallest);
            self.levels[k + 1].insert(at, t);
            self.stats.trivial_moves += 1;
            return self.commit();
        }
        // Read the inputs: level k (newest first for level 0) has priority over level k+1.
        let mut srcs: Vec<(&Table, bool)> = Vec::new();
        let lk = &self.levels[k];
        let mut order = inputs.clone();
        order.sort_unstable_by(|a, b| b.cmp(a));
        srcs.extend(order.iter().map(|&i| (&lk[i], false)));
        srcs.extend(next.iter().map(|&i| (&self.levels[k + 1][i], true)));
        let mut data: Vec<(Vec<u8>, Vec<TableRecord>)> = Vec::with_capacity(srcs.len());
        for (t, _) in &srcs {
            data.push(t.read_all()?);
        }
        let mut all: Vec<(usize, Merged)> = Vec::new();
        for (prio, ((t, lower), (buf, recs))) in srcs.iter().zip(&data).enumerate() {
            for r in recs {
                all.push((
                    prio,
                    Merged {
                        key: &buf[r.key.clone()],
                        raw: &buf[r.range.clone()],
                        src: lower.then_some(Src {
                            file: t.meta.number,
                            off: r.off,
                        }),
                        delete: r.delete,
                    },
                ));
            }
        }
        // Stable sort by key, the highest-priority (lowest index) source first.
        all.sort_by(|a, b| a.1.key.cmp(b.1.key).then(a.0.cmp(&b.0)));
        let mut merged: Vec<Merged> = Vec::with_capacity(all.len());
        for (_, m) in all {
            if merged.last().is_some_and(|x| x.key == m.key) {
                continue;
            }
            merged.push(m);
        }
        merged.retain(|m| !m.delete || self.deeper_may_hold(k + 1, m.key));
        // Cut on compact sizes, so the cuts do not depend on freewrite.
        let mut cuts = Vec::new();
        let mut start = 0;
        let mut acc = 0u64;
        for (i, m) in merged.iter().enumerate() {
            acc += m.raw.len() as u64;
            if acc >= self.opts.table_bytes {
                cuts.push(start..i + 1);
                start = i + 1;
                acc = 0;
            }
        }
        if start < merged.len() {
            cuts.push(start..merged.len());
        }
        let mut outputs = Vec::new();
        for cut in cuts {
            let part = &merged[cut];
            let bubbles = match self.opts.freewrite {
                Some(caps) => {
                    let items: Vec<Item> = part
                        .iter()
                        .map(|m| Item {
                            len: m.raw.len() as u64,
                            src: m.src,
                        })
                        .collect();
                    let (b, st) = plan(caps, TABLE_HEADER as u64, &items);
                    self.stats.plan.add(&st);
                    b
                }
                None => vec![0; part.len()],
            };
            let mut b = TableBuilder::new();
            for (m, &bub) in part.iter().zip(&bubbles) {
                if bub > 0 {
                    b.bubble(bub);
                }
                b.add(m.key, m.raw);
            }
            let number = self.next_file;
            self.next_file += 1;
            let meta = b.finish(&self.dir.join(table_name(number)), number)?;
            self.stats.compaction_bytes_written += meta.file_size;
            self.stats.app_bytes_written += meta.file_size;
            self.stats.bubble_bytes_written += meta.bubble_bytes;
            outputs.push(meta);
        }
        drop(data);
        self.crash_point("compact:outputs-written");
        let mut gone = Vec::new();
        let mut rm = |level: &mut Vec<Table>, idx: &[usize]| {
            let mut idx = idx.to_vec();
            idx.sort_unstable_by(|a, b| b.cmp(a));
            for i in idx {
                gone.push(level.remove(i).meta.number);
            }
        };
        rm(&mut self.levels[k], &inputs);
        rm(&mut self.levels[k + 1], &next);
        for meta in outputs {
            let t = Table::open(&self.dir, meta)?;
            let at = self.levels[k + 1].partition_point(|x| x.meta.smallest < t.meta.smallest);
            self.levels[k + 1].insert(at, t);
        }
        self.stats.compactions += 1;
        self.commit()?;
        self.crash_point("compact:committed");
        for n in gone {
            remove(&self.dir.join(table_name(n)))?;
        }
        sync_dir(&self.dir)
    }
}
