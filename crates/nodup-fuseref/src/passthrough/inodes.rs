//! The passthrough file system's inode table. Each inode the kernel knows names a source
//! inode, so renames behind it need no bookkeeping: by an O_PATH descriptor held open while
//! the descriptor budget lasts, beyond it by a file handle (`name_to_handle_at`) reopened for
//! each request. The budget exists because this machine caps open files (RLIMIT_NOFILE) well
//! below the hundreds of thousands of inodes a metadata benchmark makes the kernel hold.
//! Inodes are found by our number or by the source's (device, inode) pair, and go when the
//! kernel forgets them.

use super::sys::{self, Handle};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// How one source inode is reached.
#[derive(Debug)]
enum Reach {
    Fd(OwnedFd),
    Handle(Handle),
}

/// One source inode.
#[derive(Debug)]
pub struct Node {
    reach: Reach,
    /// A symlink (no /proc reopening: that would reach its target or the link itself).
    pub symlink: bool,
}

/// A descriptor on a node's source inode for the length of one request: the held one, or
/// one opened from its handle.
pub struct NodeFd {
    node: Arc<Node>,
    temp: Option<OwnedFd>,
}

impl NodeFd {
    /// The O_PATH descriptor, for `*at` calls.
    pub fn raw(&self) -> RawFd {
        match (&self.temp, &self.node.reach) {
            (Some(fd), _) | (None, Reach::Fd(fd)) => fd.as_raw_fd(),
            (None, Reach::Handle(_)) => -1,
        }
    }

    /// Whether the inode is a symlink.
    pub fn symlink(&self) -> bool {
        self.node.symlink
    }
}

struct Entry {
    node: Arc<Node>,
    key: (u64, u64),
    lookups: u64,
}

#[derive(Default)]
struct Table {
    by_ino: FxHashMap<u64, Entry>,
    by_key: FxHashMap<(u64, u64), u64>,
    next: u64,
}

/// All inodes the kernel holds.
pub struct Inodes {
    table: Mutex<Table>,
    /// A plain descriptor on the source root: where handles are opened.
    mount_fd: OwnedFd,
    /// Descriptors held by nodes, and how many may be.
    held: AtomicUsize,
    budget: usize,
}

