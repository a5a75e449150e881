//! A null FUSE file system (flat root, writes discarded, reads zeros) with two transports
//! running the same request handler: the classic /dev/fuse read/write loop and
//! FUSE-over-io_uring (Linux 6.14+, `fuse.enable_uring`). It exists to measure what the ring
//! transport does to the FUSE ceiling before nodup, whose FUSE layer (fuser 0.18) has no ring,
//! would adopt it (issue 20). Over the classic transport, WRITE data can instead go through a
//! reference data path ([`sink`]), to measure what storing it costs on top of the transport.

pub mod abi;
pub mod classic;
pub mod init;
pub mod mount;
pub mod nullfs;
pub mod ring;
pub mod sink;

use std::sync::atomic::{AtomicU64, Ordering};

/// Which transport carried a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// An io_uring entry.
    Ring,
    /// /dev/fuse read/write.
    Classic,
}

/// Requests served, per transport and per opcode (printed at exit: the test checks the ring
/// carried them, the benchmark reports requests per write).
#[derive(Debug)]
pub struct Served {
    ring: AtomicU64,
    classic: AtomicU64,
    by_opcode: [AtomicU64; 64],
    /// WRITE data a sink took: bytes, and the XOR of its [`sink::fold`]s.
    sink_bytes: AtomicU64,
    sink_fold: AtomicU64,
}

impl Default for Served {
    fn default() -> Self {
        Served {
            ring: AtomicU64::new(0),
            classic: AtomicU64::new(0),
            by_opcode: std::array::from_fn(|_| AtomicU64::new(0)),
            sink_bytes: AtomicU64::new(0),
            sink_fold: AtomicU64::new(0),
        }
    }
}

impl Served {
    /// Count one request with `opcode` that came `via` a transport.
    pub fn note(&self, via: Via, opcode: u32) {
        let total = match via {
            Via::Ring => &self.ring,
            Via::Classic => &self.classic,
        };
        total.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.by_opcode.get(opcode as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Count `bytes` of WRITE data a sink took, whose fold is `fold`.
    pub fn note_sink(&self, fold: u64, bytes: u64) {
        self.sink_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.sink_fold.fetch_xor(fold, Ordering::Relaxed);
    }

    /// `ring=N classic=M ops=OPCODE:COUNT,... sink_bytes=N sink_fold=HEX`.
    pub fn summary(&self) -> String {
        let ops: Vec<String> = (self.by_opcode.iter().enumerate())
            .map(|(op, c)| (op, c.load(Ordering::Relaxed)))
            .filter(|&(_, n)| n > 0)
            .map(|(op, n)| format!("{op}:{n}"))
            .collect();
        format!(
            "ring={} classic={} ops={} sink_bytes={} sink_fold={:016x}",
            self.ring.load(Ordering::Relaxed),
            self.classic.load(Ordering::Relaxed),
            ops.join(","),
            self.sink_bytes.load(Ordering::Relaxed),
            self.sink_fold.load(Ordering::Relaxed)
        )
    }
}
