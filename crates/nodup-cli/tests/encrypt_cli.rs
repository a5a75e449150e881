//! Encrypted images through the command line and a real mount: nothing written is readable
//! on the image, a missing or wrong key is refused in one line without changing a byte, the
//! right key (or passphrase) mounts it, and stats and fsck say what it is encrypted with.

mod common;
use common::*;
use std::fs;

fn one_line_error(o: &std::process::Output, has: &str) {
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains(has), "{e}");
    // The engine's error-type prefix is not for people.
    assert!(!e.contains("invalid argument"), "{e}");
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn encrypted_image_through_a_mount() {
    if !fuse_available() {
        return;
    }
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("nodup-enc-{}-{n}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let key = dir.join("key");
    fs::write(&key, [0xebu8; 32]).unwrap();
    let wrong = dir.join("wrong");
    fs::write(&wrong, [0xecu8; 32]).unwrap();
    let k = key.to_str().unwrap();
    let f = Fixture::new("enc", "128M", &["--encrypt-key-file", k]);
    let log = dir.join("log");
    let l = log.to_str().unwrap();
    f.mount(&["--encrypt-key-file", k, "--log-file", l]);
    let text: Vec<u8> = b"TOP-SECRET-PAYLOAD-0042 ".repeat(40_000);
    fs::write(f.path("classified-report.txt"), &text).unwrap();
    fs::write(f.path("copy.txt"), &text).unwrap();
    let s = f.stats();
    assert_eq!(s["encrypted"], true, "{s}");
    assert_eq!(s["encryption"]["key"], "raw");
    assert!(s["dedup_ratio"].as_f64().unwrap() > 0.49);
    f.umount();
    let img = fs::read(&f.img).unwrap();
    assert!(
        !contains(&img, b"TOP-SECRET-PAYLOAD"),
        "plaintext on the image"
    );
    assert!(
        !contains(&img, b"classified-report"),
        "a file name on the image"
    );
    // No key, a wrong key: one line each, the image unchanged.
    let m = f.mnt.to_str().unwrap();
    let i = f.img.to_str().unwrap();
    one_line_error(&nodup(&["mount", i, m]), "give its key file");
    one_line_error(
        &nodup(&["mount", i, m, "--encrypt-key-file", wrong.to_str().unwrap()]),
        "wrong key",
    );
    one_line_error(&nodup(&["fsck", i]), "give its key file");
    one_line_error(
        &nodup(&["stats", i, "--encrypt-key-file", wrong.to_str().unwrap()]),
        "wrong key",
    );
    assert!(
        fs::read(&f.img).unwrap() == img,
        "a refused mount changed the image"
    );
    assert!(ok(nodup(&["fsck", i, "--encrypt-key-file", k])).contains("consistent"));
    let st = ok(nodup(&["stats", i, "--encrypt-key-file", k]));
    assert!(st.contains("encrypted  AES-256"), "{st}");
    // Encrypted images default to stores + flushes; streaming, when asked for, reads back too.
    let said = fs::read_to_string(&log).unwrap();
    assert!(said.contains("stores + cache-line flushes"), "{said}");
    fs::remove_file(&log).unwrap();
    f.mount(&["--encrypt-key-file", k, "--stream-data", "--log-file", l]);
    assert_eq!(fs::read(f.path("classified-report.txt")).unwrap(), text);
    assert_eq!(fs::read(f.path("copy.txt")).unwrap(), text);
    let more: Vec<u8> = b"STREAMED-AND-ENCRYPTED ".repeat(50_000);
    fs::write(f.path("streamed.txt"), &more).unwrap();
    f.umount();
    assert!(fs::read_to_string(&log)
        .unwrap()
        .contains("non-temporal stores"));
    f.mount(&["--encrypt-key-file", k]);
    assert_eq!(fs::read(f.path("streamed.txt")).unwrap(), more);
    f.umount();
    assert!(ok(nodup(&["fsck", i, "--encrypt-key-file", k])).contains("consistent"));
    let _ = fs::remove_dir_all(&dir);
}
