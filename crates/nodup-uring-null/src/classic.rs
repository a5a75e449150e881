//! The classic transport: a thread blocks in read(2) on its /dev/fuse descriptor, gets one
//! whole request, and answers with one write(2). Used for the `--classic` mode and, in ring
//! mode, for what the kernel still sends that way (FORGET, INTERRUPT). With a [`Sink`], WRITE
//! data goes through one of the reference data paths of [`crate::sink`].

use crate::abi::{self, Wire};
use crate::init::{MAX_WRITE, READ_BUF};
use crate::nullfs::{NullFs, Reply};
use crate::sink::{Sink, SinkKind};
use crate::{Served, Via};
use std::fs::File;
use std::io::{self, IoSlice, Read, Write};

/// READ replies point into this instead of filling a buffer.
static ZEROS: [u8; MAX_WRITE as usize] = [0; MAX_WRITE as usize];

/// Serve requests from `dev` until the connection ends (unmount: ENODEV). `served` counts the
/// requests handled.
pub fn serve(dev: &File, fs: &NullFs, served: &Served) -> io::Result<()> {
    serve_into(dev, fs, served, None)
}

/// [`serve`], with WRITE data given to `sink` (none: discarded).
pub fn serve_into(
    mut dev: &File,
    fs: &NullFs,
    served: &Served,
    mut sink: Option<Sink>,
) -> io::Result<()> {
    let (mut map, start) = request_buffer()?;
    let buf = &mut map[start..start + READ_BUF];
    loop {
        // A WRITE read by `read_landing` is fingerprinted already: its fold.
        let mut landed = None;
        let got = match sink.as_mut() {
            Some(s) if s.kind() == SinkKind::Land => read_landing(dev, s, buf, &mut landed),
            _ => dev.read(buf),
        };
        let n = match got {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                // ENOENT: the request was interrupted before we read it.
                Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                Some(libc::ENODEV) => return Ok(()),
                _ => return Err(e),
            },
        };
        let Some(h) = abi::InHeader::read(&buf[..n]) else {
            return Err(io::Error::other(format!("short request ({n} bytes)")));
        };
        if let Some(s) = sink.as_mut() {
            if h.opcode == abi::op::WRITE && n > WRITE_HEAD {
                let fold = match landed.take() {
                    Some(f) => f,
                    None => s.take(&buf[WRITE_HEAD..n])?,
                };
                served.note_sink(fold, (n - WRITE_HEAD) as u64);
            }
        }
        let body = &buf[40..n.min(h.len as usize).max(40)];
        let (op_in, extra) = body.split_at(abi::op_in_size(h.opcode).min(body.len()));
        let reply = fs.handle(&h, op_in, extra);
        served.note(Via::Classic, h.opcode);
        if !send(dev, h.unique, &reply)? {
            return Ok(());
        }
    }
}

/// Bytes of a WRITE request before its data: the header and `fuse_write_in`, 40 bytes each
/// (protocol 7.9 and later: Linux 2.6.26 on).
const WRITE_HEAD: usize = 80;

/// The request buffer: on a transparent huge page, as nodup's (`nodup_fs::fuse::request_buffer`
/// says why), so the null measured here has what nodup has. The mapping is one huge page
/// longer than the buffer; the buffer is the [`READ_BUF`] bytes from the offset returned, its
/// first 2 MiB boundary.
fn request_buffer() -> io::Result<(memmap2::MmapMut, usize)> {
    const HUGE: usize = 2 << 20;
    let map = memmap2::MmapMut::map_anon(READ_BUF.div_ceil(HUGE) * HUGE + HUGE)?;
    let start = (map.as_ptr() as usize).next_multiple_of(HUGE) - map.as_ptr() as usize;
    // Advice only: on 4 KiB pages the buffer works the same, a little slower.
    let _ = map.advise_range(memmap2::Advice::HugePage, start, map.len() - start);
    Ok((map, start))
}

/// Read one request for a `land` sink: readv(2) with the first [`WRITE_HEAD`] bytes into `buf`
/// and the rest into the sink's next slot, so a WRITE's data lands there and is fingerprinted
/// in place. Another request's body is copied back behind its head in `buf`. A WRITE's data
/// is then not in `buf` (the handler only checks its length), and `landed` gets its fold.
fn read_landing(
    dev: &File,
    sink: &mut Sink,
    buf: &mut [u8],
    landed: &mut Option<u64>,
) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let (head, rest) = buf.split_at_mut(WRITE_HEAD);
    let slot = sink.slot(MAX_WRITE as usize);
    let iov = [
        libc::iovec {
            iov_base: head.as_mut_ptr().cast(),
            iov_len: head.len(),
        },
        libc::iovec {
            iov_base: slot.as_mut_ptr().cast(),
            iov_len: slot.len(),
        },
    ];
    // SAFETY: two valid, disjoint, writable buffers of the lengths given.
    let r = unsafe { libc::readv(dev.as_raw_fd(), iov.as_ptr(), 2) };
    let n = usize::try_from(r).map_err(|_| io::Error::last_os_error())?;
    let body = n.saturating_sub(WRITE_HEAD);
    if abi::InHeader::read(head).is_some_and(|h| h.opcode == abi::op::WRITE) {
        *landed = Some(sink.landed(body));
    } else {
        let slot = sink.slot(MAX_WRITE as usize);
        // The kernel sends at most 80 + max_write bytes, which both buffers hold.
        let body = body.min(slot.len()).min(rest.len());
        rest[..body].copy_from_slice(&slot[..body]);
    }
    Ok(n)
}

/// Write one reply; false when the connection is gone.
fn send(mut dev: &File, unique: u64, reply: &Reply) -> io::Result<bool> {
    let (error, data): (i32, &[u8]) = match reply {
        Reply::None => return Ok(true),
        Reply::Err(e) => (-e, &[]),
        Reply::Body(b) => (0, b.bytes()),
        Reply::Zeros(n) => (0, &ZEROS[..*n]),
    };
    let head = abi::OutHeader {
        len: (16 + data.len()) as u32,
        error,
        unique,
    };
    // /dev/fuse takes a reply in one write (writev here), or not at all.
    match dev.write_vectored(&[IoSlice::new(head.bytes()), IoSlice::new(data)]) {
        Ok(n) if n == head.len as usize => Ok(true),
        Ok(n) => Err(io::Error::other(format!(
            "short reply write ({n} of {})",
            head.len
        ))),
        Err(e) => match e.raw_os_error() {
            // The request was interrupted and is gone: nothing to answer.
            Some(libc::ENOENT) => Ok(true),
            Some(libc::ENODEV) => Ok(false),
            _ => Err(e),
        },
    }
}
