//! `nodup stats|fsck`: what an image or a mount holds, and whether it is consistent. Both
//! leave an unmounted image byte-identical (`fsck --repair` excepted).

use super::size::{bytes, count, duration};
use anyhow::{anyhow, bail, Result};
use clap::Args;
use nodup_fs::image::{self, ImageLock};
use nodup_fs::{FileSystem, FsOptions};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Arguments of `nodup stats`.
#[derive(Args)]
pub struct StatsArgs {
    /// An image file (not mounted; it is only read) or the mount point of a mounted one.
    pub target: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Key file of an encrypted image (not needed for a mount point).
    #[arg(long, value_name = "FILE")]
    pub encrypt_key_file: Option<PathBuf>,
}

/// Arguments of `nodup fsck`.
#[derive(Args)]
pub struct FsckArgs {
    /// Image file (must not be mounted; only read unless --repair).
    pub image: PathBuf,
    /// Fix what failure recovery would fix, and report it.
    #[arg(long)]
    pub repair: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Key file of an encrypted image.
    #[arg(long, value_name = "FILE")]
    pub encrypt_key_file: Option<PathBuf>,
}

/// Open an unmounted image for stats/fsck: read-only (file and medium) unless `write`; with
/// `fsck`, a log record the table refuses ends the log there (for fsck to report, or drop with
/// --repair) instead of failing the open.
fn open_unmounted(
    path: &Path,
    write: bool,
    key: Option<&Path>,
    fsck: bool,
) -> Result<(ImageLock, FileSystem)> {
    super::mount::check_image(path)?;
    super::mkfs::check_recorded_budget(path)?;
    let lock = ImageLock::try_lock(path).map_err(|_| {
        // stats reads a mounted file system through its mount point; fsck checks images only.
        let hint = if fsck {
            "unmount it first"
        } else {
            "use the mount point instead, or unmount it first"
        };
        anyhow!("{}: image is mounted ({hint})", path.display())
    })?;
    Ok((lock, open_locked(path, write, key, fsck)?))
}

/// The file system of an image whose lock the caller holds (see [`open_unmounted`]).
fn open_locked(path: &Path, write: bool, key: Option<&Path>, fsck: bool) -> Result<FileSystem> {
    let (medium, _, failed_before) =
        image::open_reporting(path, !write).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    if let Some(line) = failed_before {
        eprintln!("nodup: warning: {line}");
    }
    let mut opts = FsOptions {
        read_only: !write,
        fsck,
        ..FsOptions::default()
    };
    opts.open.key = key.map(super::mkfs::read_key_file).transpose()?;
    FileSystem::open(medium, &opts)
        .map_err(|e| anyhow!("{}: {}", path.display(), super::open_error(&e)))
}

/// Figures of an image opened read-only before its failure recovery: the allocator, the
/// reference counts and the index (its entries and the memory they take) are what that
/// recovery rebuilds, so they are unknown. As JSON pointers, each nulled where present.
const UNKNOWN_BEFORE_RECOVERY: [&str; 16] = [
    "/free_blocks",
    "/physical_bytes",
    "/bytes_saved",
    "/dedup_factor",
    "/dedup_ratio",
    "/index_entries",
    "/index_memory_bytes",
    "/refcount_histogram",
    // `smart`'s fingerprint store is filled again from the files; its budget and the other
    // structures' memory are the recorded configuration's, and known.
    "/smart/memory/fingerprint_store_bytes",
    "/smart/memory/total_bytes",
    "/smart/engine/store/fingerprints_in_memory",
    "/smart/engine/store/fingerprints_on_media",
    "/smart/engine/store/media_groups",
    "/smart/engine/store/tombstones",
    "/smart/engine/store/memory",
    // `selective`'s fingerprint cache is filled from the index; its capacity is configured.
    "/selective/fp_cache/entries",
];

