//! `nodup sim run`: stream a trace once through several schemes, each on its own thread.
//!
//! The calling thread decodes the trace in batches of 16 Ki events and hands every batch (shared,
//! not copied) to one worker per scheme through a bounded channel of 4 batches, so memory is the
//! schemes' modeled state plus at most ~5 batches per scheme (about 6 MiB each), whatever the
//! trace length.

use crate::error::{Result, SimError};
use crate::model::ModelConfig;
use crate::schemes::SchemeKind;
use crate::sim::{SchemeResult, Sim};
use crate::trace::{Event, TraceReader};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::mpsc::sync_channel;
use std::sync::Arc;

const BATCH: usize = 1 << 14;

/// Results of one run (`nodup sim run --json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    /// Trace file.
    pub trace: String,
    /// Events in the trace.
    pub events: u64,
    /// Writes in the trace.
    pub writes: u64,
    /// Reads in the trace.
    pub reads: u64,
    /// The model configuration used.
    pub config: ModelConfig,
    /// Wall-clock seconds of the run.
    pub elapsed_s: f64,
    /// Trace events per second per scheme (events / elapsed).
    pub events_per_s: f64,
    /// Results by scheme name.
    pub schemes: BTreeMap<String, SchemeResult>,
}

/// Simulate `schemes` over the trace at `path`; `progress` gets the trace bytes read so far.
pub fn run(
    path: &std::path::Path,
    schemes: &[SchemeKind],
    cfg: &ModelConfig,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<RunReport> {
    cfg.validate()?;
    if schemes.is_empty() {
        return Err(SimError::Invalid("no scheme to run".into()));
    }
    let mut reader = TraceReader::open(path)?;
    let t0 = std::time::Instant::now();
    let (results, read_err) = std::thread::scope(|sc| {
        let mut txs = Vec::new();
        let mut handles = Vec::new();
        for &k in schemes {
            let (tx, rx) = sync_channel::<Arc<Vec<Event>>>(4);
            txs.push(tx);
            handles.push(sc.spawn(move || {
                let mut sim = Sim::new(k, cfg);
                for batch in rx {
                    for e in batch.iter() {
                        sim.event(e);
                    }
                }
                (k, sim.finish())
            }));
        }
        let mut err = None;
        loop {
            let mut v = Vec::with_capacity(BATCH);
            match reader.next_batch(&mut v, BATCH) {
                Ok(0) => break,
                Ok(_) => {
                    let b = Arc::new(v);
                    for tx in &txs {
                        // A worker only hangs up by panicking; the join below reports it.
                        let _ = tx.send(b.clone());
                    }
                    progress(reader.bytes_read());
                }
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        drop(txs);
        let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        (results, err)
    });
    if let Some(e) = read_err {
        return Err(e);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let c = reader.counts();
    let mut out = BTreeMap::new();
    for r in results {
        let (k, res) = r.map_err(|_| SimError::Invalid("a scheme worker panicked".into()))?;
        out.insert(k.name().to_string(), res);
    }
    Ok(RunReport {
        trace: path.display().to_string(),
        events: c.events,
        writes: c.writes,
        reads: c.reads,
        config: cfg.clone(),
        elapsed_s: elapsed,
        events_per_s: c.events as f64 / elapsed.max(1e-9),
        schemes: out,
    })
}