/// The (device, inode) pair naming a source inode.
fn key(st: &libc::stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

fn is_symlink(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

impl Inodes {
    /// A table holding the root (inode 1, `root` an O_PATH descriptor on the source
    /// directory, never forgotten), keeping at most `budget` other descriptors open. The
    /// budget is ignored (unbounded) when file handles cannot be opened here.
    pub fn new(root: OwnedFd, st: &libc::stat, budget: usize) -> io::Result<Inodes> {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY;
        let mount_fd = sys::open_at(root.as_raw_fd(), ".".as_ref(), flags, 0)?;
        // open_by_handle_at needs CAP_DAC_READ_SEARCH; without it every node keeps its fd.
        let handles_work = sys::name_to_handle(root.as_raw_fd(), "".as_ref())
            .and_then(|h| sys::open_handle(mount_fd.as_raw_fd(), &h))
            .is_ok();
        let mut t = Table {
            next: 2,
            ..Table::default()
        };
        t.by_key.insert(key(st), 1);
        let node = Node {
            reach: Reach::Fd(root),
            symlink: false,
        };
        t.by_ino.insert(
            1,
            Entry {
                node: Arc::new(node),
                key: key(st),
                lookups: u64::MAX / 2,
            },
        );
        Ok(Inodes {
            table: Mutex::new(t),
            mount_fd,
            held: AtomicUsize::new(0),
            budget: if handles_work { budget } else { usize::MAX },
        })
    }

    /// A descriptor on `ino`'s source inode (ESTALE when the kernel names one it forgot).
    pub fn fd(&self, ino: u64) -> io::Result<NodeFd> {
        let node = self
            .table
            .lock()
            .by_ino
            .get(&ino)
            .map(|e| e.node.clone())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ESTALE))?;
        let temp = match &node.reach {
            Reach::Fd(_) => None,
            Reach::Handle(h) => Some(sys::open_handle(self.mount_fd.as_raw_fd(), h)?),
        };
        Ok(NodeFd { node, temp })
    }

    /// Look `name` up in the directory `dir` refers to: our inode number (one more kernel
    /// reference on it) and the source's status.
    pub fn lookup(&self, dir: RawFd, name: &OsStr) -> io::Result<(u64, libc::stat)> {
        if self.held.load(Ordering::Relaxed) < self.budget {
            let fd = sys::open_path(dir, name)?;
            let st = sys::stat_fd(fd.as_raw_fd())?;
            let ino = self.intern(&st, || Ok(Reach::Fd(fd)))?;
            return Ok((ino, st));
        }
        let st = sys::stat_at(dir, name)?;
        let ino = self.intern(&st, || sys::name_to_handle(dir, name).map(Reach::Handle))?;
        Ok((ino, st))
    }

    /// Our number for the source inode of status `st`, counting one kernel reference; a new
    /// node is reached as `reach` says (called only when the inode is not known yet).
    fn intern(
        &self,
        st: &libc::stat,
        reach: impl FnOnce() -> io::Result<Reach>,
    ) -> io::Result<u64> {
        if let Some(ino) = self.take_ref(st) {
            return Ok(ino);
        }
        let reach = reach()?;
        let mut t = self.table.lock();
        // Another thread may have added it meanwhile; ours is then dropped.
        if let Some(&ino) = t.by_key.get(&key(st)) {
            if let Some(e) = t.by_ino.get_mut(&ino) {
                e.lookups += 1;
                return Ok(ino);
            }
        }
        if matches!(reach, Reach::Fd(_)) {
            self.held.fetch_add(1, Ordering::Relaxed);
        }
        let ino = t.next;
        t.next += 1;
        t.by_key.insert(key(st), ino);
        let node = Node {
            reach,
            symlink: is_symlink(st),
        };
        t.by_ino.insert(
            ino,
            Entry {
                node: Arc::new(node),
                key: key(st),
                lookups: 1,
            },
        );
        Ok(ino)
    }

    fn take_ref(&self, st: &libc::stat) -> Option<u64> {
        let mut t = self.table.lock();
        let ino = *t.by_key.get(&key(st))?;
        t.by_ino.get_mut(&ino)?.lookups += 1;
        Some(ino)
    }

    /// The kernel dropped `count` references to `ino`; its node goes at zero.
    pub fn forget(&self, ino: u64, count: u64) {
        let mut t = self.table.lock();
        let Some(e) = t.by_ino.get_mut(&ino) else {
            return;
        };
        e.lookups = e.lookups.saturating_sub(count);
        if e.lookups == 0 {
            let key = e.key;
            if let Some(e) = t.by_ino.remove(&ino) {
                if matches!(e.node.reach, Reach::Fd(_)) {
                    self.held.fetch_sub(1, Ordering::Relaxed);
                }
            }
            t.by_key.remove(&key);
        }
    }

    /// Number of inodes held (the root included).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.lock().by_ino.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(dir: &std::path::Path, budget: usize) -> Inodes {
        let root = sys::open_path(libc::AT_FDCWD, dir.as_os_str()).unwrap();
        let st = sys::stat_fd(root.as_raw_fd()).unwrap();
        Inodes::new(root, &st, budget).unwrap()
    }

    #[test]
    fn interning_counts_and_forgetting_drops() {
        for budget in [usize::MAX, 0] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("f"), b"x").unwrap();
            let t = table(dir.path(), budget);
            let open = || t.lookup(t.fd(1).unwrap().raw(), "f".as_ref()).unwrap().0;
            let a = open();
            assert_eq!(open(), a, "the same source inode gets the same number");
            assert_eq!(t.len(), 2);
            // Reached after a rename behind its back, by descriptor or by handle.
            std::fs::rename(dir.path().join("f"), dir.path().join("g")).unwrap();
            let st = sys::stat_fd(t.fd(a).unwrap().raw()).unwrap();
            assert_eq!(st.st_size, 1);
            t.forget(a, 1);
            assert!(t.fd(a).is_ok(), "one reference left");
            t.forget(a, 1);
            assert_eq!(t.fd(a).err().unwrap().raw_os_error(), Some(libc::ESTALE));
            assert_eq!(t.held.load(Ordering::Relaxed), 0);
        }
    }
}
