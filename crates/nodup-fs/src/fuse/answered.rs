//! Writes answered before they are stored (`nodup mount --async-writes`): which requests
//! qualify, the writes still being stored after their answer, and the errors found then, kept
//! for the next fsync or close of a handle open for writing.
//!
//! A synchronous writer waits for each answer, so the daemon's work on a write adds to the
//! writer's time whole. Answered at once, that work overlaps the writer preparing its next
//! write and the kernel copying it in. The data is then durable at fsync instead of when the
//! call returns; `FileSystem::write_admitted` keeps the rest: room reserved first, and the
//! inode locked until the write is stored.

use super::caller::killed_suidgid;
use super::Adapter;
use fuser::{Errno, INodeNo, OpenFlags, ReplyWrite, Request, WriteFlags};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Smallest write answered before it is stored: below it the hand-over to the next serving
/// thread costs more than the overlap gives (4 KiB writes measured 8-12 % slower).
pub const ASYNC_MIN: usize = 128 << 10;

/// Answered writes still being stored, and the errors of those that failed, by inode.
#[derive(Debug, Default)]
pub struct Answered {
    state: Mutex<Pending>,
    /// Signalled whenever an answered write is stored (or has failed).
    stored: Condvar,
    /// Writes answered before they were stored since the mount (the stats' `writes_answered_early`).
    count: AtomicU64,
    /// A write failed after its answer: from then on every write is stored before its answer,
    /// so a medium that has started failing reports to each writer at once.
    failed: AtomicBool,
}

#[derive(Debug, Default)]
struct Pending {
    /// Sequence number of the next answered write (all inodes: numbers never repeat).
    next: u64,
    /// Sequence numbers of the answered writes still being stored, by inode.
    in_flight: HashMap<u64, BTreeSet<u64>>,
    /// The first errno of a failed answered write, by inode, until an fsync takes it.
    errors: HashMap<u64, i32>,
}

/// One answered write being stored. Dropped without [`Storing::done`] (a panic while storing),
/// it counts as failed with EIO, so nothing waits for it forever.
pub struct Storing<'a> {
    answered: &'a Answered,
    ino: u64,
    seq: u64,
    result: Option<Option<i32>>,
}

impl Storing<'_> {
    /// The write is stored, or failed with errno `e`.
    fn done(mut self, e: Option<i32>) {
        self.result = Some(e);
    }
}

impl Drop for Storing<'_> {
    fn drop(&mut self) {
        let e = self.result.take().unwrap_or(Some(libc::EIO));
        self.answered.end(self.ino, self.seq, e);
    }
}

impl Answered {
    /// A write of `ino` is answered now; it is being stored until its [`Storing`] is done.
    fn begin(&self, ino: u64) -> Storing<'_> {
        let mut st = self.state.lock();
        let seq = st.next;
        st.next += 1;
        st.in_flight.entry(ino).or_default().insert(seq);
        drop(st);
        self.count.fetch_add(1, Ordering::Relaxed);
        Storing {
            answered: self,
            ino,
            seq,
            result: None,
        }
    }

    /// Write `seq` of `ino` is stored, or failed with errno `e` (the first error is kept: later ones
    /// add nothing a caller could act on). The error is in place before anyone waiting for the
    /// write wakes.
    fn end(&self, ino: u64, seq: u64, e: Option<i32>) {
        let mut st = self.state.lock();
        if let Some(e) = e {
            st.errors.entry(ino).or_insert(e);
            self.failed.store(true, Ordering::Relaxed);
        }
        if let Some(set) = st.in_flight.get_mut(&ino) {
            set.remove(&seq);
            if set.is_empty() {
                st.in_flight.remove(&ino);
            }
        }
        drop(st);
        self.stored.notify_all();
    }

    /// Wait until the writes of `ino` answered before this call are stored (not those answered
    /// after it: a close must not wait out a writer that keeps streaming); then the file's
    /// error, taken when `consume`, else left for the next caller.
    fn settle(&self, ino: u64, consume: bool) -> Option<i32> {
        let mut st = self.state.lock();
        let before = st.next;
        while st
            .in_flight
            .get(&ino)
            .and_then(|set| set.first())
            .is_some_and(|&seq| seq < before)
        {
            self.stored.wait(&mut st);
        }
        if consume {
            st.errors.remove(&ino)
        } else {
            st.errors.get(&ino).copied()
        }
    }

    /// Writes answered before they were stored since the mount.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Whether a write has failed after its answer on this mount.
    fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }
}

