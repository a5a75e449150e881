//! Image files: choosing and opening the medium an image was made for, and the lock that keeps
//! two processes from using one image at once.

use crate::error::{FsError, Result};
use crate::superblock::{self, MediumKind};
use nodup_core::media::{
    file_system_type, fs_magic, BlockFile, BlockFileOptions, Medium, Pmem, PmemOptions,
};
use nodup_core::BLOCK_SIZE;
use std::fs::File;
use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;

/// The medium kind to use for a new image at `path`: pmem on tmpfs (or a DAX mount), else blockfile.
pub fn default_kind(path: &Path) -> MediumKind {
    use std::os::unix::ffi::OsStrExt;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return MediumKind::BlockFile;
    };
    // SAFETY: `c` is NUL terminated; `st` is a plain C struct filled by the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if r == 0 && st.f_type as i64 == fs_magic::TMPFS {
        return MediumKind::Pmem;
    }
    if is_dax_mount(dir) {
        MediumKind::Pmem
    } else {
        MediumKind::BlockFile
    }
}

fn is_dax_mount(dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else {
        return false;
    };
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    let mut best: Option<(usize, bool)> = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 4 {
            continue;
        }
        if dir.starts_with(f[1]) && best.is_none_or(|(l, _)| f[1].len() > l) {
            best = Some((f[1].len(), f[3].split(',').any(|o| o.starts_with("dax"))));
        }
    }
    best.is_some_and(|(_, dax)| dax)
}

/// Create a new image file of `len` bytes for `kind`; on a block device, the image takes the
/// whole device, whose whole 4 KiB blocks must be `len` bytes (a tail of a few sectors is left
/// unused), is zeroed ([`zero_device`]) and is used as a block file.
pub fn create(path: &Path, len: u64, kind: MediumKind) -> Result<Arc<dyn Medium>> {
    create_with_progress(path, len, kind, &mut |_| {})
}

/// [`create`], calling `progress` with the bytes of a block device zeroed so far (first with
/// 0, just before anything on the device changes).
pub fn create_with_progress(
    path: &Path,
    len: u64,
    kind: MediumKind,
    progress: &mut dyn FnMut(u64),
) -> Result<Arc<dyn Medium>> {
    if block_device_len(path)?.is_some() {
        if kind != MediumKind::BlockFile {
            return Err(FsError::Engine(nodup_core::Error::Invalid(format!(
                "{}: a block device holds a blockfile image, not {}",
                path.display(),
                kind.name()
            ))));
        }
        let dev = BlockFile::open(path, BlockFileOptions::default())?;
        let whole = dev.len() / BLOCK_SIZE as u64 * BLOCK_SIZE as u64;
        if whole != len {
            return Err(FsError::Engine(nodup_core::Error::Invalid(format!(
                "{}: the device has {whole} bytes of whole blocks, not {len}",
                path.display()
            ))));
        }
        zero_device(path, dev.len(), progress)?;
        return Ok(Arc::new(dev));
    }
    Ok(match kind {
        MediumKind::Pmem => Arc::new(Pmem::create(path, len)?),
        MediumKind::BlockFile => {
            Arc::new(BlockFile::create(path, len, BlockFileOptions::default())?)
        }
    })
}

/// Open an existing image with the medium recorded in its superblock (checked read-only first:
/// a file that is not a nodup image is rejected before anything opens it for writing).
pub fn open(path: &Path) -> Result<(Arc<dyn Medium>, MediumKind)> {
    open_with(path, false)
}

/// [`open`] for a mount: with `stream_data`, a pmem image's new data blocks are written with
/// non-temporal stores instead of stores + cache-line flushes (`PmemOptions::stream_data`;
/// `nodup mount --stream-data`, docs/choices.md). Block-file images ignore it. The third value
/// says how a pmem image's stores reach it (for the mount's log).
pub fn open_for_mount(
    path: &Path,
    stream_data: bool,
) -> Result<(Arc<dyn Medium>, MediumKind, Option<PmemStores>)> {
    let o = open_medium(path, false, stream_data)?;
    log_failed_before(path, o.failed_before.as_deref());
    Ok((o.medium, o.kind, o.stores))
}

