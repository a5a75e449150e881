//! `nodup mkfs`: create an image, with the guard rails of `mkfs.ext4` and `zpool create`: an
//! existing image or file with data, or an image larger than the space that holds it, is
//! refused unless `--force`; a failed mkfs leaves nothing behind.

use super::size::{bytes, parse_size_or_zero};
use anyhow::{anyhow, bail, Result};
use clap::builder::PossibleValue;
use clap::Args;
use nodup_core::fingerprint::FpKind;
use nodup_core::meta::MetaLayoutKind;
use nodup_core::policy::PolicyKind;
use nodup_core::{FormatOptions, KeyFile};
use nodup_fs::image::{self, ImageLock, Target};
use nodup_fs::{Caller, FileSystem, FsOptions, MediumKind};
use std::path::{Path, PathBuf};

/// Smallest image.
pub const MIN_IMAGE: u64 = 4 << 20;
/// Largest image (the engine keeps a bit per block and the index in memory; beyond this the
/// DRAM it needs stops being reasonable, and ext4 files end at 16 TiB anyway).
pub const MAX_IMAGE: u64 = 16 << 40;

/// Policies the command line accepts.
pub fn policy_values() -> [PossibleValue; 6] {
    [
        PossibleValue::new("light").help("inline dedup, xxh3 + byte compare, prefetch (default)"),
        PossibleValue::new("none").help("no dedup (the baseline)"),
        PossibleValue::new("strong").help("sha256, trusted without compare"),
        PossibleValue::new("weak-verify").help("crc32c + byte compare, no prefetch"),
        PossibleValue::new("smart").help(
            "dedup in a fixed memory budget: inline + out-of-line, two-level fingerprint store",
        ),
        PossibleValue::new("selective").help(
            "FSDedup: ecc + byte compare, only hot fingerprints kept (LRCU cache with refresh), prefetch cache",
        ),
    ]
}

/// Arguments of `nodup mkfs`.
#[derive(Args)]
pub struct MkfsArgs {
    /// Image file to create, or a block device to format whole (refused when it holds data or
    /// an image, unless --force; a device must not be in use).
    pub image: PathBuf,
    /// Size of an image file: bytes or with a K/M/G/T suffix (e.g. 4G); 4 MiB to 16 TiB,
    /// rounded down to whole 4 KiB blocks. Required for a file; a block device's image takes
    /// the whole device.
    #[arg(long)]
    pub size: Option<String>,
    /// Dedup policy.
    #[arg(long, default_value = "light", value_parser = policy_values())]
    pub policy: String,
    /// Fingerprint function (default: sha256 for strong, crc32c for weak-verify, ecc for
    /// selective, else xxh3). One the policy would not use is refused: strong takes only
    /// sha256 or blake3, weak-verify no xxh3, selective only ecc or crc32c, none none.
    #[arg(long, value_parser = ["xxh3", "crc32c", "ecc", "sha256", "blake3"])]
    pub fingerprint: Option<String>,
    /// On-media dedup metadata layout (default: hashtable for smart, whose DRAM must not grow
    /// with unique data, as the region layout's per-region counters do; else region).
    #[arg(long, value_parser = ["region", "entry", "hashtable"])]
    pub meta_layout: Option<String>,
    /// Memory budget of the `smart` policy (fingerprint store, skipped buffer, read cache,
    /// worker), e.g. 3M; default 3.5M, at most the machine's memory. Recorded in the image;
    /// `mount` may override.
    #[arg(long, value_name = "SIZE")]
    pub mem_budget: Option<String>,
    /// Encrypt the image at rest (AES-256: XTS for data, CTR for metadata) with the key in
    /// FILE: 32 bytes of binary are the key, text is a passphrase (argon2id). Mount needs the same file.
    #[arg(long, value_name = "FILE")]
    pub encrypt_key_file: Option<PathBuf>,
    /// Medium the image is used as (default: pmem on tmpfs/DAX, else blockfile); recorded in the image.
    #[arg(long, value_parser = ["pmem", "blockfile"])]
    pub medium: Option<String>,
    /// Overwrite an existing image or file with data, and allow an image larger than the free
    /// space of the file system that holds it.
    #[arg(long, short = 'f')]
    pub force: bool,
}

