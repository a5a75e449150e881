//! Subcommands, one module per area (each owned by the crate it drives).

pub mod bench;
pub mod check;
pub mod ctl;
pub mod du;
pub mod estimate;
pub mod estimate_model;
pub mod freewrite;
pub mod helper;
pub mod list;
pub mod malloc_tune;
pub mod mkfs;
pub mod mount;
pub mod sim;
pub mod size;
pub mod trace;

/// An error as one line: each cause once (a cause whose text an outer message already contains
/// is not repeated), without Rust's " (os error N)" suffixes.
pub fn plain_error(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for c in e.chain() {
        let s = without_errno(&c.to_string());
        if out.contains(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out
}

/// A progress bar of `len` drawn with `template`, only when stderr is a terminal (piped, a
/// long command stays quiet).
pub fn progress_bar(len: u64, template: &str) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        pb.set_style(style);
    }
    Some(pb)
}

/// An error's text (I/O, file system) without the "(os error N)" suffix.
pub fn plain(e: &dyn std::fmt::Display) -> String {
    without_errno(&e.to_string())
}

/// `msg` without Rust's " (os error N)" suffix, as the C tools print an error.
pub fn without_errno(msg: &str) -> String {
    match msg.find(" (os error") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

/// An error of opening a file system, for the command line: an engine's "invalid argument"
/// is the caller's mistake and its message already says which (a key file that does not open
/// the image, one missing for an encrypted image), so the prefix, which reads like a Rust
/// error type, is dropped.
pub fn open_error(e: &nodup_fs::FsError) -> String {
    match e {
        nodup_fs::FsError::Engine(nodup_core::Error::Invalid(m)) => m.clone(),
        e => e.to_string(),
    }
}
