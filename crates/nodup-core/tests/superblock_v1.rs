//! Engine superblock versions through the engine: a version-1 image (made here by rewriting
//! block 0 of a fresh image in the frozen version-1 layout) opens with the same geometry, a
//! read-only open leaves it byte-identical, and the next superblock write of a writable open
//! converts it to version 2. Images this build cannot use are refused with their message.

use std::sync::Arc;

use nodup_core::engine::superblock::{PolicyParams, Superblock, SB_SIZE, VERSION};
use nodup_core::engine::{FormatOptions, OpenOptions, OpenState};
use nodup_core::fingerprint::FpKind;
use nodup_core::media::{Medium, MemMedium};
use nodup_core::meta::MetaLayoutKind;
use nodup_core::policy::PolicyKind;
use nodup_core::{BlockNr, Engine, Error, WriteCtx, BLOCK_SIZE};

const MEM_BUDGET: u64 = 5 << 20;

fn block(i: u64) -> Vec<u8> {
    (0..BLOCK_SIZE)
        .map(|j| (i.wrapping_mul(97).wrapping_add(j as u64 / 32) % 251) as u8)
        .collect()
}

/// What an open engine reports about its image.
#[derive(Debug, PartialEq)]
struct Shape {
    client: (BlockNr, u64),
    data: (BlockNr, u64),
    policy: PolicyKind,
    fingerprint: FpKind,
    layout: MetaLayoutKind,
}

fn shape(e: &Engine) -> Shape {
    Shape {
        client: e.client_area(),
        data: e.data_area(),
        policy: e.policy_kind(),
        fingerprint: e.fingerprint_kind(),
        layout: e.meta_layout(),
    }
}

/// A populated image, shut down when `clean`: its medium, the blocks written (with the
/// index of their content) and the engine's shape.
fn image(clean: bool) -> (Arc<MemMedium>, Vec<(BlockNr, u64)>, Shape) {
    let m = Arc::new(MemMedium::new(2 << 20));
    let fopts = FormatOptions {
        meta_layout: MetaLayoutKind::Entry,
        mem_budget: MEM_BUDGET,
        client_area_blocks: 3,
        ..Default::default()
    };
    let e = Engine::format(m.clone(), &fopts, &OpenOptions::default()).unwrap();
    let data: Vec<Vec<u8>> = (0..24).map(|i| block(i % 9)).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let got = e.write(&mut WriteCtx::default(), &refs).unwrap();
    let written = got.into_iter().zip((0..24).map(|i| i % 9)).collect();
    let s = shape(&e);
    if clean {
        e.shutdown().unwrap();
    }
    (m, written, s)
}

/// Recompute the checksum stored at `at` over the bytes before it.
fn reseal(b: &mut [u8], at: usize) {
    let sum = xxhash_rust::xxh3::xxh3_64(&b[..at]);
    b[at..at + 8].copy_from_slice(&sum.to_le_bytes());
}

/// Rewrite block 0 of `m` in the version-1 layout (written out here from the frozen table:
/// bytes 0..128 as in version 2, memory budget at 128, xxh3 of 0..136 at 136), with something
/// other than zeros after it, as block 0 of an old image may hold.
fn make_v1(m: &MemMedium) -> Vec<u8> {
    let mut b = vec![0u8; SB_SIZE];
    m.read(0, &mut b).unwrap();
    assert_eq!(u32::from_le_bytes([b[8], b[9], b[10], b[11]]), 2);
    let budget = b[136..144].to_vec();
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    b[128..136].copy_from_slice(&budget);
    reseal(&mut b, 136);
    b[144..].fill(0x5c);
    m.write(0, &b).unwrap();
    let sb = Superblock::load(m).unwrap();
    assert_eq!(sb.version, 1);
    m.snapshot()
}

fn check_data(e: &Engine, written: &[(BlockNr, u64)]) {
    let mut buf = vec![0u8; BLOCK_SIZE];
    for &(b, i) in written {
        e.read(b, &mut buf).unwrap();
        assert!(buf == block(i), "block {b}");
    }
}

fn v1_params() -> PolicyParams {
    PolicyParams {
        mem_budget: MEM_BUDGET,
        ..PolicyParams::default()
    }
}

fn read_only() -> OpenOptions {
    OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    }
}

