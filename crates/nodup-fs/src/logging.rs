//! The daemon's log: one line per event (mount, recovery, checkpoints, errors, shutdown), to
//! stderr in the foreground, to a file, or to syslog (journald picks it up) when daemonized.
//! A library user that sets no sink gets no output.

use parking_lot::Mutex;
use std::io::Write;
use std::sync::OnceLock;

/// Where log lines go.
pub enum Sink {
    /// Standard error (a foreground daemon, tests).
    Stderr,
    /// Appended to a file.
    File(std::fs::File),
    /// syslog(3), facility daemon, tagged `nodup` with the pid.
    Syslog,
}

/// Importance of a line (syslog priority).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Error,
    Warning,
    Info,
}

static SINK: OnceLock<Mutex<Option<Sink>>> = OnceLock::new();

fn sink() -> &'static Mutex<Option<Sink>> {
    SINK.get_or_init(|| Mutex::new(None))
}

/// Send log lines to `s` from now on.
pub fn set_sink(s: Sink) {
    if let Sink::Syslog = s {
        // SAFETY: the identifier is a static NUL-terminated string, kept for the process.
        unsafe {
            libc::openlog(
                c"nodup".as_ptr(),
                libc::LOG_PID | libc::LOG_NDELAY,
                libc::LOG_DAEMON,
            )
        };
    }
    *sink().lock() = Some(s);
}

/// Write one log line.
pub fn log(level: Level, msg: &str) {
    let mut g = sink().lock();
    let Some(s) = g.as_mut() else { return };
    let tag = match level {
        Level::Error => "error: ",
        Level::Warning => "warning: ",
        Level::Info => "",
    };
    match s {
        Sink::Stderr => eprintln!("nodup: {tag}{msg}"),
        Sink::File(f) => {
            let now = crate::inode::Ts::now();
            let _ = writeln!(
                f,
                "{}.{:03} nodup[{}]: {tag}{msg}",
                now.sec,
                now.nsec / 1_000_000,
                std::process::id()
            );
        }
        Sink::Syslog => {
            let prio = match level {
                Level::Error => libc::LOG_ERR,
                Level::Warning => libc::LOG_WARNING,
                Level::Info => libc::LOG_INFO,
            };
            if let Ok(c) = std::ffi::CString::new(format!("{tag}{msg}")) {
                // SAFETY: a "%s" format with one NUL-terminated string argument.
                unsafe { libc::syslog(prio, c"%s".as_ptr(), c.as_ptr()) };
            }
        }
    }
}

/// Log an informational line.
pub fn info(msg: &str) {
    log(Level::Info, msg)
}

/// Log a warning.
pub fn warn(msg: &str) {
    log(Level::Warning, msg)
}

/// Log an error.
pub fn error(msg: &str) {
    log(Level::Error, msg)
}
