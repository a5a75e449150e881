//! The bubble planner of Freewrite (§2). A file is being rewritten: some of its records are
//! copied unchanged from an old file, others are new, some old ones are gone. A run of copied
//! records that are contiguous in the old file covers whole old blocks, an *island* of k blocks.
//! In a compact layout the island lands at any byte offset and a block-level dedup layer must
//! write it again; a *bubble* of f·B bytes (0 < f < 1) inserted before it moves it back onto a
//! block boundary, where its blocks are byte-identical to the old ones and dedup drops them.
//!
//! Limits, as in the paper: the *bubble cap* bounds f/k for each bubble (default 12.5 %), the
//! *global cap* bounds the sum of bubble bytes over the size of the file written (default
//! 5 %); when either would be exceeded the island gets no bubble. There is at most one bubble
//! between two islands (one per run, right before the record that holds the island's first
//! byte). A bubble shorter than a record header cannot be written and is skipped.
//!
//! Writes are streamed: [`StreamPlanner`] either buffers a run until its island is known
//! ([`IslandSize::Lookahead`]; never more than the `ceil(1/cap)` blocks after which any bubble
//! passes the bubble cap) or, for writers that cannot wait, estimates the island from the
//! sizes of recent islands ([`IslandSize::Estimate`]). [`plan`] is the whole-list form.

use crate::error::{Error, Result};
use serde::Serialize;
use std::collections::VecDeque;

#[cfg(test)]
mod tests;

/// Limits and geometry of bubble insertion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Caps {
    /// Dedup block size B in bytes.
    pub block: u64,
    /// Bubble cap: the largest f/k (f = bubble bytes / B, k = island blocks).
    pub bubble_cap: f64,
    /// Global cap: the largest sum of bubble bytes / bytes of the file written.
    pub global_cap: f64,
    /// Smallest bubble that can be written (a record header).
    pub min_bubble: u64,
}

impl Default for Caps {
    /// The paper's defaults: 4 KiB blocks, bubble cap 12.5 % (512 B of a block), global cap 5 %.
    fn default() -> Self {
        Caps {
            block: 4096,
            bubble_cap: 0.125,
            global_cap: 0.05,
            min_bubble: crate::record::HEADER as u64,
        }
    }
}

impl Caps {
    /// The defaults with these caps, refused outside (0, 1].
    pub fn with_caps(bubble_cap: f64, global_cap: f64) -> Result<Self> {
        for (name, v) in [("bubble cap", bubble_cap), ("global cap", global_cap)] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(Error::Invalid(format!("{name} {v}: must be in (0, 1]")));
            }
        }
        Ok(Caps {
            bubble_cap,
            global_cap,
            ..Caps::default()
        })
    }

    /// Refuse caps a store cannot write with: caps outside (0, 1], a block smaller than two
    /// record headers or larger than 1 MiB, a smallest bubble shorter than a record header.
    pub fn check(&self) -> Result<()> {
        let h = crate::record::HEADER as u64;
        let caps_ok = [self.bubble_cap, self.global_cap]
            .iter()
            .all(|&v| v > 0.0 && v <= 1.0);
        if !caps_ok || !(2 * h..=1 << 20).contains(&self.block) || self.min_bubble < h {
            return Err(Error::Invalid(format!("unusable freewrite caps {self:?}")));
        }
        Ok(())
    }

    /// Island length from which every bubble (< B) passes the bubble cap.
    fn sure_blocks(&self) -> u64 {
        let k = (self.block - 1) as f64 / (self.bubble_cap * self.block as f64);
        (k.ceil() as u64).max(1)
    }
}

/// Where a record copied unchanged sat in its old file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Src {
    /// Which old file (any id; runs never span two).
    pub file: u64,
    /// Byte offset of the record in that file.
    pub off: u64,
}

/// One record of the file being written, in write order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item {
    /// Encoded length in bytes.
    pub len: u64,
    /// Its place in an old file when copied unchanged; `None` for new data.
    pub src: Option<Src>,
}

/// How the planner learns the length of the island it places a bubble before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IslandSize {
    /// Hold a run's records back until its island is known (or long enough for any bubble).
    Lookahead,
    /// Decide when the island starts, taking its length as the mean of the last 16 islands.
    Estimate,
}

