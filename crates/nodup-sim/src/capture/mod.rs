//! `nodup sim capture`: record an approximation of a real program's last-level-cache write-backs.
//!
//! # What is recorded, and how far it is from the real thing
//!
//! The program (and every process it starts) runs in its own process group. Every `interval` of
//! its run time the group is stopped (SIGSTOP), and for each process the capture finds the pages
//! written since the last sample, reads them through `/proc/PID/mem`, and emits every 64-byte line
//! whose content changed, with its new content, in address order; then the group continues
//! (SIGCONT). Pages written since the last sample are found with soft-dirty bits (`4` written to
//! `/proc/PID/clear_refs`, then bit 55 of `/proc/PID/pagemap`) when the kernel keeps them; a kernel
//! built without `CONFIG_MEM_SOFT_DIRTY` (the probe writes a page of this process and looks at
//! the bit) makes the capture read every present page of the writable mappings instead ("full
//! scan"): the same lines come out, it only costs more time per sample. A change is found by
//! comparing each line's 64-bit hash with the previous sample's; a page seen for the first time
//! is compared with zero when it is anonymous memory (which starts zero-filled) and taken as the
//! baseline when it is file-backed (its initial content came from the file, not from a write).
//!
//! Approximations:
//! - A line written several times within an interval is emitted once, with its last content, as
//!   if the cache had held it for the whole interval; a line changed and changed back is not
//!   emitted. The interval thus plays the part of the cache: a shorter interval gives more
//!   write-backs of hot lines (a smaller cache), a longer one fewer (a larger cache). Real
//!   evictions also depend on what else the cache holds, which this does not model.
//! - Emission is in address order within a sample, not in time order.
//! - Writes a process makes after the last sample before it exits are lost, and so are the lines
//!   of processes that live shorter than one interval.
//! - Reads cannot be observed this way (page-idle tracking, the only other source, needs
//!   `CONFIG_IDLE_PAGE_TRACKING`): they are synthesized from the write set. After each write,
//!   `read_ratio / (1 - read_ratio)` reads on average go to lines written earlier (uniformly among
//!   the last 65,536 distinct write addresses). The header flag says so.
//! - Each process is its own address space: line numbers are `(process slot << 42) | vaddr / 64`.
//! - A process that leaves the program's process group is not stopped while it is read.

pub mod procmem;

use crate::error::{Result, SimError};
use crate::trace::{Event, Line, TraceWriter, FLAG_CAPTURED, FLAG_READS_SYNTHESIZED, ZERO_LINE};
use procmem::{is_stopped, process_tree, Proc, Region, PAGE, PM_PRESENT, PM_SOFT_DIRTY};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashMap;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;

/// Capture parameters.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// Sampling interval of the program's run time (ms).
    pub interval_ms: u64,
    /// Fraction of emitted events that are synthesized reads.
    pub read_ratio: f64,
    /// Seed of the read synthesis.
    pub seed: u64,
}

/// What a capture did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CaptureSummary {
    /// Samples taken.
    pub samples: u64,
    /// "soft-dirty" or "full scan".
    pub mode: &'static str,
    /// Processes seen.
    pub processes: u64,
    /// Write events emitted.
    pub writes: u64,
    /// Read events synthesized.
    pub reads: u64,
    /// Pages read through /proc/PID/mem.
    pub pages_read: u64,
    /// The program's exit status (128 + signal when killed).
    pub exit_code: i32,
}

/// Line hashes of one page at the previous sample.
type Shadow = Box<[u64; 64]>;

struct ProcState {
    slot: u64,
    shadow: FxHashMap<u64, Shadow>,
}

const RECENT: usize = 1 << 16;

/// Emits writes and the reads synthesized after them.
struct Emitter<W: std::io::Write> {
    out: TraceWriter<W>,
    rng: SmallRng,
    reads_per_write: f64,
    owed: f64,
    recent: Vec<u64>,
    next: usize,
}

impl<W: std::io::Write> Emitter<W> {
    fn write(&mut self, line: u64, data: &Line) -> Result<()> {
        self.out.write(&Event::write(line, *data))?;
        if self.recent.len() < RECENT {
            self.recent.push(line);
        } else {
            self.recent[self.next] = line;
            self.next = (self.next + 1) % RECENT;
        }
        self.owed += self.reads_per_write;
        while self.owed >= 1.0 {
            self.owed -= 1.0;
            let a = self.recent[self.rng.gen_range(0..self.recent.len())];
            self.out.write(&Event::read(a))?;
        }
        Ok(())
    }
}

fn line_hash(l: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(l)
}

