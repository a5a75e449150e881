//! `MemMedium`: a heap-backed medium for tests and the simulator (volatile; flush and fence are no-ops).

use super::Medium;
use crate::{Error, Result};
use parking_lot::RwLock;

/// A medium held in a `Vec<u8>`; every write is immediately "durable" for the life of the process.
pub struct MemMedium {
    bytes: RwLock<Vec<u8>>,
}

impl MemMedium {
    /// A zero-filled medium of `len` bytes.
    pub fn new(len: u64) -> MemMedium {
        MemMedium {
            bytes: RwLock::new(vec![0; len as usize]),
        }
    }

    /// A copy of the whole content (for crash and corruption tests).
    pub fn snapshot(&self) -> Vec<u8> {
        self.bytes.read().clone()
    }

    /// A medium holding exactly `bytes`.
    pub fn from_bytes(bytes: Vec<u8>) -> MemMedium {
        MemMedium {
            bytes: RwLock::new(bytes),
        }
    }
}

fn range(off: u64, len: usize, total: usize) -> Result<std::ops::Range<usize>> {
    let start =
        usize::try_from(off).map_err(|_| Error::Invalid(format!("offset {off} out of range")))?;
    let end = start.checked_add(len).filter(|&e| e <= total);
    match end {
        Some(end) => Ok(start..end),
        None => Err(Error::Invalid(format!(
            "access {off}+{len} beyond medium end {total}"
        ))),
    }
}

impl Medium for MemMedium {
    fn len(&self) -> u64 {
        self.bytes.read().len() as u64
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        let b = self.bytes.read();
        let r = range(off, buf.len(), b.len())?;
        buf.copy_from_slice(&b[r]);
        Ok(())
    }
    fn write(&self, off: u64, data: &[u8]) -> Result<()> {
        let mut b = self.bytes.write();
        let total = b.len();
        let r = range(off, data.len(), total)?;
        b[r].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self, _off: u64, _len: u64) {}
    fn fence(&self) -> Result<()> {
        Ok(())
    }
    fn sync_all(&self) -> Result<()> {
        Ok(())
    }
    fn discard(&self, off: u64, len: u64) -> Result<bool> {
        let mut b = self.bytes.write();
        let total = b.len();
        let r = range(off, len as usize, total)?;
        b[r].fill(super::DISCARDED);
        Ok(true)
    }
    fn kind(&self) -> &'static str {
        "mem"
    }
}
