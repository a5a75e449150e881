//! Helpers shared by the engine's integration tests.

use std::collections::HashMap;

use nodup_core::{BlockNr, Engine, BLOCK_SIZE};

/// A 4 KiB block of pseudo-random bytes determined by `c` and `salt` (distinct per test file,
/// so contents of different suites never coincide).
pub fn content_salted(c: u64, salt: u64, mul: u64, shift: u32) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK_SIZE];
    let mut x = salt.wrapping_mul(c + 1);
    for w in v.chunks_mut(8) {
        x ^= x >> shift;
        x = x.wrapping_mul(mul);
        w.copy_from_slice(&x.to_le_bytes());
    }
    v
}

/// Every held reference `(block, content id)` reads back `content(id)`, each block's
/// reference count equals the references held (no entry = exactly one), the metadata audits
/// clean and the physical bytes count the distinct blocks. Returns the reference counts seen.
pub fn check_held(
    e: &Engine,
    held: &[(BlockNr, u64)],
    content: impl Fn(u64) -> Vec<u8>,
    what: &str,
) -> HashMap<BlockNr, u64> {
    let mut count: HashMap<BlockNr, u64> = HashMap::new();
    let mut buf = vec![0u8; BLOCK_SIZE];
    for &(b, c) in held {
        e.read(b, &mut buf).unwrap();
        assert!(buf == content(c), "{what}: block {b} lost content {c}");
        *count.entry(b).or_default() += 1;
    }
    for (&b, &n) in &count {
        match e.block_refcount(b).unwrap() {
            Some(rc) => assert_eq!(rc, n, "{what}: refcount of {b}"),
            None => assert_eq!(n, 1, "{what}: block {b} without entry referenced {n} times"),
        }
    }
    let a = e.audit().unwrap();
    assert!(a.problems.is_empty(), "{what}: {:?}", a.problems);
    assert_eq!(
        e.stats().physical_bytes,
        count.len() as u64 * BLOCK_SIZE as u64,
        "{what}"
    );
    count
}