/// How a pmem image's stores reach the medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmemStores {
    /// New data blocks with non-temporal stores (`--stream-data`).
    Streaming,
    /// Ordinary stores and cache-line flushes.
    Flushed,
    /// Ordinary stores, written back by `msync` at each fence (`page_cache`: the image is on a
    /// file system with a page cache in front of a disk; else the CPU has no flush instruction).
    Msynced { page_cache: bool },
}

impl PmemStores {
    /// What the mount's log says about it.
    pub fn describe(self) -> &'static str {
        match self {
            PmemStores::Streaming => "non-temporal stores (--stream-data)",
            PmemStores::Flushed => {
                "stores + cache-line flushes (--stream-data=false, or not available here)"
            }
            PmemStores::Msynced { page_cache: true } => {
                "stores, written back by msync at every fence: the image is on a file system \
                 with a page cache (not tmpfs or DAX), so what an fsync answers for is on the \
                 disk (blockfile is the medium made for disks)"
            }
            PmemStores::Msynced { page_cache: false } => {
                "stores, written back by msync at every fence (this CPU has no cache-line \
                 flush instruction)"
            }
        }
    }
}

/// [`open`], read-only when `read_only` (the file is opened without write access and every
/// store is refused), for checks that must leave the image byte-identical.
pub fn open_with(path: &Path, read_only: bool) -> Result<(Arc<dyn Medium>, MediumKind)> {
    let o = open_medium(path, read_only, false)?;
    log_failed_before(path, o.failed_before.as_deref());
    Ok((o.medium, o.kind))
}

/// [`open_with`] for a command without a log: the third value is the warning line about a
/// write-back that failed before this open (`media/write_back.rs`), for it to print.
pub fn open_reporting(
    path: &Path,
    read_only: bool,
) -> Result<(Arc<dyn Medium>, MediumKind, Option<String>)> {
    let o = open_medium(path, read_only, false)?;
    let line = o
        .failed_before
        .as_deref()
        .map(|e| failed_before_line(path, e));
    Ok((o.medium, o.kind, line))
}

/// An image's medium, opened.
struct Opened {
    medium: Arc<dyn Medium>,
    kind: MediumKind,
    stores: Option<PmemStores>,
    /// A write-back of the file that failed before this open, as the kernel reported it.
    failed_before: Option<String>,
}

fn failed_before_line(path: &Path, e: &str) -> String {
    format!(
        "{}: a write-back of the image failed before this open ({e}): the last changes of the \
         run that wrote it may not have reached it; this open reads what did",
        path.display()
    )
}

fn log_failed_before(path: &Path, e: Option<&str>) {
    if let Some(e) = e {
        crate::logging::warn(&failed_before_line(path, e));
    }
}

/// The image's medium as its superblock records it, read-only or not, pmem streaming new data
/// when asked.
fn open_medium(path: &Path, read_only: bool, stream_data: bool) -> Result<Opened> {
    // Only the medium kind, fixed at mkfs, is taken from this read through the page cache.
    let (sb, _, _) = superblock::probe_file(path)?;
    let kind = sb.medium_kind();
    let (medium, stores, failed_before): (Arc<dyn Medium>, _, _) = match (kind, read_only) {
        (MediumKind::Pmem, false) => {
            let opts = PmemOptions {
                stream_data,
                ..PmemOptions::default()
            };
            let p = Pmem::open_with(path, opts)?;
            let stores = if p.streams_data() {
                PmemStores::Streaming
            } else if p.syncs_on_fence() {
                PmemStores::Msynced {
                    page_cache: p.flush_instr() != nodup_core::media::FlushInstr::Msync,
                }
            } else {
                PmemStores::Flushed
            };
            let failed = p.write_back_failed_before_open().map(str::to_owned);
            (Arc::new(p), Some(stores), failed)
        }
        (MediumKind::Pmem, true) => {
            let p = Pmem::open_read_only(path)?;
            let failed = p.write_back_failed_before_open().map(str::to_owned);
            (Arc::new(p), None, failed)
        }
        (MediumKind::BlockFile, ro) => {
            let opts = BlockFileOptions {
                read_only: ro,
                keep_cache: true,
                ..BlockFileOptions::default()
            };
            let b = BlockFile::open(path, opts)?;
            // A cleanly closed image's cached pages are what its disk holds (see
            // `media/write_back.rs`): a remount keeps them warm. Any other image's are
            // dropped, so that its recovery reads what reached the disk.
            if !closed_cleanly(&b) {
                b.forget_cached_pages();
            }
            let failed = b.write_back_failed_before_open().map(str::to_owned);
            (Arc::new(b), None, failed)
        }
    };
    Ok(Opened {
        medium,
        kind,
        stores,
        failed_before,
    })
}

