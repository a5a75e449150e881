//! The summary lines of the `make torture` contract, printed last so a script can read them.

/// Totals of a torture run.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Crash states checked (media-level crash campaign, recovery crashes included).
    pub crash_states: u64,
    /// Crash-state violations plus media-fault and kill -9 (fsck, remount) failures.
    pub violations: u64,
    /// Completed kill -9 cycles.
    pub kill9_cycles: u64,
    /// fsynced files missing or wrong after a kill -9.
    pub lost_fsynced: u64,
    /// (target, execs, crashes) per fuzz target.
    pub fuzz: Vec<(String, u64, u64)>,
    /// Stress model mismatches.
    pub stress_mismatches: u64,
}

impl Summary {
    /// The contract's lines, in order.
    pub fn lines(&self) -> Vec<String> {
        let mut v = vec![
            format!("crash states checked: {}", self.crash_states),
            format!("violations: {}", self.violations),
            format!("kill -9 cycles: {}", self.kill9_cycles),
            format!("lost fsynced files: {}", self.lost_fsynced),
        ];
        for (t, n, _) in &self.fuzz {
            v.push(format!("fuzz execs: {n} (target {t})"));
        }
        v.push(format!(
            "stress model mismatches: {}",
            self.stress_mismatches
        ));
        v
    }

    /// True when nothing went wrong (the exit status of `make torture`).
    pub fn passed(&self) -> bool {
        self.violations == 0
            && self.lost_fsynced == 0
            && self.stress_mismatches == 0
            && self.fuzz.iter().all(|f| f.2 == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_follow_the_contract_and_any_problem_fails() {
        let mut s = Summary {
            crash_states: 10,
            kill9_cycles: 2,
            fuzz: vec![("fs_image".into(), 5, 0)],
            ..Default::default()
        };
        assert_eq!(
            s.lines(),
            [
                "crash states checked: 10",
                "violations: 0",
                "kill -9 cycles: 2",
                "lost fsynced files: 0",
                "fuzz execs: 5 (target fs_image)",
                "stress model mismatches: 0"
            ]
        );
        assert!(s.passed());
        s.fuzz[0].2 = 1;
        assert!(!s.passed());
        s.fuzz[0].2 = 0;
        s.lost_fsynced = 1;
        assert!(!s.passed());
    }
}
