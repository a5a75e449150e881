//! What the file system reports about itself: the `nodup stats --json` object (engine
//! counters plus file-system numbers) and the statfs figures behind `df`.

use crate::fs::{FileSystem, StatFs, LOG_HEADROOM};
use crate::inode::Kind;
use std::sync::atomic::Ordering;

const BS: u64 = nodup_core::BLOCK_SIZE as u64;

impl FileSystem {
    /// Engine counters plus file-system numbers, as the `nodup stats --json` object.
    pub fn stats_json(&self) -> serde_json::Value {
        let es = self.engine.stats();
        let logical = self.mapped.load(Ordering::Relaxed) * BS;
        let physical = es.physical_bytes;
        let ratio = if logical == 0 {
            0.0
        } else {
            1.0 - physical as f64 / logical as f64
        };
        // As `zpool list` shows it: 1.00 when nothing is stored.
        let factor = if physical == 0 {
            1.0
        } else {
            logical as f64 / physical as f64
        };
        let histogram = self.engine.refcount_histogram().unwrap_or_default();
        let mut v = serde_json::to_value(&es).unwrap_or_else(|_| serde_json::json!({}));
        let (files, dirs, extents, map_bytes, map_index) = {
            let t = self.tables.read();
            let dirs = t
                .inodes
                .values()
                .filter(|n| n.read().attr.kind == Kind::Dir)
                .count();
            (
                t.inodes.len() - dirs,
                dirs,
                t.extents(),
                t.block_map_bytes(),
                t.map_index_bytes(),
            )
        };
        let (log_bytes, log_records, log_blocks, log_spare) = {
            let l = self.log.lock();
            (l.bytes(), l.records, l.blocks().len(), l.spare.len())
        };
        let reserve = self.meta.lock().reserve.len();
        let (segments, seg_bytes, seg_live) = self.persist.seg_totals();
        let ckpt = self.ckpt_stats.lock().clone();
        if let Some(o) = v.as_object_mut() {
            o.insert("logical_bytes".into(), logical.into());
            o.insert("physical_bytes".into(), physical.into());
            o.insert("dedup_ratio".into(), serde_json::json!(ratio));
            o.insert(
                "bytes_saved".into(),
                logical.saturating_sub(physical).into(),
            );
            o.insert("dedup_factor".into(), serde_json::json!(factor));
            o.insert("size_bytes".into(), self.medium.len().into());
            o.insert(
                "uptime_seconds".into(),
                serde_json::json!(self.clock.elapsed().as_secs_f64()),
            );
            o.insert(
                "refcount_histogram".into(),
                serde_json::to_value(&histogram).unwrap_or_default(),
            );
            o.insert("medium".into(), self.kind.name().into());
            o.insert("files".into(), (files as u64).into());
            o.insert("directories".into(), (dirs as u64).into());
            o.insert("file_extents".into(), extents.into());
            o.insert("block_map_bytes".into(), map_bytes.into());
            o.insert("block_map_index_bytes".into(), map_index.into());
            o.insert("log_bytes".into(), log_bytes.into());
            o.insert("log_records".into(), log_records.into());
            o.insert("log_blocks".into(), (log_blocks as u64).into());
            o.insert(
                "copy_shared_bytes".into(),
                (self.copy_shared.load(Ordering::Relaxed) * BS).into(),
            );
            o.insert("log_spare_blocks".into(), (log_spare as u64).into());
            o.insert("reserve_blocks".into(), (reserve as u64).into());
            o.insert("ckpt_estimate".into(), self.persist.estimate().into());
            o.insert("checkpoint_segments".into(), (segments as u64).into());
            o.insert("checkpoint_bytes".into(), seg_bytes.into());
            o.insert("checkpoint_live_bytes".into(), seg_live.into());
            o.insert(
                "checkpoints".into(),
                serde_json::to_value(&ckpt).unwrap_or_default(),
            );
            o.insert(
                "recovery".into(),
                serde_json::to_value(&self.recovery).unwrap_or_default(),
            );
            let (done, failed) = self.live_recoveries();
            let for_leaks = self.live_recovery.lock().for_leaks;
            o.insert(
                "live_recoveries".into(),
                serde_json::json!({"done": done, "failed": failed, "for_leaks": for_leaks}),
            );
            // Why every change fails with EIO now (null while changes go on).
            o.insert(
                "changes_refused".into(),
                match self.changes_possible() {
                    Ok(()) => serde_json::Value::Null,
                    Err(e) => e.to_string().into(),
                },
            );
            let pp = self.engine.policy_params();
            o.insert(
                "encrypted".into(),
                (pp.cipher != nodup_core::engine::superblock::CIPHER_NONE).into(),
            );
            o.insert(
                "encryption".into(),
                match pp.kdf {
                    None => serde_json::Value::Null,
                    Some(k) => serde_json::json!({
                        "cipher": "aes-256-xts+ctr",
                        "data": "AES-256-XTS, 4 KiB units, tweak = block number",
                        "metadata": "AES-256-CTR, keystream by image offset",
                        "key": k.kind.name(),
                        "argon2id": (k.kind == nodup_core::media::crypt::KdfKind::Argon2id)
                            .then(|| serde_json::json!({"m_kib": k.m_kib, "t": k.t, "p": k.p})),
                    }),
                },
            );
            if let Some(sm) = self.smart_report() {
                o.insert("smart".into(), sm);
            }
            if self.engine.policy_kind() == nodup_core::policy::PolicyKind::Selective {
                // The hot-fingerprint and prefetch caches' figures (memory, hits, refreshes).
                let eng = self.engine.policy_report();
                if let Some(st) = eng.get("store") {
                    o.insert("selective".into(), st.clone());
                }
            }
        }
        v
    }