/// Reject policies and options that are not built or mean nothing for the chosen policy.
pub fn check_policy_options(policy: &str, mem_budget: bool) -> Result<()> {
    if mem_budget && policy != "smart" {
        bail!("--mem-budget: policy {policy} keeps no memory budget (only smart does)");
    }
    Ok(())
}

/// Refuse a `--fingerprint` the policy would not use (it computes none, or replaces it by its
/// own), as other options that mean nothing for a policy are refused.
fn check_fingerprint(policy: PolicyKind, fp: FpKind) -> Result<()> {
    let p = nodup_core::policy::make_policy(policy, &Default::default())?;
    if p.never_dedups() {
        bail!(
            "--fingerprint {}: policy {} computes no fingerprint",
            fp.name(),
            policy.name()
        );
    }
    let used = p.fingerprint_for(fp);
    if used != fp {
        bail!(
            "--fingerprint {}: policy {} would use {} instead",
            fp.name(),
            policy.name(),
            used.name()
        );
    }
    Ok(())
}

/// The key file of `--encrypt-key-file`: 32 bytes of binary are a raw key, text (not empty, at
/// most 4 KiB) a passphrase (`KdfParams::for_key_file` decides).
pub fn read_key_file(path: &Path) -> Result<KeyFile> {
    use std::io::Read;
    let mut bytes = Vec::new();
    // At most one byte past the limit: a huge file (or /dev/zero) is refused, not read whole.
    std::fs::File::open(path)
        .and_then(|f| f.take(4097).read_to_end(&mut bytes))
        .map_err(|e| anyhow!("--encrypt-key-file {}: {e}", path.display()))?;
    if bytes.is_empty() || bytes.len() > 4096 {
        bail!(
            "--encrypt-key-file {}: {} bytes (a 32-byte binary key, or a passphrase of 1 to 4096 bytes)",
            path.display(),
            if bytes.len() > 4096 { "more than 4096".to_string() } else { bytes.len().to_string() }
        );
    }
    Ok(KeyFile(bytes))
}

/// A `--mem-budget` value: a size of at least `smart`'s minimum and at most this machine's
/// physical memory.
pub fn parse_budget(s: &str) -> Result<u64> {
    let b = parse_size_or_zero(s).map_err(|e| anyhow!("--mem-budget: {e}"))?;
    let min = nodup_core::policy::smart::MIN_BUDGET;
    if b < min {
        bail!(
            "--mem-budget {s}: too small, smart needs at least {}",
            bytes(min)
        );
    }
    // smart allocates the fingerprint store's share (about three quarters of the budget) when
    // the image is formatted or opened, so a budget beyond the machine's memory can never be
    // honoured: the allocation fails and aborts the process (mkfs would leave a half-made
    // image). The image's size is not the bound: a large image can use a large budget, and
    // would still abort on a small machine.
    if let Some(mem) = physical_memory() {
        if b > mem {
            bail!(
                "--mem-budget {s}: more than this machine's memory ({})",
                bytes(mem)
            );
        }
    }
    Ok(b)
}

/// Refuse to open the `smart` image at `path` with the memory budget recorded in it when that
/// is more than this machine's memory: the store's allocation would abort the process (an
/// image made on a larger machine, or a forged superblock). Other policies record none.
pub fn check_recorded_budget(path: &Path) -> Result<()> {
    let sb =
        nodup_fs::image::probe_engine_file(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let budget = sb.params.mem_budget;
    if sb.policy != PolicyKind::Smart {
        return Ok(());
    }
    match physical_memory() {
        Some(mem) if budget > mem => bail!(
            "{}: its smart memory budget ({}) is more than this machine's memory ({}); mount it with --mem-budget SIZE",
            path.display(),
            bytes(budget),
            bytes(mem)
        ),
        _ => Ok(()),
    }
}

/// This machine's physical memory in bytes (None when sysconf cannot tell).
fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf only reads system parameters.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let (pages, size) = (u64::try_from(pages).ok()?, u64::try_from(size).ok()?);
    pages.checked_mul(size).filter(|&m| m > 0)
}