/// `nodup stats`.
pub fn stats(a: StatsArgs) -> Result<()> {
    let t = a.target.display();
    if let Some(e) = super::list::dead_mount_error(&a.target) {
        return Err(e);
    }
    let mounted = a.target.is_dir();
    let (mut v, from) = if mounted {
        // Only the root of a nodup mount answers the stats.
        let v = nodup_fs::ctl::read_stats(&a.target)
            .map_err(|_| anyhow!("{t}: not a mounted nodup file system"))?;
        let img = super::mount::mounted_image(&a.target.canonicalize()?)
            .map_or_else(|| t.to_string(), |p| p.display().to_string());
        (v, format!("{img} on {t}"))
    } else if a.target.exists() {
        let (_lock, fs) = open_unmounted(&a.target, false, a.encrypt_key_file.as_deref(), false)?;
        let mut v = fs.stats_json();
        if fs.recovery().kind == "failure" {
            eprintln!(
                "nodup: warning: {t} was not unmounted cleanly: space and dedup figures are \
                 unknown until it is recovered (mount it, or run `nodup fsck --repair {t}`)"
            );
            for p in UNKNOWN_BEFORE_RECOVERY {
                if let Some(x) = v.pointer_mut(p) {
                    *x = Value::Null;
                }
            }
            v["needs_recovery"] = true.into();
        }
        (v, format!("{t} (not mounted)"))
    } else {
        bail!("{t}: no such image or mount point");
    };
    if v.get("needs_recovery").is_none() {
        v["needs_recovery"] = false.into();
    }
    if a.json {
        println!("{v}");
    } else {
        print!("{}", human(&v, &from, mounted));
    }
    Ok(())
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "0 %".into()
    } else {
        format!("{:.1} %", 100.0 * part as f64 / whole as f64)
    }
}

/// The human form of the stats: a summary a person can read first, then details grouped by
/// what they measure (state now, counters since mount, memory, reference counts). The counters
/// since mount are left out for an image that is not `mounted`: opening it read-only to read
/// its figures is not a mount, and they would only count that open (`--json` keeps the keys,
/// which scripts read).
fn human(v: &Value, from: &str, mounted: bool) -> String {
    let mut o = String::new();
    let mut line = |s: String| {
        o.push_str(&s);
        o.push('\n');
    };
    let logical = u(v, "logical_bytes");
    let physical = u(v, "physical_bytes");
    let total = u(v, "total_blocks") * 4096;
    let free = u(v, "free_blocks") * 4096;
    let used = total.saturating_sub(free);
    let unrecovered = v["needs_recovery"] == true;
    line(format!(
        "nodup {from}: policy {}, fingerprint {}, layout {}, medium {}",
        v["policy"].as_str().unwrap_or("?"),
        v["fingerprint"].as_str().unwrap_or("?"),
        v["meta_layout"].as_str().unwrap_or("?"),
        v["medium"].as_str().unwrap_or("?")
    ));
    if v["encrypted"] == true {
        line(format!(
            "  encrypted  AES-256 at rest (XTS data, CTR metadata), key: {}",
            v["encryption"]["key"].as_str().unwrap_or("?")
        ));
    }
    let size = bytes(u(v, "size_bytes").max(total));
    if unrecovered {
        // Free space and the blocks in use are what recovery counts again.
        line(format!("  size       {size:>10}"));
        line(format!("  used       {:>10}   until recovered", "unknown"));
    } else {
        line(format!("  size       {size:>10}   ({} free)", bytes(free)));
        line(format!(
            "  used       {:>10}   data {} + metadata {}",
            bytes(used),
            bytes(physical),
            bytes(used.saturating_sub(physical))
        ));
    }
    line(format!(
        "  logical    {:>10}   in {} files, {} directories",
        bytes(logical),
        count(u(v, "files")),
        count(u(v, "directories"))
    ));
    if unrecovered {
        line(format!("  saved      {:>10}   until recovered", "unknown"));
    } else {
        line(format!(
            "  saved      {:>10}   dedup {:.2}x (ratio {:.4})",
            bytes(u(v, "bytes_saved")),
            f(v, "dedup_factor").max(1.0),
            f(v, "dedup_ratio")
        ));
    }
    if mounted {
        since_mount(v, &mut line);
    }
    line(String::new());
    line("Memory:".into());
    if let (Some(anon), Some(rss)) = (
        v["daemon_anon_bytes"].as_u64(),
        v["daemon_rss_bytes"].as_u64(),
    ) {
        line(format!(
            "  daemon resident  {} of its own (+ {} of mapped image pages)",
            bytes(anon),
            bytes(rss.saturating_sub(anon))
        ));
    }
    let entries = u(v, "index_entries");
    let per = if entries == 0 {
        0.0
    } else {
        u(v, "index_memory_bytes") as f64 / entries as f64
    };
    if unrecovered {
        line("  index            unknown until recovered".into());
    } else {
        line(format!(
            "  index            {} for {} entries ({per:.1} B each)",
            bytes(u(v, "index_memory_bytes")),
            count(entries)
        ));
    }
    for l in policy_lines(v, mounted) {
        line(l);
    }
    if let Some(rows) = v["refcount_histogram"].as_array().filter(|r| !r.is_empty()) {
        line(String::new());
        line("Blocks by reference count (as zpool status -D):".into());
        line(format!(
            "  {:>8}  {:>12}  {:>10}  {:>12}  {:>10}",
            "refcnt", "blocks", "size", "referenced", "ref. size"
        ));
        for r in rows {
            let (blocks, refd) = (u(r, "blocks"), u(r, "referenced"));
            line(format!(
                "  {:>8}  {:>12}  {:>10}  {:>12}  {:>10}",
                u(r, "refs"),
                count(blocks),
                bytes(blocks * 4096),
                count(refd),
                bytes(refd * 4096)
            ));
        }
    }
    o
}

