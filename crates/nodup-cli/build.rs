//! Records the commit the binary is built from (`nodup --version`), so that a benchmark's
//! figures name the code that produced them, not whatever the checkout holds when they are
//! written up. `unknown` outside a git checkout; `-dirty` when tracked sources (crates, Cargo
//! files) differ from it.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let o = Command::new("git").args(args).output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=7", "HEAD"]);
    let id = match &commit {
        Some(c) => {
            // Only what the rerun below watches (bench results and docs do not make the code
            // dirty); without optional locks, so the index is not rewritten under a build.
            let dirty = git(&[
                "--no-optional-locks",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ":(top)crates",
                ":(top)Cargo.toml",
                ":(top)Cargo.lock",
            ])
            .is_some_and(|s| !s.is_empty());
            format!("{c}{}", if dirty { "-dirty" } else { "" })
        }
        None => "unknown".into(),
    };
    println!("cargo:rustc-env=NODUP_COMMIT={id}");
    // Rerun when the commit or the index moves, and when any tracked source changes (the
    // dirty mark): cargo scans a directory given here for modified files.
    for p in ["HEAD", "index", "refs", "packed-refs"] {
        if let Some(path) = git(&["rev-parse", "--git-path", p]) {
            if Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for d in ["crates", "Cargo.toml", "Cargo.lock"] {
        let p = root.join(d);
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
}