/// Whether a write may be answered before it is stored by its size and flags: a direct write
/// (the writeback cache has answered already), large enough, on a file not opened for
/// synchronous writes.
pub(super) fn qualifies(len: usize, write_flags: WriteFlags, open_flags: OpenFlags) -> bool {
    len >= ASYNC_MIN
        && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE)
        && open_flags.0 & libc::O_DSYNC == 0
}

impl Adapter {
    /// Whether this write is answered before it is stored: the mount asks for it, no write
    /// has failed after its answer yet, the write [`qualifies`], and no set-id bit must drop
    /// with it. The kernel flags every write of a caller without CAP_FSETID; the bits then
    /// drop after the data is stored, and a caller that has seen the answer must not see them
    /// still set, so such a write on a set-id file is stored first.
    pub(super) fn answers_early(
        &self,
        req: &Request,
        ino: u64,
        len: usize,
        write_flags: WriteFlags,
        open_flags: OpenFlags,
    ) -> bool {
        self.async_writes
            && !self.answered.failed()
            && qualifies(len, write_flags, open_flags)
            && (!write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
                || self
                    .fs
                    .getattr(ino)
                    .is_ok_and(|a| killed_suidgid(a.perm, a.gid, req.gid()) == a.perm))
    }

    /// Store a write that [`Adapter::answers_early`] allows, answering it (taking `reply`) once
    /// it is admitted; `storing` then tracks it until [`Adapter::stored`]. When it is not
    /// admitted, `reply` is left for the caller to answer as for any write.
    pub(super) fn write_answered<'a>(
        &'a self,
        ino: u64,
        off: u64,
        data: &[u8],
        reply: &mut Option<ReplyWrite>,
        storing: &mut Option<Storing<'a>>,
    ) -> crate::Result<usize> {
        // The answer says how much is written: a write crossing the largest file size is short.
        let data = crate::data::fitting(off, data)?;
        self.fs.write_admitted(ino, off, data, || {
            if let Some(rp) = reply.take() {
                *storing = Some(self.answered.begin(ino));
                rp.written(data.len() as u32);
            }
        })
    }

    /// A write answered early is stored (`r` is `Ok`) or failed: end its `storing`, keeping
    /// the error for the file's fsync and closes.
    pub(super) fn stored(
        &self,
        ino: u64,
        off: u64,
        storing: Option<Storing<'_>>,
        r: crate::Result<usize>,
    ) {
        let Err(e) = r else {
            if let Some(s) = storing {
                s.done(None);
            }
            return;
        };
        crate::logging::error(&format!(
            "write to inode {ino} at byte {off} failed after it was answered ({e}); fsync of the file reports it, and closes of handles open for writing"
        ));
        if let Some(s) = storing {
            s.done(Some(e.errno()));
        }
        // A handle through the page cache left the answered data there; drop it, so reads
        // show what the file holds (a direct handle left none, and this costs nothing then). From another thread: the kernel locks the pages, and a queued request
        // holding one may need this serving thread to finish.
        if let Some(n) = self.notifier.get().cloned() {
            let _ = std::thread::Builder::new()
                .name("nodup-inval".into())
                .spawn(move || {
                    let _ = n.inval_inode(INodeNo(ino), 0, 0);
                });
        }
    }

    /// What an fsync of `ino` owes: its writes answered early stored (the sync runs even when
    /// one failed, so the file's other data is made durable all the same), then everything
    /// made durable; a failed sync is reported before a failed early write.
    pub(super) fn sync_file(&self, ino: u64) -> Result<(), Errno> {
        let answered = self.settle(ino, true);
        self.fs.sync().map_err(super::err)?;
        answered
    }

    /// Wait for `ino`'s writes answered so far to be stored; the first error among them, if
    /// any, removed from the file when `consume` (fsync), left for later callers otherwise
    /// (close: a close of a duplicated descriptor must not take the error from the writer's
    /// fsync).
    pub(super) fn settle(&self, ino: u64, consume: bool) -> Result<(), Errno> {
        if !self.async_writes {
            return Ok(());
        }
        match self.answered.settle(ino, consume) {
            Some(e) => Err(Errno::from_i32(e)),
            None => Ok(()),
        }
    }
}