/// Whether both clean flags of the image on `m` say its last close was clean, as read through
/// the page cache: the file system's, and the engine's, which is set last at a close and
/// cleared first at an open (the file system's stays set into a mount until its first
/// checkpoint), so it is the one that catches a killed run.
fn closed_cleanly(m: &dyn Medium) -> bool {
    superblock::probe_medium(m).is_ok_and(|(sb, _, _)| sb.is_clean())
        && nodup_core::engine::superblock::Superblock::load(m).is_ok_and(|e| e.clean)
}

/// The engine superblock at the start of an image file, read without opening its medium: for
/// what mkfs fixed (policy, recorded memory budget), before a command takes the image's lock
/// (opening the medium writes back and drops the file's cached pages, which a mount that holds
/// the image would feel).
pub fn probe_engine_file(path: &Path) -> Result<nodup_core::engine::superblock::Superblock> {
    let len = match block_device_len(path)? {
        Some(len) => len,
        None => std::fs::metadata(path)?.len(),
    };
    let mut head = vec![0u8; nodup_core::engine::superblock::SB_SIZE];
    File::open(path)?.read_exact(&mut head)?;
    Ok(nodup_core::engine::superblock::Superblock::decode(
        &head, len,
    )?)
}

/// What a path given to mkfs holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Nothing there yet.
    Missing,
    /// A regular file without data (empty, or sparse with no data at all).
    Empty,
    /// A nodup image.
    Image,
    /// A regular file with data.
    Data,
    /// Something that is neither a regular file nor a block device (directory, character
    /// device, a symbolic link to a file, ...).
    NotFile,
}

/// Bytes of the head of a block device that must be zero for mkfs to take it as empty:
/// partition tables and the superblocks of the common file systems and volume managers all
/// lie within it.
const DEVICE_HEAD: usize = 1 << 20;

/// Whether the file system holding the image file at `path` can allocate space ahead of a
/// write (`fallocate` mode 0): where it cannot, a full disk meets the image's writes as they
/// are written back instead of failing them up front, and what an unmount writes has no
/// space kept for it (docs/operating.md). Probed on the image's first block, which is
/// allocated already (no data changes; ext4 and xfs update the file's times). It says whether
/// the call is supported, not whether a rewrite needs new space: on a copy-on-write file
/// system (btrfs, ZFS) it does anyway. `None` when it cannot be told (the file cannot be
/// opened for writing, another error); a block device needs no allocating (`Some(true)`).
pub fn allocates_ahead(path: &Path) -> Option<bool> {
    if block_device_len(path).ok()?.is_some() {
        return Some(true);
    }
    let f = std::fs::OpenOptions::new().write(true).open(path).ok()?;
    // SAFETY: fallocate on a descriptor `f` owns, inside the file's first block: its size
    // does not change.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, BLOCK_SIZE as i64) };
    if r == 0 {
        return Some(true);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EOPNOTSUPP | libc::ENOSYS) => Some(false),
        _ => None,
    }
}