/// Scan one process: emit changed lines, return its new shadow and the pages read.
fn scan<W: std::io::Write>(
    p: &Proc,
    st: &mut ProcState,
    soft_dirty: bool,
    em: &mut Emitter<W>,
) -> Result<u64> {
    let Some(regions) = p.regions() else {
        return Ok(0);
    };
    let mut old = std::mem::take(&mut st.shadow);
    let mut new: FxHashMap<u64, Shadow> = FxHashMap::default();
    let mut pm = Vec::new();
    let mut buf = vec![0u8; 256 * PAGE as usize];
    let mut pages_read = 0u64;
    for Region {
        start,
        end,
        anonymous,
    } in regions
    {
        let mut at = start;
        while at < end {
            let n = ((end - at) / PAGE).min(1 << 14);
            if !p.pagemap(at, n, &mut pm) {
                break;
            }
            let mut i = 0u64;
            while i < n {
                let e = pm[i as usize];
                let va = at + i * PAGE;
                if e & PM_PRESENT == 0 {
                    i += 1;
                    continue;
                }
                let wanted = !soft_dirty || e & PM_SOFT_DIRTY != 0 || !old.contains_key(&va);
                if !wanted {
                    if let Some(s) = old.remove(&va) {
                        new.insert(va, s);
                    }
                    i += 1;
                    continue;
                }
                // A run of wanted present pages, read in one call.
                let mut run = 1u64;
                while i + run < n && run < 256 {
                    let e2 = pm[(i + run) as usize];
                    let va2 = va + run * PAGE;
                    let w2 = e2 & PM_PRESENT != 0
                        && (!soft_dirty || e2 & PM_SOFT_DIRTY != 0 || !old.contains_key(&va2));
                    if !w2 {
                        break;
                    }
                    run += 1;
                }
                let bytes = &mut buf[..(run * PAGE) as usize];
                if !p.read(va, bytes) {
                    i += run;
                    continue;
                }
                pages_read += run;
                for k in 0..run {
                    let pva = va + k * PAGE;
                    let page = &bytes[(k * PAGE) as usize..((k + 1) * PAGE) as usize];
                    let prev = old.remove(&pva);
                    let mut hashes: Shadow = Box::new([0; 64]);
                    for (j, l) in page.chunks_exact(64).enumerate() {
                        hashes[j] = line_hash(l);
                        let changed = match &prev {
                            Some(h) => h[j] != hashes[j],
                            None => anonymous && l != ZERO_LINE,
                        };
                        if changed {
                            let line = (st.slot << 42) | ((pva >> 6) + j as u64) & ((1 << 42) - 1);
                            let mut data = ZERO_LINE;
                            data.copy_from_slice(l);
                            em.write(line, &data)?;
                        }
                    }
                    new.insert(pva, hashes);
                }
                i += run;
            }
            at += n * PAGE;
        }
    }
    st.shadow = new;
    if soft_dirty {
        p.clear_soft_dirty();
    }
    Ok(pages_read)
}

fn signal_group(pgid: i32, sig: i32) {
    // SAFETY: kill(2) with a negative pid signals the process group we created; no memory is
    // shared with the callee.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// Run `cmd` and write its captured trace to `out`.
pub fn capture(
    cmd: &[OsString],
    out: &std::path::Path,
    o: &CaptureOptions,
) -> Result<CaptureSummary> {
    if cmd.is_empty() {
        return Err(SimError::Invalid(
            "capture: no command given after --".into(),
        ));
    }
    if o.interval_ms == 0 || !(0.0..1.0).contains(&o.read_ratio) {
        return Err(SimError::Invalid(
            "capture: --interval-ms must be >= 1 and --read-ratio within 0..1".into(),
        ));
    }
    let soft_dirty = procmem::soft_dirty_supported();
    let writer = TraceWriter::create(out, FLAG_CAPTURED | FLAG_READS_SYNTHESIZED)?;
    let mut em = Emitter {
        out: writer,
        rng: SmallRng::seed_from_u64(o.seed),
        reads_per_write: o.read_ratio / (1.0 - o.read_ratio),
        owed: 0.0,
        recent: Vec::new(),
        next: 0,
    };
    let mut command = std::process::Command::new(&cmd[0]);
    command.args(&cmd[1..]);
    // SAFETY: setpgid is async-signal-safe; the closure touches no state of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|e| {
        SimError::Capture(format!("cannot start {}: {e}", cmd[0].to_string_lossy()))
    })?;
    let pgid = child.id() as i32;
    let mut states: FxHashMap<i32, ProcState> = FxHashMap::default();
    let mut s = CaptureSummary {
        mode: if soft_dirty {
            "soft-dirty"
        } else {
            "full scan"
        },
        ..CaptureSummary::default()
    };
    let interval = std::time::Duration::from_millis(o.interval_ms);
    let status = loop {
        std::thread::sleep(interval);
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => {}
            Err(e) => return Err(SimError::io("waiting for the captured program", e)),
        }
        signal_group(pgid, libc::SIGSTOP);
        let tree = process_tree(pgid);
        for _ in 0..200 {
            if tree.iter().all(|&p| is_stopped(p)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut result = Ok(());
        for &pid in &tree {
            let Some(p) = Proc::open(pid) else { continue };
            let next_slot = states.len() as u64 + 1;
            let st = states.entry(pid).or_insert_with(|| ProcState {
                slot: next_slot,
                shadow: FxHashMap::default(),
            });
            match scan(&p, st, soft_dirty, &mut em) {
                Ok(n) => s.pages_read += n,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        // Processes that are gone keep their slot (no reuse) but not their shadow.
        for (pid, st) in states.iter_mut() {
            if !tree.contains(pid) {
                st.shadow = FxHashMap::default();
            }
        }
        signal_group(pgid, libc::SIGCONT);
        s.samples += 1;
        if let Err(e) = result {
            signal_group(pgid, libc::SIGKILL);
            let _ = child.wait();
            return Err(e);
        }
    };
    s.processes = states.len() as u64;
    let counts = em.out.finish()?;
    s.writes = counts.writes;
    s.reads = counts.reads;
    s.exit_code = match status.code() {
        Some(c) => c,
        None => {
            use std::os::unix::process::ExitStatusExt;
            128 + status.signal().unwrap_or(0)
        }
    };
    Ok(s)
}

#[cfg(test)]
mod tests;
