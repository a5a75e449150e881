//! The FUSE wire format this daemon speaks (protocol 7.x, native endian), including the
//! FUSE-over-io_uring additions of 7.42 that Debian bookworm's `linux/fuse.h` lacks.
//!
//! Every struct is `#[repr(C)]`, made of fixed-size integers with no implicit padding, and its
//! size is asserted below against the kernel's: the kernel reads and writes these bytes as is.

use std::mem::size_of;

/// Protocol major version we speak.
pub const KERNEL_VERSION: u32 = 7;
/// Highest protocol minor version whose layouts this module matches (7.44 is Linux 6.18's).
pub const KERNEL_MINOR_VERSION: u32 = 44;
/// The node id of the root directory.
pub const ROOT_ID: u64 = 1;

/// Opcodes (`enum fuse_opcode`) this daemon looks at.
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const MKNOD: u32 = 8;
    pub const UNLINK: u32 = 10;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const GETXATTR: u32 = 22;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
}

/// INIT flags (`flags` holds bits 0-31, `flags2` bits 32-63).
pub mod init_flags {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    /// The daemon serves requests over io_uring (offered only when `enable_uring` is set).
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// Commands in `sqe->cmd_op` of an `IORING_OP_URING_CMD` on /dev/fuse.
pub const URING_CMD_REGISTER: u32 = 1;
/// Commit the reply in an entry's buffers and fetch the next request into them.
pub const URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// Size of the `in_out` area of [`UringReqHeader`] (holds `fuse_in_header` / `fuse_out_header`).
pub const URING_IN_OUT_HEADER_SZ: usize = 128;
/// Size of the `op_in` area of [`UringReqHeader`] (the opcode's fixed argument struct).
pub const URING_OP_IN_OUT_SZ: usize = 128;

/// Plain wire data: `#[repr(C)]`, integer fields only, no padding, any bit pattern valid.
///
/// # Safety
/// Implement only for types meeting the above; `read` and `bytes` rely on it.
pub unsafe trait Wire: Copy + Default {
    /// The struct at the start of `b`, or None when `b` is too short.
    fn read(b: &[u8]) -> Option<Self> {
        if b.len() < size_of::<Self>() {
            return None;
        }
        // SAFETY: `b` holds at least size_of::<Self>() bytes, read_unaligned has no alignment
        // requirement, and every bit pattern is a valid Self (trait contract).
        Some(unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<Self>()) })
    }
    /// The struct's bytes as they go on the wire.
    fn bytes(&self) -> &[u8] {
        // SAFETY: Self has no padding (trait contract), so all size_of::<Self>() bytes behind
        // `self` are initialised; the slice borrows `self`.
        unsafe { std::slice::from_raw_parts((self as *const Self).cast::<u8>(), size_of::<Self>()) }
    }
}

