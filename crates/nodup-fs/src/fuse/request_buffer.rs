//! Huge pages under fuser's request buffers, through a global allocator the serving binaries
//! install (`nodup`, and `nodup-fuseref` so the ceiling it measures has them too).
//!
//! Each fuser serving thread reads requests into one buffer of its own, a zeroed
//! `FUSER_REQUEST_BUFFER`-byte allocation, and the kernel copies a WRITE's data into it one
//! 4 KiB page at a time, pinning each page first (`get_user_pages`). After the engine has
//! hashed, compared and stored the previous request, the page structures of that buffer are
//! no longer cached, and pinning them cost more than the copy itself: perf of a 1 MiB, 75 %
//! duplicates fio stream counted 340 samples in `gup_fast_fallback` against 267 in the copy
//! (the null file system: 166). On a 2 MiB page the pin is one step per page table entry of
//! the huge page; the same stream then counts 126, the serving threads use about 10 % less
//! CPU, and one writer ran 4-5 % faster (`docs/choices.md`).
//!
//! Only allocations of exactly that size are mapped here (2 MiB-aligned, `MADV_HUGEPAGE`);
//! everything else goes to the system allocator unchanged. A buffer costs 2 MiB of memory as
//! soon as it serves any request: 8 MiB for a 4-thread mount, where 4 KiB pages cost what the
//! largest request touched. `nodup mount --huge-buffers=false` ([`set_huge_pages`]) keeps them
//! on 4 KiB pages (`MADV_NOHUGEPAGE`, also where THP is on for everything).

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

/// Size of fuser 0.18's per-thread request buffer (its `MAX_WRITE_SIZE`, 16 MiB, plus 4 KiB
/// for the request header). A fuser that changes it shows in the mount test that looks for
/// these mappings (`crates/nodup-cli/tests/fs_fuse.rs`,
/// `request_buffers_are_advised_for_huge_pages`).
pub const FUSER_REQUEST_BUFFER: usize = (16 << 20) + 4096;

/// The transparent huge page size on x86-64 and arm64 with 4 KiB base pages.
const HUGE_PAGE: usize = 2 << 20;

/// Bytes of the mapping behind one request buffer.
pub const REQUEST_BUFFER_MAPPING: usize = FUSER_REQUEST_BUFFER.div_ceil(HUGE_PAGE) * HUGE_PAGE;

/// Whether request buffers mapped from now on are advised for huge pages.
static HUGE_PAGES: AtomicBool = AtomicBool::new(true);

/// Advise request buffers mapped from now on for huge pages (the default) or against them.
/// Set it before the session starts: fuser maps its buffers when its threads start.
pub fn set_huge_pages(on: bool) {
    HUGE_PAGES.store(on, Ordering::Relaxed);
}

/// The system allocator, except that fuser's request buffers get 2 MiB-aligned mappings
/// advised for transparent huge pages (unless [`set_huge_pages`] said otherwise).
pub struct RequestBufferAlloc;

fn is_request_buffer(layout: Layout) -> bool {
    layout.size() == FUSER_REQUEST_BUFFER && layout.align() <= HUGE_PAGE
}

/// A zeroed, 2 MiB-aligned anonymous mapping of `REQUEST_BUFFER_MAPPING` bytes, or null.
fn map_huge() -> *mut u8 {
    let len = REQUEST_BUFFER_MAPPING;
    // Linux aligns an anonymous mapping to 2 MiB only when its length is a multiple of it, and
    // not on every version: reserve one huge page more and trim to an aligned start.
    // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len + HUGE_PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return ptr::null_mut();
    }
    let base = p as usize;
    let start = base.div_ceil(HUGE_PAGE) * HUGE_PAGE;
    let head = start - base;
    let tail = HUGE_PAGE - head;
    // SAFETY: both ranges lie inside the mapping just made and outside [start, start + len).
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap((start + len) as *mut libc::c_void, tail);
        }
        // Advice only: without THP (or with it off) the buffer works on 4 KiB pages.
        let advice = if HUGE_PAGES.load(Ordering::Relaxed) {
            libc::MADV_HUGEPAGE
        } else {
            libc::MADV_NOHUGEPAGE
        };
        libc::madvise(start as *mut libc::c_void, len, advice);
    }
    start as *mut u8
}

