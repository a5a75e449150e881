//! The one error type of the crate: I/O, unparsable input lines, corrupt own-format files, bad arguments.

use thiserror::Error;

/// Everything that can go wrong while reading, replaying, analysing or generating a trace.
#[derive(Debug, Error)]
pub enum TraceError {
    /// An operating-system I/O error, with what was being done.
    #[error("{what}: {source}")]
    Io {
        /// What the tool was doing (path and action).
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A trace line that does not parse (1-based line number).
    #[error("line {line}: {msg}")]
    Parse {
        /// 1-based line number in the trace file.
        line: u64,
        /// Why the line was rejected.
        msg: String,
    },
    /// A corrupt or unsupported own-format (binary) trace file.
    #[error("own trace format: {0}")]
    Format(String),
    /// An invalid option value (size, distribution, ratio...).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// An output that would destroy an input or a file with data.
    #[error("{0}")]
    Refused(String),
    /// The plot could not be drawn or written.
    #[error("plot: {0}")]
    Plot(String),
}

impl TraceError {
    /// Wrap an `io::Error` with a description of the action that failed.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        TraceError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Result alias of the crate.
pub type Result<T, E = TraceError> = std::result::Result<T, E>;
