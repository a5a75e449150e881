//! The FUSE-over-io_uring transport (Linux 6.14+): one queue per possible CPU, each served by a
//! thread pinned to that CPU with its own io_uring (128-byte SQEs). Each queue registers
//! `depth` entries — a header buffer ([`abi::UringReqHeader`]) and a payload buffer — with
//! `FUSE_IO_URING_CMD_REGISTER`; the command completes when the kernel has copied a request
//! into them; the reply goes back into the same buffers and `COMMIT_AND_FETCH` hands the entry
//! back for the next request. A request is queued on the ring of the CPU its caller runs on.

use crate::abi::{self, Wire};
use crate::nullfs::{NullFs, Reply};
use crate::sink::Sink;
use crate::{Served, Via};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::alloc::{self, Layout};
use std::io;
use std::mem::size_of;
use std::os::fd::RawFd;
use std::ptr::NonNull;

/// How the ring runs the kernel's task work (the copy of a request into our buffers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TaskRun {
    /// io_uring's default: task work interrupts the thread (as libfuse sets it up).
    Default,
    /// IORING_SETUP_COOP_TASKRUN | TASKRUN_FLAG: task work waits for the next syscall.
    Coop,
    /// IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN: task work runs only while we wait for CQEs.
    Defer,
}

/// One queue's parameters.
#[derive(Debug, Clone, Copy)]
pub struct QueueSetup {
    /// Queue index = the CPU it serves.
    pub qid: u16,
    /// Ring entries (requests the queue can hold at once).
    pub depth: usize,
    /// Payload buffer size per entry (at least the connection's max_write).
    pub payload: usize,
    /// Task-work mode of the ring.
    pub taskrun: TaskRun,
    /// Pin the queue's thread to its CPU (the usual design: the request's copy and its
    /// handling stay on the CPU that issued it).
    pub pin: bool,
}