#[test]
fn new_images_are_version_2_with_their_parameters() {
    let (m, written, s) = image(true);
    let sb = Superblock::load(&*m).unwrap();
    assert_eq!(sb.version, VERSION);
    assert_eq!(sb.params, v1_params());
    let (e, st) = Engine::open(m.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(st, OpenState::Clean);
    assert_eq!(shape(&e), s);
    assert_eq!(e.policy_params(), v1_params());
    check_data(&e, &written);
    e.shutdown().unwrap();
}

#[test]
fn clean_v1_image_opens_read_only_untouched_and_converts_on_writable_open() {
    let (m, written, s) = image(true);
    let v1 = make_v1(&m);

    let (e, st) = Engine::open(m.clone(), &read_only()).unwrap();
    assert_eq!(st, OpenState::Clean);
    assert_eq!(shape(&e), s);
    assert_eq!(e.policy_params(), v1_params());
    check_data(&e, &written);
    assert!(e.shutdown().is_err(), "shutdown of a read-only engine");
    drop(e);
    assert!(
        m.snapshot() == v1,
        "a read-only open wrote to a version-1 image"
    );

    // Writable: clearing the clean flag is the superblock write that converts it.
    let (e, st) = Engine::open(m.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(st, OpenState::Clean);
    let sb = Superblock::load(&*m).unwrap();
    assert_eq!((sb.version, sb.clean), (VERSION, false));
    assert_eq!(sb.params, v1_params());
    let mut b0 = vec![0u8; SB_SIZE];
    m.read(0, &mut b0).unwrap();
    assert!(b0[164..264].iter().all(|&x| x == 0), "reserved bytes");
    assert!(
        m.snapshot()[BLOCK_SIZE..] == v1[BLOCK_SIZE..],
        "only block 0 changed"
    );
    assert_eq!(shape(&e), s);
    check_data(&e, &written);
    let extra = block(100);
    e.write(&mut WriteCtx::default(), &[&extra]).unwrap();
    e.shutdown().unwrap();
    drop(e);
    let sb = Superblock::load(&*m).unwrap();
    assert_eq!((sb.version, sb.clean), (VERSION, true));

    let (e, st) = Engine::open(m.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(st, OpenState::Clean);
    assert_eq!(shape(&e), s);
    assert_eq!(e.policy_params(), v1_params());
    check_data(&e, &written);
    e.shutdown().unwrap();
}

#[test]
fn dirty_v1_image_stays_v1_through_recovery_until_clean_shutdown() {
    let (m, written, s) = image(false);
    let v1 = make_v1(&m);

    let (e, st) = Engine::open(m.clone(), &read_only()).unwrap();
    assert_eq!(st, OpenState::NeedsRecovery);
    drop(e);
    assert!(
        m.snapshot() == v1,
        "a read-only open wrote to a version-1 image"
    );

    let (e, st) = Engine::open(m.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(st, OpenState::NeedsRecovery);
    assert_eq!(shape(&e), s);
    e.recover(
        &mut written.iter().map(|&(b, _)| b),
        &mut std::iter::empty(),
    )
    .unwrap();
    let sb = Superblock::load(&*m).unwrap();
    assert_eq!((sb.version, sb.clean), (1, false));
    check_data(&e, &written);
    e.shutdown().unwrap();
    drop(e);
    let sb = Superblock::load(&*m).unwrap();
    assert_eq!((sb.version, sb.clean), (VERSION, true));
    assert_eq!(sb.params, v1_params());

    let (e, st) = Engine::open(m.clone(), &OpenOptions::default()).unwrap();
    assert_eq!(st, OpenState::Clean);
    check_data(&e, &written);
    e.shutdown().unwrap();
}

/// Open `img` with block 0 patched by `patch` (checksum recomputed when `reseal_at` is set).
fn open_patched(
    img: &[u8],
    patch: impl Fn(&mut [u8]),
    reseal_at: Option<usize>,
) -> Result<(), Error> {
    let mut b = img.to_vec();
    patch(&mut b[..SB_SIZE]);
    if let Some(at) = reseal_at {
        reseal(&mut b, at);
    }
    let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(b));
    Engine::open(m, &OpenOptions::default()).map(|_| ())
}

fn message(r: Result<(), Error>) -> String {
    match r {
        Ok(()) => panic!("image accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn images_this_build_cannot_use_are_refused_with_their_reason() {
    let (m, _, _) = image(true);
    let img = m.snapshot();
    let put32 =
        |at: usize, v: u32| move |b: &mut [u8]| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    assert_eq!(
        message(open_patched(&img, put32(8, 3), None)),
        "engine superblock version 3 is newer than this build supports (max 2); upgrade nodup"
    );
    assert_eq!(
        message(open_patched(&img, put32(8, 0), Some(264))),
        "corrupt image: engine superblock version 0 is unknown"
    );
    let features = |b: &mut [u8]| b[128..136].copy_from_slice(&(1u64 << 2).to_le_bytes());
    assert_eq!(
        message(open_patched(&img, features, Some(264))),
        "image uses incompatible engine features this build does not support: bit(s) 2 \
         (mask 0x4); upgrade nodup"
    );
    assert_eq!(
        message(open_patched(&img, put32(160, 2), Some(264))),
        "image is encrypted with cipher 2, which this build does not support"
    );
    // Cipher 1 (encryption at rest) with no key derivation recorded.
    assert_eq!(
        message(open_patched(&img, put32(160, 1), Some(264))),
        "corrupt image: engine superblock: unknown key derivation 0"
    );
    assert_eq!(
        message(open_patched(&img, |b| b[230] = 0xff, Some(264))),
        "corrupt image: engine superblock: reserved policy-parameter bytes 212..264 are not zero"
    );
    assert_eq!(
        message(open_patched(&img, |b| b[190] = 0xff, Some(264))),
        "corrupt image: engine superblock: key parameters on an image without a cipher"
    );
    assert_eq!(
        message(open_patched(&img, |b| b[150] ^= 0x40, None)),
        "corrupt image: engine superblock checksum mismatch"
    );
    // The same checks hold for a version-1 image where its layout has the field.
    let v1 = make_v1(&m);
    assert_eq!(
        message(open_patched(&v1, |b| b[100] ^= 1, None)),
        "corrupt image: engine superblock checksum mismatch"
    );
    assert!(open_patched(&v1, |_| {}, None).is_ok());
}
