//! The bank/queue model: when each request's steps run, and so its latency.
//!
//! # The model in one page
//!
//! The processor issues the trace's requests in order, one every `issue_gap_ns`, but never more
//! than `window` at once: request i is issued no earlier than the completion of request
//! i - window (the memory controller's queue slots, like the miss-status and write-queue entries
//! of a real controller). Latency is measured from issue to completion, so it includes queueing
//! at the banks but not the processor's stall when the window is full (that stall shows in the
//! run time instead).
//!
//! A request is a short list of steps, decided by the scheme when it issues (dedup decisions and
//! cache states are functional and taken in trace order):
//! - `Compute(ns)`: controller logic (hashing, encryption, a metadata cache access, a compare);
//!   pure latency, no shared resource (the units are pipelined).
//! - `Read(bank)`, `Write(bank)`: a PCM access; each bank is one server taking requests first
//!   come first served *by the time they become ready*, busy `pcm_read_ns` / `pcm_write_ns`.
//! - `After(ns)`: the next step cannot start before issue + ns (work started in parallel at
//!   issue, e.g. counter-mode pad generation overlapping a read, or DeWrite's speculative
//!   encryption), so only the part not hidden adds latency.
//!
//! Steps run strictly in sequence within a request. A discrete-event loop orders all bank steps of
//! all requests by ready time (ties by issue order), so a write waiting 321 ns for its SHA-1 does
//! not hold a bank that a later read could use meanwhile. Background requests (dirty metadata
//! written back when evicted from an on-chip cache) occupy banks but neither the window nor the
//! latency statistics. Every foreground request's latency is exactly its service (compute, the
//! unhidden part of `After`, bank busy time) plus its bank waits, which the tests check.
//!
//! Eliminating a write frees its bank for others: fewer bank writes mean shorter waits for every
//! read and write queued behind them, which is how deduplication speeds up reads.

use super::hist::Hist;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One step of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Controller latency (ns), no shared resource.
    Compute(u64),
    /// PCM read on a bank.
    Read(u32),
    /// PCM write on a bank.
    Write(u32),
    /// Do not go on before issue + ns (parallel work started at issue).
    After(u64),
}

/// Steps a request holds at most.
pub const MAX_STEPS: usize = 12;

/// A request's steps, built by a scheme.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    steps: [Step; MAX_STEPS],
    n: u8,
}

impl Default for Request {
    fn default() -> Self {
        Request {
            steps: [Step::Compute(0); MAX_STEPS],
            n: 0,
        }
    }
}

impl Request {
    /// Append a step (zero-length compute steps are dropped).
    pub fn push(&mut self, s: Step) -> &mut Self {
        if s == Step::Compute(0) || s == Step::After(0) {
            return self;
        }
        assert!((self.n as usize) < MAX_STEPS, "request too long");
        self.steps[self.n as usize] = s;
        self.n += 1;
        self
    }

    /// The steps.
    pub fn steps(&self) -> &[Step] {
        &self.steps[..self.n as usize]
    }
}

/// Read or write, for the statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A trace read.
    Read,
    /// A trace write.
    Write,
}

struct Flight {
    req: Request,
    next: u8,
    issue: u64,
    kind: Option<Kind>,
    ring: usize,
    wait: u64,
    service: u64,
}

/// Per-kind latency totals.
#[derive(Default, Clone)]
pub struct KindStats {
    /// Latency histogram.
    pub hist: Hist,
    /// Sum of bank waits.
    pub wait_ns: u128,
    /// Sum of service times.
    pub service_ns: u128,
}

/// The discrete-event timing engine.
pub struct Timing {
    read_ns: u64,
    write_ns: u64,
    gap: u64,
    bank_free: Vec<u64>,
    heap: BinaryHeap<Reverse<(u64, u64, u32)>>,
    flights: Vec<Flight>,
    free_flights: Vec<u32>,
    /// Completion time of the last `window` foreground requests (u64::MAX = in flight).
    ring: Vec<u64>,
    seq: u64,
    events: u64,
    last_issue: u64,
    /// Issue time of the request being built.
    now: u64,
    end: u64,
    /// Write latencies.
    pub writes: KindStats,
    /// Read latencies.
    pub reads: KindStats,
}

