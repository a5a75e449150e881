//! The simulator's error type: one line each, saying what failed and where.

/// Errors of trace handling, capture and simulation.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// An I/O call failed; `what` says on which file or process.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A trace file is not a valid trace (bad magic, version, checksum, truncation, field).
    #[error("{0}")]
    Format(String),
    /// A capture could not be set up or run.
    #[error("capture: {0}")]
    Capture(String),
    /// An option or argument is out of range.
    #[error("{0}")]
    Invalid(String),
    /// A plot could not be drawn.
    #[error("plot: {0}")]
    Plot(String),
}

impl SimError {
    /// An I/O error with its context.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        SimError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Result with [`SimError`].
pub type Result<T> = std::result::Result<T, SimError>;