/// `nodup mkfs`.
pub fn mkfs(a: MkfsArgs) -> Result<()> {
    check_policy_options(&a.policy, a.mem_budget.is_some())?;
    // Checked before anything is created or overwritten.
    let mem_budget = match &a.mem_budget {
        Some(b) => parse_budget(b)?,
        None => 0,
    };
    // Read before anything is created: a bad key file leaves nothing behind.
    if let Some(p) = &a.encrypt_key_file {
        read_key_file(p)?;
    }
    let img = a.image.display();
    let device =
        image::block_device_len(&a.image).map_err(|e| anyhow!("{img}: {}", super::plain(&e)))?;
    let size = match (&a.size, device) {
        (None, None) => bail!("--size is required for an image file (e.g. --size 4G)"),
        (Some(s), None) => parse_size_or_zero(s).map_err(|e| anyhow!("--size: {e}"))?,
        (None, Some(len)) => len,
        (Some(s), Some(len)) => {
            let asked = parse_size_or_zero(s).map_err(|e| anyhow!("--size: {e}"))?;
            if asked / 4096 != len / 4096 {
                bail!(
                    "--size {s}: an image on a block device takes the whole device ({}); leave --size out",
                    bytes(len)
                );
            }
            len
        }
    };
    let what = if device.is_some() {
        "the device"
    } else {
        "--size"
    };
    let shown = a.size.clone().unwrap_or_else(|| bytes(size));
    if size < MIN_IMAGE {
        bail!(
            "{what} {shown}: too small, an image needs at least {}",
            bytes(MIN_IMAGE)
        );
    }
    if size > MAX_IMAGE {
        bail!(
            "{what} {shown}: nodup images are limited to {}",
            bytes(MAX_IMAGE)
        );
    }
    // An image is whole 4 KiB blocks. A size between two is rounded down, never up: the image
    // then never takes more than was asked (a quota or a partition planned for that size
    // holds), and less than a block is not worth refusing the command for (mkfs.ext4 too uses
    // the whole blocks of a device that is not a multiple of its block size). The made line
    // says so, so the figure in it is not a surprise.
    let asked = size;
    let size = size / 4096 * 4096;
    let rounded = if size != asked {
        ", rounded down to whole 4 KiB blocks"
    } else {
        ""
    };
    let policy =
        PolicyKind::from_name(&a.policy).ok_or_else(|| anyhow!("unknown policy {}", a.policy))?;
    let fp_name = a.fingerprint.clone().unwrap_or_else(|| {
        match policy {
            PolicyKind::Strong => "sha256",
            PolicyKind::WeakVerify => "crc32c",
            PolicyKind::Selective => "ecc",
            _ => "xxh3",
        }
        .to_string()
    });
    let fingerprint =
        FpKind::from_name(&fp_name).ok_or_else(|| anyhow!("unknown fingerprint {fp_name}"))?;
    if policy == PolicyKind::Selective && !matches!(fingerprint, FpKind::Ecc | FpKind::Crc32c) {
        bail!("--fingerprint {fp_name}: selective uses a similarity fingerprint, ecc (default) or crc32c");
    }
    if a.fingerprint.is_some() {
        check_fingerprint(policy, fingerprint)?;
    }
    let meta_layout = match a.meta_layout.as_deref() {
        Some(n) => MetaLayoutKind::from_name(n).ok_or_else(|| anyhow!("unknown layout {n}"))?,
        None => MetaLayoutKind::default_for(policy),
    };
    let kind = match a.medium.as_deref() {
        // A device is not a file to map: pmem is an image file on tmpfs or DAX.
        Some("pmem") if device.is_some() => {
            bail!("--medium pmem: a block device holds a blockfile image (pmem maps an image file on tmpfs or DAX)")
        }
        Some("pmem") => MediumKind::Pmem,
        Some("blockfile") => MediumKind::BlockFile,
        // /dev is a tmpfs, which would pick pmem.
        _ if device.is_some() => MediumKind::BlockFile,
        _ => image::default_kind(&a.image),
    };
    let existed = check_target(&a.image, a.force)?;
    // Held until the device is formatted: nothing mounts it meanwhile.
    let _claim = super::mount::claim_device(&a.image)?;
    let free = match device {
        // The device is the space: nothing else to fill.
        Some(len) => len,
        None => image::free_space(&a.image).map_err(|e| anyhow!("{img}: {}", super::plain(&e)))?,
    };
    if size > free && !a.force {
        bail!(
            "{img}: a {} image does not fit in the {} free where it would live (writes would \
             fail once it fills; --force to make it anyway)",
            bytes(size),
            bytes(free)
        );
    }
    let encrypt = a
        .encrypt_key_file
        .as_deref()
        .map(read_key_file)
        .transpose()?;
    let fopts = FormatOptions {
        policy,
        fingerprint,
        meta_layout,
        mem_budget,
        encrypt,
        ..FormatOptions::default()
    };
    // SAFETY: getuid/getgid cannot fail.
    let owner = unsafe {
        Caller {
            uid: libc::getuid(),
            gid: libc::getgid(),
            umask: 0,
        }
    };
    // Zeroing a large device takes a while: show it on a terminal.
    let pb =
        device.and_then(|_| super::progress_bar(size, "zeroing {bar:40} {bytes}/{total_bytes}"));
    // Whether anything on a device was changed yet (the zeroing says so before it starts).
    let mut touched = false;
    let made = (|| -> Result<()> {
        let medium = image::create_with_progress(&a.image, size, kind, &mut |done| {
            touched = true;
            if let Some(pb) = &pb {
                pb.set_position(done);
            }
        })?;
        if let Some(pb) = &pb {
            pb.finish_and_clear();
        }
        let fs = FileSystem::format(medium, kind, &fopts, &FsOptions::default(), owner)?;
        fs.shutdown()?;
        Ok(())
    })();
    if let Err(e) = made {
        if device.is_some() {
            // Once zeroing began, no half-made image opens: the zeroing starts at block 0, and
            // the format clears its superblock before anything else.
            let now = if touched {
                "the device holds no usable image now"
            } else {
                "the device was not changed"
            };
            bail!("formatting {img}: {}; {now}", super::plain_error(&e));
        }
        // Nothing half-made stays behind (what was there before --force is gone either way).
        let _ = std::fs::remove_file(&a.image);
        let what = if existed { "overwriting" } else { "creating" };
        bail!("{what} {img}: {}", super::plain_error(&e));
    }
    for w in image::host_warnings(&a.image, &img.to_string()) {
        eprintln!("nodup: note: {w}");
    }
    if kind == MediumKind::Pmem && nodup_core::media::Pmem::would_sync_on_fence(&a.image) {
        eprintln!(
            "nodup: note: {img} is a pmem image on a file system with a page cache (not tmpfs \
             or DAX): every write is made durable before it returns by msync, which makes small \
             writes slow unless it is mounted with --writeback-cache (docs/operating.md); \
             blockfile is the medium made for disks"
        );
    }
    println!(
        "nodup: made {img} ({}{}{rounded}, policy {}, fingerprint {}, layout {}, medium {}{})",
        if device.is_some() {
            "block device, "
        } else {
            ""
        },
        bytes(size),
        policy.name(),
        fingerprint.name(),
        meta_layout.name(),
        kind.name(),
        match &fopts.encrypt {
            None => "",
            Some(k) if k.0.len() == 32 => ", encrypted, raw key",
            Some(_) => ", encrypted, passphrase",
        }
    );
    Ok(())
}

/// Check what is at `path` before mkfs writes there; returns whether something existed.
fn check_target(path: &Path, force: bool) -> Result<bool> {
    let p = path.display();
    let t = image::target(path).map_err(|e| anyhow!("{p}: {}", super::plain(&e)))?;
    match t {
        Target::Missing => return Ok(false),
        Target::NotFile => bail!("{p}: exists and is not a regular file or block device"),
        Target::Empty => {}
        Target::Image if !force => {
            bail!("{p}: already holds a nodup image (--force to overwrite it and everything in it)")
        }
        Target::Data if !force => {
            bail!("{p}: is not empty and not a nodup image (--force to overwrite it)")
        }
        Target::Image | Target::Data => {}
    }
    ImageLock::try_lock(path).map_err(|_| anyhow!("{p}: image is mounted"))?;
    Ok(true)
}