/// The counters since mount and the last checkpoint (a mounted file system only).
fn since_mount(v: &Value, line: &mut impl FnMut(String)) {
    let rec = &v["recovery"];
    line(String::new());
    line(format!(
        "Since mount ({} ago; {} mount, recovery {}):",
        duration(f(v, "uptime_seconds")),
        rec["kind"].as_str().unwrap_or("?"),
        duration(rec["seconds"].as_f64().unwrap_or(0.0))
    ));
    let written = u(v, "blocks_written");
    line(format!(
        "  blocks written   {} ({}), duplicates {} ({}), fingerprint collisions {}",
        count(written),
        bytes(written * 4096),
        count(u(v, "dedup_hits")),
        pct(u(v, "dedup_hits"), written),
        count(u(v, "fp_collisions"))
    ));
    line(format!(
        "  data I/O         written {}, read {}",
        bytes(u(v, "media_bytes_written")),
        bytes(u(v, "media_bytes_read"))
    ));
    line(format!(
        "  dedup metadata   written {}, read {}",
        bytes(u(v, "meta_bytes_written")),
        bytes(u(v, "meta_bytes_read"))
    ));
    let ck = &v["checkpoints"];
    line(format!(
        "  checkpoints      {} (last took {}, longest pause {}), log {} since the last",
        count(ck["count"].as_u64().unwrap_or(0)),
        duration(ck["last_seconds"].as_f64().unwrap_or(0.0)),
        duration(ck["max_pause_seconds"].as_f64().unwrap_or(0.0)),
        bytes(u(v, "log_bytes"))
    ));
    let lr = &v["live_recoveries"];
    let (done, failed) = (u(lr, "done"), u(lr, "failed"));
    line(format!(
        "  media errors     {} absorbed{}",
        count(u(v, "media_errors_absorbed")),
        if done + failed > 0 {
            format!(
                "; engine rebuilt while mounted {} times ({} failed)",
                count(done),
                count(failed)
            )
        } else {
            String::new()
        }
    ));
    if let Some(why) = v["changes_refused"].as_str() {
        line(format!("  changes refused  {why}"));
    }
}

/// A byte figure, or "unknown" where it is null (one recovery rebuilds, not yet recovered).
fn bytes_or_unknown(v: &Value) -> String {
    v.as_u64().map_or_else(|| "unknown".to_string(), bytes)
}