/// Counts of one plan (or several, added up).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PlanStats {
    /// Records planned.
    pub items: u64,
    /// Their bytes (the compact size of the file).
    pub item_bytes: u64,
    /// Runs that cover at least one whole old block.
    pub islands: u64,
    /// Old blocks those islands cover.
    pub island_blocks: u64,
    /// Island blocks that landed aligned with no bubble.
    pub aligned_free_blocks: u64,
    /// Island blocks aligned by a bubble.
    pub bubbled_blocks: u64,
    /// Bubbles inserted.
    pub bubbles: u64,
    /// Their bytes.
    pub bubble_bytes: u64,
    /// Islands whose bubble would have been shorter than a record header.
    pub skipped_small: u64,
    /// Islands whose bubble would have broken the bubble cap.
    pub skipped_bubble_cap: u64,
    /// Islands whose bubble would have broken the global cap.
    pub skipped_global_cap: u64,
    /// Estimate mode: bubbles placed before runs that then covered no whole block.
    pub wasted_bubbles: u64,
}

impl PlanStats {
    /// Add `o` into `self`.
    pub fn add(&mut self, o: &PlanStats) {
        self.items += o.items;
        self.item_bytes += o.item_bytes;
        self.islands += o.islands;
        self.island_blocks += o.island_blocks;
        self.aligned_free_blocks += o.aligned_free_blocks;
        self.bubbled_blocks += o.bubbled_blocks;
        self.bubbles += o.bubbles;
        self.bubble_bytes += o.bubble_bytes;
        self.skipped_small += o.skipped_small;
        self.skipped_bubble_cap += o.skipped_bubble_cap;
        self.skipped_global_cap += o.skipped_global_cap;
        self.wasted_bubbles += o.wasted_bubbles;
    }
}

/// What was decided for a run's island.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Undecided,
    Free,
    Bubble,
    Small,
    BubbleCap,
    GlobalCap,
}

/// A run of copied records contiguous in one old file.
#[derive(Debug)]
struct Run {
    file: u64,
    /// Old offset of its first record.
    start: u64,
    /// Old offset just past its last record.
    end: u64,
    /// First old block boundary at or after `start` (where the island begins).
    first: u64,
    outcome: Outcome,
    /// Bubble placed before the run's island (estimate mode accounting).
    bubble: u64,
}

impl Run {
    fn blocks(&self, b: u64) -> u64 {
        if self.end > self.first {
            (self.end - self.first) / b
        } else {
            0
        }
    }
}

/// Places bubbles while records stream through it: push each record in write order, then pop
/// the bubble bytes to write before each record, in the same order, as they become ready.
pub struct StreamPlanner {
    caps: Caps,
    mode: IslandSize,
    sure: u64,
    budget: f64,
    /// Output offset where the next released record (or its bubble) goes.
    out: u64,
    /// Records of the current run held back (lookahead mode only).
    pending: VecDeque<Item>,
    /// Bubble before each released record, oldest first.
    ready: VecDeque<u64>,
    run: Option<Run>,
    history: VecDeque<u64>,
    stats: PlanStats,
}

impl StreamPlanner {
    /// A planner for one output file whose first record goes at offset `base` and whose compact
    /// size (the global cap's denominator) is `total` bytes.
    pub fn new(caps: Caps, mode: IslandSize, base: u64, total: u64) -> Self {
        StreamPlanner {
            caps,
            mode,
            sure: caps.sure_blocks(),
            budget: caps.global_cap * total as f64,
            out: base,
            pending: VecDeque::new(),
            ready: VecDeque::new(),
            run: None,
            history: VecDeque::new(),
            stats: PlanStats::default(),
        }
    }

    /// Add the next record of the output.
    pub fn push(&mut self, item: Item) {
        self.stats.items += 1;
        self.stats.item_bytes += item.len;
        let continues = match (&self.run, item.src) {
            (Some(r), Some(s)) => s.file == r.file && s.off == r.end,
            _ => false,
        };
        if !continues {
            self.close_run();
        }
        let Some(src) = item.src else {
            self.release(item, 0);
            return;
        };
        let b = self.caps.block;
        let run = self.run.get_or_insert(Run {
            file: src.file,
            start: src.off,
            end: src.off,
            first: src.off.div_ceil(b) * b,
            outcome: Outcome::Undecided,
            bubble: 0,
        });
        let item_start = run.end;
        run.end += item.len;
        let decided = run.outcome != Outcome::Undecided;
        let (first, end) = (run.first, run.end);
        match self.mode {
            IslandSize::Lookahead => {
                if decided {
                    self.release(item, 0);
                } else {
                    self.pending.push_back(item);
                    if end >= first + self.sure * b {
                        self.decide_lookahead();
                    }
                }
            }
            IslandSize::Estimate => {
                if !decided && item_start <= first && first < end {
                    let k = if self.history.is_empty() {
                        1.0
                    } else {
                        self.history.iter().sum::<u64>() as f64 / self.history.len() as f64
                    };
                    let at = self.out + (first - item_start);
                    let (outcome, bubble) = self.judge(at, k);
                    if let Some(r) = self.run.as_mut() {
                        r.outcome = outcome;
                        r.bubble = bubble;
                    }
                    self.release(item, bubble);
                } else {
                    self.release(item, 0);
                }
            }
        }
    }

