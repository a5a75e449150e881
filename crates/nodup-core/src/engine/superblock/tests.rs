//! Unit tests of the engine superblock codec: round trips, the version-1 layout, refusals.

use super::*;

const LEN: u64 = 64 << 20;

fn params() -> PolicyParams {
    PolicyParams {
        mem_budget: 3 << 30,
        hot_cache_entries: 4096,
        prefetch_cache_bytes: 1 << 20,
        cipher: CIPHER_NONE,
        ..PolicyParams::default()
    }
}

fn planned(params: PolicyParams) -> Superblock {
    Superblock::plan(
        LEN,
        16,
        PolicyKind::Light,
        FpKind::Xxh3,
        MetaLayoutKind::Region,
        params,
        |t, _| t + 1,
    )
    .unwrap()
}

/// Recompute the checksum stored at `at` over the bytes before it.
fn reseal(b: &mut [u8], at: usize) {
    let sum = xxhash_rust::xxh3::xxh3_64(&b[..at]);
    b[at..at + 8].copy_from_slice(&sum.to_le_bytes());
}

/// `sb` in the version-1 layout, written from the frozen table with literal offsets (not
/// through `off_v1`), followed by what else block 0 of a version-1 image may hold.
fn encode_v1(sb: &Superblock) -> [u8; SB_SIZE] {
    let mut b = [0xa5u8; SB_SIZE];
    b[..128].copy_from_slice(&sb.encode()[..128]);
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    b[128..136].copy_from_slice(&sb.params.mem_budget.to_le_bytes());
    reseal(&mut b, 136);
    b
}

