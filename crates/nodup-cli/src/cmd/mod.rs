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
/// is not repeated).
pub fn plain_error(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for c in e.chain() {
        let s = c.to_string();
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

/// An I/O error's text without the "(os error N)" suffix.
pub fn plain_io(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}