    /// Bubble bytes to write before the next released record, in push order.
    pub fn pop(&mut self) -> Option<u64> {
        self.ready.pop_front()
    }

    /// End of the output: release everything held back; the counts of the plan.
    pub fn finish(&mut self) -> PlanStats {
        self.close_run();
        self.stats.clone()
    }

    /// Counts so far.
    pub fn stats(&self) -> &PlanStats {
        &self.stats
    }

    fn release(&mut self, item: Item, bubble: u64) {
        self.ready.push_back(bubble);
        self.out += bubble + item.len;
    }

    /// The bubble that puts old offset-to-be `at` (its output offset without a bubble) on a
    /// block boundary, for an island of `k` blocks, with the caps checked.
    fn judge(&mut self, at: u64, k: f64) -> (Outcome, u64) {
        let b = self.caps.block;
        let bubble = (b - at % b) % b;
        let outcome = if bubble == 0 {
            Outcome::Free
        } else if bubble < self.caps.min_bubble {
            Outcome::Small
        } else if bubble as f64 > self.caps.bubble_cap * k * b as f64 {
            Outcome::BubbleCap
        } else if (self.stats.bubble_bytes + bubble) as f64 > self.budget {
            Outcome::GlobalCap
        } else {
            Outcome::Bubble
        };
        if outcome == Outcome::Bubble {
            self.stats.bubbles += 1;
            self.stats.bubble_bytes += bubble;
            (outcome, bubble)
        } else {
            (outcome, 0)
        }
    }

    /// Lookahead: decide the held-back run's island (k is final or past `sure`) and release it.
    fn decide_lookahead(&mut self) {
        let Some(run) = self.run.as_ref() else { return };
        let b = self.caps.block;
        let k = run.blocks(b);
        let (first, start) = (run.first, run.start);
        let (outcome, bubble) = if k == 0 {
            (Outcome::Undecided, 0)
        } else {
            // The run is contiguous, so its first boundary lands `first - start` bytes after
            // the output offset of its first record.
            self.judge(self.out + (first - start), k as f64)
        };
        let mut old = start;
        let mut placed = false;
        while let Some(item) = self.pending.pop_front() {
            let holds_first = !placed && old + item.len > first;
            old += item.len;
            if holds_first {
                placed = true;
                self.release(item, bubble);
            } else {
                self.release(item, 0);
            }
        }
        if let Some(r) = self.run.as_mut() {
            if k > 0 {
                r.outcome = outcome;
                r.bubble = bubble;
            }
        }
    }

    /// The current run ended: settle its island and count it.
    fn close_run(&mut self) {
        if self.mode == IslandSize::Lookahead
            && self
                .run
                .as_ref()
                .is_some_and(|r| r.outcome == Outcome::Undecided)
        {
            self.decide_lookahead();
        }
        let Some(run) = self.run.take() else { return };
        let k = run.blocks(self.caps.block);
        if self.mode == IslandSize::Estimate && run.outcome != Outcome::Undecided {
            if self.history.len() == 16 {
                self.history.pop_front();
            }
            self.history.push_back(k);
        }
        if k == 0 {
            if run.bubble > 0 {
                self.stats.wasted_bubbles += 1;
            }
            return;
        }
        let s = &mut self.stats;
        s.islands += 1;
        s.island_blocks += k;
        match run.outcome {
            Outcome::Free => s.aligned_free_blocks += k,
            Outcome::Bubble => s.bubbled_blocks += k,
            Outcome::Small => s.skipped_small += 1,
            Outcome::BubbleCap => s.skipped_bubble_cap += 1,
            Outcome::GlobalCap => s.skipped_global_cap += 1,
            Outcome::Undecided => {}
        }
    }
}

/// Plan a whole output at once (lookahead): the bubble bytes before each item, and the counts.
pub fn plan(caps: Caps, base: u64, items: &[Item]) -> (Vec<u64>, PlanStats) {
    plan_with(caps, IslandSize::Lookahead, base, items)
}

/// [`plan`] with a choice of how island sizes are learnt.
pub fn plan_with(caps: Caps, mode: IslandSize, base: u64, items: &[Item]) -> (Vec<u64>, PlanStats) {
    let total = items.iter().map(|i| i.len).sum();
    let mut p = StreamPlanner::new(caps, mode, base, total);
    let mut bubbles = Vec::with_capacity(items.len());
    for &it in items {
        p.push(it);
        while let Some(b) = p.pop() {
            bubbles.push(b);
        }
    }
    let stats = p.finish();
    while let Some(b) = p.pop() {
        bubbles.push(b);
    }
    (bubbles, stats)
}