impl Timing {
    /// A model with `banks` banks and the given PCM latencies, gap and window.
    pub fn new(banks: u32, read_ns: u64, write_ns: u64, gap: u64, window: u32) -> Self {
        Timing {
            read_ns,
            write_ns,
            gap,
            bank_free: vec![0; banks as usize],
            heap: BinaryHeap::new(),
            flights: Vec::new(),
            free_flights: Vec::new(),
            ring: vec![0; window as usize],
            seq: 0,
            events: 0,
            last_issue: 0,
            now: 0,
            end: 0,
            writes: KindStats::default(),
            reads: KindStats::default(),
        }
    }

    /// Number of banks.
    pub fn banks(&self) -> u32 {
        self.bank_free.len() as u32
    }

    /// Decide when the next foreground request issues (processing earlier events) and return
    /// that time; the scheme then builds the request and calls [`Timing::submit`].
    pub fn begin(&mut self) -> u64 {
        let mut t = if self.seq == 0 {
            0
        } else {
            self.last_issue + self.gap
        };
        let w = self.ring.len() as u64;
        if self.seq >= w {
            let slot = (self.seq % w) as usize;
            while self.ring[slot] == u64::MAX {
                self.step_one();
            }
            t = t.max(self.ring[slot]);
        }
        while let Some(&Reverse((at, _, _))) = self.heap.peek() {
            if at >= t {
                break;
            }
            self.step_one();
        }
        self.now = t;
        t
    }

    /// Start the foreground request built after [`Timing::begin`].
    pub fn submit(&mut self, kind: Kind, req: Request) {
        let slot = (self.seq % self.ring.len() as u64) as usize;
        self.ring[slot] = u64::MAX;
        self.seq += 1;
        self.last_issue = self.now;
        self.start(Some(kind), slot, req);
    }

    /// Start a background request (metadata write-back) at the current issue time.
    pub fn background(&mut self, req: Request) {
        self.start(None, 0, req);
    }

    fn start(&mut self, kind: Option<Kind>, ring: usize, req: Request) {
        let f = Flight {
            req,
            next: 0,
            issue: self.now,
            kind,
            ring,
            wait: 0,
            service: 0,
        };
        let id = match self.free_flights.pop() {
            Some(i) => {
                self.flights[i as usize] = f;
                i
            }
            None => {
                self.flights.push(f);
                (self.flights.len() - 1) as u32
            }
        };
        self.advance(id, self.now);
    }

    /// Run the non-bank steps of flight `id` from time `t` up to its next bank step (queued as an
    /// event) or its end.
    fn advance(&mut self, id: u32, mut t: u64) {
        let f = &mut self.flights[id as usize];
        while (f.next as usize) < f.req.n as usize {
            match f.req.steps[f.next as usize] {
                Step::Compute(d) => {
                    t += d;
                    f.service += d;
                }
                Step::After(x) => {
                    let target = f.issue + x;
                    if target > t {
                        f.service += target - t;
                        t = target;
                    }
                }
                Step::Read(_) | Step::Write(_) => {
                    self.events += 1;
                    self.heap.push(Reverse((t, self.events, id)));
                    return;
                }
            }
            f.next += 1;
        }
        self.complete(id, t);
    }

    /// Serve the earliest ready bank step.
    fn step_one(&mut self) {
        let Some(Reverse((t, _, id))) = self.heap.pop() else {
            panic!("timing: waiting on a request that has no pending step");
        };
        let f = &mut self.flights[id as usize];
        let (bank, dur) = match f.req.steps[f.next as usize] {
            Step::Read(b) => (b, self.read_ns),
            Step::Write(b) => (b, self.write_ns),
            _ => unreachable!("only bank steps are queued"),
        };
        let free = &mut self.bank_free[bank as usize];
        let start = t.max(*free);
        *free = start + dur;
        f.wait += start - t;
        f.service += dur;
        f.next += 1;
        self.advance(id, start + dur);
    }