/// The policy's own figures, when it keeps any (`smart`'s budget, `selective`'s caches); its
/// counters since the open only for a `mounted` file system (an image read here has none).
fn policy_lines(v: &Value, mounted: bool) -> Vec<String> {
    let mut o = Vec::new();
    let sm = &v["smart"];
    if sm.is_object() {
        let (mem, st, eng) = (&sm["memory"], &sm["engine"]["store"], &sm["engine"]);
        o.push(String::new());
        let (bits, want) = (
            u(st, "prefix_bits"),
            u(&eng["policy"]["budget"], "prefix_bits"),
        );
        // An image read with another budget than the one it was saved with keeps the saved
        // width (and the tree's memory that goes with it) until it is mounted.
        let width = if want != 0 && bits != want {
            format!("{bits} prefix bits as saved, {want} once mounted with this budget")
        } else {
            format!("{bits} prefix bits")
        };
        o.push(format!(
            "Smart (memory budget {}, {} eviction, {width}):",
            bytes(u(mem, "budget_bytes")),
            st["eviction"].as_str().unwrap_or("?"),
        ));
        o.push(format!(
            "  dedup memory     {}: fingerprint store {} (merge scratch {}), skipped buffer {}, read cache {}, worker {}",
            bytes_or_unknown(&mem["total_bytes"]),
            bytes_or_unknown(&mem["fingerprint_store_bytes"]),
            bytes(u(mem, "merge_scratch_bytes")),
            bytes(u(mem, "skipped_buffer_bytes")),
            bytes(u(mem, "read_cache_bytes")),
            bytes(u(mem, "worker_scratch_bytes"))
        ));
        o.push(format!(
            "  left unassigned  {} for transient buffers, {} for the worker thread's stack and arena",
            bytes(u(mem, "transient_reserve_bytes")),
            bytes(u(mem, "worker_thread_reserve_bytes"))
        ));
        let c = &st["counters"];
        let held = if st["fingerprints_on_media"].is_null() {
            "unknown until recovered".to_string()
        } else {
            format!(
                "{} in memory, {} on media in {} groups",
                count(u(st, "fingerprints_in_memory")),
                count(u(st, "fingerprints_on_media")),
                count(u(st, "media_groups"))
            )
        };
        if !mounted {
            o.push(format!("  fingerprints     {held}"));
        } else {
            o.push(format!(
                "  fingerprints     {held}; {} promoted, {} merges, {} lost",
                count(u(c, "promotions")),
                count(u(c, "merges")),
                count(u(c, "dropped"))
            ));
            let share = f(sm, "selectivity");
            o.push(format!(
                "  duplicates       {} inline, {} out of line; inline selectivity {:.0} % ({})",
                count(u(sm, "inline_hits")),
                count(u(sm, "out_of_line_hits")),
                100.0 * share,
                eng["policy"]["selectivity"]["mode"].as_str().unwrap_or("?")
            ));
        }
        let fs = &sm["fs"];
        if fs.is_object() {
            let sb = &fs["skipped_buffer"];
            o.push(format!(
                "  skipped buffer   {} of {} blocks ({}), {} files by inode only, {} overflows",
                count(u(sb, "pending_blocks")),
                count(u(sb, "capacity_blocks")),
                pct(u(sb, "pending_blocks"), u(sb, "capacity_blocks")),
                count(u(sb, "pending_files")),
                count(u(sb, "overflows"))
            ));
            let w = &fs["worker"];
            if mounted {
                o.push(format!(
                    "  worker           {} blocks/s; {} processed, {} remapped, {} errors",
                    count(u(fs, "worker_rate")),
                    count(u(w, "processed")),
                    count(u(w, "remapped")),
                    count(u(w, "errors"))
                ));
            }
        }
        if mounted {
            let mut io = format!(
                "  store I/O        read {}, written {}, {} errors",
                bytes(u(st, "store_io_read_bytes")),
                bytes(u(st, "store_io_written_bytes")),
                count(u(st, "store_io_errors"))
            );
            if let Some(e) = st["store_io_last_error"].as_str() {
                io.push_str(&format!(" (last: {e})"));
            }
            o.push(io);
            let rc = &eng["read_cache"];
            if rc.is_object() {
                o.push(format!(
                    "  read cache       {} hits, {} misses, {} of media reads saved",
                    count(u(rc, "hits")),
                    count(u(rc, "misses")),
                    bytes(u(rc, "media_bytes_saved"))
                ));
            } else {
                o.push("  read cache       off".into());
            }
        }
    }
    let se = &v["selective"];
    if se.is_object() {
        let (fc, pf) = (&se["fp_cache"], &se["prefetch"]);
        let refresh = match (fc["refresh_ms"].as_u64(), fc["refresh_ops"].as_u64()) {
            (None, None) => "never".to_string(),
            (Some(ms), None) => format!("every {}", duration(ms as f64 / 1000.0)),
            (None, Some(n)) => format!("every {} operations", count(n)),
            (Some(ms), Some(n)) => format!(
                "every {} or {} operations",
                duration(ms as f64 / 1000.0),
                count(n)
            ),
        };
        o.push(String::new());
        o.push("Selective (hot fingerprints only):".into());
        let mut cache = format!(
            "  fingerprint cache  {} of {} entries, {} of {}",
            fc["entries"]
                .as_u64()
                .map_or_else(|| "unknown".to_string(), count),
            count(u(fc, "capacity")),
            bytes(u(fc, "memory_bytes")),
            bytes(u(fc, "budget_bytes")),
        );
        let mut pre = format!(
            "  prefetch cache     {} blocks, {} of {}",
            count(u(pf, "blocks")),
            bytes(u(pf, "memory_bytes")),
            bytes(u(pf, "budget_bytes")),
        );
        if mounted {
            cache.push_str(&format!(
                "; {} hits, {} misses, {} evictions, {} refreshes ({refresh})",
                count(u(fc, "hits")),
                count(u(fc, "misses")),
                count(u(fc, "evictions")),
                count(u(fc, "refreshes"))
            ));
            pre.push_str(&format!(
                "; {} hits, {} verifications read the medium, {} of reads saved",
                count(u(pf, "hits")),
                count(u(pf, "verify_reads")),
                bytes(u(pf, "bytes_saved"))
            ));
        }
        o.push(cache);
        o.push(pre);
    }
    o
}

