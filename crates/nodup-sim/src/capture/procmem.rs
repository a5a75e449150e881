//! Reading another process's memory through procfs: its writable mappings (`/proc/PID/maps`),
//! page presence and soft-dirty bits (`/proc/PID/pagemap`), page contents (`/proc/PID/mem`),
//! and its child processes (`/proc/PID/task/TID/children`).

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Bytes in a page.
pub const PAGE: u64 = 4096;
/// pagemap bit: page present in RAM.
pub const PM_PRESENT: u64 = 1 << 63;
/// pagemap bit: page soft-dirty (written since the last `clear_refs` 4).
pub const PM_SOFT_DIRTY: u64 = 1 << 55;

/// One writable mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Anonymous memory (heap, stack, anonymous mmap), which starts zero-filled.
    pub anonymous: bool,
}

/// Parse `/proc/PID/maps` text into its writable regions worth scanning (kernel-provided and
/// device mappings are left out).
pub fn parse_maps(text: &str) -> Vec<Region> {
    let mut out = Vec::new();
    for l in text.lines() {
        let mut f = l.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        // offset, dev, inode, then an optional path (may hold spaces).
        let path: Vec<&str> = f.skip(3).collect();
        let path = path.join(" ");
        if perms.as_bytes().get(1) != Some(&b'w') {
            continue;
        }
        if path.starts_with("[vvar")
            || path == "[vsyscall]"
            || path == "[vdso]"
            || path.starts_with("/dev/")
        {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        if end <= start || start % PAGE != 0 || end % PAGE != 0 {
            continue;
        }
        let anonymous = path.is_empty() || path.starts_with('[');
        out.push(Region {
            start,
            end,
            anonymous,
        });
    }
    out
}

/// Open files of one process.
pub struct Proc {
    /// Process id.
    pub pid: i32,
    pagemap: File,
    mem: File,
}

impl Proc {
    /// Open the procfs files of `pid` (None when it is gone).
    pub fn open(pid: i32) -> Option<Proc> {
        Some(Proc {
            pid,
            pagemap: File::open(format!("/proc/{pid}/pagemap")).ok()?,
            mem: File::open(format!("/proc/{pid}/mem")).ok()?,
        })
    }

    /// Its writable regions now.
    pub fn regions(&self) -> Option<Vec<Region>> {
        let text = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).ok()?;
        Some(parse_maps(&text))
    }

    /// pagemap entries of `pages` pages from `start` into `out` (cleared first).
    pub fn pagemap(&self, start: u64, pages: u64, out: &mut Vec<u64>) -> bool {
        out.clear();
        let mut buf = vec![0u8; (pages * 8) as usize];
        if self
            .pagemap
            .read_exact_at(&mut buf, start / PAGE * 8)
            .is_err()
        {
            return false;
        }
        out.extend(
            buf.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))),
        );
        true
    }

    /// Read memory at `addr` into `buf` (false when the range cannot be read).
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        self.mem.read_exact_at(buf, addr).is_ok()
    }

    /// Reset its soft-dirty bits (`echo 4 > /proc/PID/clear_refs`).
    pub fn clear_soft_dirty(&self) -> bool {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid), "4").is_ok()
    }
}

/// `pid` and all its descendants, parents first.
pub fn process_tree(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                let path = t.path().join("children");
                if let Ok(s) = std::fs::read_to_string(path) {
                    for c in s.split_whitespace().filter_map(|c| c.parse::<i32>().ok()) {
                        if !out.contains(&c) {
                            out.push(c);
                        }
                    }
                }
            }
        }
        i += 1;
    }
    out
}

/// Whether `pid` is stopped, dead or gone (its state letter in `/proc/PID/stat`).
pub fn is_stopped(pid: i32) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // The state follows the parenthesized command name, which may hold spaces or parentheses.
    match s
        .rfind(')')
        .and_then(|i| s[i + 1..].split_whitespace().next())
    {
        Some(st) => matches!(st, "T" | "t" | "Z" | "X"),
        None => true,
    }
}

/// Whether this kernel keeps soft-dirty bits: clear them on this process, write a page, and see
/// bit 55 of its pagemap entry go from 0 to 1.
pub fn soft_dirty_supported() -> bool {
    let me = std::process::id() as i32;
    let Some(p) = Proc::open(me) else {
        return false;
    };
    let mut page = vec![0u8; 3 * PAGE as usize];
    let addr = (page.as_ptr() as u64).div_ceil(PAGE) * PAGE;
    let off = (addr - page.as_ptr() as u64) as usize;
    page[off] = 1;
    let mut e = Vec::new();
    if !p.clear_soft_dirty() || !p.pagemap(addr, 1, &mut e) || e[0] & PM_SOFT_DIRTY != 0 {
        return false;
    }
    // A volatile write so the store is not optimized away before the check.
    // SAFETY: `off` is inside `page`, which is alive and exclusively borrowed here.
    unsafe { std::ptr::write_volatile(page.as_mut_ptr().add(off), 2) };
    p.pagemap(addr, 1, &mut e) && e[0] & PM_SOFT_DIRTY != 0 && std::hint::black_box(&page)[off] == 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_keep_writable_user_regions() {
        let text = "\
55d0a000-55d0c000 r-xp 00000000 fd:00 123  /usr/bin/cat
55d0c000-55d0d000 rw-p 00002000 fd:00 123  /usr/bin/cat
55d0e000-55d2f000 rw-p 00000000 00:00 0    [heap]
7f00a000-7f00b000 rw-p 00000000 00:00 0
7f00b000-7f00c000 rw-s 00000000 00:05 9    /dev/zero (deleted)
7ffd1000-7ffd3000 rw-p 00000000 00:00 0    [stack]
7ffd4000-7ffd6000 r--p 00000000 00:00 0    [vvar]
7ffd6000-7ffd8000 r-xp 00000000 00:00 0    [vdso]
7ffd9000-7ffda000 rw-p 00000000 00:00 0    /tmp/a file with spaces
";
        let r = parse_maps(text);
        let got: Vec<(u64, bool)> = r.iter().map(|x| (x.start, x.anonymous)).collect();
        assert_eq!(
            got,
            vec![
                (0x55d0c000, false),
                (0x55d0e000, true),
                (0x7f00a000, true),
                (0x7ffd1000, true),
                (0x7ffd9000, false)
            ]
        );
    }

    #[test]
    fn reads_its_own_memory_and_tree() {
        let me = std::process::id() as i32;
        let p = Proc::open(me).expect("own procfs");
        let regions = p.regions().expect("own maps");
        assert!(regions.iter().any(|r| r.anonymous));
        let v = vec![0x5Au8; 3 * PAGE as usize];
        let addr = (v.as_ptr() as u64).div_ceil(PAGE) * PAGE;
        let mut e = Vec::new();
        assert!(p.pagemap(addr, 1, &mut e));
        assert!(e[0] & PM_PRESENT != 0);
        let mut buf = [0u8; 64];
        assert!(p.read(addr, &mut buf));
        assert_eq!(buf, [0x5A; 64]);
        assert_eq!(process_tree(me)[0], me);
        assert!(!is_stopped(me));
        // Either answer is fine (kernel configuration); it must not crash.
        let _ = soft_dirty_supported();
    }
}
