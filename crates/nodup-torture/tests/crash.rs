//! Crash-state checking: the real system must pass, and mutants must be caught.

use nodup_torture::crash::{run_workload, CrashConfig};
use nodup_torture::verify::Mutant;
use nodup_torture::workload::WorkloadSpec;

fn small() -> CrashConfig {
    CrashConfig {
        spec: WorkloadSpec {
            ops: 25,
            ..WorkloadSpec::default()
        },
        max_points: 40,
        ..CrashConfig::default()
    }
}

#[test]
fn crash_states_are_consistent() {
    let seed = std::env::var("TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    eprintln!("seed {seed}");
    let st = run_workload(seed, &small(), None);
    eprintln!("{} states, {} violations", st.states, st.violations);
    assert!(st.states >= 40, "only {} states", st.states);
    assert_eq!(st.violations, 0, "{:#?}", st.examples);
}

fn mutant_caught(cfg: CrashConfig, what: &str) {
    let st = run_workload(3, &cfg, None);
    eprintln!("{what}: {} states, {} violations", st.states, st.violations);
    assert!(
        st.violations > 0,
        "{what}: the checker missed a broken system"
    );
}

#[test]
fn checker_catches_refcount_mutant() {
    mutant_caught(
        CrashConfig {
            mutant: Mutant::ReleaseReferenced,
            ..small()
        },
        "release-referenced",
    );
}

#[test]
fn checker_catches_corruption_mutant() {
    mutant_caught(
        CrashConfig {
            mutant: Mutant::CorruptData,
            ..small()
        },
        "corrupt-data",
    );
}

#[test]
fn checker_catches_lost_flushes() {
    // Nothing written after setup ever becomes durable: completed operations get lost.
    mutant_caught(
        CrashConfig {
            drop_flushes: true,
            ..small()
        },
        "drop-flushes",
    );
}