macro_rules! wire {
    ($($(#[$m:meta])* $name:ident ($size:expr) { $($field:ident : $ty:ty),* $(,)? })*) => {$(
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name { $(pub $field: $ty),* }
        // SAFETY: repr(C), integer fields only; the size assertion below rules out padding
        // because every listed size equals the sum of its fields.
        unsafe impl Wire for $name {}
        const _: () = assert!(size_of::<$name>() == $size);
    )*};
}

wire! {
    /// `fuse_in_header`: leads every request.
    InHeader (40) { len: u32, opcode: u32, unique: u64, nodeid: u64, uid: u32, gid: u32,
        pid: u32, total_extlen: u16, padding: u16 }
    /// `fuse_out_header`: leads every reply.
    OutHeader (16) { len: u32, error: i32, unique: u64 }
    /// `fuse_init_in`.
    InitIn (64) { major: u32, minor: u32, max_readahead: u32, flags: u32, flags2: u32,
        unused: [u32; 11] }
    /// `fuse_init_out`.
    InitOut (64) { major: u32, minor: u32, max_readahead: u32, flags: u32, max_background: u16,
        congestion_threshold: u16, max_write: u32, time_gran: u32, max_pages: u16,
        map_alignment: u16, flags2: u32, max_stack_depth: u32, request_timeout: u16,
        unused: [u16; 11] }
    /// `fuse_attr`.
    Attr (88) { ino: u64, size: u64, blocks: u64, atime: u64, mtime: u64, ctime: u64,
        atimensec: u32, mtimensec: u32, ctimensec: u32, mode: u32, nlink: u32, uid: u32,
        gid: u32, rdev: u32, blksize: u32, flags: u32 }
    /// `fuse_entry_out`: the reply of LOOKUP, MKNOD and the first half of CREATE's.
    EntryOut (128) { nodeid: u64, generation: u64, entry_valid: u64, attr_valid: u64,
        entry_valid_nsec: u32, attr_valid_nsec: u32, attr: Attr }
    /// `fuse_attr_out`: the reply of GETATTR and SETATTR.
    AttrOut (104) { attr_valid: u64, attr_valid_nsec: u32, dummy: u32, attr: Attr }
    /// `fuse_getattr_in`.
    GetattrIn (16) { getattr_flags: u32, dummy: u32, fh: u64 }
    /// `fuse_setattr_in`.
    SetattrIn (88) { valid: u32, padding: u32, fh: u64, size: u64, lock_owner: u64, atime: u64,
        mtime: u64, ctime: u64, atimensec: u32, mtimensec: u32, ctimensec: u32, mode: u32,
        unused4: u32, uid: u32, gid: u32, unused5: u32 }
    /// `fuse_mknod_in`; the name follows.
    MknodIn (16) { mode: u32, rdev: u32, umask: u32, padding: u32 }
    /// `fuse_create_in`; the name follows.
    CreateIn (16) { flags: u32, mode: u32, umask: u32, open_flags: u32 }
    /// `fuse_open_in`.
    OpenIn (8) { flags: u32, open_flags: u32 }
    /// `fuse_open_out`: the reply of OPEN and the second half of CREATE's.
    OpenOut (16) { fh: u64, open_flags: u32, backing_id: i32 }
    /// `fuse_read_in`.
    ReadIn (40) { fh: u64, offset: u64, size: u32, read_flags: u32, lock_owner: u64,
        flags: u32, padding: u32 }
    /// `fuse_write_in`; the data follows.
    WriteIn (40) { fh: u64, offset: u64, size: u32, write_flags: u32, lock_owner: u64,
        flags: u32, padding: u32 }
    /// `fuse_write_out`.
    WriteOut (8) { size: u32, padding: u32 }
    /// `fuse_release_in` (also RELEASEDIR).
    ReleaseIn (24) { fh: u64, flags: u32, release_flags: u32, lock_owner: u64 }
    /// `fuse_flush_in`.
    FlushIn (24) { fh: u64, unused: u32, padding: u32, lock_owner: u64 }
    /// `fuse_fsync_in`.
    FsyncIn (16) { fh: u64, fsync_flags: u32, padding: u32 }
    /// `fuse_getxattr_in`; the attribute name follows.
    GetxattrIn (8) { size: u32, padding: u32 }
    /// `fuse_statfs_out` (`struct fuse_kstatfs`).
    StatfsOut (80) { blocks: u64, bfree: u64, bavail: u64, files: u64, ffree: u64, bsize: u32,
        namelen: u32, frsize: u32, padding: u32, spare: [u32; 6] }
    /// `fuse_forget_in`.
    ForgetIn (8) { nlookup: u64 }
    /// `fuse_batch_forget_in`; `count` × `fuse_forget_one` follow.
    BatchForgetIn (8) { count: u32, dummy: u32 }
    /// `fuse_uring_ent_in_out`: the trailer of a ring entry's header buffer.
    UringEntInOut (32) { flags: u64, commit_id: u64, payload_sz: u32, padding: u32,
        reserved: u64 }
    /// `fuse_uring_cmd_req`: the command data in the 80-byte area of an SQE128.
    UringCmdReq (24) { flags: u64, commit_id: u64, qid: u16, padding: [u8; 6] }
}

/// `fuse_uring_req_header`: `iov[0]` of a ring entry. The kernel writes the request's
/// `fuse_in_header` into `in_out`, its fixed argument struct into `op_in` and the trailer; the
/// daemon writes the `fuse_out_header` into `in_out` and the reply size into the trailer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UringReqHeader {
    /// `fuse_in_header` on fetch, `fuse_out_header` on commit.
    pub in_out: [u8; URING_IN_OUT_HEADER_SZ],
    /// The opcode's fixed argument struct (`in_args[0]`), on fetch only.
    pub op_in: [u8; URING_OP_IN_OUT_SZ],
    /// Commit id and payload size, both directions.
    pub ent: UringEntInOut,
}
const _: () = assert!(size_of::<UringReqHeader>() == 288);

impl Default for UringReqHeader {
    fn default() -> Self {
        UringReqHeader {
            in_out: [0; URING_IN_OUT_HEADER_SZ],
            op_in: [0; URING_OP_IN_OUT_SZ],
            ent: UringEntInOut::default(),
        }
    }
}

/// Size of the fixed argument struct that leads the body of a request with this opcode
/// (`in_args[0]`; what the ring puts in `op_in`, the rest going to the payload buffer).
/// Opcodes whose first argument is a name or nothing have 0.
pub fn op_in_size(opcode: u32) -> usize {
    match opcode {
        op::GETATTR => size_of::<GetattrIn>(),
        op::SETATTR => size_of::<SetattrIn>(),
        op::MKNOD => size_of::<MknodIn>(),
        op::CREATE => size_of::<CreateIn>(),
        op::OPEN => size_of::<OpenIn>(),
        op::READ => size_of::<ReadIn>(),
        op::WRITE => size_of::<WriteIn>(),
        op::RELEASE => size_of::<ReleaseIn>(),
        op::FLUSH => size_of::<FlushIn>(),
        op::FSYNC => size_of::<FsyncIn>(),
        op::GETXATTR => size_of::<GetxattrIn>(),
        op::FORGET => size_of::<ForgetIn>(),
        op::BATCH_FORGET => size_of::<BatchForgetIn>(),
        op::INIT => size_of::<InitIn>(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_round_trip_and_short_input() {
        let h = InHeader {
            len: 64,
            opcode: op::WRITE,
            unique: 0x1122_3344_5566_7788,
            nodeid: 9,
            ..Default::default()
        };
        let b = h.bytes().to_vec();
        assert_eq!(b.len(), 40);
        // Native endian on the wire; the daemon only builds for little-endian Linux hosts.
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_ne_bytes());
        assert_eq!(InHeader::read(&b), Some(h));
        assert_eq!(InHeader::read(&b[..39]), None);
    }
}
