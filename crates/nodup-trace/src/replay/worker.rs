//! A replay worker: executes its stream's operations in order with pwrite/pread and verifies reads.

use super::latency::Histogram;
use crate::content::SectorContent;
use crate::error::{Result, TraceError};
use crate::record::{BLOCK_BYTES, SECTORS_PER_BLOCK, SECTOR_BYTES};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

/// Most verify-error descriptions kept per worker (the count is always exact).
const MAX_SAMPLES: usize = 10;

/// One replay file (one trace device).
pub struct DevFile {
    /// The open file.
    pub file: File,
    /// Its name inside the replay directory.
    pub name: String,
}

/// One I/O call: a run of consecutive 4 KiB blocks of one file.
pub struct IoOp {
    /// Target file.
    pub file: Arc<DevFile>,
    /// First block (byte offset = block * 4096).
    pub first_block: u64,
    /// Trace line (or record number) of the first record in the call.
    pub line: u64,
    /// Write (true) or read (false).
    pub write: bool,
    /// Write: content of each block. Read: expected content, `ZERO` where not verified.
    pub blocks: Vec<[SectorContent; SECTORS_PER_BLOCK as usize]>,
}

/// What one worker did.
#[derive(Default)]
pub struct WorkerStats {
    /// Write calls.
    pub write_ops: u64,
    /// Read calls.
    pub read_ops: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Blocks that differed from the expected content.
    pub verify_errors: u64,
    /// Blocks that had at least one verified sector.
    pub verified_blocks: u64,
    /// Latency of write calls.
    pub write_lat: Histogram,
    /// Latency of read calls.
    pub read_lat: Histogram,
    /// First verify errors, described.
    pub samples: Vec<String>,
}

/// Read as much of `buf` as the file has at `off` (short only at end of file).
fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Run until the channel closes; an I/O error ends the worker with that error.
pub fn run(rx: Receiver<IoOp>) -> Result<WorkerStats> {
    let mut st = WorkerStats::default();
    let mut buf = vec![0u8; 512 * BLOCK_BYTES as usize];
    let mut expect = [0u8; SECTOR_BYTES as usize];
    for op in rx {
        let len = op.blocks.len() * BLOCK_BYTES as usize;
        let off = op.first_block * BLOCK_BYTES;
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let data = &mut buf[..len];
        if op.write {
            for (b, chunk) in op.blocks.iter().zip(data.chunks_mut(BLOCK_BYTES as usize)) {
                crate::content::fill_sectors(b, chunk);
            }
            let t0 = Instant::now();
            op.file.file.write_all_at(data, off).map_err(|e| {
                TraceError::io(
                    format!("line {}: writing {} at {off}", op.line, op.file.name),
                    e,
                )
            })?;
            st.write_lat.record(t0.elapsed().as_nanos() as u64);
            st.write_ops += 1;
            st.write_bytes += len as u64;
        } else {
            let t0 = Instant::now();
            let n = read_full_at(&op.file.file, data, off).map_err(|e| {
                TraceError::io(
                    format!("line {}: reading {} at {off}", op.line, op.file.name),
                    e,
                )
            })?;
            st.read_lat.record(t0.elapsed().as_nanos() as u64);
            st.read_ops += 1;
            st.read_bytes += len as u64;
            data[n..].fill(0); // beyond end of file reads as a hole
            for (i, b) in op.blocks.iter().enumerate() {
                let mut checked = false;
                let mut bad_sector = None;
                for (s, sc) in b.iter().enumerate() {
                    if sc.is_zero() {
                        continue;
                    }
                    checked = true;
                    sc.fill(&mut expect);
                    let at = i * BLOCK_BYTES as usize + s * SECTOR_BYTES as usize;
                    if data[at..at + SECTOR_BYTES as usize] != expect[..] {
                        bad_sector = Some(s);
                        break;
                    }
                }
                if checked {
                    st.verified_blocks += 1;
                }
                if let Some(s) = bad_sector {
                    st.verify_errors += 1;
                    if st.samples.len() < MAX_SAMPLES {
                        st.samples.push(format!(
                            "line {}: {} offset {}: read data differs from the last write (sector {s} of the block)",
                            op.line,
                            op.file.name,
                            off + (i as u64) * BLOCK_BYTES
                        ));
                    }
                }
            }
        }
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;

    #[test]
    fn detects_data_changed_behind_the_replayer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev-1-0.img");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let f = Arc::new(DevFile {
            file,
            name: "dev-1-0.img".into(),
        });
        let content = [SectorContent::sector([7; 16]); 8];
        let op = |write, line| IoOp {
            file: f.clone(),
            first_block: 2,
            line,
            write,
            blocks: vec![content; 3],
        };
        let (tx, rx) = sync_channel(8);
        tx.send(op(true, 1)).unwrap();
        drop(tx);
        let st = run(rx).unwrap();
        assert_eq!((st.write_ops, st.write_bytes), (1, 3 * 4096));
        // Intact data verifies; one flipped byte in the middle block is exactly one error.
        let (tx, rx) = sync_channel(8);
        tx.send(op(false, 2)).unwrap();
        drop(tx);
        assert_eq!(run(rx).unwrap().verify_errors, 0);
        f.file.write_all_at(&[0xFF], 3 * 4096 + 700).unwrap();
        let (tx, rx) = sync_channel(8);
        tx.send(op(false, 3)).unwrap();
        drop(tx);
        let st = run(rx).unwrap();
        assert_eq!((st.verify_errors, st.verified_blocks), (1, 3));
        assert!(
            st.samples[0].starts_with("line 3: dev-1-0.img offset 12288"),
            "{}",
            st.samples[0]
        );
        // A truncated file (lost data) reads as zeros and fails verification too.
        f.file.set_len(2 * 4096).unwrap();
        let (tx, rx) = sync_channel(8);
        tx.send(op(false, 4)).unwrap();
        drop(tx);
        assert_eq!(run(rx).unwrap().verify_errors, 3);
    }
}