/// The copy-on-write file system holding the image file at `path` (btrfs, ZFS, bcachefs), if
/// it is on one: there even a rewrite of a stored block needs new space when the kernel
/// writes it back, so a full disk can fail a write-back that no reservation foresaw (which
/// stops changes until the next mount). `None` elsewhere, for a block device, or when it
/// cannot be told.
pub fn copy_on_write_host(path: &Path) -> Option<&'static str> {
    if block_device_len(path).ok()?.is_some() {
        return None;
    }
    match file_system_type(&File::open(path).ok()?)? {
        fs_magic::BTRFS => Some("btrfs"),
        fs_magic::ZFS => Some("ZFS"),
        fs_magic::BCACHEFS => Some("bcachefs"),
        _ => None,
    }
}

/// What `nodup mkfs` notes and the mount warns of about the file system holding the image
/// at `path` (shown as `shown`): that it cannot allocate ahead ([`allocates_ahead`]), that it
/// is copy-on-write ([`copy_on_write_host`]). One line each; none for a plain file system.
pub fn host_warnings(path: &Path, shown: &str) -> Vec<String> {
    let mut v = Vec::new();
    if allocates_ahead(path) == Some(false) {
        v.push(format!("{shown}: {NO_ALLOCATE_AHEAD}"));
    }
    if let Some(cow) = copy_on_write_host(path) {
        v.push(format!("{shown} is on {cow}, {COPY_ON_WRITE_HOST}"));
    }
    v
}

/// What [`host_warnings`] says about an image on a copy-on-write file system, after its name.
const COPY_ON_WRITE_HOST: &str = "a copy-on-write file system: even a rewrite of data the \
    image holds needs new space there when it is written back, so a full disk can fail a \
    write-back, which stops changes until the next mount; keep room free there \
    (docs/operating.md)";

/// What [`host_warnings`] says about an image whose file system cannot allocate ahead.
const NO_ALLOCATE_AHEAD: &str = "the file system holding the image cannot allocate space \
    ahead of a write (fallocate is not supported there): a full disk is met by the writes \
    themselves or at write-back, which stops changes until the next mount, and an unmount may \
    be left to failure recovery (docs/operating.md)";

/// The length in bytes of the block device at `path` (following a link such as
/// /dev/disk/by-id/…), or `None` when `path` is not a block device.
pub fn block_device_len(path: &Path) -> Result<Option<u64>> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_block_device() => {}
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    // A device's length is where a seek to its end lands (its metadata says 0).
    Ok(Some(File::open(path)?.seek(SeekFrom::End(0))?))
}

/// Bytes zeroed per call on a device (the progress step).
const ZERO_STEP: u64 = 1 << 30;

/// Zero the first `len` bytes of the block device at `path`, so that a new image on it starts
/// as a new image file does, with nothing of what the device held before (format writes what
/// it reads at open, and numbers its log records apart from an older image's, but leaves the
/// rest as it finds it). The kernel's BLKZEROOUT (write-zeroes or unmap where the device has
/// them) is used, else plain writes of zeros.
pub fn zero_device(path: &Path, len: u64, progress: &mut dyn FnMut(u64)) -> Result<()> {
    use std::os::unix::fs::FileExt;
    // BLKZEROOUT = _IO(0x12, 127).
    const BLKZEROOUT: libc::c_ulong = (0x12 << 8) | 127;
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    // BLKZEROOUT drops the device's cached pages for the range, and while we hold the device
    // exclusively (`claim_device`) it can only invalidate them: a dirty page an earlier writer
    // left (an image copied onto the device a moment ago) makes it fail with EBUSY. Written
    // back first, none is dirty.
    f.sync_all()?;
    let mut done = 0u64;
    let mut by_ioctl = true;
    let mut busy = 0;
    let zeros = vec![0u8; 1 << 20];
    progress(0);
    while done < len {
        let n = (len - done).min(ZERO_STEP);
        if by_ioctl {
            let range: [u64; 2] = [done, n];
            // SAFETY: BLKZEROOUT reads a [start, length] pair of u64 from the pointer.
            let r = unsafe { libc::ioctl(f.as_raw_fd(), BLKZEROOUT, range.as_ptr()) };
            if r == 0 {
                done += n;
                progress(done);
                continue;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                // Not offered for this device (or a length it cannot take): write zeros.
                Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::EINVAL) => {
                    by_ioctl = false
                }
                // The kernel could not drop the device's cached pages for the range (one
                // dirtied since the sync above, or mapped by another process for a moment).
                // Try again for up to two seconds.
                Some(libc::EBUSY) if busy < 20 => {
                    busy += 1;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    continue;
                }
                _ => return Err(e.into()),
            }
        }
        let mut at = done;
        while at < done + n {
            let k = (done + n - at).min(zeros.len() as u64) as usize;
            f.write_all_at(&zeros[..k], at)?;
            at += k as u64;
        }
        done += n;
        progress(done);
    }
    f.sync_all()?;
    Ok(())
}