    /// `smart`'s figures: the policy, its store and read cache, the worker and skipped buffer,
    /// and the memory of each structure against the budget.
    fn smart_report(&self) -> Option<serde_json::Value> {
        if self.engine.policy_kind() != nodup_core::policy::PolicyKind::Smart {
            return None;
        }
        let eng = self.engine.policy_report();
        // A read-only open (the stats of an unmounted image) runs no worker: `fs` is null.
        let fsr = self
            .smart
            .as_ref()
            .map_or(serde_json::Value::Null, |s| s.report());
        let mem =
            |v: &serde_json::Value, p: &str| v.pointer(p).and_then(|x| x.as_u64()).unwrap_or(0);
        let store = mem(&eng, "/store/memory/total_bytes");
        let rc = mem(&eng, "/read_cache/memory_bytes");
        let skipped = mem(&fsr, "/skipped_buffer/memory_bytes");
        let worker = mem(&fsr, "/scratch_bytes");
        let budget = mem(&eng, "/policy/budget/total");
        let transient = mem(&eng, "/policy/budget/transient");
        let thread = mem(&eng, "/policy/budget/worker_thread");
        Some(serde_json::json!({
            "engine": eng,
            "fs": fsr,
            "memory": {
                "budget_bytes": budget,
                "fingerprint_store_bytes": store,
                "skipped_buffer_bytes": skipped,
                "read_cache_bytes": rc,
                "worker_scratch_bytes": worker,
                "transient_reserve_bytes": transient,
                "worker_thread_reserve_bytes": thread,
                "merge_scratch_bytes": mem(&eng, "/store/memory/merge_scratch_bytes"),
                "total_bytes": store + skipped + rc + worker,
            },
            "inline_hits": mem(&eng, "/store/counters/mem_hits"),
            "out_of_line_hits": mem(&fsr, "/worker/remapped"),
            "selectivity": eng.pointer("/policy/selectivity/effective_share").cloned(),
            "store_io_read_bytes": mem(&eng, "/store/store_io_read_bytes"),
            "store_io_written_bytes": mem(&eng, "/store/store_io_written_bytes"),
        }))
    }

    /// statfs numbers. Free blocks count the metadata blocks held in advance (checkpoint
    /// reserve, log pool), which hold nothing yet; available blocks are what data writes may
    /// take (the engine's free blocks minus the log headroom).
    pub fn statfs(&self) -> StatFs {
        let es = self.engine.stats();
        let held = {
            let meta = self.meta.lock();
            meta.reserve.len() + self.log.lock().spare.len()
        } as u64;
        StatFs {
            blocks: es.total_blocks,
            free: (es.free_blocks + held).min(es.total_blocks),
            avail: es.free_blocks.saturating_sub(LOG_HEADROOM),
            inodes: self.tables.read().inodes.len() as u64,
        }
    }
}
