//! Sizes on the command line and in reports: parsing `4G`-style arguments and printing byte
//! counts and durations the way people read them.

use anyhow::{anyhow, bail, Result};

/// Parse `4096`, `64K`, `512M`, `4G`, `1T` (binary units, in either case; an optional
/// `iB`/`B` suffix is accepted, also in lower case: `2kb`, `1gib`). Zero is refused: no size argument of nodup means anything at 0 (those with a
/// larger minimum use [`parse_size_or_zero`] and name their own).
pub fn parse_size(s: &str) -> Result<u64> {
    let n = parse_size_or_zero(s)?;
    if n == 0 {
        bail!("invalid size {s:?}: too small (at least 1 byte)");
    }
    Ok(n)
}

/// [`parse_size`] that lets 0 through, for a caller that checks its own minimum and says
/// what it is (an image's, a memory budget's), which a bare "too small" would not.
pub fn parse_size_or_zero(s: &str) -> Result<u64> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    // ASCII lower-casing keeps every byte where it was, so the lengths cut the same text.
    let t = if lower.ends_with("ib") {
        &t[..t.len() - 2]
    } else if lower.ends_with('b') {
        &t[..t.len() - 1]
    } else {
        t
    };
    let (num, mul) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow!("invalid size {s:?} (a number with an optional K, M, G or T)"))?;
    if !n.is_finite() {
        bail!("invalid size {s:?} (a number with an optional K, M, G or T)");
    }
    if n < 0.0 {
        bail!("invalid size {s:?}: negative");
    }
    // f64 holds every integer up to 2^53 exactly, and 2^64 itself: anything at or above it
    // would not fit in the u64 the size is kept in.
    if n * mul as f64 >= u64::MAX as f64 {
        bail!("invalid size {s:?}: too large (does not fit in 64 bits, 16 EiB)");
    }
    Ok((n * mul as f64) as u64)
}

/// `1.20 GiB`, `612.3 MiB`, `17 B`: binary units, three significant digits or so.
pub fn bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    match u {
        0 => format!("{b} B"),
        _ if v >= 100.0 => format!("{v:.0} {}", UNITS[u]),
        _ if v >= 10.0 => format!("{v:.1} {}", UNITS[u]),
        _ => format!("{v:.2} {}", UNITS[u]),
    }
}

/// `850 us`, `12.3 ms`, `1.52 s`, `3 min 12 s`.
pub fn duration(secs: f64) -> String {
    if secs < 0.001 {
        format!("{:.0} us", secs * 1e6)
    } else if secs < 1.0 {
        format!("{:.1} ms", secs * 1e3)
    } else if secs < 120.0 {
        format!("{secs:.2} s")
    } else {
        format!("{} min {} s", (secs / 60.0) as u64, (secs % 60.0) as u64)
    }
}

/// `71,234`: a count with thousands separators.
pub fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5m").unwrap(), 3 << 19);
        assert_eq!(parse_size("2 kb").unwrap(), 2048);
        assert_eq!(parse_size("1gib").unwrap(), 1 << 30);
        assert_eq!(parse_size("512m").unwrap(), 512 << 20);
        assert!(parse_size("x").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
        let e = |s: &str| parse_size(s).unwrap_err().to_string();
        assert!(e("0").contains("too small"), "{}", e("0"));
        assert!(e("0.1").contains("too small"));
        assert!(e("99999999999999999999").contains("too large"));
        assert!(e("-1G").contains("negative"));
        assert!(e("1Q").contains("a number with an optional K, M, G or T"));
        assert_eq!(parse_size_or_zero("0").unwrap(), 0);
    }

    #[test]
    fn human_forms() {
        assert_eq!(bytes(17), "17 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(612 << 20), "612 MiB");
        assert_eq!(bytes(12 << 30 | 300 << 20), "12.3 GiB");
        assert_eq!(duration(0.0123), "12.3 ms");
        assert_eq!(duration(1.524), "1.52 s");
        assert_eq!(count(71234), "71,234");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000000), "1,000,000");
    }
}