/// `nodup fsck`.
pub fn fsck(a: FsckArgs) -> Result<()> {
    let key = a.encrypt_key_file.as_deref();
    // A repair opens the image read-write, and that alone rewrites its superblocks, saved
    // state and checkpoint. So the image is checked read-only first: a consistent one that
    // was unmounted cleanly has nothing to repair, and is left byte for byte as it was.
    let (lock, fs) = open_unmounted(&a.image, false, key, true)?;
    let first = nodup_fs::fsck::check(&fs, false)?;
    drop(fs);
    if !a.repair || (first.consistent() && first.repaired.is_empty()) {
        return fsck_report(&a, &first);
    }
    // A device is claimed while repaired, as a mount claims it.
    let claim = super::mount::claim_device(&a.image)?;
    let fs = open_locked(&a.image, true, key, true)?;
    let mut rep = nodup_fs::fsck::check(&fs, true)?;
    if fs.recovery().kind == "failure" {
        let ri = fs.recovery();
        let mut what = format!(
            "failure recovery: replayed {} log records",
            ri.replayed_records
        );
        if let Some(e) = &ri.engine {
            what.push_str(&format!(
                ", {} reference counts fixed, {} entries recreated, {} entries invalidated, {} leaked blocks freed",
                e.refcounts_fixed, e.entries_recreated, e.entries_invalidated, e.leaked_blocks_freed
            ));
        }
        rep.repaired.insert(0, what);
    }
    fs.shutdown()?;
    // The medium is closed before the lock goes (its close may drop the image's cache).
    drop(fs);
    drop((lock, claim));
    fsck_report(&a, &rep)
}

/// Print what fsck found (and repaired); an error when the image is not consistent.
fn fsck_report(a: &FsckArgs, rep: &nodup_fs::fsck::FsckReport) -> Result<()> {
    if a.json {
        println!("{}", serde_json::to_string(rep)?);
    } else {
        for r in &rep.repaired {
            println!("repaired: {r}");
        }
        for p in &rep.problems {
            println!("problem: {p}");
        }
        println!(
            "nodup fsck: {} inodes ({} files, {} directories), {} block references to {} distinct blocks: {}",
            rep.inodes,
            rep.files,
            rep.directories,
            rep.block_refs,
            rep.distinct_blocks,
            if rep.consistent() { "consistent" } else { "INCONSISTENT" }
        );
    }
    if !rep.consistent() {
        bail!(
            "{}: {} problem(s) found",
            a.image.display(),
            rep.problems.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mount's stats say how often the engine was rebuilt while mounted and, while changes
    /// are refused, why; a quiet mount says neither.
    #[test]
    fn mount_stats_show_live_recoveries_and_refused_changes() {
        let quiet = serde_json::json!({"live_recoveries": {"done": 0, "failed": 0}, "changes_refused": null});
        let out = human(&quiet, "mount", true);
        assert!(
            !out.contains("rebuilt") && !out.contains("refused"),
            "{out}"
        );
        let v = serde_json::json!({
            "media_errors_absorbed": 2,
            "live_recoveries": {"done": 3, "failed": 1},
            "changes_refused": "the engine gave up its live state after a failed store: no change can be made durable until failure recovery rebuilds it",
        });
        let out = human(&v, "mount", true);
        assert!(
            out.contains("2 absorbed; engine rebuilt while mounted 3 times (1 failed)"),
            "{out}"
        );
        assert!(
            out.contains("  changes refused  the engine gave up its live state"),
            "{out}"
        );
    }
}
