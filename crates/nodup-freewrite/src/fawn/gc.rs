//! Garbage collection of the FAWN store: copy the live records of the log, in log order, into
//! a new log and drop the old one. With freewrite on, the stream planner (lookahead) places a
//! bubble record before each run of copied records whose island would otherwise land off a
//! block boundary, so the block-level dedup below sees those blocks as duplicates of the old
//! log's and does not write them.

use super::index::{key_hash, Index, Loc};
use super::{log_name, FawnStore};
use crate::error::{Error, IoContext, Result};
use crate::fsutil::{remove, sync_dir};
use crate::logfile::{scan_log, BlockWriter, LogHeader, LogKind, LOG_HEADER};
use crate::planner::{IslandSize, Item, PlanStats, Src, StreamPlanner};
use crate::record::{self, Entry};
use serde::Serialize;
use std::collections::VecDeque;

/// What one garbage collection did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    /// Records read from the old log (bubbles and DELETE markers included).
    pub records_scanned: u64,
    /// Live records copied.
    pub records_copied: u64,
    /// Bytes of the old log.
    pub old_log_bytes: u64,
    /// Bytes of the new log.
    pub new_log_bytes: u64,
    /// Bytes handed to the file system for the new log.
    pub bytes_written: u64,
    /// Planner counts (all zero with freewrite off).
    pub plan: PlanStats,
}

/// The new log being written: records copied in order, bubbles where the planner says.
struct Copier {
    out: BlockWriter,
    index: Index,
    planner: Option<StreamPlanner>,
    /// Records held back until the planner releases them: (key hash, bytes).
    pending: VecDeque<(u64, Vec<u8>)>,
    scratch: Vec<u8>,
}

impl Copier {
    fn copy(&mut self, old_off: u64, h: u64, raw: &[u8]) -> Result<()> {
        match self.planner.as_mut() {
            None => self.emit(0, h, raw),
            Some(p) => {
                p.push(Item {
                    len: raw.len() as u64,
                    src: Some(Src {
                        file: 0,
                        off: old_off,
                    }),
                });
                self.pending.push_back((h, raw.to_vec()));
                self.drain()
            }
        }
    }

    /// Write the records the planner has released, each after its bubble.
    fn drain(&mut self) -> Result<()> {
        while let Some(bubble) = self.planner.as_mut().and_then(|p| p.pop()) {
            let Some((h, raw)) = self.pending.pop_front() else {
                break;
            };
            self.emit(bubble, h, &raw)?;
        }
        Ok(())
    }

    fn emit(&mut self, bubble: u64, h: u64, raw: &[u8]) -> Result<()> {
        if bubble > 0 {
            self.scratch.clear();
            record::encode_bubble(&mut self.scratch, bubble as usize);
            self.out.append(&self.scratch)?;
        }
        let off = self.out.append(raw)?;
        self.index.add(
            h,
            Loc {
                off,
                len: raw.len() as u32,
            },
        );
        Ok(())
    }
}

impl FawnStore {
    /// Copy the live records into a new log (with bubbles when freewrite is on) and drop the
    /// old log. Everything written before is durable when this returns.
    pub fn gc(&mut self) -> Result<GcReport> {
        self.log.sync()?;
        let old_end = self.log.end();
        let new_gen = self.gen + 1;
        let tmp = self.dir.join(format!("{}.tmp", log_name(new_gen)));
        remove(&tmp)?;
        let out = BlockWriter::create(
            tmp.clone(),
            &LogHeader {
                kind: LogKind::Data,
                number: new_gen,
            },
        )?;
        let planner = self.opts.freewrite.map(|caps| {
            StreamPlanner::new(
                caps,
                IslandSize::Lookahead,
                LOG_HEADER as u64,
                self.index.bytes(),
            )
        });
        let mut c = Copier {
            out,
            index: Index::with_capacity(self.index.keys() as usize),
            planner,
            pending: VecDeque::new(),
            scratch: Vec::new(),
        };
        let mut rep = GcReport {
            old_log_bytes: old_end,
            ..GcReport::default()
        };
        let index = &self.index;
        let end = scan_log(
            self.log.path(),
            self.log.file(),
            LogKind::Data,
            |off, raw, e| {
                rep.records_scanned += 1;
                if let Entry::Put { key, .. } = e {
                    let h = key_hash(key);
                    if index.contains(h, off) {
                        rep.records_copied += 1;
                        c.copy(off, h, raw)?;
                    }
                }
                Ok(())
            },
        )?;
        end.expect_end(self.log.path(), old_end)?;
        if let Some(p) = c.planner.as_mut() {
            rep.plan = p.finish();
        }
        c.drain()?;
        if c.index.keys() != self.index.keys() {
            return Err(Error::corrupt(
                self.log.path(),
                format!(
                    "garbage collection found {} of {} live records",
                    c.index.keys(),
                    self.index.keys()
                ),
            ));
        }
        c.out.sync()?;
        self.crash_point("gc:new-log-synced");
        let dst = self.dir.join(log_name(new_gen));
        std::fs::rename(&tmp, &dst)
            .ctx(|| format!("rename {} to {}", tmp.display(), dst.display()))?;
        sync_dir(&self.dir)?;
        self.crash_point("gc:committed");
        c.out.renamed(dst);
        let old = std::mem::replace(&mut self.log, c.out);
        self.closed_bytes += old.bytes_written();
        let old_path = old.path().to_path_buf();
        drop(old);
        remove(&old_path)?;
        sync_dir(&self.dir)?;
        self.gen = new_gen;
        self.index = c.index;
        rep.new_log_bytes = self.log.end();
        rep.bytes_written = self.log.bytes_written();
        self.stats.gc_runs += 1;
        self.stats.bubble_space = rep.plan.bubble_bytes;
        self.stats.bubble_bytes_written += rep.plan.bubble_bytes;
        self.stats.plan.add(&rep.plan);
        Ok(rep)
    }
}
