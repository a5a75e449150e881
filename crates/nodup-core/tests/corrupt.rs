//! Corrupted and foreign images: every damaged superblock is refused with an error, and random
//! damage to the metadata areas (reverse map, layout, save area, regions) never panics — the
//! engine either refuses the image or keeps answering with errors or data.

use std::sync::Arc;

use nodup_core::engine::{FormatOptions, OpenOptions, OpenState};
use nodup_core::media::{Medium, MemMedium};
use nodup_core::meta::MetaLayoutKind;
use nodup_core::{BlockNr, Engine, Error, WriteCtx, BLOCK_SIZE};
use proptest::prelude::*;

fn block(i: u64) -> Vec<u8> {
    (0..BLOCK_SIZE)
        .map(|j| (i.wrapping_mul(131).wrapping_add(j as u64 / 64) % 251) as u8)
        .collect()
}

/// A populated image: returns its bytes, the data blocks referenced and the data-area start.
fn image(layout: MetaLayoutKind, clean: bool) -> (Vec<u8>, Vec<BlockNr>, u64) {
    let m = Arc::new(MemMedium::new(1 << 20));
    let fopts = FormatOptions {
        meta_layout: layout,
        client_area_blocks: 2,
        ..Default::default()
    };
    let e = Engine::format(m.clone(), &fopts, &OpenOptions::default()).unwrap();
    let data: Vec<Vec<u8>> = (0..60).map(|i| block(i % 25)).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let got = e.write(&mut WriteCtx::default(), &refs).unwrap();
    let ds = e.data_area().0;
    if clean {
        e.shutdown().unwrap();
    }
    (m.snapshot(), got, ds)
}

/// Use a possibly damaged image every way a caller would; errors are fine, panics are not.
fn exercise(bytes: Vec<u8>, refs: &[BlockNr]) {
    let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(bytes));
    let Ok((e, st)) = Engine::open(m, &OpenOptions::default()) else {
        return;
    };
    if st == OpenState::NeedsRecovery
        && e.recover(&mut refs.iter().copied(), &mut std::iter::empty())
            .is_err()
    {
        return;
    }
    let mut buf = vec![0u8; BLOCK_SIZE];
    for &b in refs {
        let _ = e.read(b, &mut buf);
    }
    let data: Vec<Vec<u8>> = (0..30).map(|i| block(i % 40)).collect();
    let r: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let _ = e.write(&mut WriteCtx::default(), &r);
    for &b in refs {
        let _ = e.release(b);
    }
    let _ = e.audit();
    let _ = e.stats();
    let _ = e.shutdown();
}

#[test]
fn every_superblock_byte_is_checked() {
    let (img, _, _) = image(MetaLayoutKind::Region, true);
    for i in 0..nodup_core::engine::superblock::SB_SIZE {
        for bit in [0u8, 3, 7] {
            let mut b = img.clone();
            b[i] ^= 1 << bit;
            let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(b));
            match Engine::open(m, &OpenOptions::default()) {
                Err(Error::NotNodup(_)) | Err(Error::Corrupt(_)) | Err(Error::Version { .. }) => {}
                Err(e) => panic!("byte {i} bit {bit}: unexpected error {e}"),
                Ok(_) => panic!("byte {i} bit {bit}: damaged superblock accepted"),
            }
        }
    }
}

#[test]
fn truncated_and_foreign_images_are_refused() {
    let (img, _, _) = image(MetaLayoutKind::Entry, true);
    for len in [0usize, 100, 4096, img.len() / 2, img.len() - 4096] {
        let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(img[..len].to_vec()));
        assert!(
            Engine::open(m, &OpenOptions::default()).is_err(),
            "truncated to {len}"
        );
    }
    let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(vec![0x5a; 1 << 20]));
    assert!(matches!(
        Engine::open(m, &OpenOptions::default()),
        Err(Error::NotNodup(_))
    ));
}

#[test]
fn damaged_save_area_is_refused_not_trusted() {
    let (img, refs, ds) = image(MetaLayoutKind::Region, true);
    // The save area sits right before the data area; damage its last used bytes and header.
    let mut hit = 0;
    for blk in 1..ds {
        let mut b = img.clone();
        let off = blk as usize * BLOCK_SIZE + 40;
        b[off] ^= 0x10;
        let m: Arc<dyn Medium> = Arc::new(MemMedium::from_bytes(b.clone()));
        if Engine::open(m, &OpenOptions::default()).is_err() {
            hit += 1;
        }
        exercise(b, &refs);
    }
    assert!(hit >= 1, "no damaged metadata block was detected");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_metadata_damage_never_panics(
        layout in (0..3usize).prop_map(|i| [MetaLayoutKind::Region, MetaLayoutKind::Entry, MetaLayoutKind::Hashtable][i]),
        clean in any::<bool>(),
        flips in proptest::collection::vec((any::<u64>(), any::<u8>()), 1..40),
    ) {
        let (mut img, refs, ds) = image(layout, clean);
        // Metadata lives in blocks 1..data start, and regions among the first data blocks.
        let span = (ds as usize + 48) * BLOCK_SIZE - BLOCK_SIZE;
        for (pos, x) in flips {
            let off = BLOCK_SIZE + (pos as usize % span);
            img[off] ^= x | 1;
        }
        exercise(img, &refs);
    }
}
