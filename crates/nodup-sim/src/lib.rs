//! nodup-sim: a trace-driven simulator of cache-line deduplication inside the memory controller
//! of an encrypted PCM main memory, the evaluation of FSDedup (`../shared/papers/fsdedup-tos24.txt`,
//! §4) and of the schemes it compares with: Baseline, Dedup_SHA1, DeWrite, ESD and FSDedup.
//!
//! - [`trace`]: the events (64-byte line reads and writes with their content) and the compact,
//!   checksummed binary trace format, read as a stream.
//! - [`gen`]: synthetic traces with a target duplicate rate and reference-count skew (Table 1).
//! - [`capture`]: traces of real programs, sampled through soft-dirty bits and `/proc/PID/mem`
//!   (an approximation of last-level-cache write-backs; the module doc says how far it is from
//!   the real thing and how the interval moves the results; reads are synthesized).
//! - [`model`]: the memory model — PCM latencies and energies (Table 2), a bank/queue timing
//!   model explained in one page (`model::timing`), counter-mode AES on the real data with
//!   per-line counters, on-chip metadata caches, event counts from which energy is summed.
//! - [`schemes`]: one module per scheme over shared machinery; the LRCU (with refresh) and the
//!   prefetch cache of ESD/FSDedup are nodup-core's `cache` modules, the ECC fingerprint is
//!   nodup-core's SECDED code (`fingerprint::ecc`).
//! - [`sim`], [`run`]: one scheme over a stream of events; several schemes over one trace, each
//!   on its own thread, memory bounded by the modeled state plus a few batches.
//! - [`stats`], [`report`]: Table 1 of a trace; text, markdown tables and PNG figures.
//!
//! The command line is `nodup sim gen|capture|run|stats|report`.

pub mod capture;
pub mod error;
pub mod gen;
pub mod model;
pub mod report;
pub mod run;
pub mod schemes;
pub mod sim;
pub mod stats;
pub mod trace;
