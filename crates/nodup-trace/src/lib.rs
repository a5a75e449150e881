//! nodup-trace: block traces (FIU blkparse formats), replay, statistics, synthesis (built by issue 4).
