//! A real capture of a small program whose writes are known.

use super::*;
use crate::trace::{Op, TraceReader};

/// A shell builds a growing string "0123...": its content must show up among the captured
/// writes, with the synthesized reads beside them, and the exit status must come back.
#[test]
fn captures_a_running_program() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.trace");
    let script = "i=0; while [ $i -lt 12000 ]; do a=\"$a$i\"; i=$((i+1)); done; sleep 0.05";
    let cmd: Vec<OsString> = ["sh", "-c", script].iter().map(OsString::from).collect();
    let o = CaptureOptions {
        interval_ms: 5,
        read_ratio: 0.5,
        seed: 1,
    };
    let s = capture(&cmd, &out, &o).unwrap();
    assert_eq!(s.exit_code, 0);
    assert!(s.samples >= 2, "{s:?}");
    assert!(s.writes > 100, "{s:?}");
    let ev = TraceReader::open(&out).unwrap().read_all().unwrap();
    let writes = ev.iter().filter(|e| e.op == Op::Write).count() as u64;
    assert_eq!(writes, s.writes);
    // Reads are synthesized about one per write, to lines written before.
    let reads = ev.len() as u64 - writes;
    assert!(
        reads * 10 >= writes * 9 && reads <= writes,
        "{reads} reads, {writes} writes"
    );
    // The shell's growing string "0123..." shows up in the written content.
    let needle = b"50015002";
    assert!(ev
        .iter()
        .any(|e| e.op == Op::Write && e.data.windows(needle.len()).any(|w| w == needle)));
    // A failing command is reported with its status.
    let bad: Vec<OsString> = ["sh", "-c", "exit 3"].iter().map(OsString::from).collect();
    assert_eq!(capture(&bad, &out, &o).unwrap().exit_code, 3);
    let none: Vec<OsString> = vec!["/nonexistent/program".into()];
    assert!(capture(&none, &out, &o).is_err());
}