/// A page-aligned zeroed buffer the kernel writes into while we do not look: it is only ever
/// accessed through raw pointers, and only while its entry is ours (between a CQE and the next
/// SQE), so no Rust reference to it is alive while the kernel owns it.
struct KernelBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl KernelBuf {
    fn new(len: usize) -> io::Result<Self> {
        let layout = Layout::from_size_align(len.max(1), 4096).map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(KernelBuf { ptr, layout })
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for KernelBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; `serve_queue` drops buffers only after
        // every entry's command has completed, so the kernel holds no pointer into it.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// One ring entry: its buffers and the iovec pair REGISTER points at.
struct Entry {
    header: KernelBuf,
    payload: KernelBuf,
    iov: Box<[libc::iovec; 2]>,
}

/// Set `sqe->len` of a 128-byte SQE: the crate's `UringCmd80` builder has no setter for it, and
/// REGISTER requires it to be 2 (the iovec count).
fn set_sqe_len(e: &mut squeue::Entry128, len: u32) {
    const LEN_OFFSET: usize = 24; // struct io_uring_sqe: opcode..fd (8), off (8), addr (8), len
    const _: () = assert!(size_of::<squeue::Entry128>() == 128);
    let p = (e as *mut squeue::Entry128).cast::<u8>();
    // SAFETY: Entry128 is #[repr(C)] (a struct io_uring_sqe followed by 64 command bytes), 128
    // bytes of plain data, so offset 24..28 lies inside it and is the kernel ABI's `len`
    // (`sqe_len_lands_in_the_sqe` checks the layout against the builder's own fields).
    unsafe { p.add(LEN_OFFSET).cast::<u32>().write_unaligned(len) }
}

/// A ring command on the registered /dev/fuse descriptor (fixed file 0).
fn uring_cmd(
    cmd_op: u32,
    qid: u16,
    commit_id: u64,
    idx: usize,
    iov: Option<&[libc::iovec; 2]>,
) -> squeue::Entry128 {
    let req = abi::UringCmdReq {
        qid,
        commit_id,
        ..Default::default()
    };
    let mut cmd = [0u8; 80];
    cmd[..size_of::<abi::UringCmdReq>()].copy_from_slice(req.bytes());
    let mut e = opcode::UringCmd80::new(types::Fixed(0), cmd_op)
        .cmd(cmd)
        .addr(iov.map(|v| v.as_ptr() as u64))
        .build()
        .user_data(idx as u64);
    if iov.is_some() {
        set_sqe_len(&mut e, 2);
    }
    e
}

fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays within it for cpu < CPU_SETSIZE
    // (checked); sched_setaffinity reads size_of::<cpu_set_t>() bytes from it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Answer the request the kernel put into entry `e`, leaving the reply in its buffers; returns
/// the commit id to send back.
///
/// # Safety
/// The entry's command must have completed (the kernel does not touch its buffers until the
/// next command for it is submitted).
unsafe fn answer(
    e: &Entry,
    fs: &NullFs,
    served: &Served,
    sink: Option<&mut Sink>,
) -> io::Result<u64> {
    // SAFETY: the header buffer is page-aligned and at least size_of::<UringReqHeader>() bytes
    // (see `serve_queue`), UringReqHeader is plain bytes/integers, and per the contract nothing
    // else accesses it now.
    let hdr = unsafe { &mut *e.header.ptr.as_ptr().cast::<abi::UringReqHeader>() };
    // SAFETY: as above, for the payload buffer's `len()` bytes.
    let payload =
        unsafe { std::slice::from_raw_parts_mut(e.payload.ptr.as_ptr(), e.payload.len()) };
    let commit_id = hdr.ent.commit_id;
    let h = abi::InHeader::read(&hdr.in_out).unwrap_or_default();
    let op_len = abi::op_in_size(h.opcode).min(abi::URING_OP_IN_OUT_SZ);
    let in_sz = (hdr.ent.payload_sz as usize).min(payload.len());
    served.note(Via::Ring, h.opcode);
    if let Some(s) = sink {
        if h.opcode == abi::op::WRITE && in_sz > 0 {
            let fold = s.take(&payload[..in_sz])?;
            served.note_sink(fold, in_sz as u64);
        }
    }
    let reply = if h.unique == 0 {
        Reply::Err(libc::EIO)
    } else {
        fs.handle(&h, &hdr.op_in[..op_len], &payload[..in_sz])
    };
    let (error, out_sz) = match reply {
        // No opcode without a reply comes over the ring; commit an empty one all the same so
        // the entry returns to the kernel.
        Reply::None => (0, 0),
        Reply::Err(e) => (-e, 0),
        Reply::Body(b) => {
            payload[..b.bytes().len()].copy_from_slice(b.bytes());
            (0, b.bytes().len())
        }
        Reply::Zeros(n) => {
            let n = n.min(payload.len());
            payload[..n].fill(0);
            (0, n)
        }
    };
    let out = abi::OutHeader {
        len: (16 + out_sz) as u32,
        error,
        unique: h.unique,
    };
    hdr.in_out[..16].copy_from_slice(out.bytes());
    hdr.ent.payload_sz = out_sz as u32;
    Ok(commit_id)
}

/// Errors that mean the connection is gone (unmount or abort): the entry is retired.
fn is_teardown(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV
    )
}

/// Serve queue `setup.qid` on connection `fd` until unmount. `registered` is called once the
/// entries are registered (or failed to). `served` counts the requests handled.
pub fn serve_queue(
    fd: RawFd,
    setup: QueueSetup,
    fs: &NullFs,
    served: &Served,
    mut sink: Option<Sink>,
    registered: impl FnOnce(io::Result<()>),
) -> io::Result<()> {
    let mut registered = Some(registered);
    let mut report = |r: io::Result<()>| {
        if let Some(f) = registered.take() {
            f(r)
        }
    };
    let entries = match start(fd, setup) {
        Ok(x) => x,
        Err(e) => {
            report(Err(io::Error::new(e.kind(), e.to_string())));
            return Err(e);
        }
    };
    let (mut ring, ents) = entries;
    // Freed only on the clean exit (every command completed). On an error the kernel may
    // still write into the buffers: they are abandoned (the process is about to exit).
    let ents = std::mem::ManuallyDrop::new(ents);
    let (submitter, mut sq, mut cq) = ring.split();
    // REGISTER is issued inline by io_uring_enter: a refusal is already in the CQ now.
    cq.sync();
    let mut live = ents.len();
    let mut first = true;
    loop {
        for cqe in &mut cq {
            let idx = cqe.user_data() as usize;
            let res = cqe.result();
            let Some(e) = ents.get(idx) else {
                continue;
            };
            if res < 0 {
                if matches!(-res, libc::EAGAIN | libc::EINTR) {
                    // Not taken: register the entry again (only REGISTER can see these).
                    let sqe = uring_cmd(abi::URING_CMD_REGISTER, setup.qid, 0, idx, Some(&e.iov));
                    // SAFETY: the iovecs and the buffers they describe live in `ents` until
                    // every command has completed (we return only when `live` is 0).
                    unsafe { sq.push(&sqe) }.map_err(|_| io::Error::other("SQ full"))?;
                    continue;
                }
                live -= 1;
                if is_teardown(-res) {
                    continue;
                }
                let err = io::Error::from_raw_os_error(-res);
                report(Err(io::Error::new(
                    err.kind(),
                    format!("queue {}: {err}", setup.qid),
                )));
                return Err(err);
            }
            // SAFETY: this CQE completed the entry's command.
            let commit_id = unsafe { answer(e, fs, served, sink.as_mut()) }?;
            let sqe = uring_cmd(
                abi::URING_CMD_COMMIT_AND_FETCH,
                setup.qid,
                commit_id,
                idx,
                None,
            );
            // SAFETY: the entry's buffers were registered and stay alive (see above).
            unsafe { sq.push(&sqe) }.map_err(|_| io::Error::other("SQ full"))?;
        }
        if first {
            first = false;
            report(Ok(()));
        }
        if live == 0 {
            drop(std::mem::ManuallyDrop::into_inner(ents));
            return Ok(());
        }
        sq.sync();
        match submitter.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
        // Both views are cached: learn what the kernel consumed (else the SQ looks full after
        // `depth` pushes) and what it completed.
        sq.sync();
        cq.sync();
    }
}

type Started = (IoUring<squeue::Entry128, cqueue::Entry>, Vec<Entry>);

/// Pin the thread, set up the ring, allocate the entries and submit their REGISTER commands.
fn start(fd: RawFd, setup: QueueSetup) -> io::Result<Started> {
    if let Err(e) = pin_to_cpu(usize::from(setup.qid)) {
        eprintln!(
            "nodup-uring-null: queue {} not pinned to its CPU: {e}",
            setup.qid
        );
    }
    let mut b = IoUring::<squeue::Entry128, cqueue::Entry>::builder();
    match setup.taskrun {
        TaskRun::Default => {}
        TaskRun::Coop => {
            b.setup_coop_taskrun().setup_taskrun_flag();
        }
        TaskRun::Defer => {
            b.setup_single_issuer().setup_defer_taskrun();
        }
    }
    let depth = setup.depth.max(1);
    let sq_size = depth.next_power_of_two() as u32;
    let mut ring = b.setup_cqsize(2 * sq_size).build(sq_size)?;
    ring.submitter().register_files(&[fd])?;
    let mut ents = Vec::with_capacity(depth);
    for _ in 0..depth {
        let header = KernelBuf::new(size_of::<abi::UringReqHeader>())?;
        let payload = KernelBuf::new(setup.payload)?;
        let iov = Box::new([
            libc::iovec {
                iov_base: header.ptr.as_ptr().cast(),
                iov_len: size_of::<abi::UringReqHeader>(),
            },
            libc::iovec {
                iov_base: payload.ptr.as_ptr().cast(),
                iov_len: payload.len(),
            },
        ]);
        ents.push(Entry {
            header,
            payload,
            iov,
        });
    }
    {
        let mut sq = ring.submission();
        for (idx, e) in ents.iter().enumerate() {
            let sqe = uring_cmd(abi::URING_CMD_REGISTER, setup.qid, 0, idx, Some(&e.iov));
            // SAFETY: the iovecs and buffers live in `ents`, which the caller keeps until every
            // command has completed.
            unsafe { sq.push(&sqe) }.map_err(|_| io::Error::other("SQ full"))?;
        }
    }
    ring.submit()?;
    Ok((ring, ents))
}

/// Number of queues the kernel expects: one per possible CPU (it switches the connection to
/// the ring only once every queue has an entry registered).
pub fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut max = None;
    for part in s.trim().split(',') {
        let last = part.rsplit('-').next().unwrap_or(part);
        let n: usize = last
            .parse()
            .map_err(|_| io::Error::other(format!("cannot parse cpu list {s:?}")))?;
        max = max.max(Some(n));
    }
    max.map(|m| m + 1)
        .ok_or_else(|| io::Error::other("empty cpu list"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_len_lands_in_the_sqe() {
        let iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let e = uring_cmd(abi::URING_CMD_REGISTER, 3, 0, 7, Some(&iov));
        // SAFETY: Entry128 is 128 bytes of plain data (asserted in set_sqe_len).
        let b: [u8; 128] = unsafe { std::mem::transmute(e) };
        assert_eq!(b[0], opcode::UringCmd80::CODE);
        assert_eq!(&b[16..24], &(iov.as_ptr() as u64).to_ne_bytes(), "addr");
        assert_eq!(&b[24..28], &2u32.to_ne_bytes(), "len");
        assert_eq!(&b[32..40], &7u64.to_ne_bytes(), "user_data");
        assert_eq!(&b[48..56], &0u64.to_ne_bytes(), "cmd starts with flags");
        assert_eq!(&b[64..66], &3u16.to_ne_bytes(), "qid");
    }
}
