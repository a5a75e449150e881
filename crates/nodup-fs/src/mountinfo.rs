//! /proc/self/mountinfo: finding a mount's device, and its escaped path fields.

use std::path::Path;

/// `major:minor` of the newest mount on `mountpoint`, from /proc/self/mountinfo.
pub fn mount_device(mountpoint: &Path) -> Option<String> {
    let want = std::fs::canonicalize(mountpoint).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 4 && unescape(f[4]) == want.as_os_str().as_encoded_bytes())
            .then(|| f[2].to_string())
    })
}

/// Undo mountinfo's octal escapes (`\040` for a space).
pub fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn escapes() {
        assert_eq!(unescape(r"/a\040b\134c"), b"/a b\\c".to_vec());
        assert_eq!(unescape(r"/x\04"), b"/x\\04".to_vec());
        assert_eq!(unescape("/plain"), b"/plain".to_vec());
    }
}
