//! Concurrent stress with a model check, and full-device behaviour.

use std::time::{Duration, Instant};

use nodup_torture::stress::{full_device, host_full, library, library_faults, library_smart};

fn seed() -> u64 {
    std::env::var("TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(21)
}

#[test]
fn concurrent_threads_agree_with_the_model() {
    let seed = seed();
    eprintln!("seed {seed}");
    let st = library(6, seed, Instant::now() + Duration::from_secs(8));
    eprintln!("{} ops, {} mismatches", st.ops, st.mismatches);
    assert!(st.ops > 1000, "only {} ops", st.ops);
    assert_eq!(st.mismatches, 0, "{:#?}", st.examples);
}

#[test]
fn concurrent_threads_on_smart_agree_with_the_model() {
    let seed = seed();
    eprintln!("seed {seed}");
    let st = library_smart(6, seed, Instant::now() + Duration::from_secs(8));
    eprintln!(
        "{} ops, {} blocks adopted or remapped by the worker, {} mismatches",
        st.ops, st.smart_worked, st.mismatches
    );
    assert!(st.ops > 1000, "only {} ops", st.ops);
    assert!(
        st.smart_worked > 500,
        "the worker did little: {}",
        st.smart_worked
    );
    assert_eq!(st.mismatches, 0, "{:#?}", st.examples);
}

#[test]
fn concurrent_threads_under_media_faults_keep_the_rest_of_the_model() {
    let seed = seed();
    eprintln!("seed {seed}");
    let st = library_faults(6, seed, Instant::now() + Duration::from_secs(8));
    eprintln!(
        "{} ops, {} faults, {} ENOSPC, {} failed checkpoints, {} live recoveries, {} mismatches, gave up: {:?}",
        st.ops, st.faults, st.full, st.checkpoints_failed, st.live_recoveries, st.mismatches, st.gave_up
    );
    assert!(st.ops > 1000, "only {} ops", st.ops);
    // The engine gave up every half second and was rebuilt while the threads ran.
    assert!(
        st.live_recoveries >= 4,
        "{} live recoveries",
        st.live_recoveries
    );
    assert!(st.faults > 5, "only {} faults", st.faults);
    assert!(
        st.checkpoints_failed > 3,
        "only {} failed checkpoints",
        st.checkpoints_failed
    );
    assert_eq!(st.mismatches, 0, "{:#?}", st.examples);
    // At this rate the engine keeps its live state (a regression that makes it give up at
    // the first fault would leave only the crash image checked).
    assert_eq!(st.gave_up, None);
}

/// The same on `smart` (an even seed), its worker adopting and remapping while faults hit.
#[test]
fn concurrent_threads_on_smart_under_media_faults_keep_the_rest_of_the_model() {
    let seed = seed() / 2 * 2;
    eprintln!("seed {seed}");
    let st = library_faults(6, seed, Instant::now() + Duration::from_secs(6));
    eprintln!(
        "{} ops, {} blocks adopted or remapped, {} faults, {} failed checkpoints, {} live recoveries, {} mismatches, gave up: {:?}",
        st.ops, st.smart_worked, st.faults, st.checkpoints_failed, st.live_recoveries, st.mismatches, st.gave_up
    );
    assert!(
        st.live_recoveries >= 3,
        "{} live recoveries",
        st.live_recoveries
    );
    assert!(
        st.smart_worked > 100,
        "the worker did little: {}",
        st.smart_worked
    );
    assert!(st.faults > 5, "only {} faults", st.faults);
    assert_eq!(st.mismatches, 0, "{:#?}", st.examples);
    assert_eq!(st.gave_up, None);
}

#[test]
fn full_device_gives_enospc_then_recovers_space() {
    let seed = seed();
    eprintln!("seed {seed}");
    let st = full_device(seed, true);
    eprintln!(
        "{} files written, {} mismatches, finding 3: {}",
        st.ops, st.mismatches, st.shutdown_enospc
    );
    assert!(st.ops > 50);
    assert_eq!(st.mismatches, 0, "{:#?}", st.examples);
}

/// The disk under the image fills, then has room again: ENOSPC only, no give-up, every file
/// back, writes go on, a clean shutdown and reopen; on both media (root only: a small tmpfs).
#[test]
fn a_full_host_disk_gives_enospc_and_room_again_lets_writes_go_on() {
    for kind in [nodup_fs::MediumKind::BlockFile, nodup_fs::MediumKind::Pmem] {
        let Some(st) = host_full(seed(), kind) else {
            eprintln!("skipping: mounting a small tmpfs needs root");
            return;
        };
        eprintln!(
            "{}: {} files, {} mismatches",
            kind.name(),
            st.ops,
            st.mismatches
        );
        assert!(st.ops > 100, "{}: {:#?}", kind.name(), st.examples);
        assert_eq!(st.mismatches, 0, "{}: {:#?}", kind.name(), st.examples);
    }
}

/// Finding 3 (nodup-fs, fs.rs `top_up_reserve`/`checkpoint`): the checkpoint reserve is sized
/// from the previous checkpoint, so after filling the device a clean shutdown fails with
/// ENOSPC (the unmount leaves an unclean image).
#[test]
fn finding3_full_device_shuts_down_cleanly() {
    let st = full_device(21, true);
    assert_eq!(st.shutdown_enospc, 0, "{:#?}", st.examples);
}

/// Finding 3b: without maintenance ticks between writes (a burst faster than the daemon's
/// timer), a full device cannot even be reopened: failure recovery's checkpoint hits ENOSPC.
#[test]
fn finding3b_full_device_reopens_without_ticks() {
    let st = full_device(21, false);
    assert_eq!(st.mismatches, 0, "{:#?}", st.examples);
}
