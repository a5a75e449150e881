//! Segment cleaning: which segments a checkpoint rewrites, what they hold, and which of
//! their units can be copied as they are instead of being encoded anew.

use super::{GARBAGE_RATIO, GARBAGE_SLACK_MAX};
use crate::error::Result;
use crate::fs::FileSystem;
use crate::inode::Inode;
use crate::persist::manifest::SegRef;
use crate::persist::unit::{self, UnitKind};
use crate::persist::{load, SegInfo};

/// A unit frame of a segment chosen for cleaning.
pub(super) struct VictimUnit {
    pub(super) kind: UnitKind,
    pub(super) ino: u64,
    pub(super) unit: u64,
    /// Where its frame is in the segment payload.
    pub(super) off: usize,
    pub(super) len: usize,
}

/// A segment chosen for cleaning as read before the cut: its generation, its payload and the
/// unit frames in it.
pub(super) type Victim = (u64, Vec<u8>, Vec<VictimUnit>);

/// True when the copy of `v` in segment `gen` is the current one and unchanged since: it can be
/// copied as it is. (A changed unit is encoded from memory by the cut instead.)
pub(super) fn still_current(n: &Inode, v: &VictimUnit, gen: u64) -> bool {
    let units_dirty = n.unit_dirt().is_some_and(|d| !d.is_empty());
    match v.kind {
        // The head is rewritten whenever anything of the inode changed.
        UnitKind::Head => {
            n.ck.head.is_some_and(|l| l.gen == gen) && !n.ck.head_dirty && !units_dirty
        }
        _ => {
            let dirty = n.unit_dirt().is_none_or(|d| d.contains(v.unit));
            n.ck.units.get(&v.unit).is_some_and(|l| l.gen == gen) && !dirty
        }
    }
}

/// Bytes of the victims' units (an upper bound of what cleaning copies).
pub(super) fn copy_bytes(victims: &[Victim]) -> usize {
    victims.iter().map(|(_, p, _)| p.len()).sum()
}

impl FileSystem {
    /// Garbage the segments may hold beyond [`GARBAGE_RATIO`] before cleaning starts.
    fn garbage_slack(&self) -> u64 {
        (self.medium.len() / 1024).clamp(4 << 10, GARBAGE_SLACK_MAX)
    }

    /// Segments to clean by this checkpoint, oldest-emptiest first: every segment without live
    /// units, and, while the segments hold more than [`GARBAGE_RATIO`] (plus
    /// [`FileSystem::garbage_slack`]) garbage, the emptiest ones, within `budget` live bytes.
    pub(super) fn pick_victims(&self, budget: u64) -> Vec<(u64, SegRef)> {
        let slack = self.garbage_slack() as f64;
        let segs = self.persist.segs.lock();
        let size = |s: &SegInfo| s.blocks.len() as u64 * nodup_core::BLOCK_SIZE as u64;
        let mut total: u64 = segs.values().map(size).sum();
        let live: u64 = segs.values().map(|s| s.live).sum();
        let mut by_ratio: Vec<(f64, u64)> = segs
            .iter()
            .map(|(&g, s)| (s.live as f64 / size(s).max(1) as f64, g))
            .collect();
        by_ratio.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut spent = 0u64;
        let mut out = Vec::new();
        for (_, g) in by_ratio {
            let s = &segs[&g];
            let over = total as f64 > live as f64 / (1.0 - GARBAGE_RATIO) + slack;
            let eager = self.eager_cleaning && s.live < s.bytes as u64;
            if s.live > 0 && !eager && (!over || spent + s.live > budget) {
                continue;
            }
            spent += s.live;
            total = total - size(s) + s.live;
            out.push((
                g,
                SegRef {
                    head: s.blocks.first().copied().unwrap_or(0),
                    gen: g,
                    blocks: s.blocks.len() as u32,
                    bytes: s.bytes,
                },
            ));
        }
        out
    }

    /// What each victim in `victims` holds: its payload and the frames in it (media reads, no
    /// locks: done before the cut). Victims without live units are not read: they are only freed.
    pub(super) fn read_victims(&self, victims: &[(u64, SegRef)]) -> Result<Vec<Victim>> {
        let m = &*self.medium;
        let mut victim_data: Vec<Victim> = Vec::new();
        for (g, s) in victims {
            if self.persist.segs.lock().get(g).is_some_and(|x| x.live == 0) {
                continue;
            }
            let (_, payload) = load::read_segment(m, s)?;
            let mut units = Vec::new();
            let mut at = 0usize;
            unit::for_each_unit(&payload, &mut |r| {
                units.push(VictimUnit {
                    kind: r.kind,
                    ino: r.ino,
                    unit: r.unit,
                    off: at,
                    len: r.len as usize,
                });
                at += r.len as usize;
                Ok(())
            })?;
            victim_data.push((*g, payload, units));
        }
        Ok(victim_data)
    }
}
