//! FITRIM, the ioctl of `fstrim MOUNTPOINT`: free space given back to what holds the image
//! while mounted ([`FileSystem::trim`](crate::fs::FileSystem::trim)). The kernel forwards it
//! to us as a restricted ioctl, the `fstrim_range` in and out.

use super::caller::has_sys_admin;
use super::{err, Adapter};
use fuser::{Errno, Request};

/// `_IOWR('X', 121, struct fstrim_range)` (linux/fs.h; the libc crate does not name it).
pub(super) const FITRIM: u32 = 0xc018_5879;

/// `struct fstrim_range`: start, len and minlen, u64 each, in bytes of the image.
const RANGE_SIZE: usize = 24;

impl Adapter {
    /// Answer a FITRIM on any inode of the mount: CAP_SYS_ADMIN only (as every Linux file
    /// system asks); the range's `len` comes back as the bytes given back.
    pub(super) fn fitrim(
        &self,
        req: &Request,
        input: &[u8],
        out_size: u32,
    ) -> Result<Vec<u8>, Errno> {
        if !has_sys_admin(req) {
            return Err(Errno::EPERM);
        }
        let Some(range) = input.get(..RANGE_SIZE) else {
            return Err(Errno::EINVAL);
        };
        if (out_size as usize) < RANGE_SIZE {
            return Err(Errno::EINVAL);
        }
        let field = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&range[8 * i..8 * i + 8]);
            u64::from_le_bytes(w)
        };
        let (start, len, min) = (field(0), field(1), field(2));
        let given = self.fs.trim(start, len, min).map_err(err)?;
        crate::logging::info(&format!(
            "fstrim: gave {} MiB of free space back to what holds the image",
            given >> 20
        ));
        let mut out = range.to_vec();
        out[8..16].copy_from_slice(&given.to_le_bytes());
        Ok(out)
    }
}