/// Look at an mkfs target without changing it. A block device is [`Target::Empty`] when its
/// first MiB is all zeros (nothing a partition table or file system would have left).
pub fn target(path: &Path) -> Result<Target> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Target::Missing),
        Err(e) => return Err(e.into()),
    };
    if let Some(len) = block_device_len(path)? {
        if superblock::probe_file(path).is_ok() {
            return Ok(Target::Image);
        }
        let mut head = vec![0u8; DEVICE_HEAD.min(len as usize)];
        File::open(path)?.read_exact(&mut head)?;
        return Ok(if head.iter().all(|&b| b == 0) {
            Target::Empty
        } else {
            Target::Data
        });
    }
    if !meta.file_type().is_file() {
        return Ok(Target::NotFile);
    }
    if meta.len() == 0 {
        return Ok(Target::Empty);
    }
    if superblock::probe_file(path).is_ok() {
        return Ok(Target::Image);
    }
    // A sparse file without any data extent holds nothing.
    let f = File::open(path)?;
    // SAFETY: lseek on a descriptor owned by `f`.
    let r = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
        return Ok(Target::Empty);
    }
    Ok(Target::Data)
}

/// Bytes available to an unprivileged writer in the file system holding `path` (or the
/// directory it will be created in), plus what `path` itself already occupies (an image that
/// is overwritten gives its space back).
pub fn free_space(path: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| FsError::Errno(libc::EINVAL))?;
    // SAFETY: `c` is NUL terminated; `st` is a plain C struct filled by the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        let e = std::io::Error::last_os_error();
        // Say which directory: the image's own name is what the caller prints.
        return Err(std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())).into());
    }
    let own = std::fs::metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0);
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64) + own)
}

/// Claim the block device at `path` for as long as the returned handle lives, as mkfs.ext4 and
/// the kernel's own mounts do (an `O_EXCL` open): refused with [`FsError::Busy`] while a file
/// system, an md or device-mapper member or another claimant holds it, and it keeps them off
/// while held. `None` when `path` is not a block device (a file has only [`ImageLock`]).
pub fn claim_device(path: &Path) -> Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    if block_device_len(path)?.is_none() {
        return Ok(None);
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Err(FsError::Busy(format!(
            "{}: the device is in use (mounted, or held by another program)",
            path.display()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// An exclusive advisory lock on an image (held by the mount daemon for its lifetime).
pub struct ImageLock {
    _file: File,
}

impl ImageLock {
    /// Try to lock `path`; `Busy` when another process holds it.
    pub fn try_lock(path: &Path) -> Result<ImageLock> {
        let file = File::open(path)?;
        // SAFETY: flock on a valid descriptor owned by `file`.
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(FsError::Busy(format!(
                    "{} is in use (mounted?)",
                    path.display()
                )));
            }
            return Err(e.into());
        }
        Ok(ImageLock { _file: file })
    }
}