    fn complete(&mut self, id: u32, t: u64) {
        let f = &self.flights[id as usize];
        self.end = self.end.max(t);
        if let Some(kind) = f.kind {
            let s = match kind {
                Kind::Read => &mut self.reads,
                Kind::Write => &mut self.writes,
            };
            s.hist.record(t - f.issue);
            s.wait_ns += f.wait as u128;
            s.service_ns += f.service as u128;
            self.ring[f.ring] = t;
        }
        self.free_flights.push(id);
    }

    /// Run every pending step; returns the time the last request completed.
    pub fn finish(&mut self) -> u64 {
        while !self.heap.is_empty() {
            self.step_one();
        }
        self.end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(steps: &[Step]) -> Request {
        let mut r = Request::default();
        for &s in steps {
            r.push(s);
        }
        r
    }

    #[test]
    fn uncontended_latency_is_the_sum_of_steps() {
        let mut t = Timing::new(2, 75, 150, 10_000, 4);
        t.begin();
        t.submit(Kind::Write, req(&[Step::Compute(40), Step::Write(0)]));
        t.begin();
        t.submit(Kind::Read, req(&[Step::Read(1), Step::After(40)]));
        t.begin();
        // Parallel encryption (After 40) is hidden behind a 75 ns read.
        t.submit(
            Kind::Read,
            req(&[Step::Compute(2), Step::Read(0), Step::After(40)]),
        );
        assert_eq!(t.finish(), 20_077);
        assert_eq!(t.writes.hist.sum(), 190);
        assert_eq!(t.reads.hist.sum(), 75 + 77);
        assert_eq!(t.reads.wait_ns, 0);
        // After longer than the work before it: the rest adds up.
        let mut t = Timing::new(1, 75, 150, 10_000, 4);
        t.begin();
        t.submit(
            Kind::Write,
            req(&[Step::Compute(15), Step::After(40), Step::Write(0)]),
        );
        t.finish();
        assert_eq!(t.writes.hist.sum(), 190);
    }

    #[test]
    fn a_bank_serves_by_ready_time_and_writes_delay_reads() {
        // Back-to-back requests on one bank: a write (ready at 0) then a read issued at 10.
        let mut t = Timing::new(1, 75, 150, 10, 8);
        t.begin();
        t.submit(Kind::Write, req(&[Step::Write(0)]));
        t.begin();
        t.submit(Kind::Read, req(&[Step::Read(0)]));
        t.finish();
        assert_eq!(t.reads.hist.sum(), 150 - 10 + 75);
        assert_eq!(t.reads.wait_ns, 140);
        // A write that first hashes for 321 ns does not hold the bank: the later read goes first.
        let mut t = Timing::new(1, 75, 150, 10, 8);
        t.begin();
        t.submit(Kind::Write, req(&[Step::Compute(321), Step::Write(0)]));
        t.begin();
        t.submit(Kind::Read, req(&[Step::Read(0)]));
        t.finish();
        assert_eq!(t.reads.hist.sum(), 75);
        assert_eq!(t.writes.hist.sum(), 471);
        // Latency = service + wait for every request, under contention.
        let mut t = Timing::new(2, 75, 150, 5, 3);
        for i in 0..200u32 {
            t.begin();
            if i % 3 == 0 {
                t.submit(Kind::Read, req(&[Step::Read(i % 2), Step::After(40)]));
            } else {
                t.submit(
                    Kind::Write,
                    req(&[Step::Compute(7), Step::Read(1), Step::Write(i % 2)]),
                );
                t.background(req(&[Step::Write(0)]));
            }
        }
        t.finish();
        for s in [&t.reads, &t.writes] {
            assert_eq!(s.hist.sum(), s.wait_ns + s.service_ns);
            assert!(s.wait_ns > 0);
        }
    }

    #[test]
    fn the_window_bounds_requests_in_flight() {
        // Window 1: each request issues when the previous completed.
        let mut t = Timing::new(4, 75, 150, 0, 1);
        let mut issues = Vec::new();
        for _ in 0..3 {
            issues.push(t.begin());
            t.submit(Kind::Write, req(&[Step::Write(0)]));
        }
        assert_eq!(issues, vec![0, 150, 300]);
        assert_eq!(t.finish(), 450);
        assert_eq!(t.writes.wait_ns, 0);
    }
}
