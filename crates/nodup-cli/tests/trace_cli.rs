//! The `nodup trace` / `nodup replay` command contract (JSON keys, exit codes, bad lines).

use std::path::{Path, PathBuf};

mod common;
use common::{json, nodup};

fn sample(name: &str) -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for base in [
        here.join("../../../shared/data/fiu"),
        PathBuf::from("/work/shared/data/fiu"),
    ] {
        if base.join(name).exists() {
            return base.join(name);
        }
    }
    panic!("shared FIU sample {name} not found");
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The arguments of `trace gen` of `size` at half duplicates into `out`.
fn gen_args<'a>(size: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "trace",
        "gen",
        "--size",
        size,
        "--dup-ratio",
        "0.5",
        "-o",
        out,
    ]
}

/// `trace gen` of 64 MiB into `out` (more than a 1 MiB tmpfs holds).
fn gen_64m(out: &Path) -> std::process::Output {
    nodup(&gen_args("64M", s(out)))
}

#[test]
fn stats_json_has_the_contract_keys() {
    let v = json(&nodup(&[
        "trace",
        "stats",
        "--json",
        s(&sample("mail-01-sample.blkparse")),
    ]));
    for k in [
        "writes",
        "reads",
        "dedup_ratio",
        "unique_blocks",
        "bad_lines",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    assert_eq!(v["writes"], 16);
    assert_eq!(v["reads"], 984);
    assert_eq!(v["dedup_ratio"], 0.3125);
}

#[test]
fn gen_stats_replay_and_strict() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("g.fiu");
    let o = nodup(&[
        "trace",
        "gen",
        "--size",
        "4M",
        "--dup-ratio",
        "0.5",
        "--run-length",
        "fixed:8",
        "--read-ratio",
        "0.1",
        "--seed",
        "5",
        "-o",
        s(&t),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = json(&nodup(&["trace", "stats", "--json", s(&t)]));
    let r = st["dedup_ratio"].as_f64().unwrap();
    assert!((r - 0.5).abs() < 0.02, "ratio {r}");
    let plot = dir.path().join("cdf.png");
    assert!(nodup(&["trace", "stats", s(&t), "--plot", s(&plot)])
        .status
        .success());
    assert!(std::fs::metadata(&plot).unwrap().len() > 1000);

    let rep = json(&nodup(&[
        "replay",
        s(&t),
        "--dir",
        s(&dir.path().join("r")),
        "--mode",
        "batch",
        "--threads",
        "2",
        "--json",
    ]));
    for k in ["ops", "bytes", "seconds", "mib_per_s", "verify_errors"] {
        assert!(rep.get(k).is_some(), "missing {k}");
    }
    for k in ["p50", "p90", "p99", "p999", "max"] {
        assert!(rep["latency_us"].get(k).is_some(), "missing latency_us.{k}");
    }
    assert_eq!(rep["verify_errors"], 0);
    assert_eq!(rep["bytes"], 4 << 20);

    // A bad third line: skipped and counted by default, fatal with --strict (naming line 3).
    let text = std::fs::read_to_string(&t).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(2, "this is not a trace line");
    let bad = dir.path().join("bad.fiu");
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let st = json(&nodup(&["trace", "stats", "--json", s(&bad)]));
    assert_eq!(st["bad_lines"], 1);
    let o = nodup(&[
        "replay",
        s(&bad),
        "--dir",
        s(&dir.path().join("b")),
        "--strict",
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("line 3"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The --strict run above wrote the first two lines into b's file: replacing it is asked for.
    let o = nodup(&[
        "replay",
        s(&bad),
        "--dir",
        s(&dir.path().join("b")),
        "--overwrite",
        "--json",
    ]);
    assert_eq!(json(&o)["bad_lines"], 1);
    assert!(String::from_utf8_lossy(&o.stderr).contains("line 3"));

    // Convert round trip via the CLI.
    let own = dir.path().join("g.own");
    let back = dir.path().join("g2.fiu");
    assert!(nodup(&["trace", "convert", s(&t), "-o", s(&own)])
        .status
        .success());
    assert!(nodup(&["trace", "convert", s(&own), "-o", s(&back)])
        .status
        .success());
    assert_eq!(std::fs::read(&t).unwrap(), std::fs::read(&back).unwrap());
}

#[test]
fn gen_popularity_and_phases() {
    let dir = tempfile::tempdir().unwrap();
    let gen = |name: &str, extra: &[&str]| {
        let t = dir.path().join(name);
        let mut args = gen_args("32M", s(&t));
        args.extend_from_slice(extra);
        let o = nodup(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        t
    };
    // The new options' defaults are the old trace, byte for byte.
    let plain = gen("plain.fiu", &[]);
    let explicit = gen(
        "explicit.fiu",
        &["--popularity", "uniform", "--phases", "1"],
    );
    assert_eq!(
        std::fs::read(&plain).unwrap(),
        std::fs::read(&explicit).unwrap()
    );

    // Zipf: the top 1 % of contents take most duplicate references; stats shows it.
    let zipf = gen("zipf.fiu", &["--popularity", "zipf:1.2", "--phases", "2"]);
    let top1 = |t: &Path| {
        let v = json(&nodup(&["trace", "stats", "--json", s(t)]));
        let r = v["dedup_ratio"].as_f64().unwrap();
        assert!((r - 0.5).abs() < 0.02, "ratio {r}");
        assert_eq!(v["popularity"][1]["top_percent"], 1.0);
        v["popularity"][1]["share"].as_f64().unwrap()
    };
    let (z, u) = (top1(&zipf), top1(&plain));
    assert!(z > 0.3 && u < 0.15, "top 1 % share: zipf {z}, uniform {u}");
    let text = String::from_utf8(nodup(&["trace", "stats", s(&zipf)]).stdout).unwrap();
    assert!(
        text.contains("duplicate refs") && text.contains("top 1 %"),
        "{text}"
    );

    // Bad values: one line naming the problem, non-zero exit, no output file.
    for (flag, val, what) in [
        ("--popularity", "zipf:-1", "popularity"),
        ("--popularity", "zipf:x", "popularity"),
        ("--popularity", "lognormal", "popularity"),
        ("--phases", "0", "phases"),
    ] {
        let out = dir.path().join("bad.fiu");
        let o = nodup(&[
            "trace",
            "gen",
            "--size",
            "1M",
            "--dup-ratio",
            "0.5",
            flag,
            val,
            "-o",
            s(&out),
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{flag} {val}");
        assert_eq!(err.trim_end().lines().count(), 1, "{flag} {val}: {err}");
        assert!(err.starts_with("nodup: ") && err.contains(what), "{err}");
        assert!(!out.exists(), "{flag} {val} created the output");
    }
}

/// A small generated trace (16 writes of one device, dev-8-0.img on replay) in `dir`.
fn small_trace(dir: &Path, name: &str) -> PathBuf {
    let t = dir.join(name);
    let o = nodup(&[
        "trace",
        "gen",
        "--size",
        "64K",
        "--dup-ratio",
        "0.5",
        "--seed",
        "3",
        "-o",
        s(&t),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    t
}

/// A failure with one line on stderr that contains `what`.
fn fails_with(o: &std::process::Output, what: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "expected a failure: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err}"
    );
    assert!(err.contains(what), "{what:?} expected in {err}");
}

#[test]
fn convert_refuses_to_write_over_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let t = small_trace(dir.path(), "t.fiu");
    let before = std::fs::read(&t).unwrap();
    // The same path, a symlink to it, a hard link to it, and the input through a symlink.
    let sym = dir.path().join("sym.fiu");
    std::os::unix::fs::symlink(&t, &sym).unwrap();
    let hard = dir.path().join("hard.fiu");
    std::fs::hard_link(&t, &hard).unwrap();
    let dotted = dir.path().join(".").join("t.fiu");
    for (input, output) in [(&t, &t), (&t, &sym), (&t, &hard), (&sym, &t), (&t, &dotted)] {
        let o = nodup(&["trace", "convert", s(input), "-o", s(output)]);
        fails_with(&o, "is the input");
        assert_eq!(
            std::fs::read(&t).unwrap(),
            before,
            "{} -o {} changed the input",
            input.display(),
            output.display()
        );
    }
    // Another file is still fine.
    let own = dir.path().join("t.own");
    assert!(nodup(&["trace", "convert", s(&t), "-o", s(&own)])
        .status
        .success());
    // A trace with nothing to convert removes an output it created, never one that was there
    // (as root, `-o /dev/null` would otherwise remove /dev/null).
    let junk = dir.path().join("junk.fiu");
    std::fs::write(&junk, "not a trace\n").unwrap();
    let fresh = dir.path().join("fresh.own");
    assert!(!nodup(&["trace", "convert", s(&junk), "-o", s(&fresh)])
        .status
        .success());
    assert!(!fresh.exists(), "an empty output was left");
    assert!(!nodup(&["trace", "convert", s(&junk), "-o", s(&own)])
        .status
        .success());
    assert!(own.exists(), "an output that was there before was removed");
}

#[test]
fn replay_keeps_existing_files_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let t = small_trace(dir.path(), "t.fiu");
    let d = dir.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let target = d.join("dev-8-0.img");
    let precious = vec![0xa5u8; 3 << 20];
    std::fs::write(&target, &precious).unwrap();
    // Refused, naming the file, which keeps its data.
    let o = nodup(&["replay", s(&t), "--dir", s(&d)]);
    fails_with(&o, "dev-8-0.img");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--overwrite"));
    assert!(std::fs::read(&target).unwrap() == precious);
    // A trace that turns out unreadable part way (an own-format file cut short) leaves the
    // file alone even with --overwrite: nothing is truncated before the whole trace was read.
    let own = dir.path().join("t.own");
    assert!(nodup(&["trace", "convert", s(&t), "-o", s(&own)])
        .status
        .success());
    let bytes = std::fs::read(&own).unwrap();
    let cut = dir.path().join("cut.own");
    std::fs::write(&cut, &bytes[..bytes.len() - 7]).unwrap();
    let o = nodup(&["replay", s(&cut), "--dir", s(&d), "--overwrite"]);
    assert!(!o.status.success());
    assert!(std::fs::read(&target).unwrap() == precious);
    // An empty file holds nothing to lose; --overwrite replaces one with data.
    let e = dir.path().join("e");
    std::fs::create_dir(&e).unwrap();
    std::fs::write(e.join("dev-8-0.img"), b"").unwrap();
    let rep = json(&nodup(&["replay", s(&t), "--dir", s(&e), "--json"]));
    assert_eq!(rep["verify_errors"], 0);
    let rep = json(&nodup(&[
        "replay",
        s(&t),
        "--dir",
        s(&d),
        "--overwrite",
        "--json",
    ]));
    assert_eq!(rep["verify_errors"], 0);
    assert_eq!(
        std::fs::read(&target).unwrap(),
        std::fs::read(e.join("dev-8-0.img")).unwrap()
    );
    let help = String::from_utf8_lossy(&nodup(&["replay", "--help"]).stdout).into_owned();
    assert!(help.contains("--overwrite"), "{help}");
}

#[test]
fn a_trace_without_one_good_line_fails_and_bad_lines_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    // 400 lines of junk (as a binary file read as text gives).
    let junk = dir.path().join("junk.fiu");
    let text: String = (0..400)
        .map(|i| format!("\u{1}junk {i} \u{7f}\n"))
        .collect();
    std::fs::write(&junk, text).unwrap();
    for args in [
        vec!["trace", "stats", s(&junk)],
        vec!["replay", s(&junk), "--dir"],
    ] {
        let mut args = args;
        let d = dir.path().join("r");
        if args[0] == "replay" {
            args.push(s(&d));
        }
        let o = nodup(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} accepted a trace of junk");
        let n = err.lines().count();
        assert!(n <= 12, "{args:?}: {n} lines on stderr:\n{err}");
        assert!(err.contains("400 bad lines"), "{args:?}: {err}");
        assert!(err.contains("no record"), "{args:?}: {err}");
    }
    // Good records among many bad lines: success, and still few lines on stderr.
    let t = small_trace(dir.path(), "t.fiu");
    let mut mixed = std::fs::read_to_string(&t).unwrap();
    for i in 0..50 {
        mixed.push_str(&format!("not a line {i}\n"));
    }
    let m = dir.path().join("mixed.fiu");
    std::fs::write(&m, mixed).unwrap();
    let o = nodup(&["trace", "stats", "--json", s(&m)]);
    assert_eq!(json(&o)["bad_lines"], 50);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.lines().count() <= 12, "{err}");
    assert!(err.contains("50 bad lines"), "{err}");
}

#[test]
fn a_bad_plot_path_is_one_line_before_any_work_and_a_late_failure_keeps_the_stats() {
    let dir = tempfile::tempdir().unwrap();
    let t = small_trace(dir.path(), "t.fiu");
    let missing = dir.path().join("no-such-dir/cdf.png");
    let svg = dir.path().join("cdf.svg");
    for (plot, what) in [(&missing, "no such directory"), (&svg, ".png")] {
        let o = nodup(&["trace", "stats", s(&t), "--plot", s(plot)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{plot:?} accepted");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.contains(s(plot)) && err.contains(what), "{err}");
        assert!(o.stdout.is_empty(), "work done before the check");
        assert!(
            !err.contains("Error(") && !err.contains("os error"),
            "{err}"
        );
    }
    // Passes the check (its directory exists) but cannot be created: a dangling symbolic link
    // into a missing directory. The figures are printed all the same, the error is one line.
    let late = dir.path().join("late.png");
    std::os::unix::fs::symlink(dir.path().join("gone/x.png"), &late).unwrap();
    let o = nodup(&["trace", "stats", s(&t), "--plot", s(&late)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("duplicate writes"));
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(s(&late)) && err.contains("No such file"),
        "{err}"
    );
    assert!(
        !err.contains("Error(") && !err.contains("os error"),
        "{err}"
    );
}

#[test]
fn gen_and_convert_leave_no_partial_output_on_a_full_disk() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: mounting a small tmpfs needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let full = common::SmallTmpfs::new("trace-full", "1M");
    let g = full.dir.join("g.fiu");
    let o = gen_64m(&g);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "64 MiB of trace fit in 1 MiB?");
    fails_with(&o, &format!("writing {}: No space left on device", s(&g)));
    assert!(!err.contains("os error"), "{err}");
    assert!(!g.exists(), "gen left a partial trace");
    // A trace whose FIU text is far larger than the tmpfs, converted onto it.
    let big = dir.path().join("big.fiu");
    let own = dir.path().join("big.own");
    let o = gen_64m(&big);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = nodup(&["trace", "convert", s(&big), "-o", s(&own)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let c = full.dir.join("c.fiu");
    let o = nodup(&["trace", "convert", s(&own), "-o", s(&c)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the conversion fit in 1 MiB?");
    fails_with(&o, "No space left on device");
    assert!(!err.contains("os error"), "{err}");
    assert!(!c.exists(), "convert left a partial trace");
}

#[test]
fn a_damaged_binary_trace_is_not_read_as_lines_of_text() {
    let dir = tempfile::tempdir().unwrap();
    let t = small_trace(dir.path(), "t.fiu");
    let own = dir.path().join("t.own");
    let o = nodup(&["trace", "convert", s(&t), "-o", s(&own)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Its magic damaged: detection no longer sees an own-format trace.
    let mut bytes = std::fs::read(&own).unwrap();
    bytes[0] ^= 0xff;
    bytes[1] ^= 0xff;
    std::fs::write(&own, bytes).unwrap();
    let d = dir.path().join("r");
    for args in [
        vec!["replay", s(&own), "--dir", s(&d)],
        vec!["replay", s(&own), "--dir", s(&d), "--strict"],
        vec!["trace", "stats", s(&own)],
    ] {
        let o = nodup(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("bad magic"), "{args:?}: {err}");
        assert!(!err.contains("line"), "{args:?}: {err}");
    }
}

#[test]
fn gen_refuses_a_size_below_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("g.fiu");
    for size in ["0", "100"] {
        let o = nodup(&gen_args(size, s(&t)));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "--size {size} accepted");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(&format!("--size {size}: too small")), "{err}");
        assert!(!t.exists(), "--size {size} created the output");
    }
}

/// The names in `dir`, sorted (a temporary file left behind shows up here).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_failing_gen_or_convert_keeps_the_file_it_would_replace() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let t = small_trace(dir.path(), "t.fiu");
    let old = b"an older trace, not to be lost\n".repeat(100);
    let keep = dir.path().join("keep.own");
    std::fs::write(&keep, &old).unwrap();
    std::fs::set_permissions(&keep, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Late failures of convert: a bad last line under --strict, a trace of nothing but bad
    // lines (refused once read).
    let mut text = std::fs::read_to_string(&t).unwrap();
    text.push_str("not a trace line\n");
    let bad_end = dir.path().join("bad-end.fiu");
    std::fs::write(&bad_end, text).unwrap();
    let junk = dir.path().join("junk.fiu");
    std::fs::write(&junk, "not a trace\n").unwrap();
    for args in [
        vec!["trace", "convert", s(&bad_end), "--strict", "-o", s(&keep)],
        vec!["trace", "convert", s(&junk), "-o", s(&keep)],
    ] {
        let o = nodup(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(
            std::fs::read(&keep).unwrap() == old,
            "{args:?} lost the old file"
        );
    }
    assert_eq!(
        names(dir.path()),
        ["bad-end.fiu", "junk.fiu", "keep.own", "t.fiu"]
    );
    // A success replaces it, with its permissions.
    let o = nodup(&["trace", "convert", s(&t), "-o", s(&keep)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&keep).unwrap() != old);
    let mode = std::fs::metadata(&keep).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // What is not a regular file is written in place, and stays what it is.
    for args in [
        vec!["trace", "convert", s(&t), "-o", "/dev/null"],
        gen_args("64K", "/dev/null"),
    ] {
        let o = nodup(&args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    // A full disk, for gen and for convert, under a trace that was there before.
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping the full disk: mounting a small tmpfs needs root");
        return;
    }
    let full = common::SmallTmpfs::new("trace-keep", "1M");
    let there = full.dir.join("there.fiu");
    std::fs::write(&there, &old).unwrap();
    let big = dir.path().join("big.fiu");
    let big_own = dir.path().join("big.own");
    let o = gen_64m(&big);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = nodup(&["trace", "convert", s(&big), "-o", s(&big_own)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for o in [
        gen_64m(&there),
        nodup(&["trace", "convert", s(&big_own), "-o", s(&there)]),
    ] {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "a 1 MiB disk took a trace of 64 MiB?");
        assert!(err.contains("No space left"), "{err}");
        assert!(
            std::fs::read(&there).unwrap() == old,
            "lost the old file: {err}"
        );
        assert_eq!(names(&full.dir), ["there.fiu"], "{err}");
    }
}

#[test]
fn trace_io_errors_read_like_the_other_commands() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.fiu");
    let out = dir.path().join("out.own");
    let no_dir = dir.path().join("no-such-dir/g.fiu");
    for args in [
        vec!["trace", "stats", s(&missing)],
        vec!["trace", "convert", s(&missing), "-o", s(&out)],
        vec!["replay", s(&missing), "--dir", s(dir.path())],
        gen_args("64K", s(&no_dir)),
    ] {
        let o = nodup(&args);
        fails_with(&o, "No such file or directory");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("os error"), "{args:?}: {err}");
    }
}