fn err(b: &[u8]) -> String {
    match Superblock::decode(b, LEN) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn v2_roundtrip() {
    let sb = planned(params());
    assert_eq!(sb.version, VERSION);
    let b = sb.encode();
    assert_eq!(le_u32(&b, 8), 2);
    assert!(b[164..264].iter().all(|&x| x == 0));
    assert_eq!(le_u64(&b, 136), 3 << 30);
    assert_eq!(le_u64(&b, 144), 4096);
    assert_eq!(le_u64(&b, 152), 1 << 20);
    let d = Superblock::decode(&b, LEN).unwrap();
    assert_eq!(d, sb);
    assert_eq!(d.params, params());
    assert!(d.check_geometry(&planned(params())).is_ok());
    let mut c = sb;
    c.clean = true;
    assert_eq!(Superblock::decode(&c.encode(), LEN).unwrap(), c);
    assert!(Superblock::decode(&b, 1 << 20).is_err());
}

#[test]
fn v1_decodes_with_defaults_and_reencodes_as_v2() {
    let mut sb = planned(PolicyParams {
        mem_budget: 77 << 20,
        ..PolicyParams::default()
    });
    sb.clean = true;
    let b = encode_v1(&sb);
    let d = Superblock::decode(&b, LEN).unwrap();
    assert_eq!(d.version, 1);
    assert_eq!(d.features_incompat, 0);
    assert_eq!(
        d.params,
        PolicyParams {
            mem_budget: 77 << 20,
            ..PolicyParams::default()
        }
    );
    assert_eq!(
        Superblock {
            version: VERSION,
            ..d
        },
        sb
    );
    assert!(d.check_geometry(&planned(d.params)).is_ok());
    // A version-1 superblock is exactly its 144 bytes: nothing after them is read.
    assert_eq!(Superblock::decode(&b[..SB_SIZE_V1], LEN).unwrap(), d);
    assert!(Superblock::decode(&b[..SB_SIZE_V1 - 1], LEN).is_err());
    let v2 = d.encode();
    assert_eq!(le_u32(&v2, 8), VERSION);
    assert_eq!(Superblock::decode(&v2, LEN).unwrap(), sb);
    let mut bad = b;
    bad[130] ^= 1;
    assert_eq!(
        err(&bad),
        "corrupt image: engine superblock checksum mismatch"
    );
}

#[test]
fn newer_and_unknown_versions_are_refused() {
    let b = planned(params()).encode();
    for v in [3u32, 9, u32::MAX] {
        let mut n = b;
        n[8..12].copy_from_slice(&v.to_le_bytes());
        assert!(matches!(
            Superblock::decode(&n, LEN),
            Err(Error::Version { found, supported: VERSION }) if found == v
        ));
        assert_eq!(
            err(&n),
            format!(
                "engine superblock version {v} is newer than this build supports \
                 (max 2); upgrade nodup"
            )
        );
    }
    let mut z = b;
    z[8..12].copy_from_slice(&0u32.to_le_bytes());
    reseal(&mut z, 264);
    assert_eq!(
        err(&z),
        "corrupt image: engine superblock version 0 is unknown"
    );
}

#[test]
fn unknown_incompat_features_are_refused_by_bit() {
    let mut b = planned(params()).encode();
    b[128..136].copy_from_slice(&((1u64 << 63) | (1 << 5)).to_le_bytes());
    reseal(&mut b, 264);
    assert!(matches!(
        Superblock::decode(&b, LEN),
        Err(Error::Unsupported(_))
    ));
    assert_eq!(
        err(&b),
        "image uses incompatible engine features this build does not support: \
         bit(s) 5, 63 (mask 0x8000000000000020); upgrade nodup"
    );
}

#[test]
fn a_cipher_is_refused() {
    let mut sb = planned(params());
    sb.params.cipher = 3;
    let b = sb.encode();
    assert_eq!(le_u32(&b, 160), 3);
    assert!(matches!(
        Superblock::decode(&b, LEN),
        Err(Error::Unsupported(_))
    ));
    assert_eq!(
        err(&b),
        "image is encrypted with cipher 3, which this build does not support"
    );
}

#[test]
fn non_zero_reserved_bytes_are_refused() {
    let good = planned(params()).encode();
    for at in [212usize, 240, 263] {
        let mut b = good;
        b[at] = 1;
        reseal(&mut b, 264);
        assert_eq!(
            err(&b),
            "corrupt image: engine superblock: reserved policy-parameter bytes 212..264 \
             are not zero"
        );
    }
    // The key parameters (164..212) must be zero on a plain image.
    for at in [164usize, 200, 211] {
        let mut b = good;
        b[at] = 1;
        reseal(&mut b, 264);
        assert_eq!(
            err(&b),
            "corrupt image: engine superblock: key parameters on an image without a cipher"
        );
    }
}

#[test]
fn damage_is_refused() {
    let b = planned(params()).encode();
    for at in [20usize, 128, 140, 200, 264] {
        let mut bad = b;
        bad[at] ^= 1;
        assert_eq!(
            err(&bad),
            "corrupt image: engine superblock checksum mismatch"
        );
    }
    let mut bad = b;
    bad[0] = b'X';
    assert!(matches!(
        Superblock::decode(&bad, LEN),
        Err(Error::NotNodup(_))
    ));
    assert!(matches!(
        Superblock::decode(&b[..4], LEN),
        Err(Error::NotNodup(_))
    ));
    assert_eq!(
        err(&b[..SB_SIZE - 1]),
        "corrupt image: engine superblock: truncated"
    );
    let mut bad = b;
    bad[124] = 2;
    reseal(&mut bad, 264);
    assert_eq!(
        err(&bad),
        "corrupt image: engine superblock: bad clean flag"
    );
}

#[test]
fn key_parameters_round_trip_and_are_refused_without_a_cipher() {
    use crate::media::crypt::{KdfKind, KdfParams};
    let mut p = params();
    p.cipher = CIPHER_AES256;
    p.kdf = Some(KdfParams {
        kind: KdfKind::Argon2id,
        m_kib: 65536,
        t: 3,
        p: 1,
    });
    p.salt = [0xA5; 16];
    p.key_check = [0x3C; 16];
    let sb = planned(p);
    let b = sb.encode();
    assert_eq!(Superblock::decode(&b, LEN).unwrap().params, p);
    // Key parameters on a plain image, or absurd argon2 costs, are corruption.
    let mut plain = sb;
    plain.params.cipher = CIPHER_NONE;
    let e = Superblock::decode(&plain.encode(), LEN)
        .unwrap_err()
        .to_string();
    assert!(e.contains("key parameters"), "{e}");
    let mut huge = sb;
    huge.params.kdf = Some(KdfParams {
        t: 1000,
        ..p.kdf.unwrap()
    });
    let e = Superblock::decode(&huge.encode(), LEN)
        .unwrap_err()
        .to_string();
    assert!(e.contains("out of range"), "{e}");
}

#[test]
fn an_area_past_the_image_is_refused_before_use() {
    // Each area's start pushed to where its end overflows or passes the image (the fuzzer's
    // encrypted-image case: the client area's offset was multiplied before any check).
    let sb = planned(params());
    for (name, field) in [
        ("client", off::CLIENT_START),
        ("reverse map", off::REVMAP_START),
        ("layout", off::LAYOUT_START),
        ("save", off::SAVE_START),
        ("data", off::DATA_START),
    ] {
        for start in [u64::MAX - 1, u64::MAX / 4096, sb.total_blocks] {
            let mut b = sb.encode();
            b[field..field + 8].copy_from_slice(&start.to_le_bytes());
            reseal(&mut b, 264);
            assert_eq!(
                err(&b),
                format!("corrupt image: engine superblock: the {name} area ends past the image"),
                "{name} at {start}"
            );
        }
    }
}
