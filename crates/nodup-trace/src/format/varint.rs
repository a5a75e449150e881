//! LEB128 varints and zigzag signed deltas: the compact integers of the own trace format and of
//! `nodup sim`'s cache-line traces.

/// Append `v` as an LEB128 varint (7 bits per byte, high bit = more follows).
pub fn put_varint(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push(v as u8 | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

/// Decode an LEB128 varint, pulling bytes from `next`; a malformed one is `bad(what)`.
pub fn get_varint<E>(
    mut next: impl FnMut() -> Result<u8, E>,
    bad: impl Fn(&'static str) -> E,
) -> Result<u64, E> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = next()?;
        if i == 9 && b > 1 {
            return Err(bad("varint overflows 64 bits"));
        }
        v |= ((b & 0x7F) as u64) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(bad("varint longer than 10 bytes"))
}

/// Signed to unsigned so that small magnitudes of either sign encode short.
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Inverse of [`zigzag`].
pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_overlong() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            let mut it = b.iter().copied();
            let got = get_varint(|| it.next().ok_or("short"), |m| m).unwrap();
            assert_eq!(got, v);
            assert!(it.next().is_none());
        }
        let eleven = [0x80u8; 11];
        let mut it = eleven.iter().copied();
        assert_eq!(
            get_varint(|| it.next().ok_or("short"), |m| m),
            Err("varint overflows 64 bits")
        );
        let mut it = [0x80u8].iter().copied();
        assert_eq!(get_varint(|| it.next().ok_or("short"), |m| m), Err("short"));
        for v in [0i64, -1, 1, i64::MIN, i64::MAX] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!(zigzag(-1), 1);
    }
}
