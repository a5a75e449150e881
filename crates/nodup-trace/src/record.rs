//! One trace record (an I/O request) and the geometry constants shared by every module.

/// Bytes per sector: FIU LBAs and sizes count 512-byte sectors.
pub const SECTOR_BYTES: u64 = 512;
/// Bytes per block: the dedup (and replay) unit.
pub const BLOCK_BYTES: u64 = 4096;
/// Sectors per 4 KiB block.
pub const SECTORS_PER_BLOCK: u64 = BLOCK_BYTES / SECTOR_BYTES;

/// Bound on `lba + sectors` (2^53 sectors = 4 EiB): keeps block numbers within the model's key.
pub const MAX_LBA_END: u64 = 1 << 53;

/// An MD5 digest as found in the trace.
pub type Digest = [u8; 16];

/// Whether a request reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// A read (`R` in FIU).
    Read,
    /// A write (`W` in FIU).
    Write,
}

/// What one digest of a record covers: the two FIU variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DigestUnit {
    /// One MD5 per 4 KiB of the request (mail, web-vm).
    Block,
    /// One MD5 per 512 B sector, concatenated (homes).
    Sector,
}

/// One trace record: a read or write of `sectors` sectors at `lba` of device `major:minor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Timestamp in nanoseconds.
    pub ts: u64,
    /// Issuing process id.
    pub pid: u32,
    /// Issuing process name.
    pub process: String,
    /// First sector (512 B units).
    pub lba: u64,
    /// Length in sectors (512 B units), at least 1.
    pub sectors: u32,
    /// Read or write.
    pub op: Op,
    /// Device major number.
    pub major: u32,
    /// Device minor number.
    pub minor: u32,
    /// What each digest covers.
    pub unit: DigestUnit,
    /// The digests, in request order.
    pub digests: Vec<Digest>,
}

impl Record {
    /// Number of digests a request of `sectors` sectors carries in the given variant.
    pub fn expected_digests(unit: DigestUnit, sectors: u32) -> usize {
        match unit {
            DigestUnit::Block => (sectors as usize).div_ceil(SECTORS_PER_BLOCK as usize),
            DigestUnit::Sector => sectors as usize,
        }
    }

    /// The device this record addresses.
    pub fn device(&self) -> (u32, u32) {
        (self.major, self.minor)
    }

    /// First 4 KiB block of the device touched by the request.
    pub fn first_block(&self) -> u64 {
        self.lba / SECTORS_PER_BLOCK
    }

    /// One past the last 4 KiB block touched by the request.
    pub fn end_block(&self) -> u64 {
        (self.lba + self.sectors as u64).div_ceil(SECTORS_PER_BLOCK)
    }

    /// Bytes the request transfers.
    pub fn bytes(&self) -> u64 {
        self.sectors as u64 * SECTOR_BYTES
    }
}
