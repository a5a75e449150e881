//! Sharing blocks a caller already references (server-side copy, `copy_file_range`): one more
//! reference on each block's dedup entry, no data written.

use std::sync::atomic::Ordering;

use super::Engine;
use crate::meta::io::IoTally;
use crate::meta::record::OFF_REFCOUNT;
use crate::{BlockNr, Error, Result};

impl Engine {
    /// Add one reference to each of `blocks`, which the caller references already (it must hold
    /// them while this runs). Returns, per block, whether it got the reference: a block without
    /// a dedup entry (a policy that keeps none, or a block recovery left without one) cannot
    /// count a second reference, and the caller copies its data instead. Durable on return.
    pub fn share(&self, blocks: &[BlockNr]) -> Result<Vec<bool>> {
        self.check_ready()?;
        let mut t = IoTally::default();
        let mut out = Vec::with_capacity(blocks.len());
        let mut shared = 0u64;
        let r = (|| -> Result<()> {
            for &b in blocks {
                if !self.in_data(b) {
                    return Err(Error::Invalid(format!("block {b} is not in the data area")));
                }
                let loc = self.revmap.get(&self.meta, &mut t, b)?;
                if loc == 0 || !self.layout.is_entry_loc(loc) {
                    out.push(false);
                    continue;
                }
                let e = self.meta.read_entry(&mut t, loc)?;
                if !e.is_valid() || e.blocknr != b {
                    out.push(false);
                    continue;
                }
                // The entry's shard lock serialises every change of its count (writes that
                // deduplicate against it, releases).
                let (_sh, _) = self.index.lock(e.fp);
                let now = self.meta.read_entry(&mut t, loc)?;
                if !now.is_valid() || now.blocknr != b || now.fp != e.fp || now.refcount == u64::MAX
                {
                    out.push(false);
                    continue;
                }
                self.meta
                    .write_u64(&mut t, loc + OFF_REFCOUNT, now.refcount + 1)?;
                self.meta.flush(loc + OFF_REFCOUNT, 8);
                out.push(true);
                shared += 1;
            }
            Ok(())
        })();
        // The counts written so far must be durable either way: the caller gives back the
        // references of the blocks reported shared when it fails.
        let f = self.meta.fence();
        self.merge_tally(&t);
        self.c.blocks_shared.fetch_add(shared, Ordering::Relaxed);
        r.and(f)?;
        Ok(out)
    }
}
