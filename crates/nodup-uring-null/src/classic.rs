//! The classic transport: a thread blocks in read(2) on its /dev/fuse descriptor, gets one
//! whole request, and answers with one write(2). Used for the `--classic` mode and, in ring
//! mode, for what the kernel still sends that way (FORGET, INTERRUPT).

use crate::abi::{self, Wire};
use crate::init::{MAX_WRITE, READ_BUF};
use crate::nullfs::{NullFs, Reply};
use crate::{Served, Via};
use std::fs::File;
use std::io::{self, IoSlice, Read, Write};

/// READ replies point into this instead of filling a buffer.
static ZEROS: [u8; MAX_WRITE as usize] = [0; MAX_WRITE as usize];

/// Serve requests from `dev` until the connection ends (unmount: ENODEV). `served` counts the
/// requests handled.
pub fn serve(mut dev: &File, fs: &NullFs, served: &Served) -> io::Result<()> {
    let mut buf = vec![0u8; READ_BUF];
    loop {
        let n = match dev.read(&mut buf) {
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
        let body = &buf[40..n.min(h.len as usize).max(40)];
        let (op_in, extra) = body.split_at(abi::op_in_size(h.opcode).min(body.len()));
        let reply = fs.handle(&h, op_in, extra);
        served.note(Via::Classic, h.opcode);
        if !send(dev, h.unique, &reply)? {
            return Ok(());
        }
    }
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
