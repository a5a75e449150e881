//! The metadata benchmark's creator: many small files in many directories, written by one
//! thread at system-call speed, each file's content distinct (so a deduplicating file system
//! stores every block).

use std::fs;
use std::io::{self, Write};
use std::path::Path;

/// The bytes of file number `n`: a pattern no other file of the run has.
fn fill(buf: &mut [u8], n: u64) {
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for c in buf.chunks_mut(8) {
        // xorshift64: cheap, and distinct seeds give distinct streams.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

/// Create `files` files of `size` bytes spread evenly over `dirs` directories `dNNNN` under
/// `root` (files `fNNNNNN`). Returns the number of files written.
pub fn create(root: &Path, dirs: u64, files: u64, size: usize) -> io::Result<u64> {
    let dirs = dirs.max(1);
    let mut buf = vec![0u8; size];
    let mut n = 0;
    for d in 0..dirs {
        let dir = root.join(format!("d{d:04}"));
        fs::create_dir(&dir)?;
        // The first `files % dirs` directories take one file more.
        let here = files / dirs + u64::from(d < files % dirs);
        for _ in 0..here {
            fill(&mut buf, n);
            let mut f = fs::File::create(dir.join(format!("f{n:06}")))?;
            f.write_all(&buf)?;
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_files_evenly_with_distinct_contents() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(create(t.path(), 3, 10, 100).unwrap(), 10);
        let counts: Vec<usize> = (0..3)
            .map(|d| {
                fs::read_dir(t.path().join(format!("d{d:04}")))
                    .unwrap()
                    .count()
            })
            .collect();
        assert_eq!(counts, [4, 3, 3]);
        let a = fs::read(t.path().join("d0000/f000000")).unwrap();
        let b = fs::read(t.path().join("d0000/f000001")).unwrap();
        assert_eq!(a.len(), 100);
        assert_ne!(a, b);
    }
}
