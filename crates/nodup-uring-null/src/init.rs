//! The INIT handshake, always over the classic /dev/fuse read/write path: what the kernel
//! offers, what we take (nodup's capability set, optionally the writeback cache and the ring),
//! and the reply.

use crate::abi::{self, init_flags as f, Wire};
use std::fs::File;
use std::io::{self, Read, Write};

/// Largest WRITE (and READ) payload, as nodup's `MAX_WRITE`.
pub const MAX_WRITE: u32 = 1 << 20;
/// Requests the kernel may have in flight in the background (as nodup sets it).
const MAX_BACKGROUND: u16 = 64;
/// Size of a classic read buffer: the largest WRITE plus its headers, with room to spare.
pub const READ_BUF: usize = MAX_WRITE as usize + 4096;

/// What the daemon asks for at INIT.
#[derive(Debug, Clone, Copy)]
pub struct Wanted {
    /// Let the kernel cache writes (FUSE_WRITEBACK_CACHE).
    pub writeback_cache: bool,
    /// Serve requests over io_uring (FUSE_OVER_IO_URING).
    pub uring: bool,
}

/// The outcome of INIT.
#[derive(Debug, Clone, Copy)]
pub struct Negotiated {
    /// Protocol minor version in use.
    pub minor: u32,
    /// Flags both sides agreed on.
    pub flags: u64,
}

fn flags_for(w: Wanted) -> u64 {
    // nodup's set (crates/nodup-fs/src/fuse/ops.rs `init`) plus what fuser adds by default.
    let mut flags = f::ASYNC_READ
        | f::BIG_WRITES
        | f::MAX_PAGES
        | f::PARALLEL_DIROPS
        | f::DO_READDIRPLUS
        | f::HANDLE_KILLPRIV_V2
        | f::EXPORT_SUPPORT
        | f::POSIX_ACL
        | f::DONT_MASK
        | f::INIT_EXT;
    if w.writeback_cache {
        flags |= f::WRITEBACK_CACHE;
    }
    if w.uring {
        flags |= f::OVER_IO_URING;
    }
    flags
}

fn err(msg: String) -> io::Error {
    io::Error::other(msg)
}

/// Read the kernel's INIT from `dev` and answer it. Fails when the kernel speaks another
/// major version or does not offer what `wanted` requires (the ring: `enable_uring`=N).
pub fn handshake(mut dev: &File, wanted: Wanted) -> io::Result<Negotiated> {
    let mut buf = vec![0u8; READ_BUF];
    let n = loop {
        match dev.read(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    };
    let h =
        abi::InHeader::read(&buf[..n]).ok_or_else(|| err(format!("short request ({n} bytes)")))?;
    if h.opcode != abi::op::INIT {
        return Err(err(format!("expected INIT, got opcode {}", h.opcode)));
    }
    let init = abi::InitIn::read(&buf[40..n]).ok_or_else(|| err("short INIT".into()))?;
    if init.major != abi::KERNEL_VERSION {
        return Err(err(format!(
            "kernel speaks FUSE {}.{}",
            init.major, init.minor
        )));
    }
    let offered = u64::from(init.flags) | (u64::from(init.flags2) << 32);
    let want = flags_for(wanted);
    if wanted.uring && offered & f::OVER_IO_URING == 0 {
        return Err(err(
            "the kernel does not offer FUSE over io_uring (is /sys/module/fuse/parameters/enable_uring Y?)".into(),
        ));
    }
    let flags = want & offered;
    let minor = init.minor.min(abi::KERNEL_MINOR_VERSION);
    let out = abi::InitOut {
        major: abi::KERNEL_VERSION,
        minor,
        max_readahead: init.max_readahead.min(MAX_WRITE),
        flags: flags as u32,
        max_background: MAX_BACKGROUND,
        congestion_threshold: MAX_BACKGROUND * 3 / 4,
        max_write: MAX_WRITE,
        time_gran: 1,
        max_pages: (MAX_WRITE / 4096) as u16,
        flags2: (flags >> 32) as u32,
        ..Default::default()
    };
    let head = abi::OutHeader {
        len: (16 + out.bytes().len()) as u32,
        error: 0,
        unique: h.unique,
    };
    let mut reply = head.bytes().to_vec();
    reply.extend_from_slice(out.bytes());
    dev.write_all(&reply)?;
    Ok(Negotiated { minor, flags })
}