// SAFETY: every block is either the system allocator's or one mapping of `map_huge`, chosen by
// the layout alone, which `dealloc` and `realloc` receive unchanged.
unsafe impl GlobalAlloc for RequestBufferAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_request_buffer(layout) {
            map_huge()
        } else {
            // SAFETY: forwarded with the caller's layout.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_request_buffer(layout) {
            // Fresh anonymous memory reads as zeros.
            map_huge()
        } else {
            // SAFETY: forwarded with the caller's layout.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if is_request_buffer(layout) {
            // SAFETY: `p` came from `map_huge` (same layout), which mapped exactly this much.
            unsafe { libc::munmap(p.cast(), REQUEST_BUFFER_MAPPING) };
        } else {
            // SAFETY: `p` came from the system allocator with this layout.
            unsafe { System.dealloc(p, layout) }
        }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `layout.align()` with `new_size` is a valid layout.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if is_request_buffer(layout) && is_request_buffer(new) {
            return p;
        }
        if !is_request_buffer(layout) && !is_request_buffer(new) {
            // SAFETY: forwarded: `p` is the system allocator's, with this layout.
            return unsafe { System.realloc(p, layout, new_size) };
        }
        // SAFETY: moving between the two kinds: allocate, copy what both hold, free the old.
        unsafe {
            let q = self.alloc(new);
            if !q.is_null() {
                ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                self.dealloc(p, layout);
            }
            q
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer_layout() -> Layout {
        Layout::array::<u8>(FUSER_REQUEST_BUFFER).unwrap()
    }

    #[test]
    fn request_buffers_are_aligned_zeroed_and_writable() {
        let a = RequestBufferAlloc;
        // SAFETY: a non-zero layout; the block is written within bounds and freed once.
        unsafe {
            let p = a.alloc_zeroed(buffer_layout());
            assert!(!p.is_null());
            assert_eq!(p as usize % HUGE_PAGE, 0);
            let s = std::slice::from_raw_parts_mut(p, FUSER_REQUEST_BUFFER);
            assert!(s.iter().step_by(4096).all(|&b| b == 0));
            assert_eq!(s[FUSER_REQUEST_BUFFER - 1], 0);
            s[0] = 1;
            s[FUSER_REQUEST_BUFFER - 1] = 2;
            assert_eq!((s[0], s[FUSER_REQUEST_BUFFER - 1]), (1, 2));
            a.dealloc(p, buffer_layout());
        }
    }

    #[test]
    fn only_the_request_buffer_size_is_mapped_here() {
        assert!(is_request_buffer(buffer_layout()));
        for size in [
            FUSER_REQUEST_BUFFER - 1,
            FUSER_REQUEST_BUFFER + 1,
            4096,
            64 << 20,
        ] {
            assert!(
                !is_request_buffer(Layout::array::<u8>(size).unwrap()),
                "{size}"
            );
        }
        // Aligned beyond a huge page: the system allocator's business.
        let wide = Layout::from_size_align(FUSER_REQUEST_BUFFER, 2 * HUGE_PAGE).unwrap();
        assert!(!is_request_buffer(wide));
        let a = RequestBufferAlloc;
        let big = Layout::array::<u8>(FUSER_REQUEST_BUFFER + 1).unwrap();
        // SAFETY: a non-zero layout, freed once with the layout it was allocated with.
        unsafe {
            let p = a.alloc(big);
            assert!(!p.is_null());
            *p.add(FUSER_REQUEST_BUFFER) = 1;
            a.dealloc(p, big);
        }
    }

    #[test]
    fn realloc_across_the_two_kinds_keeps_the_contents() {
        let a = RequestBufferAlloc;
        let small = Layout::array::<u8>(4096).unwrap();
        // SAFETY: each block is used within its current size and freed once, with its layout.
        unsafe {
            let p = a.alloc(small);
            std::slice::from_raw_parts_mut(p, 4096).fill(7);
            let q = a.realloc(p, small, FUSER_REQUEST_BUFFER);
            assert_eq!(q as usize % HUGE_PAGE, 0);
            assert!(std::slice::from_raw_parts(q, 4096).iter().all(|&b| b == 7));
            *q.add(FUSER_REQUEST_BUFFER - 1) = 9;
            // Same size: the same mapping.
            assert_eq!(a.realloc(q, buffer_layout(), FUSER_REQUEST_BUFFER), q);
            let r = a.realloc(q, buffer_layout(), 8192);
            assert!(std::slice::from_raw_parts(r, 4096).iter().all(|&b| b == 7));
            a.dealloc(r, Layout::array::<u8>(8192).unwrap());
        }
    }
}
