//! The daemon's log: one line per event (mount, recovery, checkpoints, errors, shutdown), to
//! stderr in the foreground, to a file, or to syslog (journald picks it up) when daemonized.
//! A library user that sets no sink gets no output. An error that fails requests is logged
//! once, then at most once per ten seconds with the number of requests it failed meanwhile.

use parking_lot::Mutex;
use std::io::Write;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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

/// Least time between two lines of the same request error: a full disk or a failing medium
/// fails every request alike, and a line per request would flood the log.
const REPEAT_QUIET: Duration = Duration::from_secs(10);

/// Distinct request errors remembered (the one seen least lately is forgotten for a new one).
const REPEATS_KEPT: usize = 8;

/// A request error logged lately.
struct Recent {
    msg: String,
    /// When its last line was logged.
    logged: Instant,
    /// Times it came again since, without a line.
    repeats: u64,
    /// When it last came.
    seen: Instant,
}

impl Recent {
    /// Its line at `now`, with the repeats held back since the last one, which start over.
    fn line(&mut self, now: Instant) -> String {
        let n = std::mem::take(&mut self.repeats);
        let over = now.duration_since(std::mem::replace(&mut self.logged, now));
        if n == 0 {
            return self.msg.clone();
        }
        format!(
            "{} (and {n} more time{} in the {} s before this line)",
            self.msg,
            if n == 1 { "" } else { "s" },
            over.as_secs()
        )
    }
}

/// Request errors logged lately, and how often each came again since without a line.
#[derive(Default)]
struct Repeats {
    recent: Vec<Recent>,
}

impl Repeats {
    /// The lines to log for `msg` at `now`: the message the first time, and again once
    /// [`REPEAT_QUIET`] has passed, with the repeats it stood for; none in between. A message
    /// forgotten to make room (the one seen least lately) first has its count logged.
    fn note(&mut self, msg: &str, now: Instant) -> Vec<String> {
        if let Some(r) = self.recent.iter_mut().find(|r| r.msg == msg) {
            r.seen = now;
            if now.duration_since(r.logged) < REPEAT_QUIET {
                r.repeats += 1;
                return Vec::new();
            }
            return vec![r.line(now)];
        }
        let mut lines = Vec::new();
        if self.recent.len() == REPEATS_KEPT {
            if let Some(i) = (0..self.recent.len()).min_by_key(|&i| self.recent[i].seen) {
                let mut gone = self.recent.swap_remove(i);
                if gone.repeats > 0 {
                    lines.push(gone.line(now));
                }
            }
        }
        self.recent.push(Recent {
            msg: msg.to_owned(),
            logged: now,
            repeats: 0,
            seen: now,
        });
        lines.push(msg.to_owned());
        lines
    }

    /// Lines for the repeats not yet logged of errors logged over [`REPEAT_QUIET`] ago (or
    /// of every error, when `all`: the daemon is ending), so a count is never lost.
    fn due(&mut self, now: Instant, all: bool) -> Vec<String> {
        self.recent
            .iter_mut()
            .filter(|r| r.repeats > 0 && (all || now.duration_since(r.logged) >= REPEAT_QUIET))
            .map(|r| r.line(now))
            .collect()
    }
}

static REPEATS: OnceLock<Mutex<Repeats>> = OnceLock::new();

fn repeats() -> &'static Mutex<Repeats> {
    REPEATS.get_or_init(|| Mutex::new(Repeats::default()))
}

/// Log an error a request met: the first of a kind at once, then the same message at most
/// once per [`REPEAT_QUIET`], saying how many requests it stands for.
pub fn request_error(msg: &str) {
    let lines = repeats().lock().note(msg, Instant::now());
    for l in lines {
        error(&l);
    }
}

/// Log the counts [`request_error`] held back for errors that stopped coming (the
/// maintenance tick calls it), or all of them (`all`: at the end of the daemon).
pub fn flush_repeats(all: bool) {
    let lines = repeats().lock().due(Instant::now(), all);
    for l in lines {
        error(&l);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_errors_are_counted_not_logged_each_time() {
        let mut r = Repeats::default();
        let t = Instant::now();
        assert_eq!(r.note("full", t), ["full"]);
        assert_eq!(r.note("other", t), ["other"]);
        for i in 1..=5 {
            assert!(r.note("full", t + Duration::from_secs(i)).is_empty());
        }
        assert!(
            r.due(t + Duration::from_secs(9), false).is_empty(),
            "still coming"
        );
        let later = t + REPEAT_QUIET + Duration::from_secs(2);
        assert_eq!(
            r.note("full", later),
            ["full (and 5 more times in the 12 s before this line)"]
        );
        // One more, then silence: the tick logs its count once the quiet time is over.
        assert!(r.note("full", later + Duration::from_secs(1)).is_empty());
        assert!(r.due(later + Duration::from_secs(5), false).is_empty());
        let end = later + REPEAT_QUIET;
        assert_eq!(
            r.due(end, false),
            vec!["full (and 1 more time in the 10 s before this line)".to_string()]
        );
        assert!(r.due(end + REPEAT_QUIET, true).is_empty(), "counted once");
        // At the end of the daemon, every count held back, however recent.
        r.note("full", end + Duration::from_secs(1));
        assert_eq!(
            r.due(end + Duration::from_secs(2), true),
            vec!["full (and 1 more time in the 2 s before this line)".to_string()]
        );
        // Never more than REPEATS_KEPT messages: the one seen least lately goes, its count
        // logged first ("full" is seen again meanwhile, so "other" goes first).
        let t2 = end + Duration::from_secs(10);
        r.note("other", t2);
        assert!(r.note("other", t2).is_empty());
        for i in 0..REPEATS_KEPT - 2 {
            let at = t2 + Duration::from_millis(i as u64 + 1);
            assert_eq!(r.note(&format!("e{i}"), at).len(), 1);
        }
        assert!(r.note("full", t2 + Duration::from_secs(1)).is_empty());
        assert_eq!(
            r.note("new", t2 + Duration::from_secs(2)),
            ["other (and 1 more time in the 2 s before this line)", "new"]
        );
        assert_eq!(r.recent.len(), REPEATS_KEPT);
        assert!(r.recent.iter().all(|x| x.msg != "other"));
    }
}
